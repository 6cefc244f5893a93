"""What a view of a running job hears: phases, ranks starting and ending, their last lines.

The launcher reports to one small interface, :class:`Observer`, and knows nothing of how (or
whether) it is drawn; the live table of ``ttmesh launch`` on a terminal (``ttmesh.cli.live``)
is one. Without an observer (``--no-live``, a pipe, ``CI``) nothing here runs and the console
is what it always was: rank-prefixed lines.

Two processes report. The front (the ``ttmesh`` process) reports the phases around attempts
(checking the fabric, resetting, recovering, restarting, done) to the observer directly. The
guardian, forked for each attempt, reports the attempt's phases, its ranks, their lines and the
console's output through a pipe (:class:`EventWriter`), which the front reads and hands to
the observer (:class:`EventReader`); so one process owns the terminal for the job's whole life.
If the front is gone (killed), the guardian's writer falls back to writing the output itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
from typing import Any, Protocol

from ttmesh.states import JobPhase


class Observer(Protocol):
    """Hears a job's life. Every method is called in the front, and must not raise."""

    def phase(self, phase: JobPhase, detail: str = "") -> None:
        """The job entered ``phase`` (``detail``: a few words more, e.g. the exit code)."""

    def attempt(self, attempt: int) -> None:
        """Attempt ``attempt`` (0 first) is about to start: its guardian is forked right after
        this returns, so the observer may run no thread of its own past it."""

    def rank_started(self, rank: int, pid: int) -> None:
        """A rank's process is known (``rank`` counts from 0 on this host)."""

    def rank_ready(self, rank: int) -> None:
        """A rank said it is ready."""

    def rank_exited(self, rank: int, code: int, how: str, stopped: bool) -> None:
        """A rank ended (``stopped``: ttmesh had signalled it)."""

    def lines(self, last: dict[int, str]) -> None:
        """The last line of output each rank printed since the previous call."""

    def checklist(self, rows: list[dict[str, Any]], timeout: float | None) -> None:
        """A server's start, step by step (``serving.checklist.Row.to_json``: key, label,
        state planned | active | done | skipped, started and seconds since the attempt began,
        detail), and the time it is allowed (--ready-timeout; None: no limit)."""

    def output(self, fd: int, data: bytes) -> None:
        """Bytes for the console (``fd`` 1 or 2): prefixed worker lines, ttmesh's messages."""

    def tick(self) -> None:
        """Nothing happened for a while (about 20 times a second while ranks run)."""


# --------------------------------------------------------------------------- the pipe

OUTPUT, EVENT = b"o", b"e"
HEADER = struct.Struct("!cI")
# The guardian's events the front passes on, and nothing else.
EVENTS = ("phase", "rank_started", "rank_ready", "rank_exited", "lines", "checklist")


class EventWriter:
    """The guardian's observer: each event a frame on the pipe to the front (the guardian
    gathers lines and sends the last of each rank once per step).

    When the front is gone (a broken pipe), output is written to the console directly, as
    without a view, and events are dropped."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.lost = False

    def _send(self, kind: bytes, payload: bytes) -> bool:
        if self.lost:
            return False
        if not send_or_close(self.fd, HEADER.pack(kind, len(payload)) + payload):
            self.lost = True
            return False
        return True

    def close(self) -> None:
        """No more events (the attempt's result is handed over): the front's relay ends."""
        if not self.lost:
            self.lost = True
            with contextlib.suppress(OSError):
                os.close(self.fd)

    def _event(self, name: str, *args: Any) -> None:
        self._send(EVENT, json.dumps([name, *args]).encode())

    def phase(self, phase: JobPhase, detail: str = "") -> None:
        self._event("phase", str(phase), detail)

    def attempt(self, attempt: int) -> None:
        """Only the front starts attempts."""

    def rank_started(self, rank: int, pid: int) -> None:
        self._event("rank_started", rank, pid)

    def rank_ready(self, rank: int) -> None:
        self._event("rank_ready", rank)

    def rank_exited(self, rank: int, code: int, how: str, stopped: bool) -> None:
        self._event("rank_exited", rank, code, how, stopped)

    def lines(self, last: dict[int, str]) -> None:
        self._event("lines", {str(r): t for r, t in last.items()})

    def checklist(self, rows: list[dict[str, Any]], timeout: float | None) -> None:
        self._event("checklist", rows, timeout)

    def output(self, fd: int, data: bytes) -> None:
        if not self._send(OUTPUT, bytes([fd]) + data):
            write_all(fd, data)

    def tick(self) -> None:
        """The front ticks its own observer."""


class EventReader:
    """The front's end of the pipe: frames in, calls on the observer out."""

    def __init__(self, observer: Observer) -> None:
        self.observer = observer
        self.buffer = b""

    def feed(self, data: bytes) -> None:
        self.buffer += data
        at = 0
        while len(self.buffer) - at >= HEADER.size:
            kind, size = HEADER.unpack_from(self.buffer, at)
            end = at + HEADER.size + size
            if len(self.buffer) < end:
                break
            payload = self.buffer[at + HEADER.size : end]
            at = end
            if kind == OUTPUT:
                self.observer.output(payload[0], payload[1:])
            elif kind == EVENT:
                self._dispatch(payload)
        self.buffer = self.buffer[at:]

    def _dispatch(self, payload: bytes) -> None:
        try:
            name, *args = json.loads(payload)
        except ValueError:
            return
        if name not in EVENTS:
            return
        if name == "phase":
            self.observer.phase(JobPhase(args[0]), args[1])
        elif name == "lines":
            self.observer.lines({int(r): t for r, t in args[0].items()})
        else:
            told = getattr(self.observer, name, None)  # (a view may not draw a checklist)
            if told is not None:
                told(*args)


def send_or_close(fd: int, data: bytes) -> bool:
    """All of ``data`` to the pipe ``fd``; False, the fd closed, when its reader is gone (an
    event channel that cannot be written is lost for good: nothing is retried on it)."""
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view) :]
    except OSError:
        with contextlib.suppress(OSError):
            os.close(fd)
        return False
    return True


def write_all(fd: int, data: bytes) -> None:
    """All of ``data`` to ``fd`` (a non-blocking terminal included); a closed one drops it."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            continue
        except OSError:
            return
