"""Paths ttmesh creates and removes: safe names, private directories, owned run directories.

A name a user gives (a job id) becomes a directory name, so it must not be able to leave its
parent: :func:`safe_name` allows letters, digits, ``.``, ``_`` and ``-``, not starting with
``.`` (hidden) or ``-`` (read as an option by ``ttmesh stop -x``), at most 64 characters. Every directory ttmesh creates is checked to be a real directory
(not a symbolic link) owned by this user; a run directory is created exclusively (never reused)
and removed only when it is still the very directory this process created, without following
symbolic links. Standard library only: this runs on every launch.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shutil
import stat
import time
from pathlib import Path

from ttmesh.dataclass import dataclass
from ttmesh.errors import TTMeshError, bad_input, from_os_error

NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}")
NAME_RULE = "letters, digits, '.', '_' and '-', not starting with '.' or '-', at most 64 characters"
LOCK = ".lock"  # held (flock) by a run directory's job for its whole life
UNLOCKED_GRACE = 60.0  # a run directory without a lock file is stale only after this long


def safe_name(value: str, flag: str) -> str:
    """``value`` if it can name a file inside a directory of ours, else bad input (exit 2)."""
    if not NAME_RE.fullmatch(value):
        raise bad_input(f"{flag} {value!r}: not a valid name", f"use {NAME_RULE}")
    return value


DEFAULT_LIMIT = 16 * 1024 * 1024  # a text file a user names, unless its format says less


def read_text(path: str | os.PathLike[str], what: str, limit: int = DEFAULT_LIMIT) -> str:
    """A file the user named, as text: a regular file of at most ``limit`` bytes (a FIFO or a
    device is refused without being read: :mod:`ttmesh.fileread`); every way it can fail is
    one line (exit 2)."""
    from ttmesh import fileread

    name = os.fspath(path)
    try:
        return fileread.read_text(name, limit, what)
    except fileread.Refused as exc:
        raise bad_input(f"{what} {name} {exc.why}", exc.hint)
    except FileNotFoundError:
        raise bad_input(f"{what} {name} does not exist", "check the path")
    except OSError as exc:
        raise from_os_error(exc, f"read {what}")


def write_text(path: str | os.PathLike[str], text: str, flag: str) -> None:
    """Write a file the user named (with ``flag``, :func:`open_output`); a failure names the
    flag and the path (a full disk's error names no file), exit 2."""
    name = os.fspath(path)
    try:
        fd = open_output(name, flag)
        with os.fdopen(fd, "w") as f:
            f.write(text)
    except OSError as exc:
        raise from_os_error(exc, f"write {flag}", name)


def open_output(path: str, flag: str) -> int:
    """A descriptor to write the file the user named with ``flag`` (created, or truncated).

    In a directory everyone may write in (sticky and world-writable, as /tmp), a link or a file
    another user put at that name is refused (bad input, exit 2), as the kernel's
    ``fs.protected_symlinks`` and ``fs.protected_regular`` refuse them (machines that turn those
    off let another user's planted ``/tmp/summary.json -> /etc/passwd`` make root's ttmesh write
    the password file); a name that was free is created exclusively, so no file can be planted
    there meanwhile. Never blocks on a FIFO (no reader: ENXIO, an OSError)."""
    me = os.geteuid()
    parent = os.path.dirname(os.path.abspath(path)) or "/"
    for _ in range(8):
        try:
            pst = os.stat(parent)
        except OSError:
            pst = None
        shared = pst is not None and pst.st_mode & stat.S_ISVTX and pst.st_mode & 0o002
        try:
            lst = os.lstat(path)
        except FileNotFoundError:
            lst = None
        if shared and lst is not None and pst is not None and lst.st_uid not in (me, pst.st_uid):
            kind = "a symbolic link" if stat.S_ISLNK(lst.st_mode) else "a file"
            raise bad_input(
                f"{flag} {path} is {kind} of {_owner(lst.st_uid)}'s in {parent}, a directory "
                "everyone may write in: ttmesh does not write through it",
                "name a file of your own, or a path in a directory of yours",
            )
        flags = os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC
        if lst is None:
            try:
                fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                continue  # made meanwhile: look at it again
        else:
            fd = os.open(path, flags | os.O_CREAT, 0o644)
            with contextlib.suppress(OSError):
                if stat.S_ISREG(os.fstat(fd).st_mode):
                    os.ftruncate(fd, 0)
        with contextlib.suppress(OSError):
            os.set_blocking(fd, True)
        return fd
    raise bad_input(f"{flag} {path} keeps changing", "name a path in a directory of yours")


def not_replaceable(path: Path) -> str | None:
    """What ``path`` is when a new file must not replace it (a device, a FIFO, a socket):
    ``--force`` means overwrite a file, never put one where ``/dev/null`` was."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode) or stat.S_ISLNK(mode):
        return None
    kinds = {stat.S_ISCHR: "a character device", stat.S_ISBLK: "a block device",
             stat.S_ISFIFO: "a FIFO", stat.S_ISSOCK: "a socket", stat.S_ISDIR: "a directory"}  # fmt: skip
    return next((name for test, name in kinds.items() if test(mode)), "not a regular file")


def writable_dir(value: str, flag: str, what: str = "the files") -> Path:
    """A directory the user named for ttmesh to write into: it may not exist yet, but the
    nearest existing part must be a directory this user can write. Only checked (nothing is
    created); bad input (exit 2) otherwise."""
    from ttmesh.errors import owner_of

    if not value.strip():
        raise bad_input(f"{flag} '': no directory named", f"name a directory for {what}")
    path = Path(os.path.abspath(value))
    existing = path
    while not os.path.exists(existing) and existing != existing.parent:
        existing = existing.parent
    if not os.path.isdir(existing):
        where = "is a file" if existing == path else f"is inside {existing}, which is a file"
        raise bad_input(f"{flag} {value} {where}, not a directory", f"give a directory for {what}")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise bad_input(
            f"{flag} {value}: cannot write in {existing} (owned by {owner_of(str(existing))})",
            "give a directory you can write",
        )
    return path


def writable_file(value: str, flag: str, new_parent: bool = False) -> Path:
    """A file the user named for ttmesh to write (a report): not a directory, in an existing
    directory this user can write (or, with ``new_parent``, one that can be created). Only
    checked; bad input (exit 2) otherwise."""
    from ttmesh.errors import owner_of

    if not value.strip():
        raise bad_input(f"{flag} '': no file named", f"e.g. {flag} out.json")
    path = Path(os.path.abspath(value))
    if os.path.isdir(path):
        raise bad_input(f"{flag} {value} is a directory", "give a file name")
    parent = path.parent
    if not os.path.isdir(parent):
        if new_parent:
            writable_dir(str(parent), flag, "the file")
            return path
        raise bad_input(f"{flag} {value}: no directory {parent}", "create it, or fix the path")
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise bad_input(
            f"{flag} {value}: cannot write {path} (owned by {owner_of(str(path))})",
            "give a file you can write",
        )
    if not os.access(parent, os.W_OK | os.X_OK):  # a capture is written beside it first
        raise bad_input(
            f"{flag} {value}: cannot write in {parent} (owned by {owner_of(str(parent))})",
            "give a file in a directory you can write",
        )
    return path


def make_dirs(path: Path, what: str) -> Path:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise from_os_error(exc, f"create {what}")
    return path


def _owner(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def private_dir(path: Path, hint: str, create: bool = True) -> Path | None:
    """Create ``path`` (and its parents) if needed; it must be a directory of this user's that
    no one else can enter (mode 0700), on a path no one else can change (:func:`walk`,
    ``strict``: every directory on the way root's or this user's, and sticky where others may
    write), so that what is done there by path afterwards stays there. Refuses (exit 2) a
    symbolic link, another's directory, or a path another user could change. Without
    ``create``: None when it does not exist (nothing is made)."""
    try:
        fd, _created = walk(
            path,
            what="the runtime directory",
            create=create,
            new_mode=0o700,
            link_fix=f"remove it, or {hint}; ttmesh never follows a link another user owns",
            strict=hint,
        )
    except FileNotFoundError:
        if create:
            raise
        return None
    except OSError as exc:
        raise bad_input(f"cannot create {path}: {exc.strerror}", hint)
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            raise bad_input(f"{path} belongs to {_owner(st.st_uid)}, not to you", hint)
        if stat.S_IMODE(st.st_mode) & 0o077:
            _fchmod(fd, 0o700)
    finally:
        os.close(fd)
    return path


# --------------------------------------------------------------------------- shared directories

MAX_LINKS = 16  # symbolic links followed on one path (the kernel's own limit is 40)
NO_LINKS = "remove it; ttmesh never follows links in shared directories"


def walk(
    path: str | os.PathLike[str],
    *,
    what: str,
    create: bool = False,
    new_mode: int = 0o755,
    link_fix: str | None = None,
    strict: str | None = None,
    elsewhere: str | None = None,
) -> tuple[int, bool]:
    """(an ``O_PATH`` descriptor of directory ``path``, whether this call created it).

    The path is walked from ``/`` one component at a time, each opened relative to its parent's
    descriptor with ``O_NOFOLLOW``: a component that is a symbolic link is followed only when
    the link is owned by root or this user (anyone else could have planted it, e.g. in
    /run/lock), at most :data:`MAX_LINKS` of them. With ``create``, missing components are
    made (``mkdir`` relative to the parent's descriptor; the last one mode 0700, for the caller
    to open up through the descriptor once it is checked). Bad input (exit 2) naming the link
    and its owner for a link that is not followed, and for a component that is not a directory;
    FileNotFoundError without ``create``, OSError for what the system refuses.

    ``strict`` (the fix to print): every directory on the way must also be root's or this
    user's, and sticky when others may write in it: no one else can then rename or replace
    anything on the path, so the caller may go on using it by name. ``elsewhere``: how to name
    another path, for a component that is no directory (default: ``strict``)."""
    named = os.fspath(path)
    if not os.path.isabs(named):
        raise bad_input(f"{what} {named} is not an absolute path", "give an absolute path")
    me = os.geteuid()
    todo = [p for p in named.split("/") if p][::-1]
    fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    here, hops, created = "/", 0, False
    try:
        if strict is not None:
            _safe(what, named, "/", os.fstat(fd), me, strict)
        while todo:
            name = todo.pop()
            if name == ".":
                continue
            try:
                nxt = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                made = False
            except FileNotFoundError:
                if not create:
                    raise FileNotFoundError(errno.ENOENT, "No such file or directory", named)
                try:
                    os.mkdir(name, 0o700 if not todo else new_mode, dir_fd=fd)
                except FileExistsError:  # made meanwhile: look again
                    todo.append(name)
                    continue
                nxt = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                made = True
            where = os.path.join(here, name)
            st = os.fstat(nxt)
            if stat.S_ISLNK(st.st_mode):
                os.close(nxt)
                if st.st_uid not in (0, me):
                    raise bad_input(_link_line(what, named, where, st.st_uid), link_fix or NO_LINKS)
                hops += 1
                if hops > MAX_LINKS:
                    raise bad_input(f"{what} {named}: too many symbolic links", "check the path")
                target = os.readlink(name, dir_fd=fd)
                if target.startswith("/"):
                    os.close(fd)
                    fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
                    here = "/"
                todo.extend([p for p in target.split("/") if p][::-1])
                continue
            if not stat.S_ISDIR(st.st_mode):
                os.close(nxt)
                what_is = (
                    "is" if where == os.path.normpath(named) else f"is inside {where}, which is"
                )
                # Removing is the fix only for a stray file where ttmesh's own directory goes;
                # never for a device (/dev/zero), a file above it, or a path the user named
                # (/etc/passwd): then only the path is to change.
                device = stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
                own = where == os.path.normpath(named) and not device and elsewhere is None
                other = elsewhere or strict or "name another path"
                raise bad_input(
                    f"{what} {named} {what_is} {_kind(st.st_mode)}, not a directory",
                    f"remove it, or {other}" if own else other,
                )
            os.close(fd)
            fd, created = nxt, made
            here = os.path.dirname(here) if name == ".." else where
            if strict is not None:
                _safe(what, named, here, st, me, strict)
    except BaseException:
        os.close(fd)
        raise
    return fd, created


def _safe(what: str, named: str, where: str, st: os.stat_result, me: int, fix: str) -> None:
    """A directory on a strict path: root's or this user's, and sticky if others may write."""
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid not in (0, me):
        problem = f"belongs to {_owner(st.st_uid)}"
    elif mode & 0o022 and not mode & stat.S_ISVTX:
        problem = f"is writable by others and not sticky (mode {mode:04o})"
    else:
        return
    place = "" if os.path.normpath(named) == where else f": {where}"
    raise bad_input(f"{what} {named}{place} {problem}, so another user could change it", fix)


def _link_line(what: str, named: str, where: str, uid: int) -> str:
    if os.path.normpath(named) == where:
        return f"{what} {named} is a symbolic link owned by {_owner(uid)}"
    return f"{what} {named}: {where} is a symbolic link owned by {_owner(uid)}"


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISREG, "a file"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "not a directory"


def _fchmod(fd: int, mode: int) -> None:
    """``fchmod`` through a directory descriptor that may be ``O_PATH`` (which cannot be
    changed): through a descriptor of ``.`` opened relative to it."""
    try:
        os.fchmod(fd, mode)
    except OSError as exc:
        if exc.errno != errno.EBADF:
            raise
        real = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
        try:
            os.fchmod(real, mode)
        finally:
            os.close(real)


def _fchown(fd: int, uid: int, gid: int) -> None:
    real = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
    try:
        os.fchown(real, uid, gid)
    finally:
        os.close(real)


@dataclass
class SharedDir:
    """A directory every user of a host writes (the lease directory), checked and held open:
    everything in it is done relative to ``fd``, never through its path again."""

    path: Path
    fd: int  # an O_PATH descriptor
    uid: int  # its owner
    mode: int

    def close(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
        self.fd = -1

    @property
    def sticky(self) -> bool:
        return bool(self.mode & stat.S_ISVTX)

    def __enter__(self) -> SharedDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def shared_dir(
    path: Path,
    *,
    what: str,
    create: bool,
    trusted: set[int] | frozenset[int],
    heal: bool = False,
    fix: str,
    elsewhere: str | None = None,
) -> SharedDir | None:
    """Open (with ``create``, make: mode 1777) the shared directory ``path``; None when it does
    not exist and ``create`` is false.

    Reached by :func:`walk` (no symbolic link anyone but root or this user owns). It must be a
    real directory owned by one of ``trusted`` (root, this user, the host's owner: whoever owns
    it can remove what other users keep in it) and, when others may write in it, sticky (else
    anyone could remove anyone's files). ``heal`` (the host's standard location, run as root):
    a directory another user made there is taken over (owner root, mode 1777) with a notice,
    not refused. Anything else is bad input (exit 2) naming the path and its owner, with
    ``fix``."""
    me = os.geteuid()
    try:
        fd, created = walk(path, what=what, create=create, elsewhere=elsewhere)
    except FileNotFoundError:
        if create:
            raise
        return None
    try:
        st = os.fstat(fd)
        mode = stat.S_IMODE(st.st_mode)
        if created:
            _fchmod(fd, 0o1777)
        elif st.st_uid not in trusted:
            if not (heal and me == 0):
                raise bad_input(
                    f"{what} {path} belongs to {_owner(st.st_uid)}, who could remove what other "
                    "users keep in it",
                    fix,
                )
            _fchown(fd, 0, 0)
            _fchmod(fd, 0o1777)
            _notice(
                f"{what} {path} belonged to {_owner(st.st_uid)}: it is root's now (mode 1777), "
                "so no user can remove another's files in it"
            )
        elif mode & 0o022 and not mode & stat.S_ISVTX:
            if st.st_uid != me:
                raise bad_input(
                    f"{what} {path} (owned by {_owner(st.st_uid)}) is writable by others and "
                    f"not sticky (mode {mode:04o}): anyone could remove anyone's files in it",
                    f"chmod +t {path}",
                )
            _fchmod(fd, mode | stat.S_ISVTX)
        elif heal and st.st_uid == me and mode != 0o1777:
            _fchmod(fd, 0o1777)  # the host's standard location is open to every user
        st = os.fstat(fd)
    except BaseException:
        os.close(fd)
        raise
    return SharedDir(Path(path), fd, st.st_uid, stat.S_IMODE(st.st_mode))


def _notice(message: str) -> None:
    import sys

    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(f"ttmesh: note: {message}\n")
        sys.stderr.flush()


@dataclass
class RunDir:
    """A directory this process created for one job, locked for the job's life."""

    path: Path
    dev: int
    ino: int
    lock_fd: int

    def remove(self) -> bool:
        """Remove the directory if it is still the one created; never follows a link."""
        removed = remove_tree(self.path, (self.dev, self.ino))
        with contextlib.suppress(OSError):
            os.close(self.lock_fd)
        self.lock_fd = -1
        return removed


def create_run_dir(base: Path, name: str, hint: str) -> RunDir:
    """Create ``base/name`` exclusively and hold its lock; refuses (exit 2) if it exists."""
    safe_name(name, "job id")
    private_dir(base, hint)
    path = base / name
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        raise bad_input(
            f"the run directory {path} already exists (another job with id {name}?)",
            "give another --job-id, or see ttmesh ps",
        )
    except OSError as exc:
        raise bad_input(f"cannot create {path}: {exc.strerror}", hint)
    dir_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        st = os.fstat(dir_fd)
        fd = os.open(
            LOCK,
            os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600,
            dir_fd=dir_fd,
        )
    finally:
        os.close(dir_fd)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return RunDir(path, st.st_dev, st.st_ino, fd)


def remove_tree(path: Path, identity: tuple[int, int] | None = None) -> bool:
    """Remove directory ``path`` (not following links) if it is a real directory owned by this
    user and, with ``identity`` (dev, inode), still that very directory. False when refused."""
    try:
        parent_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return False
    try:
        try:
            st = os.stat(path.name, dir_fd=parent_fd, follow_symlinks=False)
        except FileNotFoundError:
            return True
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            return False
        if identity is not None and (st.st_dev, st.st_ino) != identity:
            return False
        shutil.rmtree(path.name, dir_fd=parent_fd, ignore_errors=True)
        return True
    finally:
        os.close(parent_fd)


def is_stale(path: Path, now: float | None = None) -> bool:
    """A run directory whose job is gone: its lock is free (or it has none and is old)."""
    try:
        fd = os.open(path / LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        try:
            age = (now or time.time()) - os.lstat(path).st_mtime
        except OSError:
            return False
        return age > UNLOCKED_GRACE
    except OSError as exc:
        return exc.errno not in (errno.ELOOP, errno.EACCES)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def sweep_stale(base: Path, keep: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """Remove run directories under ``base`` whose jobs are gone; the names removed."""
    try:
        names = os.listdir(base)
    except OSError:
        return []
    removed = []
    now = time.time()
    for name in names:
        if name in keep or not NAME_RE.fullmatch(name):
            continue
        path = base / name
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            continue
        if is_stale(path, now) and remove_tree(path, (st.st_dev, st.st_ino)):
            removed.append(name)
    return removed


def xdg_dir(var: str, default: str | None) -> str | None:
    """The base directory the XDG variable ``var`` names, when it is an absolute path (the XDG
    Base Directory spec: "If an implementation encounters a relative path in any of these
    variables it should consider the path invalid and ignore it"); else ``default`` under the
    home directory (``.cache`` for XDG_CACHE_HOME), or None when there is no default
    (XDG_RUNTIME_DIR). Every reader of an XDG variable goes through here."""
    value = os.environ.get(var, "")
    if os.path.isabs(value):
        return value
    if default is None:
        return None
    return os.path.join(os.path.expanduser("~"), default)


DELETED = " (deleted)"  # what the kernel appends to /proc/self/cwd when the directory went


def cwd() -> str:
    """This process's working directory. One that was deleted (the shell's directory removed
    under it) makes ``os.getcwd`` fail with ENOENT naming no path: bad input naming it
    instead, from the kernel's own record (``/proc/self/cwd``), with the fix."""
    try:
        return os.getcwd()
    except FileNotFoundError:
        raise gone_cwd() from None


def gone_cwd() -> TTMeshError:
    """The line for a working directory that no longer exists."""
    try:
        where = os.readlink("/proc/self/cwd").removesuffix(DELETED)
    except OSError:
        where = os.environ.get("PWD") or "(unknown)"
    return bad_input(
        f"the working directory {where} no longer exists (it was deleted)",
        "cd to a directory that exists and run the command again",
    )


def cwd_gone() -> bool:
    """Whether this process's working directory was deleted."""
    try:
        os.getcwd()
    except FileNotFoundError:
        return True
    return False
