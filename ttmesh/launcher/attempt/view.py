"""What a view of the attempt is told, and what a drain says.

The guardian tells an observer (the front's live view, through the pipe) what changed since
its last step: ranks started and ready, their last lines, the phase a person sees. That phase
goes through a machine of its own (:data:`ttmesh.states.ATTEMPT_MOVES`): readiness only grows
and a stop is the last phase an attempt shows, so a phase that would move back is a bug.

While a grace runs, the drain says how long is left and what it waits for, in stable words
(docs/recovery.md, "Stopping and draining"): :class:`DrainWords`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from ttmesh.launcher.attempt.events import Observer
from ttmesh.states import ATTEMPT_MOVES, JobPhase, Machine

LINE_WIDTH = 500  # characters of a rank's last line an observer is sent
DRAIN_SAY = 5.0  # seconds between "draining, N s left" lines while a grace runs


class AttemptView:
    """The observer's side of one attempt: what it was told, and the lines not yet sent."""

    def __init__(self, observer: Observer) -> None:
        self.observer = observer
        self.started: set[int] = set()
        self.ready: set[int] = set()
        self.phase: Machine[JobPhase] | None = None  # None: no phase told yet
        self.detail = ""
        self.last_lines: dict[int, str] = {}

    def line(self, rank: int, line: str) -> None:
        if rank >= 0:
            self.last_lines[rank] = line[:LINE_WIDTH]

    def send_lines(self) -> None:
        if self.last_lines:
            last, self.last_lines = self.last_lines, {}
            self.observer.lines(last)

    def checklist(self, rows: list[dict[str, Any]], timeout: float | None) -> None:
        """A server's start, step by step (serving.checklist), and the time it is allowed."""
        told = getattr(self.observer, "checklist", None)
        if told is not None:  # (a view of its own may not draw one)
            told(rows, timeout)

    def exited(self, rank: int, code: int, how: str, stopped: bool) -> None:
        self.send_lines()  # its last lines first
        self.observer.rank_exited(rank, code, how, stopped)

    def report(
        self, pids: dict[int, int], ready: set[int], phase: JobPhase | None, detail: str
    ) -> None:
        """Ranks started (``pids``) and ready since the last report, the lines, the phase
        (None: nothing worth saying), through the view's machine."""
        for rank, pid in sorted(pids.items()):
            if rank not in self.started:
                self.started.add(rank)
                self.observer.rank_started(rank, pid)
        for rank in sorted(ready - self.ready):
            self.ready.add(rank)
            self.observer.rank_ready(rank)
        self.send_lines()
        if phase is None:
            return
        if self.phase is None:
            self.phase = Machine(phase, ATTEMPT_MOVES, "the attempt's view")
        elif (phase, detail) == (self.phase.state, self.detail):
            return
        else:
            self.phase.change_state(phase)
        self.detail = detail
        self.observer.phase(phase, detail)


class DrainWords:
    """What a drain says: "draining, N s left" with what is waited for, when the drain begins,
    when it moves from ranks to their leftovers, and every DRAIN_SAY seconds; the live view's
    detail each second; "grace over: SIGKILL of K processes" at its end."""

    def __init__(self, emit: Callable[[str], None]) -> None:
        self.emit = emit
        self.said = 0.0  # when (monotonic)
        self.kind = ""  # "ranks" still running, or "leftovers" once they ended
        self.detail = ""  # the live view's

    def draining(self, deadline: float, ranks: int, leftovers: int = 0) -> None:
        now = time.monotonic()
        left = max(0.0, deadline - now)
        head = f"draining, {seconds(left)} s left"
        self.detail = f"draining, {math.ceil(left)} s left"  # the view: once a second
        kind = "ranks" if ranks else "leftovers"
        if kind == self.kind and now - self.said < DRAIN_SAY:
            return
        self.kind, self.said = kind, now
        if ranks:
            what = f"{ranks} rank{'s' if ranks != 1 else ''} still running"
        else:
            what = f"{leftovers} leftover process{'es' if leftovers != 1 else ''}"
        self.emit(f"{head} ({what})")

    def grace_over(self, count: int) -> None:
        line = f"grace over: SIGKILL of {count} process{'es' if count != 1 else ''}"
        self.detail = line
        self.emit(line)


def seconds(value: float) -> str:
    """Seconds left as a person reads them, rounded up: "30", "2.5", "0"."""
    if value >= 10:
        return str(math.ceil(value - 1e-9))
    return f"{math.ceil(value * 10 - 1e-9) / 10:.1f}".removesuffix(".0")
