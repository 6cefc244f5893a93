"""One host's part in recovering a job's chips: check them, reset them if needed, verify.

A launcher on one host does this itself (``launcher.launch``). A tt-metal mesh over several
hosts cannot: each host reads and resets only its own chips. The launching ttmesh then runs
``ttmesh _recover --chips ...`` on every host of the job through the job's own engine (one
mpirun); each host takes the chips of the list it has (asic ids are unique), checks them, resets
them when a check fails (or always, for ``--reset-on-failure``), and reports one
:class:`HostRecovery` as a line of JSON.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from ttmesh import procs
from ttmesh.errors import TTMeshError
from ttmesh.host.base import Host

PREFIX = "@@ttmesh-recover "

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

    @property
    def exit_code(self) -> int:
        return {FAILED: 1, REFUSED: 3}.get(self.state, 0)

    def line(self) -> str:
        return PREFIX + json.dumps(asdict(self), separators=(",", ":"))


def parse(text: str) -> HostRecovery | None:
    """The :class:`HostRecovery` a host printed (its line among others), else None."""
    for line in text.splitlines():
        if line.startswith(PREFIX):
            try:
                data = json.loads(line[len(PREFIX) :])
                return HostRecovery(**data)
            except (ValueError, TypeError):
                return None
    return None


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
            log(f"{len(left)} process(es) of job {job} still running after {grace:g} s: SIGKILL")
        for p, t in left:
            procs.signal_if_same(p, t, signal.SIGKILL)
        end = time.monotonic() + 5.0
        while left and time.monotonic() < end:
            time.sleep(0.05)
            left = [(p, t) for p, t in left if procs.alive(p, t)]
    return len(left)


def check_and_reset(
    host: Host,
    asics: Sequence[str],
    *,
    always: bool = False,
    timeout: float = 120.0,
    retries: int = 2,
    tt_smi: str | None = None,
    log: Callable[[str], None] | None = None,
    job: str | None = None,
    grace: float = 10.0,
) -> HostRecovery:
    """Check this host's chips among ``asics``; reset and verify them when the check fails
    (``always``: whatever it finds). ``job``: first let that job's processes still here end
    (``grace`` seconds, then SIGKILL), so they do not hold the chips as they are checked."""
    from ttmesh.fabric import health
    from ttmesh.fabric.devices import discover
    from ttmesh.recovery import reset

    start = time.monotonic()
    if job is not None:
        end_leftovers(job, grace, log)
    inv = discover(host)
    here = {c.asic_id for c in inv.chips}
    mine = [a for a in asics if a in here]
    if not mine:
        return HostRecovery(NONE_HERE)
    # What a reset can fix: not the system software (no reset makes hugepages or a driver).
    problems = [p for p in health.preflight(inv, mine, system=False) if p.severity == "error"]
    found = problems[0].what if problems else None
    if not problems and not always:
        return HostRecovery(HEALTHY, len(mine), seconds=time.monotonic() - start)
    try:
        outcome = reset.recover(
            host, mine, timeout=timeout, retries=retries, log=log, tt_smi=tt_smi, inv=inv
        )
    except TTMeshError as exc:
        return HostRecovery(REFUSED, len(mine), found, str(exc), time.monotonic() - start)
    if outcome.recovered:
        return HostRecovery(RECOVERED, len(mine), found, seconds=time.monotonic() - start)
    still = outcome.problems[0].what if outcome.problems else "the chips did not verify"
    return HostRecovery(FAILED, len(mine), found, still, time.monotonic() - start)
