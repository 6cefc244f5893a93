"""The end of a job in words and in ``--summary-json``: the failing rank, its last lines, the
known failure and its fix.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from ttmesh import paths
from ttmesh.errors import TTMeshError
from ttmesh.launcher.attempt.record import AttemptResult
from ttmesh.launcher.planning.prepare import Prepared
from ttmesh.render import json_text, note, plural
from ttmesh.vocab import Source

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ttmesh.fabric.devices import Inventory
    from ttmesh.launcher.attempt.failures import Diagnosis
    from ttmesh.launcher.planning.plan import LaunchPlan


SCHEMA = "ttmesh.summary/1"  # --summary-json (docs/conventions.md, "JSON")


def job_facts(prepared: Prepared, logs: Any = None) -> dict[str, Any]:
    """What a job is, for its record (``ttmesh ps JOB``) and ``--summary-json``: where and by
    whom it runs, its command, profile, chips, server and log directory."""
    from ttmesh.procs import user_name

    plan = prepared.plan
    serving = plan.serving
    return {
        "host": os.uname().nodename,  # gethostname's answer, without importing socket
        "user": user_name(os.getuid()),
        "uid": os.getuid(),
        "root": plan.root,
        "command": list(plan.ranks[0].argv) if plan.ranks else [],
        "profile": serving.profile.name if serving is not None else None,
        "chips": [b for r in plan.ranks for b in r.bdfs],
        "server": {"url": serving.url, "health": serving.health_url}
        if serving is not None
        else None,
        "logs": str(logs.path) if logs is not None else None,
    }


def explain(
    plan: LaunchPlan, inv: Inventory, final: AttemptResult, reset_done: bool = False
) -> Diagnosis | None:
    """The known failure the guardian found in the output, its fix filled in for this job
    (``inv``: its host's chips now, as a reset may have renumbered them); ``reset_done``: ttmesh reset the job's chips and verified them after it ended (a fix that
    resets them is not given again)."""
    if final.code == 0 or not final.diagnosis:
        return None
    from ttmesh.launcher.attempt import failures

    try:
        return failures.explain(final.diagnosis, inv, plan.all_chips(), reset_done=reset_done)
    except Exception as exc:  # the job's end is still reported, without the explanation
        note(f"could not explain the failure ({type(exc).__name__}: {exc})")
        return None


def summarize(
    prepared: Prepared,
    results: list[AttemptResult],
    diagnosis: Diagnosis | None = None,
    final: AttemptResult | None = None,
) -> None:
    """The end of a job, on stderr. ``final``: how it ended, when not its last attempt (a stop
    signal between attempts)."""
    final = final if final is not None else results[-1]
    plan = prepared.plan
    for r in results:  # where the stacks of a hung attempt went, before anything else is said
        if r.dumps:  # one directory per attempt (attempt.dumps)
            where = ", ".join(dict.fromkeys(os.path.dirname(f) for f in r.dumps))
            note(f"attempt {r.attempt + 1}: the stacks taken before the kill are in {where}")
    if final.code == 0 and len(results) == 1:
        return
    if len(results) > 1:
        for r in results:
            known = f"; known failure: {r.diagnosis['id']}" if r.diagnosis else ""
            note(f"attempt {r.attempt + 1}: {r.reason} (exit {r.code}, {r.duration:.1f} s){known}")
    if final.host is not None and final.code != 0:  # a rank on another host failed first
        note(f"{final.reason}; stopped this host's ranks")
        who = f"rank {final.rank}'s exit code" if final.rank is not None else final.reason
        note(f"exit {final.code}: {who} (on host {final.host})")
    elif final.source == Source.WORKER and final.rank is not None:
        rank = plan.ranks[final.rank]
        shown = final.rank + plan.rank_offset  # the global rank, in a job over several hosts
        others = [e for e in final.exits if e.rank != final.rank and e.stopped]
        how = next((e.how for e in final.exits if e.rank == final.rank), final.reason)
        chips = f" ({', '.join(rank.bdfs)})" if rank.bdfs else ""  # a chipless server: none
        note(
            f"rank {shown}{chips} {how}"
            + (f"; stopped {plural(len(others), 'other rank')}" if others else "")
        )
        if final.error_message:
            note(f"rank {shown} raised {final.error_message}")
        if final.stderr_tail:
            note(f"last lines of rank {shown}'s stderr:")
            for line in final.stderr_tail[-5:]:
                note(f"  {line}")
        for line in diagnosis.lines() if diagnosis else ():
            note(line)
        note(f"exit {final.code}: rank {shown}'s exit code")
    elif final.code != 0:
        for line in diagnosis.lines() if diagnosis else ():
            note(line)
        note(f"exit {final.code}: {final.reason}")


def write_refusal(
    path: str, exc: TTMeshError, needs: Mapping[str, object] | None = None, job: str | None = None
) -> None:
    """--summary-json when nothing started: ttmesh decided the code (2 or 3) and says why
    (``needs``: as in :func:`write_summary`)."""
    data: dict[str, object] = {
        "schema": SCHEMA,
        "job": job,
        "source": Source.TTMESH,
        "rank": None,
        "code": exc.code,
        "reason": str(exc),
        "attempts": [],
        "diagnosis": None,
        "dumps": [],
    }
    if needs is not None:
        data["needs"] = needs
    unwritten = _write_json(path, data)
    if unwritten is not None:
        note(unwritten)  # the refusal, with its code, follows


def _write_json(path: str, data: dict[str, object]) -> str | None:
    """Write the summary the user named (``paths.write_text``: never through a link another
    user planted); the line saying why it could not be, or None."""
    try:
        paths.write_text(path, json_text(data, indent=2) + "\n", "--summary-json")
    except TTMeshError as err:
        return str(err)
    return None


def write_summary(
    path: str,
    final: AttemptResult,
    results: list[AttemptResult],
    diagnosis: Diagnosis | None = None,
    needs: Mapping[str, object] | None = None,
    facts: dict[str, Any] | None = None,
    job: str | None = None,
) -> str | None:
    """Write ``--summary-json`` (``ttmesh.summary/1``); the line saying why it could not be, or
    None. ``needs``: what a fleet's replica left its fleet to do (``{"what":
    "whole-host-reset", "chips": [...]}``, ``launcher.job.repair.WHOLE_HOST_RESET``), only
    then in the file. ``facts``: the job's own (``job_facts`` and how it went: each attempt's
    times, restarts, resets, phases), as its record has them."""
    data: dict[str, object] = {
        "schema": SCHEMA,
        "job": job,
        **(facts or {}),
        "source": final.source,
        "rank": final.rank,
        "code": final.code,
        "reason": final.reason,
        "attempts": (facts or {}).get("attempts")
        or [
            {"attempt": r.attempt, "code": r.code, "rank": r.rank, "reason": r.reason}
            | ({"phases": r.phases} if r.phases is not None else {})
            for r in results
        ],
        "diagnosis": diagnosis.to_json() if diagnosis else None,
        # The stack dumps taken before a hung attempt was killed (py-spy, tt-triage), every attempt's.
        "dumps": [f for r in results for f in r.dumps],
    }
    if final.phases is not None:  # a server's start, step by step (its checklist)
        data["phases"] = final.phases
    if needs is not None:
        data["needs"] = needs
    return _write_json(path, data)
