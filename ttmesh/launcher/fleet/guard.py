"""A fleet's guard: the fleet ended in its ttmesh's place when that is killed (even SIGKILL).

A single job's guardian finishes the job when its launcher is killed (``attempt.guardian``).
A fleet's replicas are jobs of their own and stop by themselves when the fleet's ttmesh dies
(PR_SET_PDEATHSIG: SIGTERM, their own drain and the recovery of their own chips), and so does
the router; what only the fleet did is left: the links between the replicas' chips (in no
replica's mesh: ``fleet.between``), the fleet's private directory in ``/tmp`` and its job
record. The guard does those.

The fleet starts it before any replica (``python -m ttmesh _fleet-guard``: the CLI opens the
host, as only it may; in a session of its own, so a terminal's Ctrl-C never reaches it) with a pipe on its standard input
that only the fleet's ttmesh writes: one JSON line saying what to do (:data:`SCHEMA`), then one
line each time the router starts (its PID and start time), then ``{"done": true}`` when the
fleet has ended by itself. The pipe closing without that is ttmesh gone. The guard then:

1. stops the router if it still runs (SIGTERM, SIGKILL after 5 s: only while the PID has the
   start time it was told);
2. waits until no process of this user runs as one of the fleet's replicas (``--fleet-of
   FLEET`` in its command line: a replica's ttmesh and its guardian; found on /proc, so a
   replica started a moment before ttmesh died is waited for too), at most :data:`WAIT` s;
3. checks the fleet's chips together and resets them where something is wrong
   (``fleet.between``), naming the chips it could not recover;
4. writes the fleet's ``--summary-json`` when it was asked for (``ttmesh.fleet/1``: each
   replica's own summary as its ``outcome``, the router null), removes the fleet's directory
   (only if it is still the one made) and closes the fleet's record (``launcher killed``; its
   code 137, as a single job's guardian gives, or 1 when chips were not recovered or checked).

Its lines go to the stderr it inherited (the fleet's terminal), prefixed ``ttmesh:``. It is the
fleet's ``guardian`` in the job record, so ``ttmesh ps`` shows the fleet running until it is
done; SIGTERM, SIGINT and SIGHUP are ignored (a reset is never cut short).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

from ttmesh import numeric

SCHEMA = "ttmesh.fleet-guard/1"
LINE_MAX = 1 << 20  # bytes of one line from the fleet (its plan's chips: a few KiB)
POLL = 0.2  # s between looks at the replicas' processes once ttmesh is gone
WAIT = 900.0  # s at most for the replicas to end (their --grace, then their own recovery)
ROUTER_GRACE = 5.0  # s between SIGTERM and SIGKILL of the router
LAUNCHER_KILLED = "launcher killed"
KILLED_CODE = 128 + signal.SIGKILL  # what a fleet killed under its replicas ends with


def say(message: str) -> None:
    with contextlib.suppress(OSError):
        os.write(2, f"ttmesh: {message}\n".encode(errors="replace"))


def read_lines(fd: int) -> Iterator[bytes]:
    """The pipe's lines (bounded); ends when it closes."""
    pending = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except InterruptedError:
            continue
        except OSError:
            chunk = b""
        if not chunk:
            return
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            yield line
        if len(pending) > LINE_MAX:
            pending = b""  # a line longer than any the fleet writes: not the fleet's


def replicas_running(job: str, uid: int) -> list[int]:
    """The PIDs of this user's processes that run as a replica of fleet ``job``."""
    from ttmesh import procs

    out = []
    for name in os.listdir("/proc"):
        if not numeric.digits(name) or int(name) == os.getpid():
            continue
        pid = int(name)
        if procs.uid_of(pid) != uid or procs.is_zombie(pid):
            continue
        words = procs.argv(pid)
        if any(w == "--fleet-of" and nxt == job for w, nxt in itertools.pairwise(words)):
            out.append(pid)
    return out


def stop_router(router: dict[str, Any] | None) -> None:
    from ttmesh import procs

    if not router:
        return
    pid, start = int(router.get("pid", -1)), router.get("start")
    if pid <= 0 or not procs.alive(pid, start):
        return
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGTERM)  # its group: it leads its own session
    deadline = time.monotonic() + ROUTER_GRACE
    while procs.alive(pid, start) and time.monotonic() < deadline:
        time.sleep(0.05)
    if procs.alive(pid, start):
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)


