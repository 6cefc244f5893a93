"""ttmesh: launcher and mesh orchestrator for multi-chip Tenstorrent jobs.

From Python (docs/api.md): ``ttmesh.launch(ttmesh.LaunchOptions(host=..., command=...))``
runs what ``ttmesh launch`` runs and returns how it ended. The names below are imported when
first used, so ``import ttmesh`` (and the command line's start) stays cheap."""

from typing import Any

from ttmesh.version import __version__

# name -> the module that holds it
_API = {
    "launch": "ttmesh.launcher.api",
    "Control": "ttmesh.launcher.api",
    "LaunchOptions": "ttmesh.launcher.api",
    "TorchrunFlags": "ttmesh.launcher.api",
    "Result": "ttmesh.launcher.api",
    "View": "ttmesh.launcher.api",
    "LaunchError": "ttmesh.errors",
    "open_host": "ttmesh.cli.hosts",
}

__all__ = ["__version__", *_API]


def __getattr__(name: str) -> Any:
    """``ttmesh.launch`` and the rest of the Python API, imported on first use."""
    if name not in _API:
        raise AttributeError(f"module 'ttmesh' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_API[name]), name)
