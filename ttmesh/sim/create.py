"""Building simulated hosts: ``ttmesh sim create`` and the cached roots behind ``--sim NAME``."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from pathlib import Path

from ttmesh import __version__
from ttmesh.errors import bad_input
from ttmesh.host import clusterdesc
from ttmesh.sim import core
from ttmesh.sim.system import SystemModel

HERE = Path(__file__).resolve().parent
TOOLS = {
    "_ttmesh_simcore.py": HERE / "core.py",
    "_ttmesh_fileread.py": HERE.parent / "fileread.py",
    "tt-smi": HERE / "tt_smi.py",
}
# What a simulated root holds; only these are removed when it is recreated.
MANAGED = (
    "sys",
    "dev",
    "proc",
    "bin",
    "sim",
    "cluster_descriptor.yaml",
    ".dockerenv",  # sim fault container
    core.MARKER,
)


def create(
    model: SystemModel, root: Path, *, force: bool = False, config: dict | None = None
) -> Path:
    """Write a simulated host of ``model`` under ``root``; refuses to touch anything else."""
    root = Path(root)
    if root.exists() and not root.is_dir():
        raise bad_input(f"{root} exists and is not a directory", "choose another --root")
    if root.is_dir() and any(root.iterdir()):
        if core.read_marker(root) is None:
            raise bad_input(
                f"{root} is not empty and is not a simulated host",
                "give an empty or new directory",
            )
        if not force:
            raise bad_input(
                f"{root} is already a simulated host", "add --force to recreate it from scratch"
            )
        for name in MANAGED:
            target = root / name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            elif target.exists() or target.is_symlink():
                target.unlink()
    root.mkdir(parents=True, exist_ok=True)
    (root / "sim").mkdir()
    (root / "sim" / "system.json").write_text(json.dumps(model.to_dict(), indent=1) + "\n")
    sim = core.SimRoot(str(root))
    state = sim.initial_state(config)
    sim._write_state(state)
    sim.make_lock()
    sim.write_static()
    name = model.name if model.host is None else f"{model.name} host {model.host}"
    header = [
        f"Simulated {name}: {model.title}" if model.title else f"Simulated {name}",
        f"Written by ttmesh {__version__} from {model.source or 'a system file'}.",
    ]
    (root / "cluster_descriptor.yaml").write_text(
        clusterdesc.dump(model.to_cluster_descriptor(), header)
    )
    sim.render(state)
    install_tools(root)
    (root / "run" / "lock" / "ttmesh").mkdir(parents=True, exist_ok=True)
    marker = {"system": model.name, "ttmesh": __version__, "created": time.time()}
    if model.host is not None:
        marker["host"] = model.host
    (root / core.MARKER).write_text(json.dumps(marker) + "\n")
    return root


def install_tools(root: Path) -> None:
    """Copy the standard-library tools (tt-smi stand-in, its core and reader) into
    ``root/bin``, each written to a new file (never through a link left in its place) and
    renamed over the old one."""
    bin_dir = root / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, source in TOOLS.items():
        replace_file(bin_dir / name, source.read_bytes(), 0o755 if name == "tt-smi" else 0o644)


def replace_file(target: Path, data: bytes, mode: int = 0o644) -> None:
    """``target`` holds ``data`` now: written to a file created for it (``O_EXCL``, not
    following links) and renamed over ``target`` (which replaces a link, never its target)."""
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)  # a leftover of a killed process with this PID (unlink follows nothing)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            os.fchmod(f.fileno(), mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
