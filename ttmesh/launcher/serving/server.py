"""What the guardian does for a server beyond any worker: watch it become ready (and stay
healthy), say where it answers, show the phase while it starts, and clean what it leaves.

Leftovers are files matching the profile's patterns (SGLang's ``/dev/shm/sglang_loads_*``)
that appeared while the attempt ran, belong to this user and are plain files: what was there
before the attempt is never touched.
"""

from __future__ import annotations

import glob
import os
import stat
import sys
import time

from ttmesh.launcher.serving.spec import ServingSpec
from ttmesh.launcher.serving.watch import Event, Watch

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
        self.before = self._leftovers()

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
                critical=self.spec.profile.critical,
                health_interval=self.spec.health_interval,
                failures=self.spec.health_failures,
            )
            self.watch.start()
        return self.wake_r

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

    def phase(self, listening: bool) -> str:
        phases = self.spec.profile.phases
        return phases.get("listening" if listening else "starting", "starting")

    def progress(self, elapsed: float) -> str | None:
        """A line saying the phase and the time so far, now and then while it starts."""
        now = time.monotonic()
        if now < self.next_progress:
            return None
        self.next_progress = now + self._every()
        minutes, seconds = divmod(int(elapsed), 60)
        return f"{self.name}: {self.phase(self.listening)}: {minutes}m{seconds:02d}s"

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

    def _leftovers(self) -> set[str]:
        return {p for pattern in self.spec.profile.leftovers for p in glob.glob(pattern)}

    def clean(self) -> list[str]:
        """Remove this user's plain files the profile names that appeared during the attempt."""
        removed = []
        for path in sorted(self._leftovers() - self.before):
            try:
                st = os.lstat(path)
                if stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid():
                    os.unlink(path)
                    removed.append(path)
            except OSError:
                continue
        return removed
