"""Sub-commands of the ``gpufleet`` command line; each module exposes ``register(subparsers)``."""
