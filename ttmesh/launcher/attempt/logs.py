"""Workers' output: whole lines, prefixed by rank, never interleaved mid-line.

The supervisor is the only writer to ttmesh's stdout and stderr while a job runs: it reads each
worker's pipes, cuts complete lines and writes each one with a single ``write`` call, prefixed
``[r0]`` (coloured on a terminal; ``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE`` gives torchrun's
own). ``--ranks-filter`` and ``--redirects`` limit what reaches the console; per-rank log files
(``--log-dir``, laid out as torchrun's: :mod:`ttmesh.launcher.planning.logspec`) always get everything,
without prefixes. The last lines of each stream are kept for the failure summary.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from collections import deque
from collections.abc import Callable
from typing import IO

from ttmesh.dataclass import dataclass, field
from ttmesh.launcher.attempt.bringup import BringUp
from ttmesh.launcher.planning.logspec import LogSpec
from ttmesh.runtime.joblogs import AttemptLogs, StreamLog, owner_name
from ttmesh.vocab import LAUNCHER

COLOURS = ("36", "33", "35", "32", "34", "31", "96", "93", "95", "92", "94", "91")
MAX_PARTIAL = 64 * 1024
# The last lines of each stream, kept for the failure summary and to find a known failure line
# (ttmesh.launcher.attempt.failures): tt-metal follows its error with a C++ backtrace of dozens of lines.
TAIL_LINES = 100
TAIL_WIDTH = 4096  # characters kept of each line in the tail
TAIL_BYTES = 4 * TAIL_WIDTH  # bytes kept of each line: TAIL_WIDTH characters in any UTF-8


@dataclass
class Stream:
    """One output stream of a rank: the unfinished line, the last lines, its log file."""

    rank: int
    name: str  # "stdout" | "stderr"
    buffer: bytes = b""
    tail: deque = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    log: IO[bytes] | None = None
    kept: StreamLog | None = None  # the job's own copy (runtime.joblogs), unless --no-logs
    # The name the job's own copy is kept under, until its first bytes make it (None: made,
    # or none kept). A stream that says nothing leaves no files: a launch does not open four
    # files a rank before its ranks start (128 ranks: 512).
    keep_as: str | None = None
    last: bytes | None = None  # the last block of lines when it alone holds the whole tail


class Console:
    def __init__(
        self,
        world: int,
        ranks_filter: frozenset[int] | None = None,
        log_dir: str | None = None,
        quiet: bool = False,
        attempt: int = 0,
        launcher: bool = False,
        offset: int = 0,
        sink: Callable[[int, bytes], None] | None = None,
        spec: LogSpec | None = None,
        local_ranks: dict[int, int] | None = None,
        keep: AttemptLogs | None = None,
    ) -> None:
        """``log_dir``: a directory of ``attemptN/rankR.NAME.log`` files (ttmesh's own probe);
        ``spec`` with a run directory: torchrun's layout instead. ``local_ranks``: each rank's
        local rank, for a prefix template (default: its index). ``keep``: the attempt's files
        in the job's own logs (every stream, bounded: ``ttmesh logs``)."""
        self.filter = ranks_filter
        self.spec = spec
        # Where console bytes go: fd 1 or 2 (a live view takes them to draw above its table).
        self.sink: Callable[[int, bytes], None] = sink or _write_all
        self.quiet = quiet
        self.colour = {
            "stdout": os.isatty(1) and not os.environ.get("NO_COLOR"),
            "stderr": os.isatty(2) and not os.environ.get("NO_COLOR"),
        }
        self.offset = offset  # ranks are shown by their global number (a job over several hosts)
        self.width = len(str(max(offset + world - 1, 0)))
        self.prefixes: dict[int, bytes] = {}
        if spec is not None and spec.template is not None:
            for rank in range(world):
                local = (local_ranks or {}).get(rank, rank)
                self.prefixes[rank] = (spec.prefix(rank + offset, local) or "").encode()
        self.on_line: Callable[[int, str], None] | None = None
        # Each block of whole lines as it is cut (owner, stream, bytes without its last
        # newline): the guardian's live matches (known fatal lines, a server's checklist).
        self.on_block: Callable[[int, str, bytes], None] | None = None
        self.bringup: BringUp | None = None  # the fabric lines each block is searched for
        self.heard = 0.0  # when a rank last printed (monotonic; 0: not yet): --hang-timeout
        self.lost: set[int] = set()  # console fds that could not be written (see _lose)
        self.streams: dict[tuple[int, str], Stream] = {}
        self.keep = keep
        for rank in (*range(world), *((LAUNCHER,) if launcher else ())):
            for name in ("stdout", "stderr"):
                stream = Stream(rank, name)
                if keep is not None:  # by the rank's global number, as its [rN] says
                    stream.keep_as = owner_name(rank + offset if rank >= 0 else rank)
                owner = "mpirun" if rank == LAUNCHER else str(rank)
                fd = spec.open_log(attempt, owner, name) if spec is not None else None
                if fd is not None:
                    stream.log = os.fdopen(fd, "ab")
                elif log_dir:
                    directory = os.path.join(log_dir, f"attempt{attempt}")
                    os.makedirs(directory, exist_ok=True)
                    base = "mpirun" if rank == LAUNCHER else f"rank{rank}"
                    stream.log = open(os.path.join(directory, f"{base}.{name}.log"), "ab")  # noqa: SIM115
                self.streams[(rank, name)] = stream

    def _prefix(self, rank: int, name: str) -> bytes:
        if rank == LAUNCHER:
            return b"[mpirun] "
        if rank in self.prefixes:  # the user's template, as written: torchrun adds nothing
            text = self.prefixes[rank]
            if self.colour[name] and text:
                return f"\x1b[{COLOURS[rank % len(COLOURS)]}m".encode() + text + b"\x1b[0m"
            return text
        tag = f"[r{rank + self.offset}]".ljust(self.width + 3)
        if self.colour[name]:
            tag = f"\x1b[{COLOURS[rank % len(COLOURS)]}m{tag}\x1b[0m"
        return (tag + " ").encode()

    def _emit(self, stream: Stream, block: bytes) -> None:
        """Complete lines (``block`` ends with a newline), at C speed: a rank printing 100 MB
        must not cost a Python object, or a loop step, per line. The tail keeps bytes (its last
        lines only, split from the end), decoded when asked for."""
        body = block[:-1]
        if block.count(b"\n") >= TAIL_LINES:  # this block holds the whole tail: cut it later
            stream.tail.clear()
            stream.last = body
        else:
            self._settle(stream)
            stream.tail.extend(piece[:TAIL_BYTES] for piece in body.split(b"\n"))
        if stream.rank != LAUNCHER:  # a rank's, mpirun's output demultiplexed (not its own)
            self.heard = time.monotonic()
            if self.bringup is not None:
                self.bringup.scan(stream.rank, body)
        if self.on_line is not None:
            for line in body.split(b"\n"):
                self.on_line(stream.rank, line.decode(errors="replace"))
        if stream.keep_as is not None and self.keep is not None:
            stream.kept, stream.keep_as = self.keep.stream(stream.keep_as, stream.name), None
        if stream.kept is not None:  # buffered: flushed by the guardian's clock (flush_kept)
            stream.kept.write(block)
        if self.on_block is not None:
            self.on_block(stream.rank, stream.name, body)
        if stream.log is not None:
            stream.log.write(block)
            stream.log.flush()
        hidden = (
            self.filter is not None and stream.rank not in self.filter and stream.rank != LAUNCHER
        ) or (
            self.spec is not None
            and stream.rank != LAUNCHER
            and not self.spec.on_console(stream.rank, stream.name)
        )
        if self.quiet or hidden:
            return
        fd = 1 if stream.name == "stdout" else 2
        if fd in self.lost:
            return
        prefix = self._prefix(stream.rank, stream.name)
        data = prefix + body.replace(b"\n", b"\n" + prefix) + b"\n"
        try:
            self.sink(fd, data)
        except OSError as exc:
            self._lose(fd, exc)

    def _lose(self, fd: int, exc: OSError) -> None:
        """ttmesh's own stdout or stderr cannot take the ranks' output (a full disk, a closed
        descriptor): said once on stderr (when stdout is the one lost), and that stream's
        console output is dropped from then on. The job goes on (its result is its exit code; ttmesh logs
        JOB keeps every line); a reader that went away (EPIPE) is dropped silently, as before."""
        self.lost.add(fd)
        if exc.errno == errno.EPIPE or fd != 1:  # stderr: nowhere left to say it
            return
        kept = f"ttmesh logs {self.keep.job}" if self.keep is not None else "--log-dir"
        line = (
            f"ttmesh: cannot write the ranks' output to stdout: {exc.strerror or exc} "
            f"(the rest of it is not shown; {kept} keeps every line)\n"
        )
        with contextlib.suppress(OSError):
            _write_all(2, line.encode())

    def feed(self, rank: int, name: str, data: bytes) -> None:
        stream = self.streams[(rank, name)]
        buffer = stream.buffer + data if stream.buffer else data
        cut = buffer.rfind(b"\n") + 1  # 0: no complete line yet
        if len(buffer) - cut >= MAX_PARTIAL:  # an endless line: cut it here
            block, stream.buffer = buffer + b"\n", b""
        else:
            block, stream.buffer = buffer[:cut], buffer[cut:]
        if block:
            self._emit(stream, block)

    def close(self, rank: int, name: str) -> None:
        stream = self.streams[(rank, name)]
        if stream.buffer:
            self._emit(stream, stream.buffer + b"\n")
            stream.buffer = b""

    @staticmethod
    def _settle(stream: Stream) -> None:
        """The tail's lines out of the last big block, if one is kept whole."""
        if stream.last is not None:
            pieces = stream.last.rsplit(b"\n", TAIL_LINES)[-TAIL_LINES:]
            stream.tail.extend(piece[:TAIL_BYTES] for piece in pieces)
            stream.last = None

    def tail(self, rank: int, name: str = "stderr") -> list[str]:
        self._settle(self.streams[(rank, name)])
        return [
            line.decode(errors="replace")[:TAIL_WIDTH] for line in self.streams[(rank, name)].tail
        ]

    def flush_kept(self) -> None:
        """The job's own copy to its files, for a reader (``ttmesh logs --follow``); each stream
        at most every ``joblogs.FLUSH_EVERY`` s."""
        if self.keep is not None:
            self.keep.flush()

    def shutdown(self) -> None:
        for (rank, name), stream in self.streams.items():
            self.close(rank, name)
            if stream.log is not None:
                stream.log.close()
        if self.keep is not None:
            self.keep.close()
            self.keep = None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except BlockingIOError:
            continue
        view = view[n:]
