"""What a job does about its chips around its attempts: resets with ``--auto-reset``, the
check after a crash, and every host's recovery in a mesh over several hosts.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ttmesh.dataclass import dataclass
from ttmesh.fabric.devices import discover
from ttmesh.fabric.problem import chip_name
from ttmesh.launcher.attempt.events import Observer
from ttmesh.launcher.attempt.record import AttemptResult
from ttmesh.launcher.job.jobstate import JobState, ResetEntry
from ttmesh.launcher.planning.prepare import Prepared
from ttmesh.render import note, plural
from ttmesh.states import JobPhase, ResetStage

if TYPE_CHECKING:
    from ttmesh.fabric.devices import Inventory
    from ttmesh.launcher.nodes.multihost import Peers
    from ttmesh.launcher.planning.plan import LaunchPlan
    from ttmesh.recovery.reset import ChipProgress, ResetOutcome


@dataclass(frozen=True)
class Recovery:
    """What to do about the chips before and after attempts (ttmesh launch's health options):
    a policy, never written once made (what the job does under it is its ``JobState``'s)."""

    auto_reset: bool = False  # pre-flight found a problem: reset, re-check, then start
    reset_on_failure: bool = False  # reset after any abnormal end, links down or not
    timeout: float = 120.0
    retries: int = 2
    tt_smi: str | None = None
    preflight: bool = True
    own_pids: tuple[int, ...] = ()  # more processes whose leases and holders are the job's own
    train_timeout: float | None = (
        None  # links and cables to train after a reset (None: the boards')
    )
    # A replica of that fleet (--fleet-of): where one reset is the whole host, it resets nothing
    # itself and leaves what it needs in its JobState (its --summary-json's "needs") for the fleet.
    fleet_of: str | None = None


WHOLE_HOST_RESET = "whole-host-reset"  # a fleet replica's "needs": every replica drained first


def defers_reset(fleet_of: str | None, inv: Inventory) -> bool:
    """Whether this job leaves its chips' reset to its fleet: it is a replica (``fleet_of``)
    on a host whose one reset is the whole host (a Galaxy's ``tt-smi -glx_reset``), which
    would take every other replica's chips; only the fleet, with every replica drained, may."""
    from ttmesh.fabric.domains import is_galaxy

    return fleet_of is not None and is_galaxy(inv)


def _defer(state: JobState, recovery: Recovery, asics: list[str], why: str | None) -> None:
    """Record (once) that this job's chips need the whole-host reset, and say so."""
    inv = state.inv
    known = {c.asic_id: c for c in inv.chips}
    bdfs: list[str] = []
    for asic in asics:  # by the PCI address that reaches each (a lost chip: none)
        lead = inv.lead(known[asic]) if asic in known else None
        if lead is not None and lead.bdf and lead.bdf not in bdfs:
            bdfs.append(lead.bdf)
    if state.deferred is None:
        note(
            f"not resetting the chips{f' ({why})' if why else ''}: this host's reset is the "
            "whole host (tt-smi -glx_reset), which takes every replica's chips; "
            f"fleet {recovery.fleet_of} drains every replica, then resets it"
        )
    earlier = state.deferred["why"] if state.deferred is not None else None
    state.deferred = {
        "what": WHOLE_HOST_RESET, "fleet": recovery.fleet_of, "chips": bdfs,
        "why": why or earlier,
    }  # fmt: skip


def reset_chips(
    state: JobState,
    recovery: Recovery,
    asics: list[str],
    observer: Observer | None = None,
    phase: JobPhase = JobPhase.RECOVERING,
    why: str | None = None,
) -> ResetOutcome | None:
    """Reset ``asics`` safely and verify them (the outcome; None: refused), each reset kept in
    ``state.resets``. A fleet's replica on a whole-host-reset host resets nothing: it records
    what it needs in ``state.deferred`` (``defers_reset``)."""
    from ttmesh.errors import TTMeshError
    from ttmesh.recovery import reset

    if defers_reset(recovery.fleet_of, state.inv):
        _defer(state, recovery, asics, why)
        return None
    progress = None
    if observer is not None:
        observer.phase(phase, "resetting the chips")

        def progress(chips: list[reset.ChipProgress]) -> None:
            observer.phase(phase, _reset_detail(chips))

    at = time.time()
    try:
        outcome = reset.recover(
            state.inv.host,
            asics,
            timeout=recovery.timeout,
            retries=recovery.retries,
            force=False,
            log=lambda m: note(f"reset: {m}"),
            tt_smi=recovery.tt_smi,
            settle=recovery.train_timeout,
            own_pids=recovery.own_pids,
            progress=progress,
        )
    except TTMeshError as exc:
        note(f"reset refused: {exc}")
        state.resets.append(_reset_entry(at, phase, why, None, str(exc)))
        return None
    state.resets.append(_reset_entry(at, phase, why, outcome))
    if outcome.recovered and outcome.unreached:  # the others are; these never were
        from ttmesh.fabric import health

        named = health.expected(state.inv).names  # a lost chip by its topology's address
        lost = ", ".join(chip_name(state.inv, a, named) for a in outcome.unreached)
        note(
            f"reset: {plural(len(outcome.plan.chips), 'chip')} recovered and verified "
            f"({outcome.seconds:.1f} s); not recovered: {lost} (missing from the host: a "
            "reset cannot reach it; power-cycle the host)"
        )
    elif outcome.recovered:
        note(f"reset: chips recovered and verified ({outcome.seconds:.1f} s)")
    else:
        for p in outcome.problems[:3]:
            note(f"reset: still wrong: {p.what}")
    return outcome


def _reset_entry(
    at: float,
    phase: JobPhase,
    why: str | None,
    outcome: ResetOutcome | None,
    refused: str | None = None,
) -> ResetEntry:
    """One reset as the job's record keeps it."""
    return {
        "at": round(at, 3),
        "when": "before the start" if phase is JobPhase.RESETTING else "after an attempt",
        "why": why,
        "chips": [c["bdf"] or c["asic_id"] for c in outcome.chips] if outcome else [],
        "recovered": bool(outcome and outcome.recovered),
        "seconds": round(outcome.seconds, 3) if outcome else None,
        "refused": refused,
    }


def last_reset_verified(state: JobState, since: float) -> bool:
    """Whether the job's chips were reset and verified after ``since`` (the last attempt's
    end), and no reset failed meanwhile: advice to reset them again would be wrong."""
    after = [r for r in state.resets if r["at"] >= since]
    return bool(after) and all(r["recovered"] for r in after)


def _reset_detail(chips: list[ChipProgress]) -> str:
    """``3 of 4 chips done, 1 waiting for links``: a reset's progress in a few words."""
    counts: dict[str, int] = {}
    for c in chips:
        counts[c.stage] = counts.get(c.stage, 0) + 1
    done = counts.pop(ResetStage.DONE, 0)
    rest = ", ".join(f"{n} {stage}" for stage, n in counts.items())
    return f"{done} of {plural(len(chips), 'chip')} done" + (f", {rest}" if rest else "")


def after_crash(
    prepared: Prepared,
    state: JobState,
    recovery: Recovery,
    result: AttemptResult,
    always: bool = False,
    observer: Observer | None = None,
    peers: Peers | None = None,
    name: str = "recover",
) -> str | None:
    """A job that brought the fabric up and ended abnormally may have left links down.

    ``always``: check the chips whatever the plan says (ttmesh itself was killed mid-job, so
    nobody knows which ranks brought the fabric up). Over several hosts: what is still wrong
    on a host after every host recovered (a restart then does not happen), else None.
    ``peers`` (c10d agents, ``launcher.nodes.multihost.Peers``): every host checks and
    recovers together through the store, under ``name`` (unique in the job), whether its
    own ranks brought the fabric up or not (a peer's did: its cables end here)."""
    plan = prepared.plan
    if result.code == 0 or plan.chipless:
        return None  # a chipless server leaves no chip to check
    if peers is not None and peers.coord.lost is None:  # a host gone: each recovers alone
        if observer is not None:
            observer.phase(JobPhase.RECOVERING, "checking the chips with every host")
        return recover_with_peers(prepared, state, recovery, peers, name, recovery.reset_on_failure)
    joined = plan.fabric_at_start or result.fabric_ranks or recovery.reset_on_failure
    if not (joined or always):
        return None
    if plan.hosts:  # over several hosts: each host recovers its own chips
        if observer is not None:
            observer.phase(JobPhase.RECOVERING, "checking the chips on every host")
        return recover_hosts(prepared, recovery, always=recovery.reset_on_failure)
    from ttmesh.fabric import health

    if observer is not None:
        observer.phase(JobPhase.RECOVERING, "checking the job's chips")
    inv = state.inv = discover(state.inv.host)  # a reset may have renumbered the devices
    down = [
        p
        for p in health.preflight(inv, plan.all_chips(), recovery.own_pids, system=False)
        if p.severity == "error"
    ]
    if not down and not recovery.reset_on_failure:
        return None
    why = down[0].what if down else "--reset-on-failure"
    if not defers_reset(recovery.fleet_of, inv):
        note(_recovery_line(plan, result, why))
    reset_chips(state, recovery, plan.all_chips(), observer, why=why)
    if state.deferred is not None:
        return f"its chips need the whole-host reset, which fleet {recovery.fleet_of} does"
    return None


def _recovery_line(plan: LaunchPlan, result: AttemptResult, why: str) -> str:
    """What the check after an attempt found, and that the chips are reset: a stop the user
    asked for reads as one (a server whose own teardown leaves the chips to reset says why it
    is expected), a failure as a failure."""
    if not result.asked:
        return f"the job ended ({why}): resetting its chips"
    teardown = plan.serving.profile.teardown if plan.serving is not None else ""
    if teardown:
        return f"the server stopped as asked: {teardown}; resetting them, as expected ({why})"
    return f"the job stopped as asked and left its chips to reset ({why}): resetting them"


def recover_with_peers(
    prepared: Prepared,
    state: JobState,
    recovery: Recovery,
    peers: Peers,
    name: str,
    always: bool = False,
) -> str | None:
    """c10d agents: this host's chips recovered with every other host's, through the store
    (``launcher.nodes.multihost.Peers.recover``); the first problem anywhere, else None."""
    host = state.inv.host
    left: str | None = peers.recover(
        name, host, prepared.plan.all_chips(), always=always, timeout=recovery.timeout,
        retries=recovery.retries, tt_smi=recovery.tt_smi, train_timeout=recovery.train_timeout,
        own_pids=recovery.own_pids,
    )  # fmt: skip
    state.inv = discover(host)  # a reset renumbers devices
    return left


def rank_refused(result: AttemptResult) -> str | None:
    """A rank of a mesh over several hosts was refused on its host before its command ran
    (pre-flight there, or the wrong host): its line, a refusal as on one host, not a crash."""
    from ttmesh.launcher.nodes.rankshim import refused_before_start

    return refused_before_start(result.code, result.stderr_tail)


def recover_hosts(
    prepared: Prepared, recovery: Recovery, always: bool, before_start: bool = False
) -> str | None:
    """Every host of a mesh over several hosts checks its chips of the job and resets them
    where needed (ttmesh.launcher.nodes.hostrecovery); the first host's remaining problem, else None.
    After an attempt each host first lets the job's processes still there end; before the
    start, mpirun failing to reach the hosts is bad input (exit 2)."""
    from ttmesh.launcher.nodes import hostrecovery, mpi

    plan = prepared.plan
    assert prepared.mesh_hosts is not None, "a mesh over several hosts has its MpiHosts"
    by_host = {name: mpi.host_chips(plan, node) for node, name in enumerate(plan.hosts)}
    return hostrecovery.recover(
        prepared.mesh_hosts,
        by_host,
        always=always,
        timeout=recovery.timeout,
        retries=recovery.retries,
        tt_smi=recovery.tt_smi,
        note=note,
        job=None if before_start else plan.job,
        grace=plan.policy.grace,
        reachable=before_start,
        train_timeout=recovery.train_timeout,
    )
