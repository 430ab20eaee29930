"""Foundations shared by every mechanism family: errors, validation, randomness, directed rounding, the
measurement framework and estimates (the layout: :mod:`mechanisms`)."""
