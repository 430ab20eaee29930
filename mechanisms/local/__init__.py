"""Local DP: each protocol's device randomizer, server estimator and variance together (layout: :mod:`mechanisms`)."""
