"""An attempt's ranks in a simulated host's view (``plan.host_view``): one namespace, built once.

As root, a thread of the guardian builds the view in a mount namespace of its own (a thread may
unshare its mount namespace: the kernel gives it its own filesystem context, its cwd kept) and
starts the attempt's ranks there (:meth:`Views.within`), so they inherit the view with no helper
process and no nsenter (about 1 ms of CPU a rank, and a Python start an attempt). The thread is
the ranks' parent for the kernel: their parent-death signal fires when it ends, so it lives until
the attempt ends (:meth:`Views.close`). A user who is not root needs a user namespace too, which a
process of several threads cannot make; for them:

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
import threading
from _queue import SimpleQueue  # queue's own (queue imports heapq and more: 1 ms)
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

NSENTER = ("/usr/bin/nsenter", "/bin/nsenter")  # the system's own (never one found on PATH)
READY_TIMEOUT = 30.0  # seconds for the helper to build the view (tens of milliseconds)
LINE = 4096  # the helper's one line, bounded


def reserve_descriptors(count: int) -> None:
    """Grow this process's descriptor table to fit ``count`` more descriptors than it has open
    now, while it has one thread. A table that threads share waits for an RCU grace period
    each time it grows (the kernel's expand_fdtable: 7 to 15 ms here), and it grows at 64,
    128, 256, ... descriptors: a view's thread opening 64 chips' entries and 128 ranks' pipes
    waited for several. Within the soft limit on open descriptors; nothing is kept open."""
    soft = os.sysconf("SC_OPEN_MAX")  # RLIMIT_NOFILE's soft limit
    highest = max(int(n) for n in os.listdir("/proc/self/fd"))
    target = min(highest + count, soft - 1)
    if target <= highest:
        return
    fd = os.open("/", os.O_PATH | os.O_CLOEXEC)
    with contextlib.suppress(OSError):  # past what it may open: the table grows as it must
        os.close(os.dup2(fd, target, inheritable=False))
    os.close(fd)


def _nsenter() -> str | None:
    return next((p for p in NSENTER if os.access(p, os.X_OK)), None)


class Views:
    """How an attempt's ranks are started in a view: :meth:`open` once, :meth:`within` or
    :meth:`prefix` per start, :meth:`close` when the attempt ends. ``helper``: the view's helper
    command without its mode (``launcher.planning.simview.HostView.helper``), for ``root``
    and ``devices``."""

    def __init__(
        self, helper: list[str], root: str, devices: list[str], open_files: int = 0
    ) -> None:
        self.helper = helper
        self.root = root  # the simulated root, and the /dev/tenstorrent indices shown of it
        self.devices = devices
        # The descriptors the attempt holds at once, the view's and the ranks' (the plan's
        # open_files): made room for before the thread is (reserve_descriptors).
        self.open_files = open_files
        self.notice: str | None = None  # one line: the view could not be made
        self.fds: tuple[int, ...] = ()  # the helper's namespaces, open until close()
        self._nsenter = _nsenter()
        self._thread: _ViewThread | None = None  # as root: the view's own thread

    def open(self) -> None:
        if os.getuid() == 0:
            reserve_descriptors(self.open_files)
            thread = _ViewThread(self.root, self.devices)
            thread.start()
            thread.ready.wait()
            if thread.failed is None:
                self._thread = thread
            else:
                self.notice = thread.failed
                thread.join()
            return
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

    def within(self, start: Callable[[], T]) -> T:
        """``start()`` (which starts the ranks) where the ranks see the view: in the view's
        thread when it has one (its exception raised here), else here."""
        if self._thread is None:
            return start()
        return self._thread.call(start)

    def prefix(self, cwd: str) -> list[str]:
        """What a rank's command starts behind (nothing when the view could not be made, or
        when the ranks start in the view's thread: they are in the view already)."""
        if not self.usable or self._thread is not None:
            return []
        if self._nsenter is None:
            return [*self.helper, "--"]
        kinds = ("mount",) if len(self.fds) == 1 else ("user", "mount")
        me = os.getpid()
        spaces = [f"--{kind}=/proc/{me}/fd/{fd}" for kind, fd in zip(kinds, self.fds, strict=True)]
        keep = ["--preserve-credentials"] if "user" in kinds else []
        return [self._nsenter, *spaces, *keep, f"--wd={cwd}", "--"]

    def close(self) -> None:
        """The attempt has ended (its ranks with it): let the view go."""
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds = ()
        if self._thread is not None:
            self._thread.stop()
            self._thread = None


class _ViewThread(threading.Thread):
    """A thread in a mount namespace of its own holding the view, running what it is given
    (the ranks' start) until :meth:`stop`. The namespace lives while the thread or a rank is
    in it; the kernel frees it with the last of them."""

    def __init__(self, root: str, devices: list[str]) -> None:
        super().__init__(name="ttmesh-host-view", daemon=True)
        self.root = root
        self.devices = devices
        self.ready = threading.Event()
        self.failed: str | None = None  # one line: why the view could not be made
        self.calls: SimpleQueue[Callable[[], None] | None] = SimpleQueue()

    def run(self) -> None:
        from ttmesh.runtime import hostview  # (ctypes: only a simulated host's job loads it)

        try:
            hostview.build(self.root, self.devices)
        except hostview.ViewError as exc:
            # Mounted or not, nothing is started in this namespace: the thread ends with it.
            self.failed = str(exc)
        finally:
            self.ready.set()
        if self.failed is not None:
            return
        while (call := self.calls.get()) is not None:
            call()

    def call(self, fn: Callable[[], T]) -> T:
        """``fn()`` run in the view's thread, its result or exception returned here."""
        done = threading.Event()
        box: list[T] = []
        error: list[BaseException] = []

        def run() -> None:
            try:
                box.append(fn())
            except BaseException as exc:
                error.append(exc)
            finally:
                done.set()

        self.calls.put(run)
        done.wait()
        if error:
            raise error[0]
        return box[0]

    def stop(self) -> None:
        self.calls.put(None)
        self.join()


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
