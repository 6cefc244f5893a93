"""Reading a file that someone else may have put there: regular files only, never blocking, at
most a limit.

A path a user names (``--rank-binding``, a profile, a system file, a capture), a simulated
root's files and a host's driver files can each be a FIFO (``open`` waits forever for a
writer), a device (``/dev/zero`` never ends: reading it fills the memory until the kernel's
OOM killer fires) or a file far larger than its format ever is. Every such read goes through
:func:`read_bytes` (or :func:`read_text`): the path is looked at first (``stat``) so a device or
FIFO is never opened, then opened with ``O_NONBLOCK | O_NOCTTY`` (should it be swapped for a
FIFO meanwhile, the open still returns at once) and checked again on the descriptor (``fstat``:
a regular file, the same one), and at most ``limit`` bytes are read.

STANDARD LIBRARY ONLY, importing nothing of ttmesh: the simulated host's ``bin/tt-smi`` runs
with this file copied next to it (``bin/_ttmesh_fileread.py``) when the venv that made the root
is gone.
"""

from __future__ import annotations

import json
import os
import stat
from typing import Any

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
JSON_DEPTH = 64  # nesting levels of a JSON document read (ttmesh's own nest fewer than 10)

_KINDS = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class Refused(ValueError):
    """A file that is not read: ``why`` completes "<what> <path> ..." (one line)."""

    def __init__(self, path: str, why: str, hint: str) -> None:
        super().__init__(f"{path} {why}")
        self.path = path
        self.why = why
        self.hint = hint


def size_text(n: int) -> str:
    """``n`` bytes for a person: 512 bytes, 4 KiB, 1.5 MiB, 24.0 GiB."""
    if n < KiB:
        return f"{n} bytes"
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= size:
            value = n / size
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{n} bytes"  # pragma: no cover


def over(n: int, limit: int) -> str:
    """``n`` (more than ``limit``) for a person, exact when rounding would hide the excess."""
    unit = next((u for u in (GiB, MiB, KiB) if n >= u), 1)
    return f"{n} bytes" if round(n / unit, 1) * unit <= limit or n < 10 * KiB else size_text(n)


def kind_of(mode: int) -> str | None:
    """What a file of ``mode`` is when it is neither a regular file nor a directory."""
    return next((name for test, name in _KINDS if test(mode)), None)


def _check(path: str, st: os.stat_result, limit: int, what: str) -> None:
    if stat.S_ISDIR(st.st_mode):
        raise Refused(path, "is a directory, not a file", "give a file")
    if not stat.S_ISREG(st.st_mode):
        kind = kind_of(st.st_mode) or "not a regular file"
        raise Refused(path, f"is {kind}, not a regular file", "give a regular file")
    if st.st_size > limit:
        raise Refused(
            path,
            f"is {over(st.st_size, limit)}: more than the {size_text(limit)} a {what} can be",
            f"a {what} is at most {size_text(limit)}: check that this is the right file",
        )


def open_regular(
    path: str | os.PathLike[str], limit: int, what: str = "file", within: str | None = None
) -> int:
    """A read-only descriptor on the regular file ``path`` (links followed) of at most
    ``limit`` bytes; :class:`Refused` for anything else, ``OSError`` when it cannot be opened.
    Never blocks (a FIFO is refused, not opened for reading) and never opens a device.
    ``within`` (a resolved directory): the file opened must lie inside it, whatever links led
    there (a host's root: a link another user planted in their simulated host never makes
    ttmesh read a file of the machine's)."""
    return _open(os.fspath(path), limit, what, within)[0]


def _open(
    name: str, limit: int, what: str, within: str | None = None
) -> tuple[int, os.stat_result]:
    _check(name, os.stat(name), limit, what)
    fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        _check(name, st, limit, what)  # swapped meanwhile? (a regular file ignores O_NONBLOCK)
        if within is not None and within != "/":
            _inside(name, fd, within)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def _inside(name: str, fd: int, within: str) -> None:
    """Refuse the open file ``fd`` unless it lies inside directory ``within``: the kernel's
    own name for it (``/proc/self/fd``), which no link or rename can fake."""
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        real = os.path.realpath(name)  # no /proc: the path as it resolves now
    if not real.startswith(within.rstrip("/") + "/"):
        raise Refused(
            name,
            f"leads out of {within} (to {real})",
            f"a file of {within} must lie inside it: remove the link",
        )


def read_bytes(
    path: str | os.PathLike[str], limit: int, what: str = "file", within: str | None = None
) -> bytes:
    """The whole regular file ``path``: at most ``limit`` bytes (a file that grows past it
    while being read, or a kernel file whose size says 0 or 4096 whatever it holds, is refused
    at the limit too). ``within``: as :func:`open_regular`."""
    fd, st = _open(os.fspath(path), limit, what, within)
    # Read what the file says it holds (plus one byte, to see it end) in one go; a kernel file
    # says 0 or 4096 whatever it holds, so go on in blocks up to the limit.
    block = max(st.st_size + 1, 64 * KiB)
    try:
        chunks = []
        left = limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, block))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > limit:
        name = os.fspath(path)
        raise Refused(
            name,
            f"holds more than the {size_text(limit)} a {what} can be",
            f"a {what} is at most {size_text(limit)}: check that this is the right file",
        )
    return data


def read_text(
    path: str | os.PathLike[str], limit: int, what: str = "file", within: str | None = None
) -> str:
    """:func:`read_bytes` as UTF-8 text; bytes that are not UTF-8 are :class:`Refused`."""
    data = read_bytes(path, limit, what, within)
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        raise Refused(
            os.fspath(path),
            f"is not UTF-8 text (byte {exc.start} is {data[exc.start]:#04x})",
            f"give a text file: a {what} is text",
        ) from None


class TooDeep(ValueError):
    """A JSON document nested deeper than the bound (its message completes "<what> ...")."""


def load_json(data: str | bytes, depth: int = JSON_DEPTH) -> Any:
    """Parse JSON that someone else may have written. Python's parser recurses once per level:
    a few KiB of ``[`` end it with ``RecursionError``, which no ``except ValueError`` of a
    caller catches. Here a document nested deeper than ``depth`` levels (``[]`` is one) is
    :class:`TooDeep`, a ``ValueError``, as malformed text is; the size is the caller's bound
    (the bytes it read)."""
    try:
        doc = json.loads(data)
    except RecursionError:
        raise TooDeep(f"nests deeper than {depth} levels") from None
    todo: list[tuple[Any, int]] = [(doc, 1)] if isinstance(doc, (dict, list)) else []
    while todo:  # iteratively: the walk must not recurse either
        value, level = todo.pop()
        children = value.values() if isinstance(value, dict) else value
        if level > depth:
            raise TooDeep(f"nests deeper than {depth} levels")
        todo.extend((c, level + 1) for c in children if isinstance(c, (dict, list)))
    return doc
