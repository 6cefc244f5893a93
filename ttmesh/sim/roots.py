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


def systems_dir() -> Path:
    """Where the stock system files are (inside the package, so a wheel carries them)."""
    return Path(__file__).resolve().parent.parent / "configs" / "systems"


def stock_names() -> list[str]:
    return sorted(p.stem for p in systems_dir().glob("*.yaml"))


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
    if marker is not None and marker.get("ttmesh") != __version__ and os.access(root, os.W_OK):
        from ttmesh.sim.create import install_tools

        install_tools(root)
        marker["ttmesh"] = __version__
        (root / MARKER).write_text(json.dumps(marker) + "\n")


def ensure_cached(name: str) -> Path:
    """The cached simulated host for stock system ``name``, created on first use."""
    if name not in stock_names():
        raise bad_input(
            f"unknown system {name!r}",
            "known systems: " + ", ".join(stock_names()),
        )
    root = cache_root() / name
    try:
        if read_marker(root) is None:
            from ttmesh.sim.create import create
            from ttmesh.sim.system import load

            model = load(name)
            if root.is_symlink() or (root.exists() and (not root.is_dir() or any(root.iterdir()))):
                raise bad_input(
                    f"{root} is in the way of the cached simulated host",
                    f"remove it: rm -r {root}",
                )
            create(model, root)
        else:
            refresh_tools(root)
    except PermissionError as exc:
        from ttmesh.errors import owner_of

        owner = owner_of(str(exc.filename or root))
        raise bad_input(
            f"cannot write the simulated host cache {root}: {exc.strerror}"
            + (f" (owned by {owner})" if owner else ""),
            "set XDG_CACHE_HOME to a directory you can write, or build one with "
            "ttmesh sim create --system NAME --root DIR and use --root DIR",
        )
    except OSError as exc:
        raise bad_input(
            f"cannot create the simulated host cache {root}: {exc.strerror}",
            "set XDG_CACHE_HOME to a directory you can write",
        )
    return root
