"""What a plain launch imports, in its front and in its guardian: only what its mode needs.

A launch's cost is mostly Python importing modules (issue 35: 248 modules and 1.9x the time of
32a02a4, two fifths of it compiling dataclasses' methods). One launch on one simulated host,
and its dry run, each record ``sys.modules`` as the front and the guardian (forked from it)
leave; the modules a plain job has no use for, and dataclasses the standard library compiles
at import, are named here so that one that comes back says where (two launches, ~1 s).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import users_shell

# Each process writes what it imported as it ends (os._exit: the front, and its guardian).
RECORDER = r"""
import dataclasses, json, os, sys
out = sys.argv[1]
end = os._exit

def record(code):
    compiled = []
    for name, module in list(sys.modules.items()):
        if name.startswith("ttmesh.") and module is not None:
            for obj in vars(module).values():
                if isinstance(obj, type) and obj.__module__ == name and dataclasses.is_dataclass(obj):
                    init = getattr(obj.__init__, "__code__", None)
                    if init is not None and init.co_filename == "<string>":
                        compiled.append(f"{name}.{obj.__qualname__}")
    with open(f"{out}.{os.getpid()}", "w") as f:
        json.dump({"modules": sorted(sys.modules), "compiled": sorted(compiled)}, f)
    end(code)

os._exit = record
sys.argv = ["ttmesh", *sys.argv[2:]]
from ttmesh.cli import entry
entry()
"""

# Never on a plain launch: what a job on one host with a command that is no server, no log
# files, no ready pattern and no ttnn Python has no use for.
HEAVY = (
    "torch", "numpy", "rich", "psutil", "re2", "prometheus_client", "argparse", "asyncio",
    "concurrent.futures", "multiprocessing", "logging", "urllib.request", "http", "email",
    "ssl", "tempfile", "secrets", "hashlib", "random", "zipfile", "tarfile", "xml", "sqlite3",
)  # fmt: skip
NOT_THIS_MODE = (
    "ttmesh.launcher.fleet",  # --replicas
    "ttmesh.launcher.nodes",  # --nnodes, --hosts, Slurm, MPI
    "ttmesh.launcher.adapters",  # tt-run's files
    "ttmesh.launcher.serving.flags",  # a server's flag table and what reads it
    "ttmesh.launcher.serving.rules",
    "ttmesh.launcher.serving.spec",
    "ttmesh.launcher.serving.watch",
    "ttmesh.launcher.serving.server",
    "ttmesh.launcher.job.logdir",  # --log-dir, --redirects, --tee
    "ttmesh.launcher.job.feed",  # a replica of a fleet
    "ttmesh.launcher.job.active",  # check --active
    "ttmesh.recovery",  # resetting chips: --auto-reset, after a crash
    "ttmesh.cli.fleetview",
    "ttmesh.sim.create",
    "ttmesh.sim.faults",
    "ttmesh.sim.tt_smi",
    "ttmesh.host.telemetry",
    "ttmesh.probes",
)
# Parsed once into the user's cache (profiles, descriptors): a launch after the first never
# imports their parsers.
CACHED = ("yaml", "google.protobuf")
FRONT_ONLY_NOT = (
    "socket",  # the guardian listens for reset notices; the front opens no socket
    "ttmesh.cli.views",  # --dry-run's text
    "ttmesh.fabric.resetscope",  # what a reset notice means: read when one comes
)


def _found(modules: list[str], names: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == n or m.startswith(n + ".") for n in names))


def _launch(root: Path, out: Path, *args: str) -> tuple[dict, list[dict]]:
    """(the front's record, the guardians') of one ``ttmesh launch``."""
    env = users_shell(NO_COLOR="1")
    argv = [sys.executable, "-c", RECORDER, str(out), "launch", "--root", str(root), *args]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env) as proc:
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode(errors="replace")
    records = {int(p.name.rsplit(".", 1)[1]): p for p in out.parent.glob(f"{out.name}.*")}
    front = json.loads(records.pop(proc.pid).read_text())
    return front, [json.loads(p.read_text()) for p in records.values()]


@pytest.mark.usefixtures("runtime")
def test_a_plain_launch_imports_only_what_its_mode_needs(qb2: Path, tmp_path: Path) -> None:
    plain = ("--tp-size", "4", "--no-python", "true")
    # The dry run comes first: the caches are cold (its parsers are allowed), then warm.
    dry, none = _launch(qb2, tmp_path / "dry", "--dry-run", *plain)
    _launch(qb2, tmp_path / "first", *plain)  # its guardian parses the failure table once
    front, guardians = _launch(qb2, tmp_path / "run", *plain)
    assert none == [] and len(guardians) == 1, "the dry run forks nothing; a launch, a guardian"
    guardian = guardians[0]
    where = "(imported at the top of a module a plain launch imports: import it where it is used)"
    for who, record, forbidden in (
        ("the dry run", dry, HEAVY + NOT_THIS_MODE + ("socket", "ttmesh.fabric.resetscope")),
        ("the front", front, HEAVY + NOT_THIS_MODE + CACHED + FRONT_ONLY_NOT),
        ("the guardian", guardian, HEAVY + NOT_THIS_MODE + CACHED + FRONT_ONLY_NOT[1:]),
    ):
        assert _found(record["modules"], forbidden) == [], f"{who} imported these {where}"
        assert record["compiled"] == [], (
            f"{who} made these dataclasses with dataclasses.dataclass, which compiles their "
            "methods at every launch: import dataclass from ttmesh.dataclass instead"
        )
