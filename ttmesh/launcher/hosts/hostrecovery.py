"""Recovering the chips of a tt-metal mesh over several hosts, each host its own.

After an attempt of such a job ended badly (and before its start, with ``--auto-reset``), the
launching ttmesh runs ``ttmesh _recover`` on every host of the job through one mpirun (the
job's engine, as for its reports and ranks; ttmesh opens no connection itself). Each host checks
the job's chips it has, resets them when the check fails (or always, ``--reset-on-failure``)
and verifies them (ttmesh.recovery.afterjob). All hosts recover before any restarts: a restart
waits for the slowest, and does not happen when one host's chips stay wrong.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ttmesh.errors import TTMeshError
from ttmesh.launcher.hosts import fanout
from ttmesh.launcher.hosts.reach import MpiHosts
from ttmesh.recovery import afterjob

SLACK = 60.0  # seconds, beyond the resets themselves, for mpirun and each host's check


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
) -> str | None:
    """Check (and reset where needed) every host's chips of the job; None when every host's
    chips are healthy or recovered, else the first host's problem, as one line. ``job``: each
    host first lets that job's processes still there end (``grace``, then SIGKILL).
    ``reachable``: mpirun failing to reach the hosts raises (exit 2), not a problem line."""
    names = [n for n in mh.names if chips_by_host.get(n)]
    if not names:
        return None
    chips = [a for n in names for a in chips_by_host[n]]
    args = ["_recover", "--chips", ",".join(chips), "--timeout", str(timeout)]
    args += ["--retries", str(retries)]
    if always:
        args.append("--always")
    if tt_smi:
        args += ["--tt-smi", tt_smi]
    if job is not None:
        args += ["--job", job, "--grace", str(grace)]
    try:
        runs = fanout.run(replace(mh, names=names), args, timeout * (retries + 1) + grace + SLACK)
    except TTMeshError as exc:  # mpirun reached no host, or timed out
        if reachable:
            raise
        return f"the hosts could not be checked: {exc}"
    first: str | None = None
    for run in runs:
        outcome = afterjob.parse(run.stdout)
        if outcome is None:
            line = f"host {run.host}: no answer from its check ({run.why()})"
        elif outcome.state == afterjob.HEALTHY:
            continue
        elif outcome.state == afterjob.RECOVERED:
            why = outcome.problem or "--reset-on-failure"
            note(f"host {run.host}: {why}: chips reset and verified ({outcome.seconds:.1f} s)")
            continue
        elif outcome.state == afterjob.NONE_HERE:
            line = f"host {run.host}: none of the job's chips is there (is it the host planned?)"
        else:
            verb = "reset refused" if outcome.state == afterjob.REFUSED else "still wrong"
            line = f"host {run.host}: {outcome.problem or 'reset'}; {verb}: {outcome.after}"
        note(line)
        first = first or line
    return first


__all__ = ["recover"]