def finish(
    spec: dict[str, Any], router: dict[str, Any] | None, open_host: Callable[[str], Any]
) -> int:
    """ttmesh is gone: the fleet ended in its place (the module's steps). ``open_host``: the
    host under a root (the CLI's: only it opens a simulated one)."""
    from ttmesh.errors import TTMeshError
    from ttmesh.launcher.fleet import between
    from ttmesh.runtime import jobs

    job = str(spec["job"])
    say(f"fleet {job}: ttmesh was killed: ending the fleet in its place (every replica stops "
        "itself, then the links between them are checked)")  # fmt: skip
    stop_router(router)
    deadline = time.monotonic() + WAIT
    uid = os.getuid()
    while (left := replicas_running(job, uid)) and time.monotonic() < deadline:
        time.sleep(POLL)
    result, checked = between.Between(), False
    if left:
        say(f"fleet {job}: {len(left)} of its replicas' processes still run after {WAIT:g} s "
            f"(pid {left[0]}): the links between replicas are not checked (see ttmesh check)")  # fmt: skip
    elif spec.get("asics"):
        try:
            result = between.check(
                open_host(str(spec.get("root") or "/")), [str(a) for a in spec["asics"]],
                {str(k): str(v) for k, v in (spec.get("names") or {}).items()},
                tt_smi=spec.get("tt_smi"), train_timeout=spec.get("train_timeout"), say=say,
            )  # fmt: skip
            checked = True
        except (OSError, TTMeshError) as exc:
            say(f"the fleet's chips could not be checked: {exc} (see ttmesh check)")
    else:
        checked = True  # a chipless fleet: nothing to check
    reason = f"{LAUNCHER_KILLED} (its guard ended the fleet)"
    if result.lost:
        reason += f"; {result.clause()}"
    elif not checked:
        reason += "; its chips not checked"
    code = KILLED_CODE if checked and result.healthy else 1
    _summary(spec, code, reason, result if checked else None)
    _remove_dir(spec)
    with contextlib.suppress(OSError, TTMeshError):
        jobs.close(job, reason, code)
    say(f"fleet {job}: exit {code}: {reason}")
    return code


def _summary(spec: dict[str, Any], code: int, reason: str, result: Any) -> None:
    """The fleet's ``--summary-json``, as the fleet would have written it, from what the guard
    knows: each replica's own summary (in the fleet's directory, written by its job)."""
    from ttmesh import fileread, paths
    from ttmesh.errors import TTMeshError

    where = spec.get("summary")
    if not isinstance(where, str) or not where:
        return
    replicas = []
    for r in spec.get("replicas") or []:
        if not isinstance(r, dict):
            continue
        outcome = None
        with contextlib.suppress(OSError, ValueError, TTMeshError, TypeError):
            outcome = json.loads(fileread.read_text(str(r.get("summary")), 1 << 20, "a summary"))
        replicas.append({**{k: v for k, v in r.items() if k != "summary"}, "state": "exited",
                         "outcome": outcome})  # fmt: skip
    summary = {
        "schema": "ttmesh.fleet/1", "job": spec["job"], "source": "ttmesh", "code": code,
        "reason": reason, "router": None, "replicas": replicas,
        "chips": result.to_json() if result is not None else None,
        "recovery": spec.get("recovery"), "resetting": False, "host_resets": [],
    }  # fmt: skip
    try:  # never through a link another user planted (paths.write_text)
        paths.write_text(where, json.dumps(summary, indent=2) + "\n", "--summary-json")
    except TTMeshError as err:
        say(str(err))


def _remove_dir(spec: dict[str, Any]) -> None:
    from pathlib import Path

    from ttmesh import paths

    where = spec.get("dir")
    if isinstance(where, str) and where:
        ident = spec.get("dir_id")
        identity = (
            (int(ident[0]), int(ident[1])) if isinstance(ident, list) and len(ident) == 2 else None
        )
        paths.remove_tree(Path(where), identity)


def main(open_host: Callable[[str], Any]) -> int:
    """Read the fleet's pipe (standard input) to its end; the fleet's end if ttmesh died."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    lines = read_lines(0)
    spec: dict[str, Any] | None = None
    router: dict[str, Any] | None = None
    for raw in lines:
        try:
            message = json.loads(raw)
        except ValueError:
            continue
        if not isinstance(message, dict):
            continue
        if spec is None:
            if message.get("schema") == SCHEMA and isinstance(message.get("job"), str):
                spec = message
            continue
        if message.get("done") is True:
            return 0  # the fleet ended by itself: nothing left to do
        if isinstance(message.get("router"), dict):
            router = message["router"]
    if spec is None:
        return 0  # never told what to guard
    return finish(spec, router, open_host)
