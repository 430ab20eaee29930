"""RAPPOR: parameters, hashing, the PRR and IRR rounds, encoder, decoder, advisor (layout: :mod:`mechanisms`)."""
