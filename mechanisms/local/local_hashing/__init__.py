"""Optimized local hashing (OLH): randomizer and estimator (layout: :mod:`mechanisms`)."""
