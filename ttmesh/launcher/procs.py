"""Process-tree primitives for supervision: subreapers, parent-death signals, descendants.

Linux only (prctl and /proc), standard library only: these run in the launch path.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import signal
from collections.abc import Callable, Iterable

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36

_libc = ctypes.CDLL(None, use_errno=True)


def _prctl(option: int, arg: int) -> None:
    if _libc.prctl(option, arg, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def set_subreaper() -> None:
    """Orphaned descendants of this process are re-parented to it instead of to init."""
    _prctl(PR_SET_CHILD_SUBREAPER, 1)


def pdeathsig_preexec(parent: int, sig: int = signal.SIGKILL) -> Callable[[], None]:
    """A Popen ``preexec_fn``: the child gets ``sig`` when ``parent`` (its spawner) dies."""

    def preexec() -> None:
        _prctl(PR_SET_PDEATHSIG, sig)
        if os.getppid() != parent:  # the parent died between fork and prctl
            os._exit(1)

    return preexec


def parents() -> dict[int, int]:
    """pid -> ppid for every live process (zombies included)."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                data = f.read()
        except OSError:
            continue
        rest = data[data.rfind(b")") + 2 :].split()
        with contextlib.suppress(IndexError, ValueError):
            out[int(name)] = int(rest[1])
    return out


def descendants(root: int, table: dict[int, int] | None = None) -> list[int]:
    """Every descendant of ``root`` (not ``root`` itself), parents before children."""
    table = parents() if table is None else table
    children: dict[int, list[int]] = {}
    for pid, ppid in table.items():
        children.setdefault(ppid, []).append(pid)
    out: list[int] = []
    stack = list(children.get(root, []))
    while stack:
        pid = stack.pop()
        out.append(pid)
        stack.extend(children.get(pid, []))
    return out


def is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return True
    rest = data[data.rfind(b")") + 2 :].split()
    return not rest or rest[0] in (b"Z", b"X")


def live_descendants(root: int) -> list[int]:
    return [p for p in descendants(root) if not is_zombie(p)]


def signal_groups(pgids: Iterable[int], sig: int) -> None:
    for pgid in pgids:
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            pass
        except PermissionError:
            pass


def signal_pids(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def reap_all() -> list[tuple[int, int]]:
    """Reap every exited child without blocking: [(pid, wait status)]."""
    reaped = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        except OSError as exc:
            if exc.errno == errno.EINTR:
                continue
            raise
        if pid == 0:
            break
        reaped.append((pid, status))
    return reaped


def exit_code(status: int) -> int:
    """A wait status as a shell would report it: the code, or 128 + signal."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1


def describe_status(status: int) -> str:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return f"killed by {name}"
    return f"exited with code {os.waitstatus_to_exitcode(status)}"
