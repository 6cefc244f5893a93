"""What the guardian does for a server beyond any worker: watch it become ready (and stay
healthy), say where it answers, show the phase while it starts, and clean what it leaves.

Leftovers are files matching the profile's patterns (SGLang's ``/dev/shm/sglang_loads_*``, and
the POSIX semaphores of Python's multiprocessing, ``/dev/shm/sem.mp-*``) that appeared while the
attempt ran, are plain files of this user that no one else may open (mode 0600, as Python and
SGLang make them) and that no live process of this user maps or holds open: what was there
before the attempt, and what another program of yours still uses, is never touched.

Why semaphores: each SGLang scheduler (one per TP rank) holds one (a multiprocessing lock),
which is unlinked when the scheduler ends cleanly (its finalizer), or by multiprocessing's
resource tracker (a child of SGLang's main process) when it notices the end. When a scheduler
dies, SGLang's SIGQUIT handler SIGKILLs its whole tree, the tracker with it, and then itself:
neither runs, with ttmesh or without it; a drain cut short by the grace's SIGKILL is the same.
Once the tree is gone nothing can use them (their names were its own), so ttmesh unlinks them.
"""

from __future__ import annotations

import os
import sys
import time

from ttmesh.launcher.serving.checklist import Checklist, Row, Step
from ttmesh.launcher.serving.spec import ServingSpec
from ttmesh.launcher.serving.watch import Event, Watch
from ttmesh.patterns import Matcher
from ttmesh.render import clock

PROGRESS_EVERY = 15.0  # seconds between phase lines while a server starts (terminal)
PROGRESS_EVERY_PIPED = 60.0


class Server:
    def __init__(self, spec: ServingSpec) -> None:
        self.spec = spec
        self.name = spec.profile.name
        self.watch: Watch | None = None
        self.wake_r = self.wake_w = -1
        self.listening = False
        self.started = time.monotonic()
        self.next_progress = self.started + self._every()
        # Its start as a checklist, from its own lines (until it is ready), and one pattern of
        # them all: a block of output none of them is in is never split into lines.
        self.checklist = Checklist(spec.profile.steps(), self.started)
        self.any_line = _any(spec.profile.steps())
        self.is_ready = False

    def start(self, pid: int) -> int:
        """Start watching the server ``pid``; the fd to select on for its events."""
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        url = self.spec.health_url
        if url is not None:
            self.watch = Watch(
                url,
                pid,
                self.wake_w,
                where=(self.spec.host, self.spec.port),
                critical=self.spec.profile.critical,
                health_interval=self.spec.health_interval,
                failures=self.spec.health_failures,
                probe=self._probe(),
            )
            self.watch.start()
        return self.wake_r

    def _probe(self) -> tuple[str, bytes, float, float] | None:
        """The hung-but-healthy probe (--probe-interval), from the profile's ``probe``."""
        probe = self.spec.profile.probe
        if self.spec.probe_interval is None or not probe:
            return None
        url = self.spec.url + probe["path"]
        return url, probe["body"].encode(), self.spec.probe_interval, self.spec.probe_timeout

    def events(self) -> list[Event]:
        try:
            os.read(self.wake_r, 4096)
        except BlockingIOError:
            pass
        out = []
        while self.watch is not None and self.watch.events:
            event = self.watch.events.popleft()
            if event.kind == "listening":
                self.listening = True
            out.append(event)
        return out

    def not_ready(self) -> str:
        """Why it is not ready yet (its watch's last word), "" without a watch."""
        return self.watch.not_ready() if self.watch is not None else ""

    def phase(self, listening: bool) -> str:
        """What it is doing: the checklist's step, else what its socket says."""
        row = self.checklist.current
        if row is not None:
            return row.step.label
        phases = self.spec.profile.phases
        return phases.get("listening" if listening else "starting", "starting")

    def progress(self, elapsed: float) -> str | None:
        """A line saying what it does and the time so far, now and then while it starts."""
        now = time.monotonic()
        if now < self.next_progress:
            return None
        self.next_progress = now + self._every()
        where = self.checklist.where(now) or self.phase(self.listening)
        allowed = f" of {clock(self.spec.ready_timeout)} allowed" if self.spec.ready_timeout else ""
        return f"{self.name}: {where} ({clock(elapsed)}{allowed})"

    def scan(self, block: bytes, now: float) -> list[Row]:
        """A block of its output while it starts: the checklist's rows it finished."""
        if self.is_ready or not self.checklist or self.any_line is None:
            return []
        if self.any_line.search(block) is None:
            return []
        done: list[Row] = []
        for raw in block.split(b"\n"):
            if self.any_line.search(raw) is not None:
                done += self.checklist.feed(raw.decode(errors="replace"), now)
        return done

    def became_ready(self, now: float) -> list[Row]:
        """It answers: the step it was in is done, and its lines are read no more."""
        self.is_ready = True
        return self.checklist.ready(now)

    def stuck(self, now: float) -> str:
        """The step a start is stuck in and for how long (for a ready timeout's line)."""
        return self.checklist.where(now)

    def _every(self) -> float:
        return PROGRESS_EVERY if sys.stderr.isatty() else PROGRESS_EVERY_PIPED

    def close(self) -> None:
        if self.watch is not None:
            self.watch.stop()
        for fd in (self.wake_r, self.wake_w):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.wake_r = self.wake_w = -1


def _any(steps: tuple[Step, ...]) -> Matcher | None:
    """One RE2 pattern of every line a checklist reads (per line: ``(?m)``), or None."""
    from ttmesh.patterns import compile_pattern

    found = [m.pattern for s in steps for m in (*s.start, *s.end, *(d.match for d in s.details))]
    if not found:
        return None
    return compile_pattern("(?m)" + "|".join(f"(?:{p})" for p in found))
