"""GPU-sharing Kubernetes device plugin (Volcano-compatible)."""

__version__ = "0.1.0"
