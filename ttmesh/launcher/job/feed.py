"""A replica's job tells its fleet how it stands: one JSON line per change, on a pipe.

A fleet (``launcher.fleet.run``) starts each replica as a child ``ttmesh launch --fleet-of
FLEET --events-fd N``, N the write end of a pipe the fleet made and passed down (and nothing
else: never a path, never the child's output). The child's front writes there, through the
observer interface every view of a job hears (``attempt.events.Observer``), one line per state
change, ``ttmesh.fleet-event/1`` (docs/conventions.md, "JSON"):

    starting {attempt}            an attempt's guardian is about to start its ranks
    ready {attempt, url, after}   the server answers its health check (after: s since starting)
    down {attempt, why}           the attempt stops serving: it is being stopped, or a rank ended
    recovering {attempt, chips}   after the attempt: the job's chips are checked
    reset {attempt, chips}        the job's chips are being reset (tt-smi -r)
    restarting {attempt}          attempt ``attempt`` (from 0) starts after the restart's wait
    ended {code}                  the job is over, with its exit code

So the fleet follows what the job decided, not its output: a server that prints ttmesh's ready
line is not ready, and ``--quiet`` or a reworded message changes nothing. The reader
(:func:`read_events`) takes lines of at most :data:`MAX_LINE` bytes that are one of these shapes
and says every other line in one line of its own, ignoring it.
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Callable
from typing import Any

from ttmesh.errors import bad_input
from ttmesh.launcher.attempt.events import Observer, send_or_close, write_all
from ttmesh.states import JobPhase

SCHEMA = "ttmesh.fleet-event/1"
MAX_LINE = 4096  # bytes of one event line, its newline included; longer is junk
# Each event's fields beyond ``schema`` and ``event``, and the types they must have.
SHAPES: dict[str, dict[str, tuple[type, ...]]] = {
    "starting": {"attempt": (int,)},
    "ready": {"attempt": (int,), "url": (str,), "after": (int, float)},
    "down": {"attempt": (int,), "why": (str,)},
    "recovering": {"attempt": (int,), "chips": (list,)},
    "reset": {"attempt": (int,), "chips": (list,)},
    "restarting": {"attempt": (int,)},
    "ended": {"code": (int,)},
}


def open_channel(fd: int) -> int:
    """The fd of ``--events-fd``, checked: an open pipe this user made, that can be written.
    It is kept from every process the job starts (not inheritable): only the front writes."""
    try:
        info = os.fstat(fd)
        import fcntl

        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    except (OSError, ValueError, OverflowError):
        raise bad_input(
            f"--events-fd {fd}: no such open file",
            "it is for ttmesh's own fleet (--replicas N), which sets it",
        ) from None
    if not stat.S_ISFIFO(info.st_mode) or info.st_uid != os.geteuid():
        raise bad_input(
            f"--events-fd {fd}: not a pipe of this user's",
            "it is for ttmesh's own fleet (--replicas N), which sets it",
        )
    if flags & os.O_ACCMODE not in (os.O_WRONLY, os.O_RDWR):
        raise bad_input(
            f"--events-fd {fd}: not open for writing",
            "it is for ttmesh's own fleet (--replicas N), which sets it",
        )
    os.set_inheritable(fd, False)
    return fd


class Feed:
    """The job's observer that writes its events to the fleet's pipe; everything it hears is
    passed on to ``inner`` (a live view), or, without one, the console's bytes are written as
    there were no observer. The fleet gone (a broken pipe), it writes no more events."""

    def __init__(self, fd: int, url: str | None, chips: list[str], inner: Observer | None) -> None:
        self.fd = fd
        self.url = url or ""
        self.chips = list(chips)
        self.inner = inner
        self.lost = False
        self.attempt_no = -1  # none started yet
        self.began = 0.0  # when the attempt started (monotonic)
        self.told: set[tuple[str, int]] = set()  # (event, attempt): each said once
        self.done = False

    def emit(self, event: str, **fields: Any) -> None:
        """One event, one line (never more than MAX_LINE: a field is cut to fit)."""
        if self.lost:
            return
        line = json.dumps({"schema": SCHEMA, "event": event, **fields}) + "\n"
        if len(line.encode()) > MAX_LINE:
            for key in ("why", "url"):
                if isinstance(fields.get(key), str):
                    fields[key] = fields[key][:200]
            line = json.dumps({"schema": SCHEMA, "event": event, **fields})[: MAX_LINE - 2] + "\n"
        if not send_or_close(self.fd, line.encode()):
            self.lost = True

    def _once(self, event: str, attempt: int, **fields: Any) -> None:
        if (event, attempt) not in self.told:
            self.told.add((event, attempt))
            self.emit(event, attempt=attempt, **fields)

    def ended(self, code: int) -> None:
        """The job's exit code, once (the launch calls it as the job returns or refuses)."""
        if not self.done:
            self.done = True
            self.emit("ended", code=code)

    # -- the observer

    def phase(self, phase: JobPhase, detail: str = "") -> None:
        now, after = self.attempt_no, round(time.monotonic() - self.began, 3)
        if phase is JobPhase.READY:
            self._once("ready", now, url=self.url, after=after)
        elif phase is JobPhase.STOPPING:
            self._once("down", now, why=detail or "stopping")
        elif phase is JobPhase.RECOVERING:  # after attempt ``now``
            self._once("recovering", now, chips=self.chips)
            if detail == "resetting the chips":
                self._once("reset", now, chips=self.chips)
        elif phase is JobPhase.RESETTING:  # pre-flight's --auto-reset, before the next attempt
            self._once("reset", now + 1, chips=self.chips)
        elif phase is JobPhase.RESTARTING:  # the wait before the next attempt
            self._once("restarting", now + 1)
        if self.inner is not None:
            self.inner.phase(phase, detail)

    def attempt(self, attempt: int) -> None:
        if attempt != self.attempt_no:
            self.attempt_no, self.began = attempt, time.monotonic()
            self.emit("starting", attempt=attempt)
        if self.inner is not None:
            self.inner.attempt(attempt)

    def rank_started(self, rank: int, pid: int) -> None:
        if self.inner is not None:
            self.inner.rank_started(rank, pid)

    def rank_ready(self, rank: int) -> None:
        if self.inner is not None:
            self.inner.rank_ready(rank)

    def rank_exited(self, rank: int, code: int, how: str, stopped: bool) -> None:
        if not stopped:  # ended by itself: it serves no more, whatever comes next
            self._once("down", self.attempt_no, why=f"rank {rank} {how}")
        if self.inner is not None:
            self.inner.rank_exited(rank, code, how, stopped)

    def lines(self, last: dict[int, str]) -> None:
        if self.inner is not None:
            self.inner.lines(last)

    def checklist(self, rows: list[dict[str, Any]], timeout: float | None) -> None:
        if self.inner is not None:
            self.inner.checklist(rows, timeout)

    def output(self, fd: int, data: bytes) -> None:
        if self.inner is not None:
            self.inner.output(fd, data)
        else:
            write_all(fd, data)

    def tick(self) -> None:
        if self.inner is not None:
            self.inner.tick()


