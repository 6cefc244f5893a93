"""Processes: who they are, how they are related, and how to signal them safely.

Two halves, by cost:

* the **launch path** (standard library, reading ``/proc``): start times, parents, process
  trees, subreapers, parent-death signals, reaping and signalling. Importing psutil costs about
  50 ms, a quarter of a whole launch, so none of this uses it.
* **who a process is** (psutil): its user and command line, for holders and blockers named in
  ``ls``, ``check`` and refusals, which are never on the launch path of a healthy host.

A PID is only ever signalled while it still has the start time it had when it was found, so a
PID reused by another process is never hit.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import re
import signal
from collections.abc import Callable, Iterable
from typing import Any

# A process's directory under /proc (the digit rule of ttmesh.numeric, which this module
# cannot import: the two are one layer).
_PID = re.compile(r"[0-9]+", re.ASCII)

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36

_libc: ctypes.CDLL | None = None


def _prctl(option: int, arg: Any) -> None:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    if _libc.prctl(option, arg, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


# --------------------------------------------------------------------------- /proc (launch path


def _stat(pid: int) -> list[bytes] | None:
    """The fields of /proc/PID/stat after the command name (state first), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return data[data.rfind(b")") + 2 :].split()


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot; None when it is gone or a zombie."""
    fields = _stat(pid)
    if not fields or fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])


def state(pid: int) -> str | None:
    """The process's state letter (``R``, ``S``, ``T`` stopped by a signal, ``t`` held by a
    debugger, ``Z``...), None when it is gone."""
    fields = _stat(pid)
    return fields[0].decode(errors="replace") if fields else None


def continue_stopped(pid: int) -> bool:
    """SIGCONT to ``pid`` if a signal stopped it (SIGSTOP, SIGTSTP): a stop signal sent to a
    stopped process waits, pending, until someone continues it, as systemd (systemd.kill(5))
    and a shell's ``kill`` of a stopped job do. True when it was stopped and is continued."""
    if state(pid) != "T":
        return False
    try:
        os.kill(pid, signal.SIGCONT)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def alive(pid: int, start: int | None = None) -> bool:
    """The process exists, is no zombie and (when ``start`` is given) is still that process."""
    now = start_time(pid)
    return now is not None and (start is None or now == start)


def uid_of(pid: int) -> int | None:
    """The real user id the process runs as; None when it is gone or cannot be seen."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def groups(pid: int) -> set[int]:
    """The supplementary groups the process runs with (empty when gone or unreadable)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Groups:"):
                    return {int(g) for g in line.split()[1:]}
    except (OSError, ValueError):
        pass
    return set()


