"""SGLang's router in front of a fleet: started, told which replicas serve, restarted, stopped.

sglang-router 0.3.2 (the ``router`` extra), started through :mod:`ttmesh.launcher.fleet.routermain`
(``python -m ttmesh.launcher.fleet.routermain --host H --port P --worker-urls URL...``: the
router's own parser and launch function) with a key of its own for each start on its standard
input, so its admin routes (``/workers``, ``/workers/{id}``, ``/flush_cache``, ``/get_loads``)
answer only requests that show it, and no command line (``ps``) shows it. Its workers are changed
while it runs through those routes (``POST /workers {"url": U}``, ``GET /workers``, ``DELETE
/workers/ID``, as 0.3.2 serves them), each answer checked (status and body). The key is sent
only once every socket listening where ttmesh asks is the router's own (``serving.listeners``):
a process that took the port first would get it otherwise. Its policy and health checks are its
own defaults unless the user passes ``--router-arg``; it holds no chip, so a router that dies is
started again with the replicas that serve.
"""

from __future__ import annotations

import contextlib
import importlib.util
import ipaddress
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

from ttmesh.errors import bad_input
from ttmesh.launcher.serving.watch import DIRECT

MODULE = "ttmesh.launcher.fleet.routermain"
ASK_TIMEOUT = 2.0  # one request to the router's own endpoints
ANSWER_MAX = 1 << 20  # bytes of an answer read (every worker of a fleet is a few hundred)
REASON_MAX = 200  # characters of the router's reason said in a line
ASK_AGAIN = 10.0  # s: a replica the router does not list is asked for again after this
ACCEPTED = ("accepted", "success", "ok")  # what 0.3.x's admin routes say of a request they take
NOTHING_YET = "is in the kernel's table"  # listeners.whose: nothing listens there (yet)
# Straight to the router (serving.watch.DIRECT): never through a proxy the environment names
# (http_proxy), which would be sent the key.


def check_installed() -> None:
    """One line before anything starts when the router is missing from this Python."""
    try:
        found = importlib.util.find_spec("sglang_router") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise bad_input(
            f"--replicas needs SGLang's router, and sglang-router is not installed for "
            f"{sys.executable}",
            "pip install 'ttmesh[router]'",
        )


def how_it_ended(code: int) -> str:
    """A child's ``returncode`` as ttmesh says an end: ``killed by SIGKILL``, ``exited with
    code 1`` (Popen gives -N for a signal)."""
    from ttmesh import procs

    return f"killed by {procs.signal_name(-code)}" if code < 0 else f"exited with code {code}"


def shell_code(code: int) -> int:
    """A child's ``returncode`` as a shell reports it: the code, or 128 + the signal."""
    return 128 - code if code < 0 else code


