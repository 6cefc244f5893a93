"""Where simulated hosts live, and the cached roots behind ``--sim NAME``.

Kept light (standard library and the sim core only): it runs on every command's start-up, and
the modules that build a root are imported only when one has to be built.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ttmesh import __version__
from ttmesh.errors import bad_input
from ttmesh.sim.core import MARKER


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ttmesh" / "sim"


def read_marker(root: Path) -> dict | None:
    try:
        return json.loads((root / MARKER).read_text() or "{}")
    except (FileNotFoundError, NotADirectoryError):
        return None
    except ValueError:
        return {}


def refresh_tools(root: Path) -> None:
    """A root made by another ttmesh version gets this version's tools (its state is kept)."""
    marker = read_marker(root)
    if marker is not None and marker.get("ttmesh") != __version__:
        from ttmesh.sim.create import install_tools

        install_tools(root)
        marker["ttmesh"] = __version__
        (root / MARKER).write_text(json.dumps(marker) + "\n")


def ensure_cached(name: str) -> Path:
    """The cached simulated host for stock system ``name``, created on first use."""
    root = cache_root() / name
    if read_marker(root) is None:
        from ttmesh.sim.create import create
        from ttmesh.sim.system import load

        model = load(name)
        if root.exists() and any(root.iterdir()):
            raise bad_input(
                f"{root} is in the way of the cached simulated host",
                f"remove it: rm -r {root}",
            )
        create(model, root)
    else:
        refresh_tools(root)
    return root
