"""How one attempt ended: the guardian's verdict, sent to the launcher as JSON.

The end is one word (:class:`ttmesh.states.AttemptEnd`), and where ttmesh rather than a worker
ended the attempt for good, a typed error says why (message, hint, exit code): the launcher
refuses with it as with any other :class:`TTMeshError`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ttmesh.errors import TTMeshError
from ttmesh.launcher.attempt.starters import RankExit
from ttmesh.states import AttemptEnd
from ttmesh.vocab import Source

HUNG = 124  # ttmesh's code for a job that never became ready (as timeout(1) uses it)


@dataclass
class AttemptResult:
    """How one attempt ended, sent from the guardian to the launcher as JSON."""

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

    def to_json(self) -> dict[str, Any]:
        error, self.error = self.error, None
        try:
            data = asdict(self)
        finally:
            self.error = error
        data["end"] = str(self.end)
        data["error"] = error_to_json(error)
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
