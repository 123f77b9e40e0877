"""The package version, apart from ``gpufleet/__init__`` so that modules can read it without a cycle."""

__version__ = "0.1.0"
