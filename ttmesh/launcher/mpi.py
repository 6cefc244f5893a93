"""The MPI start mode: every rank of a tt-metal world in one MPMD ``mpirun`` command.

tt-metal forms a mesh over several processes through MPI, so those processes must all be
started by one MPI launcher, one app context per rank with its own environment
(``mpirun -np 1 -x K=V ... prog : -np 1 -x K=V ... prog``). The guardian supervises the
``mpirun`` process like any worker: its output is split back into ranks (``--tag-output``), the
first failing rank and its code are read from mpirun's report, and the whole tree is swept.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable

from ttmesh import procs
from ttmesh.errors import bad_input
from ttmesh.launcher.logs import LAUNCHER
from ttmesh.launcher.plan import LaunchPlan, scrubbed

TAG = re.compile(rb"\[\d+,(\d+)\]<(stdout|stderr)>:")
FIRST_FAILED = re.compile(r"Process name: \[\[\d+,\d+\],(\d+)\]\s*\n\s*Exit code:\s*(\d+)")
SIGNALLED = re.compile(r"process rank (\d+) with PID \d+ on node \S+ exited on signal (\d+)")


def find_mpirun(explicit: str | None = None) -> str:
    path = explicit or os.environ.get("TTMESH_MPIRUN") or shutil.which("mpirun")
    if not path or not os.access(path, os.X_OK):
        raise bad_input(
            "no mpirun on this machine (tt-metal meshes over several processes need an MPI launcher)",
            "install Open MPI: apt-get install openmpi-bin",
        )
    return path


def mpirun_argv(
    mpirun: str, plan: LaunchPlan, base_env: dict[str, str], attempt: int
) -> tuple[list[str], dict[str, str]]:
    """(argv, environment of mpirun itself): one ``-np 1 -x K=V ... prog`` section per rank."""
    argv = [mpirun, "--tag-output", "--bind-to", "none"]
    if os.geteuid() == 0:
        argv.append("--allow-run-as-root")
    if len(plan.ranks) > (os.cpu_count() or 1):
        argv.append("--oversubscribe")
    env = {k: v for k, v in base_env.items() if not scrubbed(k)}
    if "OMP_NUM_THREADS" not in base_env:
        env["OMP_NUM_THREADS"] = "1"
    for i, rank in enumerate(plan.ranks):
        if i:
            argv.append(":")
        argv += ["-np", "1"]
        if rank.workdir:
            argv += ["--wdir", rank.workdir]
        rank_env = {**rank.env, "TORCHELASTIC_RESTART_COUNT": str(attempt)}
        for key, value in rank_env.items():
            argv += ["-x", f"{key}={value}"]
        argv += list(rank.argv)
    return argv, env


class Demux:
    """Splits mpirun's tagged output back into per-rank streams; untagged text is mpirun's."""

    def __init__(self, feed: Callable[[int, str, bytes], None]) -> None:
        self.feed = feed
        self.owner: dict[str, tuple[int, str]] = {}  # mpirun stream -> who the pending text is
        self.at_line_start: dict[str, bool] = {"stdout": True, "stderr": True}
        self.pending: dict[str, bytes] = {"stdout": b"", "stderr": b""}
        self.text: list[str] = []  # mpirun's own messages, for the failure report

    def data(self, stream: str, chunk: bytes) -> None:
        buf = self.pending[stream] + chunk
        # A tag may be cut at the end of a read: keep a short tail that could start one.
        cut = buf.rfind(b"[")
        if cut != -1 and b">:" not in buf[cut:] and len(buf) - cut < 32:
            buf, self.pending[stream] = buf[:cut], buf[cut:]
        else:
            self.pending[stream] = b""
        pos = 0
        for match in TAG.finditer(buf):
            self._text(stream, buf[pos : match.start()])
            self.owner[stream] = (int(match.group(1)), match.group(2).decode())
            self.at_line_start[stream] = False
            pos = match.end()
        self._text(stream, buf[pos:])

    def _text(self, stream: str, text: bytes) -> None:
        if not text:
            return
        owner = self.owner.get(stream) if not self.at_line_start[stream] else None
        if owner is None:
            owner = (LAUNCHER, stream)
            self.text.append(text.decode(errors="replace"))
        self.feed(owner[0], owner[1], text)
        self.at_line_start[stream] = text.endswith(b"\n")
        if self.at_line_start[stream]:
            self.owner.pop(stream, None)

    def flush(self) -> None:
        for stream in ("stdout", "stderr"):
            rest, self.pending[stream] = self.pending[stream], b""
            self._text(stream, rest)

    def first_failure(self) -> tuple[int, int] | None:
        """(rank, exit code) of the first rank mpirun saw fail, from its report."""
        text = "".join(self.text)
        match = FIRST_FAILED.search(text)
        if match:
            return int(match.group(1)), int(match.group(2))
        match = SIGNALLED.search(text)
        if match:
            return int(match.group(1)), 128 + int(match.group(2))
        return None


def rank_pids(mpirun_pid: int, world: int) -> dict[int, int]:
    """The processes mpirun started for each rank (found by their TTMESH_RANK)."""
    found: dict[int, int] = {}
    for pid in procs.descendants(mpirun_pid):
        value = procs.environ_value(pid, "TTMESH_RANK")
        if value is not None and value.isdigit():
            rank = int(value)
            if 0 <= rank < world and rank not in found:
                found[rank] = pid
    return found
