"""ttmesh: launcher and mesh orchestrator for multi-chip Tenstorrent jobs."""

__version__ = "0.1.0"
