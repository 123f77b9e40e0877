"""gpufleet: bare GPU servers to a verified multi-node vLLM service, online or air-gapped."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
