"""Randomized response: boolean RR and k-RR (GRR); randomizer and estimator (layout: :mod:`mechanisms`)."""
