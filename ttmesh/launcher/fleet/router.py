"""SGLang's router in front of a fleet: started, told which replicas serve, restarted, stopped.

``python -m sglang_router.launch_router --host H --port P --worker-urls URL...`` (sglang-router
0.3.2, the ``router`` extra); its workers are changed while it runs through its own endpoints
(``POST /workers {"url": U}``, ``GET /workers``, ``DELETE /workers/ID``, as 0.3.2 serves them).
Its policy and health checks are its own defaults unless the user passes ``--router-arg``; it
holds no chip, so a router that dies is started again with the replicas that serve.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from ttmesh.errors import bad_input

MODULE = "sglang_router.launch_router"
ASK_TIMEOUT = 2.0  # one request to the router's own endpoints


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


class Router:
    """The router process and what it was told: the replicas' URLs it routes to."""

    def __init__(
        self, host: str, port: int, extra: list[str], log: str, say: Callable[[str], None]
    ) -> None:
        self.host, self.port, self.extra, self.log = host, port, list(extra), log
        self.say = say
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.added: dict[str, float] = {}  # url -> when it was last asked to add it

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}"

    @property
    def metrics_url(self) -> str | None:
        """Where its Prometheus metrics are read, when ``--router-arg`` names their port (the
        live view and ``ttmesh ps`` show it); None when the user did not pass one."""
        port = _value(self.extra, "--prometheus-port")
        if port is None:
            return None
        host = _value(self.extra, "--prometheus-host") or "0.0.0.0"
        host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{port}/metrics"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def died(self) -> int | None:
        """Its exit code when it was started and has ended, else None."""
        return self.proc.poll() if self.proc is not None else None

    def start(self, workers: list[str]) -> None:
        argv = [sys.executable, "-m", MODULE, "--host", self.host, "--port", str(self.port)]
        if workers:
            argv += ["--worker-urls", *workers]
        argv += self.extra
        with open(self.log, "ab") as out:  # its own log: a pipe nobody reads would stop it
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=die_with_parent,
            )  # fmt: skip
        self.starts += 1
        self.added = {u: time.monotonic() for u in workers}
        self.say(f"router: started (pid {self.proc.pid}) at {self.url}, "
                 f"{len(workers)} of the replicas serving")  # fmt: skip

    def _ask(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=ASK_TIMEOUT) as reply:
            return json.loads(reply.read() or b"null")

    def workers(self) -> dict[str, str] | None:
        """url -> the router's id of it; None when the router does not answer."""
        try:
            listed = self._ask("GET", "/workers")
        except (OSError, ValueError):
            return None
        out: dict[str, str] = {}
        for w in (listed or {}).get("workers") or []:
            if isinstance(w, dict) and w.get("url"):
                out[str(w["url"])] = str(w.get("id", ""))
        return out

    def reconcile(self, serving: list[str]) -> bool:
        """The router routes to exactly ``serving``: the others removed first, then the missing
        added (asked again after 10 s: an add waits for the worker's health check). False
        when the router does not answer yet."""
        known = self.workers()
        if known is None:
            return False
        for url, wid in known.items():
            if url not in serving:
                self.remove(url, wid)
        now = time.monotonic()
        for url in serving:
            if url not in known and now - self.added.get(url, -1e9) > 10.0:
                with contextlib.suppress(OSError, ValueError):
                    self._ask("POST", "/workers", {"url": url})
                    self.added[url] = now
        return True

    def remove(self, url: str, wid: str | None = None) -> None:
        """Stop routing to ``url`` now (before its replica is stopped)."""
        self.added.pop(url, None)
        if wid is None:
            wid = (self.workers() or {}).get(url)
        if wid:
            with contextlib.suppress(OSError, ValueError):
                self._ask("DELETE", f"/workers/{wid}")

    def last_line(self) -> str:
        """The last line of its log (for a router that died, and the summary)."""
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
        return _plain(lines[-1])[-200:] if lines else ""

    def stop(self, grace: float) -> None:
        """SIGTERM (it stops taking requests and drains), SIGKILL after ``grace``."""
        proc, self.proc = self.proc, None
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


def _value(args: list[str], flag: str) -> str | None:
    """The last value of ``flag`` in ``args`` (``--flag=V`` or ``--flag V``), as argparse takes it."""
    found = None
    for i, arg in enumerate(args):
        if arg.startswith(flag + "="):
            found = arg.split("=", 1)[1]
        elif arg == flag and i + 1 < len(args):
            found = args[i + 1]
    return found


def _plain(line: str) -> str:
    """A log line without its terminal colours (the router colours its log even in a file)."""
    import re

    line = re.sub(r"\x1b\[[0-9;]*m", "", line)
    return "".join(c if c.isprintable() else "?" for c in line)


def die_with_parent() -> None:
    """In the child before it runs: SIGTERM when the fleet's ttmesh dies (even by SIGKILL)."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
