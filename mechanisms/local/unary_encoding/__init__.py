"""Unary encoding (OUE, SUE): randomizer and estimator (layout: :mod:`mechanisms`)."""
