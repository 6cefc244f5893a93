"""One ttmesh command on every host of a cluster, through one ``mpirun`` (``ls``, ``check`` and
``reset`` with ``--hosts``).

Each host runs ``ttmesh COMMAND ARGS`` itself (a rankfile puts copy N on host N), reading its
own files; this ttmesh reads no other machine's. A small shell wrapper prints the command's exit
code after its output and exits 0, so one host's failure (a ``check`` that finds problems) does
not make mpirun stop the others. The outputs come back per host, in the order named.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

from ttmesh.dataclass import dataclass, field
from ttmesh.errors import bad_input
from ttmesh.launcher.nodes.reach import MpiHosts

EXIT_MARK = "@@ttmesh-exit "
# The line ``ls``/``check`` add when run for ``--hosts`` (``--cables-line``): this host's end of
# each of its cables, as JSON, for the launching ttmesh to join with the other ends.
CABLES_MARK = "@@ttmesh-cables "
_EXIT = re.compile(re.escape(EXIT_MARK) + r"([0-9]+)\s*$")
# Runs ttmesh with the host's own Python, then says how it ended (the wrapper itself exits 0).
WRAPPER = f'"$0" -m ttmesh "$@"; echo "{EXIT_MARK}$?"'


@dataclass
class HostRun:
    """What one host's ttmesh printed, and its exit code (None: it never said)."""

    host: str
    code: int | None
    stdout: str
    stderr: str
    cables: list[dict[str, Any]] | None = field(default=None)  # its cable ends (CABLES_MARK)

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
            lines = lines[:-1]
        elif not stderr.strip():
            stderr = first
        cables = None
        if lines and lines[-1].startswith(CABLES_MARK):
            try:
                said_cables = json.loads(lines[-1][len(CABLES_MARK) :])
                cables = said_cables if isinstance(said_cables, list) else None
            except ValueError:
                cables = None
            lines = lines[:-1]
        stdout = "".join(lines)
        out.append(HostRun(name, code, stdout, stderr, cables))
    if all(r.code is None for r in out):
        raise bad_input(
            f"mpirun reached none of the hosts ({', '.join(mh.names)}): {first}",
            "check that mpirun reaches them (ssh, or --launch-agent)",
        )
    return out


def worst(runs: list[HostRun]) -> int:
    """The exit code over every host: the highest (a host that never said counts as 1)."""
    return max(1 if r.code is None else r.code for r in runs)


def join_cables(runs: list[HostRun]) -> list[dict[str, Any]]:
    """Every cable between the hosts once, with both ends (host, PCI address, unique id,
    channel) and its state: ``down`` when either end says so (a cable is one link: down from
    either end is down), ``up`` when both say up, else ``unknown`` (a host that did not say).
    A cable to a chip none of the hosts has (a machine not named) is left out, unless a host
    did not answer (it may be that one's)."""
    ends: dict[tuple[str, int], tuple[str, dict[str, Any]]] = {}
    for r in runs:
        for end in r.cables or []:
            if isinstance(end, dict) and isinstance(end.get("peer"), dict):
                ends[(str(end.get("asic_id")), int(end.get("chan") or 0))] = (r.host, end)
    silent = any(r.cables is None for r in runs)
    out: list[dict[str, Any]] = []
    seen: set[frozenset] = set()
    for (asic, chan), (host, end) in ends.items():
        peer = (str(end["peer"].get("asic_id")), int(end["peer"].get("chan") or 0))
        key = frozenset({(asic, chan), peer})
        if key in seen:
            continue
        seen.add(key)
        other = ends.get(peer)
        if other is None and not silent:
            continue
        states = {end.get("state"), other[1].get("state") if other else None}
        state = "down" if "down" in states else ("up" if states == {"up"} else "unknown")
        b = (
            {"host": other[0], "bdf": other[1].get("bdf"), "asic_id": peer[0], "chan": peer[1]}
            if other
            else {"host": None, "bdf": None, "asic_id": peer[0], "chan": peer[1]}
        )
        a: dict[str, Any] = {"host": host, "bdf": end.get("bdf"), "asic_id": asic, "chan": chan}
        out.append({"a": a, "b": b, "state": state})
    order = {r.host: i for i, r in enumerate(runs)}
    out.sort(key=lambda c: (order.get(c["a"]["host"], 0), c["a"]["bdf"] or "", c["a"]["chan"]))
    return out


def cable_text(cable: dict[str, Any]) -> str:
    """``ttmh-0 0000:31:00.0 ch14 <-> ttmh-1 0000:31:00.0 ch14``."""

    def end(e: dict[str, Any]) -> str:
        return f"{e['host'] or '?'} {e['bdf'] or e['asic_id']} ch{e['chan']}"

    return f"{end(cable['a'])} <-> {end(cable['b'])}"
