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
from ttmesh.sim import cables as simcables
from ttmesh.sim import core
from ttmesh.sim.system import SystemModel

HERE = Path(__file__).resolve().parent
TOOLS = {
    "_ttmesh_simcore.py": HERE / "core.py",
    "_ttmesh_simcables.py": HERE / "cables.py",
    "_ttmesh_fileread.py": HERE.parent / "fileread.py",
    "_ttmesh_smitable.py": HERE / "smitable.py",
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


def default_cables_dir(model: SystemModel, root: Path) -> Path:
    """Where the cables of ``model``'s system are shared by default: beside the root, named
    after the system, so hosts made side by side (``/tmp/t3k-a``, ``/tmp/t3k-b``) share them."""
    return Path(os.path.abspath(root)).parent / f"{model.name}.cables"


def create(
    model: SystemModel,
    root: Path,
    *,
    force: bool = False,
    config: dict | None = None,
    cables: Path | None = None,
) -> Path:
    """Write a simulated host of ``model`` under ``root``; refuses to touch anything else.

    A host of a system of several hosts shares its cables with the others in ``cables``
    (default: :func:`default_cables_dir`): made there by the first host created, kept by the
    others (``config``'s ``cable_window`` and ``cable_train_seconds`` set on it either way).
    """
    config = dict(config or {})
    cable_config = {k: float(config.pop(k)) for k in simcables.CONFIG_KEYS if k in config}
    if cables is not None and not model.system_cables:
        raise bad_input(
            "--cables goes with a host of a system of several hosts",
            "drop --cables (this system has no cables between hosts)",
        )
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
    shared = None
    if model.system_cables and model.host is not None:
        shared = Path(os.path.abspath(cables or default_cables_dir(model, root)))
        _share_cables(model, shared, cable_config, force)
    root.mkdir(parents=True, exist_ok=True)
    (root / "sim").mkdir()
    data = model.to_dict()
    if shared is not None:
        data["cables"] = {"dir": str(shared), "host": model.host}
    (root / "sim" / "system.json").write_text(json.dumps(data, indent=1) + "\n")
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


def _share_cables(model: SystemModel, where: Path, config: dict, force: bool) -> None:
    """The system's shared cable state in ``where``: made, or kept when it holds these cables
    (another host of the system made it); then ``config`` set on it. Training takes what it
    takes on hardware unless told (ttmesh.host.boards.link_training: external links)."""
    from ttmesh.host.boards import link_training

    train = config.get("cable_train_seconds", link_training(model.arch, external=True).typical)
    window = config.get("cable_window", simcables.DEFAULT_WINDOW)
    ends = [(ha, core.asic_hex(ua), ca, hb, core.asic_hex(ub), cb)
            for ha, ua, ca, hb, ub, cb in model.system_cables]  # fmt: skip
    data = simcables.new_state(model.name, ends, train, window)
    try:
        simcables.create(str(where), os.geteuid(), data, replace=force)
        if config:
            with simcables.Store(str(where), os.geteuid()).change() as shared:
                shared["config"].update(config)
    except simcables.CableError as exc:
        raise bad_input(exc.message, exc.hint) from None


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
