"""Watching a server: ready when its health endpoint answers 200, healthy while it keeps doing
so, and alive while every process of its tree that matters is.

SGLang can print its ready line before its port listens, so readiness is the endpoint, never
the log; and an answer counts only when it comes from the server itself: every socket listening
where the probe connects must belong to its process tree (:mod:`.listeners`), else another
process on the port (someone else's server, one of yours left over) would make it look ready
while it fails to bind. A server's ``/health`` may take a second (SGLang runs a one-token
generation), so the watch runs in a thread of the guardian and reports through a pipe the
guardian's loop selects on; it never blocks the loop. It also watches the processes whose
command lines start with the profile's ``critical`` names (SGLang renames its schedulers
``sglang::scheduler``), each from when it appears: one of them dying after ready while the
server's main process lives is a failure (a health endpoint can still answer then). Those it
follows are the guardian's to ask too (:meth:`Watch.ended`): a scheduler killed with the
fabric open takes the links between the job's chips down, and the chip watch leaves that to
this watch's verdict.
"""

from __future__ import annotations

import collections
import os
import threading
import time
import urllib.error
import urllib.request

from ttmesh import procs
from ttmesh.dataclass import dataclass
from ttmesh.render import plural

STARTING, LISTENING, READY, UNHEALTHY, DIED = "starting", "listening", "ready", "unhealthy", "died"
HUNG = "hung"  # a one-token generation got no answer in time (--probe-interval), /health or not
FOREIGN = "foreign"  # the port answers, but not from the server's tree (not an end: it waits on)
PROBE_EVERY = 0.5  # seconds between probes until ready
CRITICAL_EVERY = 0.25  # seconds between looks at the critical processes
HEALTH_TIMEOUT = 20.0  # as SGLANG_HEALTH_CHECK_TIMEOUT
# A server that fails kills its own schedulers, then exits with its own code; this long after a
# critical process is gone the server's main process must have ended too, or the server lives
# on without it (a scheduler killed from outside) and that is the failure.
SETTLE = 2.0


@dataclass(frozen=True)
class Event:
    kind: str  # listening | foreign | ready | unhealthy | died
    detail: str = ""
    at: float = 0.0


# Every request ttmesh makes of a server or a router goes to a loopback address it chose: never
# through a proxy the environment names (http_proxy), which would answer for the server or not
# at all (a server then never "ready" is killed at --ready-timeout).
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def probe(url: str, timeout: float) -> int | None:
    """The HTTP status of GET ``url``; None when nothing answers."""
    try:
        with DIRECT.open(url, timeout=timeout) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (urllib.error.URLError, OSError, ValueError):
        return None


