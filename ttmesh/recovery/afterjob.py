"""One host's part in recovering a job's chips over several hosts: check, then reset together.

A launcher on one host does this itself (``launcher.launch``). A job over several hosts cannot:
each host reads and resets only its own chips, and the cables between hosts have an end on
each, which train only when both ends are reset together. So recovery runs in two steps on
every host (``ttmesh _recover`` through one mpirun per step, or each c10d agent in-process):

1. :func:`check_host`: end what the job left here, check the job's chips here, read this host's
   cable ends and what a reset of each chip takes (its reset domain), and report one
   :class:`HostCheck`;
2. :func:`reset_together`: at the moment every host agreed on, reset the chips the launcher
   decided from every host's check (``ttmesh.recovery.together``), wait for this host's cable
   ends to train (the board's time, polled), and report one :class:`HostRecovery` with their
   state, so every cable of the job is verified from both ends.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

from ttmesh import procs
from ttmesh.dataclass import dataclass, field
from ttmesh.errors import TTMeshError
from ttmesh.host.base import Host
from ttmesh.render import plural

PREFIX = "@@ttmesh-recover "
CHECK_PREFIX = "@@ttmesh-check "
LATEST_START = 300.0  # seconds: an agreed start further away than this is refused

HEALTHY = "healthy"  # nothing wrong: nothing reset
RECOVERED = "recovered"  # reset and verified
FAILED = "failed"  # reset, and still wrong
REFUSED = "refused"  # not reset: a lease, a holder, tt-smi missing
NONE_HERE = "none-here"  # none of the chips is on this host


@dataclass
class HostRecovery:
    """How one host's chips of a job came out of a check (and a reset)."""

    state: str
    chips: int = 0  # the job's chips found on this host
    problem: str | None = None  # what the check found (before any reset), else None
    after: str | None = None  # what was still wrong after the reset, or why it was refused
    seconds: float = 0.0
    cables: list[dict[str, Any]] = field(default_factory=list)  # this host's ends, after
    trained: float = 0.0  # seconds waited for the cable ends to train
    late: float = 0.0  # seconds this host started its reset after the agreed moment

    @property
    def exit_code(self) -> int:
        return {FAILED: 1, REFUSED: 3}.get(self.state, 0)

    def line(self) -> str:
        return PREFIX + json.dumps(asdict(self), separators=(",", ":"))


@dataclass
class HostCheck:
    """What one host's check of a job's chips found, for the decision every host follows."""

    state: str  # HEALTHY (nothing wrong here), FAILED (something a reset fixes), NONE_HERE
    chips: list[str] = field(default_factory=list)  # the job's chips on this host
    problem: str | None = None  # the first thing wrong (before any reset)
    ends: list[dict[str, Any]] = field(default_factory=list)  # cables.CableEnd, as JSON
    domains: dict[str, list[str]] = field(default_factory=dict)  # chip -> what its reset takes
    train_timeout: float = 0.0  # seconds this host's cables may take to train
    clock: float = 0.0  # this host's wall clock when it checked (time.time())

    def line(self) -> str:
        return CHECK_PREFIX + json.dumps(asdict(self), separators=(",", ":"))


def _parse(text: str, prefix: str, kind: type) -> Any:
    for line in text.splitlines():
        if line.startswith(prefix):
            try:
                data = json.loads(line[len(prefix) :])
                return kind(**data)
            except (ValueError, TypeError):
                return None
    return None


def parse(text: str) -> HostRecovery | None:
    """The :class:`HostRecovery` a host printed (its line among others), else None."""
    result: HostRecovery | None = _parse(text, PREFIX, HostRecovery)
    return result


def parse_check(text: str) -> HostCheck | None:
    """The :class:`HostCheck` a host printed (its line among others), else None."""
    result: HostCheck | None = _parse(text, CHECK_PREFIX, HostCheck)
    return result


def leftovers(job: str) -> list[tuple[int, int]]:
    """This host's processes of job ``job`` (their TTMESH_JOB_ID) run by this user, other than
    this one and its ancestors, with their start times: what a rank left behind when mpirun
    killed the rank's own ttmesh."""
    mine = {os.getpid()}
    table = procs.parents()
    pid: int | None = os.getpid()
    while pid:
        pid = table.get(pid)
        if pid:
            mine.add(pid)
    found = []
    me = os.getuid()
    for p in table:
        # Only this user's processes: anyone can put a job's id in their environment, and
        # ttmesh run as root reads every process's.
        if p in mine or procs.uid_of(p) != me:
            continue
        if procs.environ_value(p, "TTMESH_JOB_ID") == job:
            start = procs.start_time(p)
            if start is not None and procs.alive(p, start):
                found.append((p, start))
    return found


