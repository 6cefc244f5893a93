"""Where simulated hosts live, and the cached roots behind ``--sim NAME``.

Kept light (standard library and the sim core only): it runs whenever a simulated host is
opened. The stock systems (``sim.system``) are imported only for ``--sim NAME``, and the module
that builds a root (``sim.create``) only when one has to be built: neither imports this one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ttmesh import __version__
from ttmesh.errors import bad_input
from ttmesh.sim.core import MARKER, read_marker


def cache_root() -> Path:
    from ttmesh.paths import xdg_dir

    return Path(xdg_dir("XDG_CACHE_HOME", ".cache") or ".") / "ttmesh" / "sim"


# in bin/ (sim.create)
TOOL_NAMES = (
    "_ttmesh_simcore.py",
    "_ttmesh_fileread.py",
    "tt-smi",
    "_ttmesh_simcables.py",
    "_ttmesh_smitable.py",
)


def refresh_tools(root: Path) -> None:
    """A root of yours made by another ttmesh version (or whose core lacks its reader) gets
    this version's tools (its state is kept). Never another user's root: what they left
    in it (a link where a tool is written) must not make this user write anywhere else."""
    marker = read_marker(root)
    if not marker:  # none, or garbled: nothing to refresh (a garbled one is refused later)
        return
    # A root made before the core had a reader (or the cables, or tt-smi its tables) of its
    # own has the core without it.
    core_alone = (root / "bin" / TOOL_NAMES[0]).is_file() and not all(
        (root / "bin" / name).is_file() for name in (TOOL_NAMES[1], *TOOL_NAMES[3:])
    )
    stale = marker.get("ttmesh") != __version__ or core_alone
    try:
        mine = os.lstat(root).st_uid == os.getuid()
    except OSError:
        return
    if stale and mine and os.access(root, os.W_OK):
        from ttmesh.sim.create import install_tools, replace_file

        install_tools(root)
        marker["ttmesh"] = __version__
        replace_file(root / MARKER, (json.dumps(marker) + "\n").encode())


def ensure_cached(name: str) -> Path:
    """The cached simulated host for stock system ``name``, created on first use."""
    from ttmesh.sim.system import load, stock_names

    if name not in stock_names():
        raise bad_input(
            f"unknown system {name!r}",
            "known systems: " + ", ".join(stock_names()),
        )
    root = cache_root() / name
    try:
        if read_marker(root) is None:
            from ttmesh.sim.create import create

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