def generate(url: str, body: bytes, timeout: float) -> str:
    """POST ``body`` to ``url``: "answered" (any HTTP answer, its body read, within ``timeout``
    in all), "timeout" (none within it), or "refused" (no connection: the server's end is for
    others to see). A socket's timeout is per read, so a server that drips its answer a byte at
    a time would never time out: a timer cuts the connection at the deadline instead."""
    import http.client
    import socket
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    # Direct, never through a proxy the environment names (as DIRECT).
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=timeout)
    deadline = time.monotonic() + timeout

    def cut() -> None:
        sock = conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # the blocked read returns at once
            except OSError:
                pass

    timer = threading.Timer(timeout, cut)
    timer.daemon = True
    timer.start()
    try:
        conn.request("POST", path, body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        response.read(65536)
        if time.monotonic() >= deadline:
            return "timeout"  # cut at the deadline: what came was not the whole answer
        return "answered"
    except ConnectionRefusedError:
        return "refused"
    except (OSError, http.client.HTTPException):
        return "timeout" if time.monotonic() >= deadline - 0.001 else "refused"
    finally:
        timer.cancel()
        conn.close()


class Watch(threading.Thread):
    """Reports events to ``wake_fd`` (a byte each) and keeps them in ``events``."""

    def __init__(
        self,
        url: str,
        server_pid: int,
        wake_fd: int,
        *,
        where: tuple[str, int] | None = None,
        critical: tuple[str, ...] = (),
        health_interval: float | None = None,
        failures: int = 3,
        probe: tuple[str, bytes, float, float] | None = None,
    ) -> None:
        super().__init__(name="ttmesh-serving-watch", daemon=True)
        self.url = url
        self.where = where  # (host, port) the probe connects to: whose listener answers there
        self.answered = ""  # why the last answer was not the server's ("" when none came)
        self.named: dict[int, str] = {}  # whose each foreign socket is (found once)
        self.server = server_pid
        self.wake_fd = wake_fd
        self.critical = critical
        self.health_interval = health_interval
        self.failures = failures
        # --probe-interval: (url, body, every, timeout) of a one-token generation after ready.
        self.probe = probe
        self.events: collections.deque[Event] = collections.deque()
        self.done = threading.Event()
        # The critical processes, as they appear while it starts (pid -> start time, name),
        # and whether it is past ready (an end among them is then this watch's to decide).
        # Read by the guardian's thread too (ended): guarded by the lock.
        self.lock = threading.Lock()
        self.watched: dict[int, tuple[int | None, str]] = {}
        self.serving = False

    def stop(self) -> None:
        self.done.set()

    def _say(self, kind: str, detail: str = "") -> None:
        self.events.append(Event(kind, detail, time.monotonic()))
        try:
            os.write(self.wake_fd, b"!")
        except OSError:
            pass

    def run(self) -> None:
        state = STARTING
        said = ""
        while not self.done.is_set():
            # The critical processes, as they appear while it starts: one that dies between
            # the server's ready and ttmesh's next probe is still one that died while it ran.
            self._note_critical()
            status = probe(self.url, HEALTH_TIMEOUT)
            if status is not None:
                why = self._not_ours()
                self.answered = why
                if why:
                    if why != said:  # once per listener: it may stay for the whole timeout
                        said = why
                        self._say(FOREIGN, f"{self.url} answers (HTTP {status}), but {why}")
                    self.done.wait(PROBE_EVERY)
                    continue
            if status is not None and status != 200 and state == STARTING:
                state = LISTENING
                self._say(LISTENING, f"HTTP {status}")
            if status == 200:
                self._say(READY)
                break
            self.done.wait(PROBE_EVERY)
        if self.done.is_set():
            return
        if self.probe is not None:  # in a thread of its own: it may wait up to its timeout
            threading.Thread(target=self._probe, name="ttmesh-serving-probe", daemon=True).start()
        self._note_critical()
        with self.lock:
            self.serving = True
        misses = 0
        next_health = time.monotonic() + (self.health_interval or 0)
        while not self.done.wait(CRITICAL_EVERY):
            gone = self.ended()
            if gone is not None and self._outlives(SETTLE):
                self._say(DIED, f"{gone} died while the server ran")
                return
            if self.health_interval and time.monotonic() >= next_health:
                status = probe(self.url, min(HEALTH_TIMEOUT, self.health_interval * 4))
                misses = 0 if status == 200 else misses + 1
                if misses >= self.failures:
                    said = f"HTTP {status}" if status is not None else "no answer"
                    self._say(
                        UNHEALTHY, f"{self.url} failed {plural(misses, 'time')} in a row ({said})"
                    )
                    return
                next_health = time.monotonic() + self.health_interval

    def _probe(self) -> None:
        """Every ``every`` seconds, a one-token generation: no answer within its timeout is a
        hung server (its /health may go on answering from the host process while every
        request waits on the device). An answer of any kind, an error included, is a server
        that runs: its health is the health check's to judge."""
        assert self.probe is not None
        url, body, every, timeout = self.probe
        while not self.done.wait(every):
            if generate(url, body, timeout) == "timeout" and not self.done.is_set():
                self._say(HUNG, f"a one-token generation ({url}) got no answer in {timeout:g} s")
                return

    def _tree(self) -> list[int]:
        return [self.server, *procs.descendants(self.server)]

    def _not_ours(self) -> str:
        """Empty when every listener the probe reaches is the server's, else why not."""
        if self.where is None:
            return ""
        from ttmesh.launcher.serving import listeners

        host, port = self.where
        try:
            import _socket

            found = _socket.getaddrinfo(host, port, 0, _socket.SOCK_STREAM)
            targets = sorted({str(a[4][0]) for a in found})
        except OSError as exc:
            return f"{host} cannot be resolved ({exc})"
        return listeners.whose(targets, port, self._tree(), self.named).why

    def not_ready(self) -> str:
        """Why the server is not ready, for the line that gives up on it: the last answer was
        not the server's, or none came (and where its processes listen instead, if anywhere)."""
        if self.answered:
            return f"{self.url} answers, but {self.answered}"
        from ttmesh.launcher.serving import listeners

        found = listeners.tree_ports(self._tree()) if procs.alive(self.server) else []
        if found and self.where is not None:
            port = str(self.where[1])
            if any(w.rsplit(":", 1)[-1] == port for w in found):
                # It listens on its port and took no request within the probe's timeout: busy
                # (loading, compiling) or its accept loop stuck, not a wrong port.
                return (
                    f"{self.url} never answered; the server listens on "
                    f"{', '.join(w for w in found if w.rsplit(':', 1)[-1] == port)} but no "
                    "request there got an answer"
                )
            return (
                f"{self.url} never answered; the server's processes listen on "
                f"{', '.join(found)}, not on port {port}"
            )
        return f"{self.url} never answered"

    def _outlives(self, seconds: float) -> bool:
        """Is the server's main process still alive ``seconds`` from now? Its own exit (the
        guardian then reports its code) ends the wait early, as does a stop."""
        deadline = time.monotonic() + seconds
        while procs.alive(self.server):
            if time.monotonic() >= deadline:
                return True
            if self.done.wait(0.05):
                return False
        return False

    def _note_critical(self) -> None:
        """Follow the critical processes that appeared since the last look."""
        found = self._critical()
        with self.lock:
            for pid, seen in found.items():
                self.watched.setdefault(pid, seen)

    def ended(self) -> str | None:
        """A critical process that ended while the server ran (``sglang::scheduler_TP0 (pid
        N)``), whose end this watch decides on: it says it died (SETTLE after it), or the
        server's own exit comes first. None while every one lives, and before ready (a start
        that loses one is its ready timeout's, or the server's exit's, to end)."""
        with self.lock:
            if not self.serving:
                return None
            followed = list(self.watched.items())
        for pid, (start, name) in followed:
            if not procs.alive(pid, start):
                return f"{name} (pid {pid})"
        return None

    def _critical(self) -> dict[int, tuple[int | None, str]]:
        """The server's processes whose command lines start with a critical name, now."""
        found: dict[int, tuple[int | None, str]] = {}
        if not self.critical:
            return found
        for pid in procs.descendants(self.server):
            cmd = _cmdline(pid)
            if cmd and any(cmd.startswith(c) for c in self.critical):
                found[pid] = (procs.start_time(pid), cmd.split()[0])
        return found


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return ""
    return " ".join(p.decode(errors="replace") for p in raw.split(b"\0") if p)
