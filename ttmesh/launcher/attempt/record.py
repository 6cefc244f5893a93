"""What an attempt leaves written: the job record's ranks, the ranks' errors, and its result.

The job record (``ttmesh ps``, ``ttmesh ls``) learns the guardian, the attempt and each rank's
PID once known; each rank's torch ``@record`` file is kept in torchrun's log layout; and
:func:`verdict` turns how the ranks ended into the attempt's :class:`AttemptResult`, the
guardian's verdict, sent to the launcher as JSON. Its end is one word
(:class:`ttmesh.states.AttemptEnd`), and where ttmesh rather than a worker ended the attempt
for good, a typed error says why (message, hint, exit code): the launcher refuses with it as
with any other :class:`TTMeshError`.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any

from ttmesh.dataclass import dataclass, field
from ttmesh.errors import TTMeshError
from ttmesh.launcher.attempt.signals import Stop
from ttmesh.launcher.attempt.starters import RankExit
from ttmesh.launcher.planning.logspec import LogSpec
from ttmesh.launcher.planning.plan import LaunchPlan
from ttmesh.states import AttemptEnd
from ttmesh.vocab import LAUNCHER, Source

HUNG = 124  # ttmesh's code for a job that never became ready (as timeout(1) uses it)


@dataclass(frozen=True)
class AttemptResult:
    """How one attempt ended, sent from the guardian to the launcher as JSON. Frozen: a later
    word on it (a diagnosis, the launcher killed meanwhile) makes a new one (``replace``)."""

    attempt: int
    code: int
    source: Source  # who decided the code
    rank: int | None
    reason: str
    end: AttemptEnd
    # Why ttmesh ended the attempt for good, as the launcher says it: REFUSED (a check still
    # running as the ranks started refused the job: a chip's heartbeat was frozen; nothing of
    # the attempt counts), UNSTARTED (a rank's program never ran: one line, code 127 or 126 as
    # a shell gives, no restart), LAUNCHER_FAILED (mpirun could not start the ranks).
    error: TTMeshError | None = None
    exits: list[RankExit] = field(default_factory=list)
    fabric_ranks: list[int] = field(default_factory=list)  # ranks that brought the fabric up
    stderr_tail: list[str] = field(default_factory=list)
    error_message: str | None = None
    duration: float = 0.0
    host: str | None = None  # the host of the failing rank, in a job over several hosts
    # A known failure line in the output (ttmesh.launcher.attempt.failures.match), found on failure only.
    diagnosis: dict[str, Any] | None = None
    # The files the ranks' stacks were written to before a hung job was killed (attempt.dumps).
    dumps: list[str] = field(default_factory=list)
    # A chip that failed under the running job (fabric.chipwatch): the line said; its chips
    # are checked and recovered after the attempt whatever the job brought up.
    chip_fault: str | None = None
    # The user asked for the stop (a signal to ttmesh, ttmesh stop): what follows (the reset a
    # server's own teardown makes necessary) is an expected step, not a failure's recovery.
    asked: bool = False
    # A server's start as its checklist went (serving.checklist: each step's state, when it
    # began and how long it took, what it said), for --summary-json; None for any other job.
    phases: list[dict[str, Any]] | None = None

    def to_json(self) -> dict[str, Any]:
        data = asdict(replace(self, error=None))  # an exception is no JSON (nor deep-copied)
        data["end"] = str(self.end)
        data["error"] = error_to_json(self.error)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AttemptResult:
        data = dict(data)
        exits = [RankExit(**e) for e in data.pop("exits", [])]
        end = AttemptEnd(data.pop("end"))
        error = error_from_json(data.pop("error", None))
        return cls(**data, end=end, error=error, exits=exits)


def error_to_json(error: TTMeshError | None) -> dict[str, Any] | None:
    if error is None:
        return None
    return {"message": error.message, "hint": error.hint, "code": error.code}


def error_from_json(data: dict[str, Any] | None) -> TTMeshError | None:
    if data is None:
        return None
    return TTMeshError(str(data["message"]), data.get("hint"), int(data["code"]))


Tail = Callable[[int, str], list[str]]  # an owner's last lines of a stream (Console.tail)


def write_record(
    plan: LaunchPlan, guardian: int, attempt: int, pids: dict[int, int], server: str | None = None
) -> None:
    """The job record's guardian, attempt and ranks (a record that cannot be written is not
    the job's failure); ``server``: a server's state now (:func:`server_state`)."""
    from ttmesh.runtime import jobs

    ranks = [
        {"rank": r.rank, "pid": pids.get(r.rank), "bdfs": list(r.bdfs), "chips": list(r.chips)}
        for r in plan.ranks
    ]
    extra = {"server": server_state(plan, server)} if server and plan.serving else {}
    with contextlib.suppress(OSError, TTMeshError):
        jobs.update(plan.job, guardian=guardian, attempt=attempt, ranks=ranks, **extra)


def server_state(plan: LaunchPlan, state: str) -> dict[str, Any]:
    """A server as ``ttmesh ps`` shows it: its URL, health endpoint, state (starting, serving,
    stopping) and since when."""
    import time

    assert plan.serving is not None
    return {
        "url": plan.serving.url,
        "health": plan.serving.health_url,
        "state": state,
        "since": round(time.time(), 3),
    }


def write_server(plan: LaunchPlan, state: str) -> None:
    """The job record's server state (a server became ready, or is being stopped)."""
    from ttmesh.runtime import jobs

    if plan.serving is None:
        return
    with contextlib.suppress(OSError, TTMeshError):
        jobs.update(plan.job, server=server_state(plan, state))


