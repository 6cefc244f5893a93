"""The one user-facing error type.

Every failure a user can act on is raised as a :class:`TTMeshError` carrying the exit code from the
conventions table (docs/conventions.md) and a hint saying how to fix it. The CLI prints it as a single
line (``ttmesh: <message> (<hint>)``) and exits with ``code``; no traceback reaches the user.
"""

from __future__ import annotations

# Exit codes (docs/conventions.md, "Exit codes").
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


class LaunchError(TTMeshError):
    """A launch refused (``ttmesh.launch``, docs/api.md): nothing of the job ran, or ttmesh could
    not do what it was asked. ``code`` is the exit code ``ttmesh launch`` gives (2: bad input,
    3: refused by pre-flight, ...), ``message`` and ``hint`` what its one line says
    (:attr:`line`). Stable: what a program embedding the launcher catches."""

    @property
    def line(self) -> str:
        """The one line ``ttmesh launch`` prints for it (without its ``ttmesh:`` prefix)."""
        return str(self)


def bad_input(message: str, hint: str | None = None) -> TTMeshError:
    return TTMeshError(message, hint, BAD_INPUT)


def refused(message: str, hint: str | None = None) -> TTMeshError:
    return TTMeshError(message, hint, REFUSED)


def failed(message: str, hint: str | None = None) -> TTMeshError:
    return TTMeshError(message, hint, FAILED)


def owner_of(path: str) -> str | None:
    """The user owning ``path`` or its nearest existing parent (None if nothing is there)."""
    import os
    import pwd

    current = os.path.abspath(path)
    while True:
        try:
            uid = os.stat(current).st_uid
        except OSError:
            parent = os.path.dirname(current)
            if parent == current:
                return None
            current = parent
            continue
        try:
            return pwd.getpwuid(uid).pw_name
        except KeyError:
            return str(uid)


def from_os_error(exc: OSError, doing: str = "use", path: str | None = None) -> TTMeshError:
    """An OSError from the machine's state (a path, a permission) as one line and a hint.

    ``path``: the file being written or read when the error does not name one (a write that
    fails on a full disk names no file)."""
    import errno
    import os

    path = exc.filename or path
    hint: str | None
    where = f" {path}" if path else ""
    what = f"cannot {doing}{where}: {exc.strerror or exc}"
    if exc.errno in (errno.EACCES, errno.EPERM):
        owner = owner_of(str(path)) if path else None
        me = _me()
        if owner and owner != me:
            hint = f"it belongs to {owner}: run as {owner}, or use a path of your own"
            if path and _in_simulated_root(str(path)):
                hint = (
                    f"the simulated host is owned by {owner}: run as {owner}, or use your own "
                    "simulated host with --sim NAME"
                )
        else:
            hint = "check its permissions (ls -l)"
    elif exc.errno == errno.ENOENT:
        hint = "check the path"
    elif exc.errno == errno.ENOTDIR:
        hint = "a part of the path is a file, not a directory"
    elif exc.errno == errno.EISDIR:
        hint = "it is a directory: give a file"
    elif exc.errno == errno.EEXIST:
        hint = "it is already there: choose another path"
    elif exc.errno in (errno.ENOSPC, errno.EDQUOT):
        hint = "free some space"
    elif exc.errno == errno.EROFS:
        hint = "the file system is read-only: use a writable path"
    else:
        hint = os.strerror(exc.errno) if exc.errno else None
        if hint == exc.strerror:
            hint = None
    return bad_input(what, hint)


def _me() -> str:
    import os
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def _in_simulated_root(path: str) -> bool:
    """Is ``path`` inside a simulated host (a directory above it has the marker)?"""
    import os

    current = os.path.abspath(path)
    for _ in range(64):
        if os.path.isfile(os.path.join(current, ".ttmesh-sim")):
            return True
        parent = os.path.dirname(current)
        if parent == current:
            return False
        current = parent
    return False
