"""Paths ttmesh creates and removes: safe names, private directories, owned run directories.

A name a user gives (a job id) becomes a directory name, so it must not be able to leave its
parent: :func:`safe_name` allows letters, digits, ``.``, ``_`` and ``-``, not starting with
``.``, at most 64 characters. Every directory ttmesh creates is checked to be a real directory
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
from dataclasses import dataclass
from pathlib import Path

from ttmesh.errors import bad_input, from_os_error

NAME_RE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}")
NAME_RULE = "letters, digits, '.', '_' and '-', not starting with '.', at most 64 characters"
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
    if not os.access(parent, os.W_OK | os.X_OK) or (
        os.path.exists(path) and not os.access(path, os.W_OK)
    ):
        where = path if os.path.exists(path) else parent
        raise bad_input(
            f"{flag} {value}: cannot write {where} (owned by {owner_of(str(where))})",
            "give a file you can write",
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


def private_dir(path: Path, hint: str) -> Path:
    """Create ``path`` (and its parents) if needed; it must be a directory of this user's that
    no one else can enter (mode 0700). Refuses (exit 2) a symbolic link or another's directory."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
        st = os.lstat(path)
    except OSError as exc:
        raise bad_input(f"cannot create {path}: {exc.strerror}", hint)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise bad_input(
            f"{path} is not a directory (a symbolic link or a file is in its place)", hint
        )
    if st.st_uid != os.getuid():
        raise bad_input(f"{path} belongs to {_owner(st.st_uid)}, not to you", hint)
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(path, 0o700)
    return path


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
