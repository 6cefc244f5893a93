"""Pre-flight: the checks a launch runs on its chips before any rank starts (exit 3 refuses),
and what ``--dry-run`` and ``ttmesh descriptor`` check alike.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ttmesh.errors import TTMeshError, refused
from ttmesh.fabric.devices import discover
from ttmesh.launcher.attempt.events import Observer
from ttmesh.launcher.job.jobstate import JobState
from ttmesh.launcher.job.repair import Recovery, reset_chips
from ttmesh.launcher.planning.prepare import Prepared
from ttmesh.render import note, plural
from ttmesh.states import JobPhase

if TYPE_CHECKING:
    pass


def run_preflight(
    prepared: Prepared, state: JobState, recovery: Recovery, observer: Observer | None = None
) -> None:
    """Refuse (exit 3) to start on chips that are unhealthy, unless --auto-reset fixes them
    (``state``: the job's chips as they are now, and what it did; a reset renumbers them)."""
    from ttmesh.fabric import health

    if observer is not None:
        observer.phase(JobPhase.CHECKING)
    from ttmesh.fabric import syscheck

    plan = prepared.plan
    inv = state.inv
    found = health.preflight(
        inv,
        plan.all_chips(),
        recovery.own_pids,
        beats=prepared.beats,
        heartbeats=state.liveness is None,  # else read while the workers start
        requires=prepared.requires,
    )
    problems = [p for p in found if p.severity == "error"]
    if not state.warned:  # a restart's pre-flight says them no more
        state.warned = True
        for p in found:
            if p.severity != "error" and p.kind in syscheck.KINDS:
                note(f"pre-flight: warning: {p.what} (fix: {p.fix})")
    fixed_by_reset = ("lease", "lock", "umd-lock", *syscheck.KINDS)  # no reset helps
    if problems and recovery.auto_reset and all(p.kind not in fixed_by_reset for p in problems):
        note(f"pre-flight: {problems[0].what}; resetting the chips first (--auto-reset)")
        outcome = reset_chips(
            state, recovery, plan.all_chips(), observer, JobPhase.RESETTING, problems[0].what
        )
        if outcome is not None and outcome.recovered:
            fresh = state.inv = discover(inv.host)  # a reset renumbers devices
            problems = [
                p
                for p in health.preflight(
                    fresh, plan.all_chips(), recovery.own_pids, requires=prepared.requires
                )
                if p.severity == "error"
            ]
    if problems and state.liveness is not None:
        refusal = state.liveness.wait()  # a frozen chip is what reading them first found
        if refusal is not None:
            raise refusal
    if problems:
        if prepared.unhealthy is not None and not recovery.auto_reset:
            raise prepared.unhealthy  # no healthy mesh of the size here: the reset giving one
        raise _preflight_refusal(problems, recovery.auto_reset)


AUTO_RESET_HINT = ", or add --auto-reset to recover the chips first"


def _preflight_refusal(problems: list[Any], auto_reset: bool) -> TTMeshError:
    """Pre-flight's errors as the launch refuses them: the others said first, the first as
    the one line (exit 3), its fix, and --auto-reset when a reset would fix it."""
    from ttmesh.fabric import health

    for p in problems[1:]:
        note(f"pre-flight: {p.what}" + (f" (fix: {p.fix})" if p.fix else ""))
    first = problems[0]
    fix = first.fix or "see ttmesh check"
    if first.kind in health.RESETTABLE and not auto_reset:
        fix += AUTO_RESET_HINT
    return refused(f"pre-flight: {first.what}", fix)


def descriptor_checks(prepared: Prepared) -> None:
    """What ``ttmesh descriptor`` refuses as the launch would (exit 3): a mesh over links that
    are down. tt-metal is given the host as discovery finds it (a mock cluster leaves them
    out) and refuses such a mesh; the chips named with --chips included."""
    from ttmesh.fabric import health

    unhealthy = prepared.unhealthy  # no healthy mesh of the size: the reset that gives one
    if unhealthy is not None:  # (the descriptor command has no --auto-reset to offer)
        raise refused(unhealthy.message, (unhealthy.hint or "").replace(AUTO_RESET_HINT, ""))
    if prepared.plan.hosts:
        return  # each host's links are read in its own ranks
    chips = set(prepared.plan.all_chips())
    down = [p for p in health.links_down(prepared.inv) if p.chips and set(p.chips) <= chips]
    if down:
        raise _preflight_refusal(down, auto_reset=True)


def dry_run_checks(
    prepared: Prepared, auto_reset: bool = False, rendezvous: bool = False
) -> Prepared:
    """What a launch checks before anything starts, checked now and changing nothing: the
    prepared launch again, its plan with the ``checks``. Pre-flight on the job's chips (one
    host), refusing as the launch would (exit 3); with ``--auto-reset`` its errors are what the
    launch would reset first. What a dry run cannot check is said, with why: a mesh over
    several hosts' own pre-flight, the rendezvous."""
    from ttmesh.fabric import health

    plan = prepared.plan
    checks: list[dict[str, str]] = []
    if plan.hosts:  # a tt-metal mesh over several hosts: each host checks its chips in its ranks
        down = prepared.hosts_not_ready
        if down and not auto_reset:
            name, what, fix = down[0]
            raise refused(
                f"host {name} is not ready: pre-flight: {what}",
                f"on {name}: {fix}, or add --auto-reset to recover the chips first; "
                "nothing started anywhere",
            )
        said = f"links down on {down[0][0]}, reset first: {down[0][1]}" if down else "none"
        checks.append(_check("pre-flight", "skipped", "each host runs its own in the job's ranks "
                             f"there, before the command starts (links down in the hosts' "
                             f"reports: {said})"))  # fmt: skip
    else:
        inv = prepared.inv
        try:
            inv.host.check_changeable()
        except TTMeshError as exc:  # reading is anyone's: the plan is shown, the refusal said
            checks.append(_check("host", "failed", f"{exc}: a launch by this user refuses "
                                 f"before anything starts (exit {exc.code})"))  # fmt: skip
        chips = plan.all_chips()
        found = health.preflight(inv, chips, beats=prepared.beats, requires=prepared.requires)
        errors = [p for p in found if p.severity == "error"]
        if errors and not auto_reset:
            raise prepared.unhealthy or _preflight_refusal(errors, auto_reset)
        kept = [p for p in errors if p.kind not in health.RESETTABLE]  # what a reset leaves
        if kept:
            raise _preflight_refusal(kept, auto_reset)
        if errors:
            checks.append(_check("pre-flight", "failed", f"{errors[0].what}: the launch resets "
                                 f"the chips first (--auto-reset: {errors[0].fix}); a dry run "
                                 "resets nothing"))  # fmt: skip
        else:
            warned = "".join(f"; warning: {p.what}" for p in found if p.severity != "error")
            checks.append(_check("pre-flight", "passed", f"{plural(len(chips), 'chip')}: driver "
                                 "nodes, leases, holders, heartbeats and the links between "
                                 f"them{warned}"))  # fmt: skip
    from ttmesh.launcher.planning import metalcheck

    if prepared.metal is not None:  # a dry run's one wait for it: nothing else takes it
        checks.append(_check(metalcheck.NAME, "passed", prepared.metal.wait()))
    else:
        checks.append(_check(metalcheck.NAME, "skipped", prepared.metal_skipped
                             or metalcheck.skip_reason(plan) or "not asked"))  # fmt: skip
    if rendezvous:
        checks.append(_check("rendezvous", "skipped", "a dry run meets no other host: the "
                             "hosts' plans, their pre-flight and one --tp-size are checked "
                             "when the job starts"))  # fmt: skip
    report = replace(plan.report, checks=tuple(checks))  # printed beside the plan
    return replace(prepared, plan=replace(plan, report=report))


def _check(name: str, result: str, detail: str) -> dict[str, str]:
    return {"check": name, "result": result, "detail": detail}