def parse(raw: bytes) -> dict[str, Any] | str:
    """One line of the channel: the event, or why it is none (said by the reader)."""
    if len(raw) > MAX_LINE:
        return f"a line over {MAX_LINE} bytes"
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        return f"not JSON: {_shown(raw)}"
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        return f"not a {SCHEMA} object: {_shown(raw)}"
    shape = SHAPES.get(data.get("event"))  # type: ignore[arg-type]
    if shape is None:
        return f"no such event: {_shown(raw)}"
    for key, types in shape.items():
        value = data.get(key)
        if not isinstance(value, types) or isinstance(value, bool):
            return f"{data['event']} without a valid {key}: {_shown(raw)}"
    return data


def _shown(raw: bytes) -> str:
    text = raw.decode(errors="replace").strip()
    return repr(text[:80] + ("..." if len(text) > 80 else ""))


def read_events(
    fd: int, on_event: Callable[[dict[str, Any]], None], on_junk: Callable[[str], None]
) -> None:
    """Read the channel until every writer has closed it: each event to ``on_event``, why
    each other line is ignored to ``on_junk``. A line longer than MAX_LINE is skipped whole
    (read on to its newline, never kept)."""
    with os.fdopen(fd, "rb") as stream:
        while raw := stream.readline(MAX_LINE + 1):
            if len(raw) > MAX_LINE and not raw.endswith(b"\n"):
                while (more := stream.readline(MAX_LINE)) and not more.endswith(b"\n"):
                    pass  # the rest of the overlong line
                on_junk(f"a line over {MAX_LINE} bytes")
                continue
            got = parse(raw.rstrip(b"\n"))
            if isinstance(got, str):
                on_junk(got)
            else:
                on_event(got)


__all__ = ["MAX_LINE", "SCHEMA", "Feed", "open_channel", "parse", "read_events"]