class Router:
    """The router process and what it was told: the replicas' URLs it routes to."""

    def __init__(
        self, host: str, port: int, extra: list[str], log: str, say: Callable[[str], None],
        module: str = MODULE,
    ) -> None:  # fmt: skip
        self.host, self.port, self.extra, self.log = host, port, list(extra), log
        self.say = say
        self.module = module  # what runs it (a test's stand-in router)
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.added: dict[str, float] = {}  # url -> when it was last asked to add it
        self.key = ""  # this start's admin key: in memory and on the router's stdin only
        self.ours = False  # every socket where ttmesh asks is this start's router's
        self.said_not_ours = ""  # what was said of another listener there (said once)
        self.listed: set[str] = set()  # the serving URLs it said it routes to, when last asked
        self.refusals: dict[str, str] = {}  # url -> why it refused to add it, when last asked

    @property
    def addr(self) -> str:
        """The address ttmesh asks the router at: its --host, loopback for every address."""
        if self.host in ("0.0.0.0", ""):
            return "127.0.0.1"
        return "::1" if self.host == "::" else self.host

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def died(self) -> int | None:
        """Its exit code when it was started and has ended, else None."""
        return self.proc.poll() if self.proc is not None else None

    def start(self, workers: list[str]) -> None:
        argv = [sys.executable, "-m", self.module, "--host", self.host, "--port", str(self.port)]
        if workers:
            argv += ["--worker-urls", *workers]
        argv += self.extra
        self.key = secrets.token_urlsafe(32)  # each start its own: no earlier listener has it
        self.ours, self.said_not_ours = False, ""
        read, write = os.pipe()
        try:
            os.write(write, f"{self.key}\n".encode())  # 44 bytes: a pipe takes them at once
            os.close(write)
            write = -1
            with open(self.log, "ab") as out:  # its own log: a pipe nobody reads would stop it
                self.proc = subprocess.Popen(
                    argv, stdin=read, stdout=out, stderr=subprocess.STDOUT,
                    start_new_session=True, preexec_fn=dies_with_this_process(),
                )  # fmt: skip
        finally:
            os.close(read)
            if write >= 0:
                os.close(write)
        self.starts += 1
        self.added = {u: time.monotonic() for u in workers}
        self.listed, self.refusals = set(), {}
        self.say(f"router: started (pid {self.proc.pid}) at {self.url}, "
                 f"{len(workers)} of the replicas serving")  # fmt: skip

    # ------------------------------------------------------------------ asking it

    def _its_own(self) -> bool:
        """Whether every socket listening where ttmesh asks is this router's (checked once a
        start: while it lives nobody else can listen there). Until then nothing is sent."""
        if self.ours:
            return True
        if not self.running():
            return False
        from ttmesh import procs
        from ttmesh.launcher.serving import listeners

        assert self.proc is not None
        tree = [self.proc.pid, *procs.descendants(self.proc.pid)]
        verdict = listeners.whose([self._target()], self.port, tree)
        if verdict.ours:
            self.ours = True
        elif NOTHING_YET not in verdict.why and verdict.why != self.said_not_ours:
            self.said_not_ours = verdict.why  # someone else listens there (said once)
            why = verdict.why.replace(", not the server", ", not the router")
            self.say(f"router: {why}: the fleet's admin key is not sent to "
                     f"{self.url}")  # fmt: skip
        return self.ours

    def _target(self) -> str:
        """The address whose listeners are read (a name: the first it resolves to)."""
        try:
            return str(ipaddress.ip_address(self.addr))
        except ValueError:
            import socket

            with contextlib.suppress(OSError, IndexError):
                found = socket.getaddrinfo(self.addr, self.port, type=socket.SOCK_STREAM)
                return str(found[0][4][0])
            return self.addr

    def _ask(
        self, method: str, path: str, body: dict[str, Any] | None = None
    ) -> tuple[int, Any] | None:
        """(HTTP status, the answer: its JSON, else its text) of one admin request with the
        key; None when the router does not answer (or is not yet known to be what listens)."""
        if not self._its_own():
            return None
        target = self._target()
        host = f"[{target}]" if ":" in target else target
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            f"http://{host}:{self.port}{path}", data=data, method=method
        )
        request.add_header("Authorization", f"Bearer {self.key}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with DIRECT.open(request, timeout=ASK_TIMEOUT) as reply:
                return reply.status, _answer(reply.read(ANSWER_MAX))
        except urllib.error.HTTPError as err:
            with err:
                try:
                    return err.code, _answer(err.read(ANSWER_MAX))
                except OSError:
                    return err.code, None
        except (OSError, ValueError):
            return None

    def workers(self) -> dict[str, str] | None:
        """url -> the router's id of it; None when the router does not answer (or refuses)."""
        answer = self._ask("GET", "/workers")
        if answer is None:
            return None
        status, listed = answer
        if status != 200 or not isinstance(listed, dict):
            return None
        out: dict[str, str] = {}
        for w in listed.get("workers") or []:
            if isinstance(w, dict) and w.get("url"):
                out[str(w["url"])] = str(w.get("id", ""))
        return out

    def reconcile(self, serving: list[str]) -> bool:
        """The router routes to exactly ``serving``: the others removed first, then the missing
        added (asked again after 10 s: an add waits for the worker's health check). False when
        the router does not answer yet. After it, ``listed`` is what of ``serving`` it routes
        to, ``refusals`` the replicas it refused to add, and why (its status and reason)."""
        known = self.workers()
        if known is None:
            return False
        for url, wid in known.items():
            if url not in serving:
                self.remove(url, wid)
        self.listed = {url for url in known if url in serving}
        self.refusals = {u: why for u, why in self.refusals.items() if u in serving}
        now = time.monotonic()
        for url in serving:
            if url in known:
                self.refusals.pop(url, None)
                continue
            if now - self.added.get(url, -1e9) <= ASK_AGAIN:
                continue
            answer = self._ask("POST", "/workers", {"url": url})
            if answer is None:
                continue  # no answer: asked again on the next round
            self.added[url] = now
            why = refused(*answer)
            if why is None:
                self.refusals.pop(url, None)
            else:
                self.refusals[url] = why
        return True

    def remove(self, url: str, wid: str | None = None) -> None:
        """Stop routing to ``url`` now (before its replica is stopped)."""
        self.added.pop(url, None)
        self.listed.discard(url)
        self.refusals.pop(url, None)
        if wid is None:
            wid = (self.workers() or {}).get(url)
        if not wid:
            return
        answer = self._ask("DELETE", f"/workers/{urllib.parse.quote(wid, safe='')}")
        why = refused(*answer) if answer is not None else None
        if why is not None:
            self.say(f"router: refuses to stop routing to {url}: {why}")

    def last_line(self) -> str:
        """The last line of its log (for a router that died, and the summary)."""
        from ttmesh.render import clip, printable

        try:  # its tail only: the log grows with every request (in the fleet's own 0700 dir)
            fd = os.open(self.log, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return ""
        try:
            size = os.fstat(fd).st_size
            tail = os.pread(fd, 4096, max(0, size - 4096))
        except OSError:
            return ""
        finally:
            os.close(fd)
        lines = [ln for ln in tail.decode(errors="replace").splitlines() if ln.strip()]
        if size > 4096 and len(lines) > 1:
            lines = lines[1:]  # the first may be the end of a line only
        return clip(printable(lines[-1]), REASON_MAX) if lines else ""

    def stop(self, grace: float) -> None:
        """SIGTERM (it stops taking requests and drains), SIGKILL after ``grace``."""
        proc, self.proc = self.proc, None
        self.key, self.ours = "", False
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # anything it left in its group


def _answer(data: bytes) -> Any:
    """An answer's body: its JSON, else its text."""
    text = data.decode(errors="replace")
    try:
        return json.loads(text)
    except ValueError:
        return text


def refused(status: int, answer: Any) -> str | None:
    """Why the router refused an admin request (``HTTP 401: Invalid authentication token``),
    one bounded printable clause; None when it took it: a 2xx whose body says so when it says
    (0.3.2: ``202 {"status": "accepted", ...}``)."""
    from ttmesh.render import clip, printable

    said = answer.get("status") if isinstance(answer, dict) else None
    error = answer.get("error") if isinstance(answer, dict) else None
    if 200 <= status < 300 and error is None and (said is None or str(said).lower() in ACCEPTED):
        return None
    reason: Any = answer
    if isinstance(answer, dict):
        reason = error if error is not None else answer.get("message", said)
        if isinstance(reason, dict):  # {"error": {"type", "code", "message"}}
            reason = reason.get("message") or reason.get("code") or reason
    text = clip(printable(str(reason or "")), REASON_MAX) or "no reason given"
    return f"HTTP {status}: {text}"


def dies_with_this_process() -> Callable[[], None]:
    """What a child runs before its program (``preexec_fn``): SIGTERM when the process that
    started it dies, even by SIGKILL (PR_SET_PDEATHSIG); a child whose starter died before
    that took hold (the kernel then sends nothing) ends at once."""
    parent = os.getpid()

    def arm() -> None:
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:
            os._exit(128 + signal.SIGTERM)

    return arm
