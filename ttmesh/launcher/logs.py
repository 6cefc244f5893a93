"""Workers' output: whole lines, prefixed by rank, never interleaved mid-line.

The supervisor is the only writer to ttmesh's stdout and stderr while a job runs: it reads each
worker's pipes, cuts complete lines and writes each one with a single ``write`` call, prefixed
``[r0]`` (coloured on a terminal). ``--ranks-filter`` limits what reaches the console; per-rank
log files (``--log-dir``) always get everything, without prefixes. The last lines of each stream
are kept for the failure summary.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO

COLOURS = ("36", "33", "35", "32", "34", "31", "96", "93", "95", "92", "94", "91")
MAX_PARTIAL = 64 * 1024
LAUNCHER = -1  # the pseudo-rank of an external launcher's own messages (mpirun)
# The last lines of each stream, kept for the failure summary and to find a known failure line
# (ttmesh.launcher.failures): tt-metal follows its error with a C++ backtrace of dozens of lines.
TAIL_LINES = 100
TAIL_WIDTH = 4096  # characters kept of each line in the tail
TAIL_BYTES = 4 * TAIL_WIDTH  # bytes kept of each line: TAIL_WIDTH characters in any UTF-8


@dataclass
class Stream:
    rank: int
    name: str  # "stdout" | "stderr"
    buffer: bytes = b""
    tail: deque = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    log: IO[bytes] | None = None


class Console:
    def __init__(
        self,
        world: int,
        ranks_filter: set[int] | None = None,
        log_dir: str | None = None,
        quiet: bool = False,
        attempt: int = 0,
        launcher: bool = False,
        offset: int = 0,
    ) -> None:
        self.filter = ranks_filter
        self.quiet = quiet
        self.colour = {
            "stdout": os.isatty(1) and not os.environ.get("NO_COLOR"),
            "stderr": os.isatty(2) and not os.environ.get("NO_COLOR"),
        }
        self.offset = offset  # ranks are shown by their global number (a job over several hosts)
        self.width = len(str(max(offset + world - 1, 0)))
        self.on_line: Callable[[int, str], None] | None = None
        self.streams: dict[tuple[int, str], Stream] = {}
        for rank in (*range(world), *((LAUNCHER,) if launcher else ())):
            for name in ("stdout", "stderr"):
                stream = Stream(rank, name)
                if log_dir:
                    directory = os.path.join(log_dir, f"attempt{attempt}")
                    os.makedirs(directory, exist_ok=True)
                    base = "mpirun" if rank == LAUNCHER else f"rank{rank}"
                    stream.log = open(os.path.join(directory, f"{base}.{name}.log"), "ab")  # noqa: SIM115
                self.streams[(rank, name)] = stream

    def _prefix(self, rank: int, name: str) -> bytes:
        if rank == LAUNCHER:
            return b"[mpirun] "
        tag = f"[r{rank + self.offset}]".ljust(self.width + 3)
        if self.colour[name]:
            tag = f"\x1b[{COLOURS[rank % len(COLOURS)]}m{tag}\x1b[0m"
        return (tag + " ").encode()

    def _emit(self, stream: Stream, lines: list[bytes]) -> None:
        # Whole batches at C speed (a rank printing 100 MB must not cost a Python loop per
        # line): the tail keeps bytes, decoded only when asked for.
        if not lines:
            return
        stream.tail.extend(line[:TAIL_BYTES] for line in lines[-TAIL_LINES:])
        if self.on_line is not None:
            for line in lines:
                self.on_line(stream.rank, line.decode(errors="replace"))
        if stream.log is not None:
            stream.log.write(b"\n".join(lines) + b"\n")
            stream.log.flush()
        hidden = (
            self.filter is not None and stream.rank not in self.filter and stream.rank != LAUNCHER
        )
        if self.quiet or hidden:
            return
        prefix = self._prefix(stream.rank, stream.name)
        data = prefix + (b"\n" + prefix).join(lines) + b"\n"
        fd = 1 if stream.name == "stdout" else 2
        _write_all(fd, data)

    def feed(self, rank: int, name: str, data: bytes) -> None:
        stream = self.streams[(rank, name)]
        stream.buffer += data
        if b"\n" not in stream.buffer and len(stream.buffer) < MAX_PARTIAL:
            return
        *lines, rest = stream.buffer.split(b"\n")
        if len(rest) >= MAX_PARTIAL:
            lines.append(rest)
            rest = b""
        stream.buffer = rest
        self._emit(stream, lines)

    def close(self, rank: int, name: str) -> None:
        stream = self.streams[(rank, name)]
        if stream.buffer:
            self._emit(stream, [stream.buffer])
            stream.buffer = b""

    def tail(self, rank: int, name: str = "stderr") -> list[str]:
        return [
            line.decode(errors="replace")[:TAIL_WIDTH] for line in self.streams[(rank, name)].tail
        ]

    def shutdown(self) -> None:
        for (rank, name), stream in self.streams.items():
            self.close(rank, name)
            if stream.log is not None:
                stream.log.close()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except BlockingIOError:
            continue
        except BrokenPipeError:
            return
        view = view[n:]
