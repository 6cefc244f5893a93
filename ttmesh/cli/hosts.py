"""Opening a host: the one place that chooses a backend, and so the only importer of the
simulator (an import-linter contract in pyproject.toml keeps it so).

A root with the simulator's marker is a simulated host; anything else is read as a real one.
"""

from __future__ import annotations

import os

from ttmesh.host.base import Host
from ttmesh.host.real import RealHost


def open_host(root: str | os.PathLike[str] = "/", flag: str | None = None) -> Host:
    """The host under ``root``: simulated when the root has the simulator's marker."""
    from ttmesh.sim.backend import SimHost, is_simulated

    if is_simulated(root):
        from ttmesh.sim.roots import refresh_tools

        host: Host = SimHost(root, flag)
        refresh_tools(host.root)
        return host
    return RealHost(root, flag)


def cached_sim(name: str) -> Host:
    """The cached simulated host of stock system ``name`` (``--sim NAME``), built on first use."""
    from ttmesh.sim.roots import ensure_cached

    return open_host(ensure_cached(name), flag=f"--sim {name}")
