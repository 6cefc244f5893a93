"""A rank's view of a simulated host at the real paths, in a mount namespace of its own.

Code that reads the machine's own paths (torch_tpu's device count in libtt's TPU compatibility
mode counts ``/dev/tenstorrent``'s digit entries; tt-umd and tt-smi read ``/dev/tenstorrent`` and
``/proc/driver/tenstorrent``) sees there the chips of the simulated host (``--sim``/``--root``)
that the job was given, and nothing else:

* ``/dev`` is a new tmpfs holding every entry of the machine's ``/dev`` (each bound from the
  original, so ``/dev/null``, ``/dev/shm``, ``/dev/pts`` are the machine's own), plus
  ``tenstorrent/`` with the job's chips' nodes, bound from the simulated root (and their
  ``by-id`` links), or the root's own directory bound whole when it holds the job's chips and
  nothing else;
* ``/proc/driver`` likewise, plus ``tenstorrent/N`` for the same chips.

``/sys`` is left as it is: the simulated root's ``sys/class/tenstorrent`` entries are links into
its own ``sys/devices``, which the machine's ``/sys`` does not have.

Run by path, before the rank's program, with the launcher's Python in isolated mode (``-I -S``:
about 10 ms), needing nothing but the standard library; it builds the view, then ``exec``s the
program, so the rank's PID, environment and exit status are the program's own. As root, the
namespace is a mount namespace; as any other user, also a user namespace mapping the user to
itself (the kernel's ``unprivileged_userns_clone``), whose capabilities the program loses at
its ``exec``: it runs as the user it was, and sees the same files.

    python -I -S hostview.py --hold ROOT DEVICES
    python -I -S hostview.py ROOT DEVICES -- PROGRAM [ARGS...]

``DEVICES``: the ``/dev/tenstorrent`` indices the job was given, comma-separated ("" for none).
``--hold`` builds the view once for every rank of an attempt: it prints ``ready`` and waits
until its standard input closes (the ranks enter its namespaces with nsenter meanwhile:
``runtime.rankview``), or prints ``failed: WHY`` (one line) and exits 3. The second
form builds it for one program and execs it (where there is no nsenter): a view that cannot be
made is one line on stderr; before anything was mounted the program runs as it would have,
after, the rank exits 126.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import sys

MS_NOSUID = 2
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
PROBE_FAILED = 3
VIEW_FAILED = 126  # as a shell says of a program it found but could not run

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_ulong,
    ctypes.c_char_p,
]
_libc.unshare.argtypes = [ctypes.c_int]


class ViewError(Exception):
    """A step of the view failed (``mounted``: something was mounted before it)."""

    def __init__(self, message: str, mounted: bool) -> None:
        super().__init__(message)
        self.mounted = mounted


def _fs(path: str | None) -> bytes | None:
    return None if path is None else os.fsencode(path)


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    if _libc.mount(_fs(source), _fs(target), _fs(fstype), flags, _fs(data) if data else None):
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), target)


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def enter() -> None:
    """A mount namespace of this process's own (and, when not root, a user namespace mapping
    this user and group to themselves), with every mount private to it."""
    uid, gid = os.getuid(), os.getgid()
    flags = CLONE_NEWNS if uid == 0 else CLONE_NEWNS | CLONE_NEWUSER
    if _libc.unshare(flags):
        err = ctypes.get_errno()
        kind = "a mount namespace" if uid == 0 else "a user and mount namespace"
        raise OSError(err, f"cannot make {kind}: {os.strerror(err)}")
    if uid != 0:
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)


def _open_path(path: str, directory: bool = False) -> int:
    """``path`` opened to be bound (O_PATH), never through a link: a node of the simulated root
    that is a link (planted, or broken) is refused, not followed."""
    fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    mode = os.fstat(fd).st_mode
    if stat.S_ISLNK(mode) or stat.S_ISDIR(mode) != directory:
        os.close(fd)
        what = "a link" if stat.S_ISLNK(mode) else "not a directory" if directory else "a directory"
        raise OSError(errno.EINVAL, f"{path} is {what}")
    return fd


def _placeholder(dst: str, src_fd: int) -> None:
    """An empty directory or file at ``dst``, to bind what ``src_fd`` is onto."""
    mode = os.fstat(src_fd).st_mode
    if stat.S_ISDIR(mode):
        os.mkdir(dst, 0o755)
    else:
        os.close(os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644))


def _bind(src_fd: int, dst: str) -> None:
    _placeholder(dst, src_fd)
    _mount(f"/proc/self/fd/{src_fd}", dst, None, MS_BIND | MS_REC)


def overlay(target: str, name: str, entries: dict[str, int] | int, links: dict[str, str]) -> None:
    """``target`` replaced by a tmpfs holding its entries (each bound from the original, links
    copied) and a directory ``name`` holding ``entries`` (name -> an O_PATH fd to bind there)
    and ``links`` (name -> link text), or, when ``entries`` is one O_PATH fd, that directory
    bound whole. The original is read through a descriptor opened before the tmpfs covers it."""
    old = os.open(target, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        names = [n for n in os.listdir(f"/proc/self/fd/{old}") if n != name]
        _mount("tmpfs", target, "tmpfs", MS_NOSUID, "mode=755")
        for entry in names:
            src, dst = f"/proc/self/fd/{old}/{entry}", os.path.join(target, entry)
            if os.path.islink(src):
                os.symlink(os.readlink(src), dst)
                continue
            fd = os.open(src, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                _bind(fd, dst)
            finally:
                os.close(fd)
        own = os.path.join(target, name)
        if isinstance(entries, int):
            _bind(entries, own)
            return
        os.mkdir(own, 0o755)
        for entry, fd in sorted(entries.items()):
            _bind(fd, os.path.join(own, entry))
        if links:
            os.mkdir(os.path.join(own, "by-id"), 0o755)
            for entry, text in sorted(links.items()):
                os.symlink(text, os.path.join(own, "by-id", entry))
    finally:
        os.close(old)


Shown = dict[str, int] | int  # name -> an O_PATH fd to bind, or one directory's, bound whole


def sources(root: str, devices: list[str]) -> tuple[Shown, dict[str, str], Shown]:
    """What the view binds from the simulated root, opened now (never through a link):
    ``/dev/tenstorrent`` nodes, their ``by-id`` links, ``/proc/driver/tenstorrent`` entries.
    Where the job has every chip of the root, each directory is bound whole (:func:`_whole`)."""
    dev: dict[str, int] = {}
    links: dict[str, str] = {}
    proc: dict[str, int] = {}
    base = os.path.join(root, "dev", "tenstorrent")
    drivers = os.path.join(root, "proc", "driver", "tenstorrent")
    for index in devices:
        dev[index] = _open_path(os.path.join(base, index))
        driver = os.path.join(drivers, index)
        if os.path.lexists(driver):
            proc[index] = _open_path(driver, directory=True)
    by_id = os.path.join(base, "by-id")
    raw: dict[str, str] = {}  # as the root has them
    if os.path.isdir(by_id) and not os.path.islink(by_id):
        for entry in os.listdir(by_id):
            text = raw[entry] = os.readlink(os.path.join(by_id, entry))
            if os.path.basename(text) in devices:
                links[entry] = f"../{os.path.basename(text)}"
    # Whole only where the root's by-id links are the very ones the view would make.
    listed = {"by-id"} if os.path.isdir(by_id) and not os.path.islink(by_id) else set()
    whole_dev = _whole(base, dev, listed) if raw == links else None
    whole_proc = _whole(drivers, proc, set())
    return (
        dev if whole_dev is None else whole_dev,
        links,
        proc if whole_proc is None else whole_proc,
    )


def _whole(directory: str, opened: dict[str, int], also: set[str]) -> int | None:
    """``directory`` opened to be bound whole when it holds nothing but the entries ``opened``
    (each checked, and closed then) and ``also``: one mount instead of one per chip (a mount
    namespace's mounts cost more the more it has: 128 chips' took about 20 ms). None else."""
    if not opened:
        return None
    try:
        fd = _open_path(directory, directory=True)
    except OSError:
        return None
    if set(os.listdir(f"/proc/self/fd/{fd}")) != set(opened) | also:
        os.close(fd)
        return None
    for entry in opened.values():
        os.close(entry)
    return fd


def build(root: str, devices: list[str]) -> None:
    """The view, in namespaces of this process's own. The sources are opened in the new mount
    namespace (a mount of another namespace cannot be bound) and before anything covers them
    (a simulated root may live under /dev/shm)."""
    try:
        enter()
    except OSError as exc:
        raise ViewError(str(exc), False)
    try:
        dev, links, proc = sources(root, devices)
    except OSError as exc:
        raise ViewError(f"cannot read the simulated host's chips in {root}: {exc}", False)
    try:
        overlay("/dev", "tenstorrent", dev, links)
        if os.path.isdir("/proc/driver"):
            overlay("/proc/driver", "tenstorrent", proc, {})
    except OSError as exc:
        raise ViewError(f"cannot show the simulated host at the real paths: {exc}", True)
    for shown in (dev, proc):
        for fd in shown.values() if isinstance(shown, dict) else [shown]:
            os.close(fd)


def main(argv: list[str]) -> int:
    hold = argv[:1] == ["--hold"]
    args = argv[1:] if hold else argv
    wrong = len(args) != 2 if hold else len(args) < 4 or args[2] != "--"
    if wrong:
        sys.stderr.write("usage: hostview.py --hold ROOT DEVICES | ROOT DEVICES -- PROGRAM...\n")
        return 2
    root, devices = args[0], [d for d in args[1].split(",") if d]
    try:
        build(root, devices)
    except ViewError as exc:
        if hold:
            sys.stdout.write(f"failed: {exc}\n")
            return PROBE_FAILED
        sys.stderr.write(f"ttmesh: {exc}\n")
        if exc.mounted:
            return VIEW_FAILED
        sys.stderr.write("ttmesh: the rank sees the machine's own /dev and /proc\n")
    if hold:
        sys.stdout.write("ready\n")
        sys.stdout.flush()
        while sys.stdin.buffer.read(4096):  # until the launcher closes it (or dies)
            pass
        return 0
    program = args[3:]
    try:
        os.execvp(program[0], program)
    except OSError as exc:  # as a shell says it: 127 not found, 126 found but not runnable
        sys.stderr.write(f"ttmesh: {program[0]}: {exc.strerror}\n")
        return 127 if isinstance(exc, FileNotFoundError) else VIEW_FAILED
    return 0  # (not reached)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