def keep_errors(plan: LaunchPlan, attempt: int, spec: LogSpec | None) -> None:
    """Each rank's recorded exception into torchrun's log layout (logspec.keep_error)."""
    if spec is None or spec.dir_fd is None:
        return
    for i, rank in enumerate(plan.ranks):
        source = rank.env.get("TORCHELASTIC_ERROR_FILE")
        if source:
            with contextlib.suppress(OSError):  # a full disk loses the copy, not the job
                spec.keep_error(attempt, str(i), source)


def verdict(
    plan: LaunchPlan,
    base: AttemptResult,
    stop: Stop | None,
    failure: RankExit | None,
    launcher_error: str | None,
    tail: Tail,
) -> AttemptResult:
    """The attempt's result from how it ended: ``base`` (every rank succeeded) unless ttmesh
    stopped it (``stop``), mpirun could not start the ranks, or a rank failed first."""
    if stop is not None:
        return replace(base, code=stop.code, source=Source.TTMESH, reason=stop.reason, end=stop.end)
    if launcher_error is not None:
        reason = f"mpirun failed to start the ranks: {launcher_error}"
        return replace(
            base, code=2, source=Source.TTMESH, reason=reason, end=AttemptEnd.LAUNCHER_FAILED,
            error=TTMeshError(reason, None, 2),
        )  # fmt: skip
    if failure is None:
        return base
    if not failure.started:  # its program never ran: one line, no restart
        rank = plan.ranks[failure.rank]
        line = f"rank {failure.rank + plan.rank_offset}"
        if rank.bdfs:
            line += f" ({', '.join(rank.bdfs)})"
        line += f" {failure.how}"
        return replace(
            base, code=failure.code, source=Source.TTMESH, rank=failure.rank, reason=line,
            end=AttemptEnd.UNSTARTED, error=TTMeshError(line, failure.hint, failure.code),
        )  # fmt: skip
    if failure.rank < 0:  # the launcher itself failed
        return replace(
            base, code=failure.code, source=Source.TTMESH, reason=failure.how,
            stderr_tail=tail(LAUNCHER, "stderr")[-10:], end=AttemptEnd.FAILED,
        )  # fmt: skip
    # torch's @record file: a server (stock SGLang keeps no torchrun variable) has none,
    # and its exit code and last stderr lines say why it failed.
    error_file = plan.ranks[failure.rank].env.get("TORCHELASTIC_ERROR_FILE")
    error = error_message(error_file) if error_file else None
    return replace(
        base, code=failure.code, rank=failure.rank, reason=f"rank {failure.rank + plan.rank_offset} {failure.how}",  # global rank
        stderr_tail=tail(failure.rank, "stderr")[-10:], error_message=error, end=AttemptEnd.FAILED,
    )  # fmt: skip


def refused(result: AttemptResult, refusal: TTMeshError) -> AttemptResult:
    """A check still running as the ranks started refused the job: nothing of the attempt
    counts, the launcher refuses with it."""
    return replace(
        result, code=refusal.code, source=Source.TTMESH, rank=None, reason=f"refused: {refusal}",
        end=AttemptEnd.REFUSED, error=refusal,
    )  # fmt: skip


def diagnose(
    plan: LaunchPlan,
    rank: int | None,
    tail: Tail,
    has_launcher: bool,
    server: str | None,
    emit: Callable[[str], None],
) -> dict[str, Any] | None:
    """A known failure line in the output that tells: the failing rank's, or every rank's
    when ttmesh ended the attempt (a server is rank 0 of its plan); then mpirun's own. When
    the failing rank's output knows none, the others' (a rank that aborted in a collective
    because a peer failed: the peer says why)."""
    from ttmesh.launcher.attempt import failures

    everyone = [r.rank for r in plan.ranks]
    if has_launcher:
        everyone.append(LAUNCHER)
    tries = [everyone] if rank is None else [[rank], [o for o in everyone if o != rank]]
    if rank is not None and has_launcher:
        tries[0].append(LAUNCHER)
    try:
        for owners in tries:
            found = failures.match(failures.tails(owners, tail, server))
            if found is not None:
                return found
        return None
    except Exception as exc:  # a broken table must not hide how the job ended
        emit(f"the table of known failures could not be read: {exc}")
        return None


def error_message(path: str) -> str | None:
    """The exception a worker recorded with torch's @record (TORCHELASTIC_ERROR_FILE)."""
    from ttmesh import fileread

    try:  # bounded: a rank may leave anything there (a FIFO would hang the guardian)
        data = json.loads(fileread.read_bytes(path, fileread.MiB, "error file"))
    except (OSError, ValueError):  # fileread.Refused is a ValueError
        return None
    if not isinstance(data, dict):
        return None
    message = data.get("message")
    if isinstance(message, dict):
        return str(message.get("message") or "") or None
    return str(message) if message else None
