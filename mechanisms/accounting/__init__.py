"""Accounting: the zCDP conversion and the privacy accountant with its ledger (layout: :mod:`mechanisms`)."""
