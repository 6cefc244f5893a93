"""One ttmesh command on every host of a cluster, through one ``mpirun`` (``ls``, ``check`` and
``reset`` with ``--hosts``).

Each host runs ``ttmesh COMMAND ARGS`` itself (a rankfile puts copy N on host N), reading its
own files; this ttmesh reads no other machine's. A small shell wrapper prints the command's exit
code after its output and exits 0, so one host's failure (a ``check`` that finds problems) does
not make mpirun stop the others. The outputs come back per host, in the order named.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass

from ttmesh.errors import bad_input
from ttmesh.launcher.hosts.reach import MpiHosts

EXIT_MARK = "@@ttmesh-exit "
_EXIT = re.compile(re.escape(EXIT_MARK) + r"(\d+)\s*$")
# Runs ttmesh with the host's own Python, then says how it ended (the wrapper itself exits 0).
WRAPPER = f'"$0" -m ttmesh "$@"; echo "{EXIT_MARK}$?"'


@dataclass
class HostRun:
    """What one host's ttmesh printed, and its exit code (None: it never said)."""

    host: str
    code: int | None
    stdout: str
    stderr: str

    def why(self) -> str:
        """The host's last word, for a summary line."""
        lines = [ln for ln in self.stderr.splitlines() if ln.strip(" -")]  # not mpirun's rules
        return lines[-1].removeprefix("ttmesh: ") if lines else "no output"


def run(mh: MpiHosts, args: list[str], timeout: float) -> list[HostRun]:
    """``ttmesh ARGS`` on every host of ``mh``; one :class:`HostRun` per host, in order."""
    # mpirun gives ranks a pseudo-terminal: plain text, no live view, on every host.
    command = ["sh", "-c", WRAPPER, sys.executable, *args]
    proc, streams = mh.run_each(command, timeout, "answer", env=("TERM=dumb",))
    said = streams.get((-1, "stderr"), b"") + streams.get((-1, "stdout"), b"")
    # mpirun's own first word (ssh's error, "ORTE was unable to reliably start ..."), not its rules.
    first = next(
        (ln.strip() for ln in said.decode(errors="replace").splitlines() if ln.strip(" -")),
        f"mpirun exited {proc.returncode}",
    )
    out = []
    for rank, name in enumerate(mh.names):
        stdout = streams.get((rank, "stdout"), b"").decode(errors="replace")
        stderr = streams.get((rank, "stderr"), b"").decode(errors="replace")
        code = None
        lines = stdout.splitlines(keepends=True)
        if lines and (match := _EXIT.match(lines[-1].strip())):
            code = int(match.group(1))
            stdout = "".join(lines[:-1])
        elif not stderr.strip():
            stderr = first
        out.append(HostRun(name, code, stdout, stderr))
    if all(r.code is None for r in out):
        raise bad_input(
            f"mpirun reached none of the hosts ({', '.join(mh.names)}): {first}",
            "check that mpirun reaches them (ssh, or --launch-agent)",
        )
    return out


def worst(runs: list[HostRun]) -> int:
    """The exit code over every host: the highest (a host that never said counts as 1)."""
    return max(1 if r.code is None else r.code for r in runs)
