"""The one user-facing error type.

Every failure a user can act on is raised as a :class:`TTMeshError` carrying the exit code from the
conventions table (shared/design.md) and a hint saying how to fix it. The CLI prints it as a single
line (``ttmesh: <message> (<hint>)``) and exits with ``code``; no traceback reaches the user.
"""

from __future__ import annotations

# Exit codes (design.md, "Exit codes").
OK = 0
FAILED = 1  # check: unhealthy; reset: not recovered; others: failed
BAD_INPUT = 2  # bad input or environment; nothing started or changed
REFUSED = 3  # launch pre-flight refused / reset refused (holders, another job's lease)


class TTMeshError(Exception):
    """An error a user can fix. ``str(err)`` is the one line the CLI prints."""

    def __init__(self, message: str, hint: str | None = None, code: int = BAD_INPUT) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.code = code

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


def bad_input(message: str, hint: str | None = None) -> TTMeshError:
    return TTMeshError(message, hint, BAD_INPUT)


def refused(message: str, hint: str | None = None) -> TTMeshError:
    return TTMeshError(message, hint, REFUSED)


def failed(message: str, hint: str | None = None) -> TTMeshError:
    return TTMeshError(message, hint, FAILED)
