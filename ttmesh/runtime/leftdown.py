"""Links a reset left down on purpose, so the next job that needs them resets both ends first.

A reset beside another live job stops at a link between the two that neither job's mesh uses
(``fabric.domains``): that link stays down until both its ends are reset together. The reset
writes it here, ``links-down.json`` in the host's lease directory (the runtime directory every
user's ttmesh shares: ``/run/lock/ttmesh``), so a later pre-flight that finds the link down
names why and the reset that brings it back, and ``ttmesh ls`` shows it. A reset that takes
both ends clears it.

Everyone may write in that directory, so the record is handled as the leases are:

* it is opened relative to the checked directory's descriptor, never through a link
  (``O_NOFOLLOW``), and believed only when it is a regular file owned by root, the directory's
  owner or this user, at most :data:`LIMIT` bytes, in the :data:`SCHEMA` shape (anything
  else reads as no record: a planted file can neither hide a link nor invent one);
* updates are one at a time (an exclusive ``flock`` on the directory, waited for at most
  :data:`LOCK_WAIT`: anyone may hold it, which only delays an update), so two resets that
  finish together both keep what they left down;
* it is replaced whole: a new file (``O_CREAT | O_EXCL | O_NOFOLLOW``, mode 0644) renamed
  over the old one, so no reader sees half a record and nothing is written through a name
  another user planted. Written as root, it is root's.

A record that cannot be written (another user's file in its place, the directory refused) does
not stop the reset: the link is down either way, and pre-flight still refuses a mesh over it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import stat
import time
from collections.abc import Iterable, Iterator
from typing import Any

from ttmesh import fileread
from ttmesh.dataclass import dataclass
from ttmesh.errors import TTMeshError
from ttmesh.paths import SharedDir
from ttmesh.runtime.leases import LeaseHost

NAME = "links-down.json"
SCHEMA = "ttmesh.links-down/1"
LIMIT = 256 * 1024  # bytes read at most (a record of every link of a host is well under it)
MAX_ENTRIES = 1024
LOCK_WAIT = 2.0  # seconds an update waits for another's to end
ASIC_RE = re.compile(r"[0-9a-f]{16}")


@dataclass(frozen=True)
class LeftDown:
    """Links between chips ``a`` and ``b`` (``chans``: (a's, b's) channel) a reset left down
    at ``since`` (unix time), and why (the job whose chip was the far end)."""

    a: str
    b: str
    chans: tuple[tuple[int, int], ...]
    since: float
    why: str

    @property
    def pair(self) -> frozenset[str]:
        return frozenset((self.a, self.b))

    def to_json(self) -> dict[str, Any]:
        return {
            "a": self.a,
            "b": self.b,
            "chans": [list(c) for c in self.chans],
            "since": round(self.since, 3),
            "why": self.why,
        }


def _entry(raw: object) -> LeftDown | None:
    if not isinstance(raw, dict):
        return None
    a, b, chans, since, why = (raw.get(k) for k in ("a", "b", "chans", "since", "why"))
    if not (isinstance(a, str) and isinstance(b, str) and ASIC_RE.fullmatch(a)):
        return None
    if not ASIC_RE.fullmatch(b) or a == b or not isinstance(chans, list) or len(chans) > 64:
        return None
    pairs = []
    for c in chans:
        if not (isinstance(c, list) and len(c) == 2):
            return None
        if not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 64 for x in c):
            return None
        pairs.append((c[0], c[1]))
    if isinstance(since, bool) or not isinstance(since, (int, float)) or not since >= 0:
        return None
    if not isinstance(why, str) or len(why) > 512:
        return None
    return LeftDown(a, b, tuple(pairs), float(since), why)


def _trusted(d: SharedDir) -> set[int]:
    return {0, d.uid, os.geteuid()}


def _read(d: SharedDir) -> list[LeftDown]:
    try:
        fd = os.open(NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=d.fd)
    except OSError:
        return []
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid not in _trusted(d) or st.st_size > LIMIT:
            return []
        data = os.pread(fd, LIMIT + 1, 0)
    except OSError:
        return []
    finally:
        os.close(fd)
    if len(data) > LIMIT:
        return []
    try:
        doc = fileread.load_json(data)
    except ValueError:  # not UTF-8, not JSON, nested too deep (fileread.TooDeep)
        return []
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        return []
    raw = doc.get("links")
    if not isinstance(raw, list) or len(raw) > MAX_ENTRIES:
        return []
    out = []
    for item in raw:
        entry = _entry(item)
        if entry is None:
            return []  # one bad entry: the file is not ttmesh's, none of it is believed
        out.append(entry)
    return out


def read(host: LeaseHost) -> list[LeftDown]:
    """The links recorded as left down on ``host`` ([] when none, or no record to believe)."""
    try:
        d = host.open_lease_dir(create=False)
    except (OSError, TTMeshError):
        return []
    if d is None:
        return []
    with d:
        return _read(d)


def _write(d: SharedDir, entries: list[LeftDown]) -> None:
    if not entries:
        with contextlib.suppress(OSError):
            st = os.stat(NAME, dir_fd=d.fd, follow_symlinks=False)
            if stat.S_ISREG(st.st_mode) and st.st_uid in _trusted(d):
                os.unlink(NAME, dir_fd=d.fd)
        return
    doc = {"schema": SCHEMA, "links": [e.to_json() for e in entries]}
    data = json.dumps(doc, separators=(",", ":")).encode()
    tmp = f".{NAME}.{os.getpid()}.{os.urandom(4).hex()}"  # as secrets.token_hex(4)
    fd = os.open(
        tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=d.fd
    )
    try:
        os.fchmod(fd, 0o644)
        os.write(fd, data)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=d.fd)
        raise
    os.close(fd)
    try:
        os.rename(tmp, NAME, src_dir_fd=d.fd, dst_dir_fd=d.fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=d.fd)
        raise


@contextlib.contextmanager
def _serialized(d: SharedDir) -> Iterator[None]:
    """Two resets updating the record at once: one after the other (an exclusive ``flock``
    on the directory itself, waited for at most :data:`LOCK_WAIT`). Anyone may lock the
    directory: that only delays the update, then it goes ahead unserialized."""
    fd = None
    with contextlib.suppress(OSError):
        fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=d.fd)
    try:
        if fd is not None:
            deadline = time.monotonic() + LOCK_WAIT
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        break
                    time.sleep(0.01)
                except OSError:
                    break
        yield
    finally:
        if fd is not None:
            os.close(fd)


def update(host: LeaseHost, add: Iterable[LeftDown] = (), reset: Iterable[str] = ()) -> str | None:
    """After a reset: forget the links whose both ends were in ``reset`` (asic ids), record
    ``add``. None when done, else why the record could not be written (a note, never fatal)."""
    wanted = list(add)
    done = set(reset)
    try:
        d = host.open_lease_dir(create=bool(wanted))
    except (OSError, TTMeshError) as exc:
        return f"cannot record the links left down: {exc}"
    if d is None:
        return None
    with d, _serialized(d):
        current = _read(d)
        kept = [e for e in current if not (e.a in done and e.b in done)]
        pairs = {e.pair for e in wanted}
        merged = [e for e in kept if e.pair not in pairs] + wanted
        if merged == current:
            return None
        try:
            _write(d, merged)
        except OSError as exc:
            return f"cannot record the links left down in {d.path}/{NAME}: {exc.strerror}"
    return None
