"""ttmesh's own stdout and stderr, and what it means when they cannot be written.

A command's output is its result: ``ttmesh ls > /dev/full`` or ``ttmesh ls >&-`` that exits 0
(or with Python's "Exception ignored" and a traceback at exit) tells a script it has a listing
it never got. :func:`install` (called by the entry point, never by an in-process ``run``)
guards both streams:

* a descriptor 0, 1 or 2 that is closed is opened on ``/dev/null`` read-only, so a write to it
  still fails (EBADF, as to a closed descriptor) but no file ttmesh opens later (a lease, the
  simulated host's state) can take its number and receive what was meant for the terminal;
* a write to stdout that fails raises :class:`StreamError` (an OSError naming the stream), which
  the entry point turns into one line on stderr and :data:`OUTPUT_FAILED` (74, EX_IOERR of
  sysexits.h); a reader that went away (EPIPE: ``ttmesh ls | head -1``) ends ttmesh quietly
  with :data:`PIPE_GONE` (141 = 128 + SIGPIPE, what a Unix tool killed by SIGPIPE gives);
* a write to stderr that fails is remembered, never raised (a message about the job must not
  stop the job), and makes a command that succeeded end with :data:`OUTPUT_FAILED`;
* once ``launch`` starts a job (:data:`job_code`), the exit code is the job's: what could not
  be written is said where it can be, a job that succeeded still exits 0.

The streams keep the buffering the interpreter chose (line-buffered on a terminal, write-through
under ``PYTHONUNBUFFERED``, block-buffered in a pipe), so output is what it was, byte for byte.
"""

from __future__ import annotations

import errno
import io
import os
import signal
import sys
from typing import Any

OUTPUT_FAILED = 74  # EX_IOERR: ttmesh's own stdout or stderr could not be written
PIPE_GONE = 128 + signal.SIGPIPE  # 141: the reader of stdout went away

# The first failure of each stream (name -> the OSError), for the exit code and one line.
failures: dict[str, OSError] = {}
# Set once a launch starts its job: the job's code is the exit code then (its lost console or
# messages are said, never turned into 74; a job that succeeded succeeded).
job_code = False
_originals: list[Any] = []  # the interpreter's own streams, kept so they never close fd 1 or 2


class StreamError(OSError):
    """A write to ttmesh's own stdout failed; ``stream`` names it."""

    def __init__(self, stream: str, exc: OSError) -> None:
        super().__init__(exc.errno, exc.strerror or str(exc))
        self.stream = stream


class _Raw(io.FileIO):
    """fd 1 or 2, never closed by ttmesh; every write complete, or a failure named."""

    def __init__(self, fd: int, stream: str) -> None:
        super().__init__(fd, "w", closefd=False)
        self.stream = stream

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        done = 0
        try:
            while done < len(view):
                n = super().write(view[done:])
                if n is None:  # non-blocking and full: let the buffer keep the rest
                    return done
                done += n
        except BlockingIOError:
            raise
        except OSError as exc:
            failures.setdefault(self.stream, exc)
            if self.stream == "stdout":
                raise StreamError(self.stream, exc) from None
            return len(view)  # stderr: remembered, dropped
        return done


def _guard_descriptors() -> None:
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDONLY)  # the lowest free number: fd itself
            if null != fd:
                os.dup2(null, fd)
                os.close(null)


def _stream(fd: int, name: str, original: Any) -> io.TextIOWrapper:
    """A text stream on ``fd`` buffered as the interpreter's ``original`` was (None: fd was
    closed when Python started, so it made none)."""
    raw = _Raw(fd, name)
    if original is not None:
        unbuffered = isinstance(getattr(original, "buffer", None), io.FileIO)
        line_buffering = bool(original.line_buffering)
        write_through = bool(getattr(original, "write_through", False))
        encoding, errors = original.encoding, original.errors
    else:
        unbuffered = write_through = bool(os.environ.get("PYTHONUNBUFFERED"))
        line_buffering = raw.isatty() or name == "stderr"
        encoding, errors = "utf-8", "backslashreplace" if name == "stderr" else "strict"
    buffer: Any = raw if unbuffered else io.BufferedWriter(raw)
    return io.TextIOWrapper(
        buffer,
        encoding=encoding,
        errors=errors,
        line_buffering=line_buffering,
        write_through=write_through,
    )


def install() -> None:
    """Guard fds 0-2 and put stdout and stderr behind :class:`_Raw` (see the module's doc)."""
    _guard_descriptors()
    _originals.extend((sys.stdout, sys.stderr))
    for fd, name in ((1, "stdout"), (2, "stderr")):
        original = getattr(sys, name)
        if original is not None:
            try:
                original.flush()
            except (OSError, ValueError):
                pass
        stream = _stream(fd, name, original)
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def message(exc: OSError, stream: str) -> str:
    """The one line for a stream that cannot be written (without the ``ttmesh: `` prefix)."""
    if exc.errno == errno.EBADF:
        return f"cannot write to {stream}: it is closed (give it a file, or > /dev/null)"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"cannot write to {stream}: {exc.strerror} (free some space, or write elsewhere)"
    return f"cannot write to {stream}: {exc.strerror or exc}"


def pipe_gone(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno == errno.EPIPE


def settle(code: int) -> int:
    """The exit code once output is flushed: a command that succeeded but whose output (or
    messages) could not be written ends with :data:`OUTPUT_FAILED`, or quietly with
    :data:`PIPE_GONE` when a reader went away; a command that failed keeps its own code. The
    first failure of stdout is said in one line on stderr, while stderr still works."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass  # recorded by _Raw
    out, err = failures.get("stdout"), failures.get("stderr")
    first = out or err
    if first is None:
        return code
    if pipe_gone(first):
        return code or PIPE_GONE
    if out is not None and err is None:
        _say(message(out, "stdout"))
    return code if job_code else code or OUTPUT_FAILED


def _say(line: str) -> None:
    try:
        os.write(2, f"ttmesh: {line}\n".encode())
    except OSError:
        pass


def live_enabled(stream: Any, no_live: bool = False) -> bool:
    """Draw a live view on ``stream``? Only on a terminal, and not asked otherwise (here, not
    in ``cli.live``: a launch whose output is not a terminal never imports the views)."""
    if no_live or os.environ.get("CI") or os.environ.get("TERM") == "dumb":
        return False
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False