def argv(pid: int, limit: int = 4096) -> tuple[str, ...]:
    """The process's command line as its words (the kernel's copy, at most ``limit`` bytes;
    empty when gone or unreadable)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read(limit)
    except OSError:
        return ()
    return tuple(p.decode(errors="replace") for p in raw.split(b"\0") if p)


def user_name(uid: int) -> str:
    """The name of user ``uid`` (the number when it has none)."""
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def parent(pid: int) -> int | None:
    fields = _stat(pid)
    try:
        return int(fields[1]) if fields else None
    except (IndexError, ValueError):
        return None


def is_zombie(pid: int) -> bool:
    fields = _stat(pid)
    return not fields or fields[0] in (b"Z", b"X")


def parents() -> dict[int, int]:
    """pid -> ppid for every live process (zombies included)."""
    out = {}
    for name in os.listdir("/proc"):
        if _PID.fullmatch(name):
            fields = _stat(int(name))
            with contextlib.suppress(IndexError, ValueError, TypeError):
                out[int(name)] = int(fields[1])  # type: ignore[index]
    return out


def _children_of(pid: int) -> list[int] | None:
    """The children of ``pid`` from /proc/PID/task/*/children; None when the kernel does not
    provide it (then only a scan of every process tells)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []  # gone
    out: list[int] = []
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                out += [int(p) for p in f.read().split()]
        except FileNotFoundError:
            if not os.path.exists(f"/proc/{pid}/task/{tid}"):
                continue  # the thread ended
            return None  # no children files (CONFIG_PROC_CHILDREN off)
        except OSError:
            continue
    return out


def has_children() -> bool:
    """This process has children (live or not yet reaped), asked without reaping any."""
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


def _walk(root: int) -> list[int] | None:
    """Descendants of ``root`` through the children lists; None without children files."""
    out: list[int] = []
    stack = _children_of(root)
    while stack:
        pid = stack.pop()
        out.append(pid)
        found = _children_of(pid)
        if found is None:
            return None
        stack.extend(found)
    return None if stack is None else out


def descendants(root: int, table: dict[int, int] | None = None) -> list[int]:
    """Every descendant of ``root`` (not ``root`` itself), parents before children.

    Without a ``table`` (pid -> ppid of every process), the tree is walked from ``root`` down
    through each process's list of children, which costs the tree's size, not the machine's
    (reading every process's stat, hundreds of files, on each sweep); and this process, asked
    about itself with no child at all, answers at once. A walk can miss a process being
    re-parented at that very moment: the sweeps that rely on it repeat until nothing is left,
    and what outlives the guardian is re-parented to the launcher, which sweeps again."""
    if table is None:
        if root == os.getpid() and not has_children():
            return []
        walked = _walk(root)
        if walked is not None:
            return walked
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


def live_descendants(root: int) -> list[int]:
    return [p for p in descendants(root) if not is_zombie(p)]


def owning(pid: int, owners: Iterable[int]) -> int | None:
    """The first of ``owners`` that is ``pid`` or one of its ancestors."""
    wanted = set(owners)
    seen: set[int] = set()
    current: int | None = pid
    while current and current not in seen and len(seen) < 256:
        if current in wanted:
            return current
        seen.add(current)
        current = parent(current)
    return None


def environ_value(pid: int, key: str) -> str | None:
    """``key`` in the process's environment (None if unset or unreadable)."""
    prefix = key.encode() + b"="
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            items = f.read().split(b"\0")
    except OSError:
        return None
    for item in items:
        if item.startswith(prefix):
            return item[len(prefix) :].decode(errors="replace")
    return None


# --------------------------------------------------------------------------- supervision


def set_subreaper(on: bool = True) -> None:
    """Orphaned descendants of this process are re-parented to it instead of to init (``on``),
    or no longer."""
    _prctl(PR_SET_CHILD_SUBREAPER, 1 if on else 0)


def is_subreaper() -> bool:
    """Whether orphaned descendants of this process come to it (PR_GET_CHILD_SUBREAPER)."""
    flag = ctypes.c_int(0)
    _prctl(PR_SET_CHILD_SUBREAPER + 1, ctypes.byref(flag))  # PR_GET_CHILD_SUBREAPER
    return bool(flag.value)


SETPRIV = ("/usr/bin/setpriv", "/bin/setpriv")  # util-linux's, where the system keeps it
_setpriv: list[str] | bool | None = False  # not looked for yet


def pdeathsig_wrapper() -> list[str] | None:
    """``[setpriv, --pdeathsig, KILL, --]``: a command prefix that gives the command SIGKILL
    when its spawner dies, or None when this system's setpriv can't (util-linux < 2.33).

    The prefix lets a spawner keep the parent-death signal without a ``preexec_fn``, which
    makes Python fork the whole interpreter and run Python code in the child before exec
    (milliseconds a process under load: 128 ranks took seconds); without one it uses vfork.
    Only the system's own setpriv is used (never one found on PATH), known by its help text."""
    global _setpriv
    if _setpriv is False:
        _setpriv = None
        for path in SETPRIV:
            try:
                with open(path, "rb") as f:
                    if b"pdeathsig" in f.read(1 << 20) and os.access(path, os.X_OK):
                        _setpriv = [path, "--pdeathsig", "KILL", "--"]
                        break
            except OSError:
                continue
    return _setpriv if isinstance(_setpriv, list) else None


def pdeathsig_preexec(parent_pid: int, sig: int = signal.SIGKILL) -> Callable[[], None]:
    """A Popen ``preexec_fn``: the child gets ``sig`` when ``parent_pid`` (its spawner) dies."""

    def preexec() -> None:
        _prctl(PR_SET_PDEATHSIG, sig)
        if os.getppid() != parent_pid:  # the parent died between fork and prctl
            os._exit(1)

    return preexec


def signal_groups(pgids: Iterable[int], sig: int) -> None:
    for pgid in pgids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)


def signal_pids(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def signal_if_same(pid: int, start: int | None, sig: int) -> bool:
    """Signal ``pid`` only while it still has start time ``start``; False if it did not.

    Raises PermissionError when the process is someone else's."""
    if start is None or start_time(pid) != start:
        return False
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    return True


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


def signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def describe_status(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by {signal_name(os.WTERMSIG(status))}"
    return f"exited with code {os.waitstatus_to_exitcode(status)}"


# --------------------------------------------------------------------------- who (psutil)


def one_line(text: str) -> str:
    """A command line as one printable line (as tt-smi shows it): newlines and tabs become
    spaces, other control characters \\xNN; an argument like ``-c "a\\nb"`` stays on one line."""
    text = text.replace("\n", " ").replace("\r", " ").replace("\t", " ")
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text).strip()


def identity(pid: int) -> tuple[str, str, int | None]:
    """(user, command line on one line, start time) of ``pid``; "?" for what can't be read."""
    import psutil

    user, cmd = "?", "?"
    try:
        proc = psutil.Process(pid)
        with contextlib.suppress(psutil.Error):
            cmd = one_line(" ".join(proc.cmdline())) or "?"
        with contextlib.suppress(psutil.Error, KeyError):
            user = proc.username()
        if user == "?":
            with contextlib.suppress(psutil.Error):
                user = str(proc.uids().real)
    except psutil.Error:
        pass
    return user, cmd, start_time(pid)


def command_line(pid: int) -> str | None:
    """The process's command line on one line, or None when it can't be read."""
    cmd = identity(pid)[1]
    return None if cmd == "?" else cmd
