"""Recovering the chips of a tt-metal mesh over several hosts, every host together.

After an attempt of such a job ended badly (and before its start, with ``--auto-reset``), the
launching ttmesh runs ``ttmesh _recover`` on every host of the job through mpirun (the job's
engine, as for its reports and ranks; ttmesh opens no connection itself), twice:

1. **check** (one fan-out): each host lets the job's processes still there end, checks the job's
   chips it has and reads its ends of the job's cables and its reset domains
   (``recovery.afterjob.check_host``);
2. **decide** (here, pure: ``recovery.together.decide``): each host's chips to reset: its own
   when its check failed, both ends of every cable either end reports down, and the far end of
   every cable a host's reset takes;
3. **reset together** (one fan-out, only when something is to be reset): every host resets its
   set at one wall-clock moment agreed here (mpirun starts hosts seconds apart; a cable's ends
   must be reset together), waits for its cable ends to train (the board's time, or
   ``--train-timeout``), and reports every end, so each cable of the job is verified from both
   ends. A cable still down is named by host, chip and channel on both sides; no restart then.

All hosts recover before any restarts: a restart waits for the slowest, and does not happen
when one host's chips or one cable stay wrong.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import replace

from ttmesh.errors import TTMeshError
from ttmesh.launcher.nodes import fanout
from ttmesh.launcher.nodes.reach import MpiHosts
from ttmesh.recovery import afterjob, together

SLACK = 60.0  # seconds, beyond the resets themselves, for mpirun and each host's check
LEAD_MIN, LEAD_MAX = 2.0, 30.0  # seconds between deciding and the agreed reset moment
LATE = 1.0  # seconds after the agreed moment a host's reset is said to be late


def lead_time(check_seconds: float) -> float:
    """How far ahead to set the agreed reset moment: twice what the check's fan-out took
    (mpirun's start on every host, which the reset's fan-out takes again), within bounds."""
    return min(max(LEAD_MIN, 2.0 * check_seconds), LEAD_MAX)


def _base(timeout: float, retries: int, tt_smi: str | None) -> list[str]:
    args = ["--timeout", str(timeout), "--retries", str(retries)]
    return args + (["--tt-smi", tt_smi] if tt_smi else [])


def recover(
    mh: MpiHosts,
    chips_by_host: dict[str, list[str]],
    *,
    always: bool,
    timeout: float,
    retries: int,
    tt_smi: str | None,
    note: Callable[[str], None],
    job: str | None = None,
    grace: float = 10.0,
    reachable: bool = False,
    train_timeout: float | None = None,
) -> str | None:
    """Check every host's chips of the job, reset together what the checks call for, verify
    every cable from both ends; None when every host's chips and every cable are healthy or
    recovered, else the first problem, as one line. ``job``: each host first lets that job's
    processes still there end (``grace``, then SIGKILL). ``reachable``: mpirun failing to
    reach the hosts raises (exit 2), not a problem line. ``train_timeout``: how long the cables
    may take to train (None: each host's boards say)."""
    names = [n for n in mh.names if chips_by_host.get(n)]
    if not names:
        return None
    chips = ",".join(a for n in names for a in chips_by_host[n])
    args = ["_recover", "--check", "--chips", chips]
    args += ["--always"] if always else []
    args += ["--job", job, "--grace", str(grace)] if job is not None else []
    args += ["--train-timeout", str(train_timeout)] if train_timeout is not None else []
    t0 = time.monotonic()
    try:
        runs = fanout.run(replace(mh, names=names), args, grace + SLACK)
    except TTMeshError as exc:  # mpirun reached no host, or timed out
        if reachable:
            raise
        return f"the hosts could not be checked: {exc}"
    lead = lead_time(time.monotonic() - t0)
    first: str | None = None
    checks: dict[str, afterjob.HostCheck] = {}
    for run in runs:
        check = afterjob.parse_check(run.stdout)
        if check is None:
            line = f"host {run.host}: no answer from its check ({run.why()})"
        elif check.state == afterjob.NONE_HERE:
            line = f"host {run.host}: none of the job's chips is there (is it the host planned?)"
        else:
            checks[run.host] = check
            continue
        note(line)
        first = first or line
    decision = together.decide(checks, always=always)
    if not decision.needed:
        return first
    at = time.time() + lead
    wait = max(c.train_timeout for c in checks.values())
    resets = [a for h in checks for a in decision.resets[h]]
    args = ["_recover", "--chips", chips, "--reset", ",".join(resets), "--at", f"{at:.3f}",
            "--train-timeout", str(wait), *_base(timeout, retries, tt_smi)]  # fmt: skip
    budget = timeout * (retries + 1) + wait + lead + SLACK
    try:
        runs = fanout.run(replace(mh, names=list(checks)), args, budget)
    except TTMeshError as exc:
        if reachable:
            raise
        return first or f"the hosts could not be reset: {exc}"
    outcomes = {run.host: (afterjob.parse(run.stdout), run.why()) for run in runs}
    return verified(outcomes, decision, note) or first


def verified(
    outcomes: Mapping[str, tuple[afterjob.HostRecovery | None, str]],
    decision: together.Decision,
    note: Callable[[str], None],
    own: str | None = None,
) -> str | None:
    """Each host's line (``own``: that host's only, the others say theirs), then the cables
    reset together, then every cable still down (from both its ends): the first problem
    (any host's), else None. ``outcomes``: host -> (its outcome or None, its last word)."""
    first: str | None = None
    ends: dict[str, list] = {}
    waited = 0.0
    for host, (outcome, last) in outcomes.items():
        if outcome is None:
            line = f"host {host}: no answer from its reset ({last})"
        else:
            ends[host] = outcome.cables
            waited = max(waited, outcome.trained)
            why = decision.why.get(host) or outcome.problem or "--reset-on-failure"
            if outcome.state == afterjob.HEALTHY:
                continue
            if outcome.late > LATE and own in (None, host):
                note(f"host {host}: started its reset {outcome.late:.1f} s after the moment "
                     "the hosts agreed on (its clock or mpirun's start lags: check NTP on the hosts)")  # fmt: skip
            if outcome.state == afterjob.RECOVERED:
                if own in (None, host):
                    note(f"host {host}: {why}: chips reset and verified ({outcome.seconds:.1f} s)")
                continue
            verb = "reset refused" if outcome.state == afterjob.REFUSED else "still wrong"
            line = f"host {host}: {why}; {verb}: {outcome.after}"
        if own in (None, host):
            note(line)
        first = first or line
    down = together.verdict(ends) if ends else []
    bad = {frozenset({(c.a.chip, c.a.chan), c.peer}) for c in down}
    trained = [c for c in decision.together if frozenset({(c.a.chip, c.a.chan), c.peer}) not in bad]
    if trained:
        note(f"cables reset together at both ends and trained: {together.pairs(trained)} "
             f"({waited:.1f} s)")  # fmt: skip
    for cable in down:
        line = together.bad_cable_line(cable, waited)
        note(line)
        first = first or line
    return first


__all__ = ["lead_time", "recover", "verified"]