def end_leftovers(job: str, grace: float, log: Callable[[str], None] | None = None) -> int:
    """Wait up to ``grace`` seconds for the job's processes still on this host to end (they
    were sent SIGTERM as their rank's ttmesh died), then SIGKILL the rest; how many were left."""
    left = leftovers(job)
    if not left:
        return 0
    deadline = time.monotonic() + grace
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [(p, t) for p, t in left if procs.alive(p, t)]
    if left:
        if log is not None:
            many = plural(len(left), "process", "processes")
            log(f"{many} of job {job} still running after {grace:g} s: SIGKILL")
        for p, t in left:
            procs.signal_if_same(p, t, signal.SIGKILL)
        end = time.monotonic() + 5.0
        while left and time.monotonic() < end:
            time.sleep(0.05)
            left = [(p, t) for p, t in left if procs.alive(p, t)]
    return len(left)


def check_host(
    host: Host,
    asics: Sequence[str],
    *,
    peers: Sequence[str] | None = None,
    always: bool = False,
    log: Callable[[str], None] | None = None,
    job: str | None = None,
    grace: float = 10.0,
    train_timeout: float | None = None,
) -> HostCheck:
    """Step 1 on this host: its chips among ``asics`` checked (``always``: as if wrong), its
    ends of the job's cables read (to ``peers``, the job's chips elsewhere; None: to any
    chip not here) and each chip's reset domain. ``job``: first let that job's processes still
    here end (``grace`` seconds, then SIGKILL), so they do not hold the chips as they are checked."""
    from ttmesh.fabric import health
    from ttmesh.fabric.devices import discover
    from ttmesh.recovery import cables, reset

    if job is not None:
        end_leftovers(job, grace, log)
    inv = discover(host)
    here = {c.asic_id for c in inv.chips}
    mine = [a for a in dict.fromkeys(asics) if a in here]
    if not mine:
        return HostCheck(NONE_HERE, clock=time.time())
    # What a reset can fix: not the system software (no reset makes hugepages or a driver).
    problems = [p for p in health.preflight(inv, mine, system=False) if p.severity == "error"]
    found = problems[0].what if problems else None
    ends = cables.read(inv, cables.ends(inv, mine, peers))
    domains = {a: list(reset.plan(inv, [a]).chips) for a in mine}
    timeout = cables.training_timeout(inv, mine) if train_timeout is None else train_timeout
    return HostCheck(
        FAILED if (problems or always) else HEALTHY,
        mine,
        found or ("--reset-on-failure" if always else None),
        [e.to_json() for e in ends],
        domains,
        timeout,
        time.time(),
    )


def reset_together(
    host: Host,
    asics: Sequence[str],
    reset_chips: Sequence[str],
    *,
    at: float,
    train_timeout: float | None = None,
    timeout: float = 120.0,
    retries: int = 2,
    tt_smi: str | None = None,
    log: Callable[[str], None] | None = None,
    own_pids: Sequence[int] = (),
) -> HostRecovery:
    """Step 2 on this host: at ``at`` (every host's agreed wall-clock moment: mpirun starts
    the hosts' steps seconds apart, and a cable's ends must be reset together) reset this
    host's chips among ``reset_chips`` (none: only verify), wait for this host's ends of the
    cables between the job's chips (``asics``, every host's) to train (up to
    ``train_timeout`` seconds, polled; None: what this host's boards take), and report
    every end's state."""
    from ttmesh.fabric.devices import discover
    from ttmesh.recovery import cables, reset

    start = time.monotonic()
    inv = discover(host)
    here = {c.asic_id for c in inv.chips}
    mine = [a for a in dict.fromkeys(reset_chips) if a in here]
    found = cables.ends(inv, [a for a in asics if a in here], asics)
    late = 0.0
    outcome = None
    if mine:
        wait = at - time.time()
        if wait > 0:
            time.sleep(wait)  # an agreed moment on the wall clock, not an event to await
        else:
            late = -wait
        try:
            outcome = reset.recover(
                host, mine, timeout=timeout, retries=retries, log=log, tt_smi=tt_smi,
                inv=inv, own_pids=own_pids,
            )  # fmt: skip
        except TTMeshError as exc:
            rows = [e.to_json() for e in cables.read(discover(host), found)]
            return HostRecovery(
                REFUSED, len(mine), None, str(exc), time.monotonic() - start, rows, 0.0, late
            )
    if train_timeout is None:
        train_timeout = cables.training_timeout(inv, [e.chip for e in found])
    inv = discover(host) if outcome is not None else inv  # a reset renumbers devices
    now, waited = cables.wait_trained(inv, found, train_timeout, log)
    rows = [e.to_json() for e in now]
    seconds = time.monotonic() - start
    if outcome is None:
        return HostRecovery(HEALTHY, 0, None, None, seconds, rows, waited, late)
    if outcome.recovered:
        return HostRecovery(RECOVERED, len(mine), None, None, seconds, rows, waited, late)
    still = outcome.problems[0].what if outcome.problems else "the chips did not verify"
    return HostRecovery(FAILED, len(mine), None, still, seconds, rows, waited, late)
