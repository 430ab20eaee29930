"""One module per ``ptel`` sub-command; each exposes ``register(subparsers)`` and ``run(args) -> int``."""
