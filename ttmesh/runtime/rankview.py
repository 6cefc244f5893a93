"""An attempt's ranks in a simulated host's view (``plan.host_view``): one namespace, built once.

The starter runs the view's helper (:mod:`ttmesh.runtime.hostview` ``--hold``) once per attempt:
it makes a mount namespace (and, for a user who is not root, a user namespace mapping the user
to itself), builds the view there and says ``ready``. The starter opens the helper's namespaces,
lets it go and keeps them open until the attempt ends; each rank enters them through the
system's nsenter (a few milliseconds) by the starter's descriptors (``/proc/<guardian>/fd/N``:
nothing is passed to the rank, and no number is closed and reused while a rank may still open
it), keeping its working directory (``--wd``: entering a mount namespace moves to its root) and
its credentials. Without nsenter each rank builds a view of its own (the helper before its program,
about 10 ms more a rank). When no namespace can be made, :attr:`Views.notice` says why in one
line and the ranks start as they would have.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import subprocess

NSENTER = ("/usr/bin/nsenter", "/bin/nsenter")  # the system's own (never one found on PATH)
READY_TIMEOUT = 30.0  # seconds for the helper to build the view (tens of milliseconds)
LINE = 4096  # the helper's one line, bounded


def _nsenter() -> str | None:
    return next((p for p in NSENTER if os.access(p, os.X_OK)), None)


class Views:
    """How an attempt's ranks are started in a view: :meth:`open` once, :meth:`prefix` per
    rank, :meth:`close` when the attempt ends. ``helper``: the view's helper command without
    its mode (``launcher.planning.simview.HostView.helper``)."""

    def __init__(self, helper: list[str]) -> None:
        self.helper = helper
        self.notice: str | None = None  # one line: the view could not be made
        self.fds: tuple[int, ...] = ()  # the helper's namespaces, open until close()
        self._nsenter = _nsenter()

    def open(self) -> None:
        if self._nsenter is None:
            return  # each rank builds its own (prefix)
        try:
            proc = subprocess.Popen(
                [*self.helper[:4], "--hold", *self.helper[4:]],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                close_fds=True,
            )
        except OSError as exc:
            self.notice = f"the view's helper could not start ({exc})"
            return
        assert proc.stdin is not None and proc.stdout is not None
        try:
            line = _line(proc.stdout.fileno(), READY_TIMEOUT)
            if line == "ready":
                kinds = ("mnt",) if os.getuid() == 0 else ("user", "mnt")
                self.fds = tuple(
                    os.open(f"/proc/{proc.pid}/ns/{kind}", os.O_RDONLY | os.O_CLOEXEC)
                    for kind in kinds
                )
            else:
                self.notice = line.removeprefix("failed: ") or "its helper said nothing"
        except OSError as exc:
            self.notice = f"its namespaces could not be opened ({exc})"
            self.close()
        finally:
            proc.stdin.close()  # it exits: the namespaces live on in these fds, then the ranks
            proc.stdout.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(READY_TIMEOUT)
            if proc.returncode is None:
                proc.kill()
                proc.wait()

    @property
    def usable(self) -> bool:
        return self.notice is None and (bool(self.fds) or self._nsenter is None)

    def prefix(self, cwd: str) -> list[str]:
        """What a rank's command starts behind (nothing when the view could not be made)."""
        if not self.usable:
            return []
        if self._nsenter is None:
            return [*self.helper, "--"]
        kinds = ("mount",) if len(self.fds) == 1 else ("user", "mount")
        me = os.getpid()
        spaces = [f"--{kind}=/proc/{me}/fd/{fd}" for kind, fd in zip(kinds, self.fds, strict=True)]
        keep = ["--preserve-credentials"] if "user" in kinds else []
        return [self._nsenter, *spaces, *keep, f"--wd={cwd}", "--"]

    def close(self) -> None:
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds = ()


def _line(fd: int, timeout: float) -> str:
    """The first line ``fd`` gives within ``timeout`` seconds ("" if none)."""
    data = b""
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while b"\n" not in data and len(data) < LINE:
            if not sel.select(timeout):
                break
            chunk = os.read(fd, LINE)
            if not chunk:
                break
            data += chunk
    return data.split(b"\n", 1)[0].decode(errors="replace").strip()
