"""Supervising one attempt: the ranks' process trees, watched to the last descendant.

Two processes share the work:

* the **front** is the ``ttmesh`` process the user started. It forks the guardian, forwards
  signals to it, waits for it and returns its verdict. It is a child subreaper, so if the
  guardian is killed, everything orphaned comes to it and is killed.
* the **guardian** (forked, in its own process group, a child subreaper) is the parent of every
  worker. Workers start through a :mod:`starter <ttmesh.launcher.attempt.starters>`; every orphaned
  descendant, even one that called ``setsid``, is re-parented to the guardian, so a sweep of its
  subtree finds everything. Exits arrive as SIGCHLD through a wakeup fd, at once. If the front
  disappears (even by SIGKILL), a pipe the front held closes and the guardian kills the tree,
  then finishes the job in its place (see :class:`ttmesh.launcher.job.run.JobRun`).

The guardian is one loop over explicit phases (:class:`Phase`): STARTING -> RUNNING ->
STOPPING (SIGTERM sent, SIGKILL at the end of the grace) -> DRAINING (no rank left: sweep every
descendant, read the last output) -> DONE. The first failing rank, a stop signal or a job that
never gets ready moves RUNNING to STOPPING; the last rank's end moves to DRAINING.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import selectors
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol

from ttmesh import procs
from ttmesh.errors import TTMeshError
from ttmesh.host.base import Host
from ttmesh.launcher.attempt.events import EventReader, EventWriter, JobPhase, Observer
from ttmesh.launcher.attempt.logs import LAUNCHER, Console
from ttmesh.launcher.attempt.logspec import LogSpec
from ttmesh.launcher.attempt.starters import RankExit, Starter, starter_for
from ttmesh.launcher.planning.plan import LaunchPlan, RankPlan
from ttmesh.patterns import compile_pattern
from ttmesh.render import note, noun
from ttmesh.runtime.leftovers import Leftovers
from ttmesh.vocab import Layout, Source

if TYPE_CHECKING:
    from ttmesh.launcher.serving.server import Server

FORWARDED = (
    signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
)  # fmt: skip
# Signals sent to ttmesh that stop the job gracefully (exit 128 + signal): as torchrun's agent
# does, the ranks get the signal that was sent (a rank's KeyboardInterrupt handler runs on
# Ctrl-C), then SIGKILL when the grace ends. SIGUSR1/2 are passed on to the workers; SIGINT is
# Ctrl-C (a second one kills at once).
STOPPING: dict[int, str] = {
    signal.SIGTERM: "terminated", signal.SIGHUP: "hangup", signal.SIGQUIT: "quit",
}  # fmt: skip


def stop_reason(sig: int) -> str:
    """How a job stopped by a signal to ttmesh ends: "interrupted (SIGINT)", "terminated
    (SIGTERM)", "hangup (SIGHUP)"."""
    what = "interrupted" if sig == signal.SIGINT else STOPPING[sig]
    return f"{what} ({procs.signal_name(sig)})"


# From the launcher only: another host of the job failed, stop this host's ranks (gracefully).
PEER_STOP = signal.SIGRTMIN + 1
POLL = 0.05  # while ranks run: rank PIDs to find, fabric marks, readiness
HUNG = 124  # ttmesh's code for a job that never became ready (as timeout(1) uses it)
SWEEP_POLL = 0.02
DRAIN = 0.5  # seconds to read what the pipes still hold once every process is gone
TICK = 0.05  # the front's observer hears at least this often while an attempt runs
LINE_WIDTH = 500  # characters of a rank's last line an observer is sent
READ_SIZE = 1 << 20  # a rank's pipe may hold up to 1 MiB (starters._pipe_size)
DRAIN_SAY = 5.0  # seconds between "draining, N s left" lines while a grace runs

__all__ = ["STOPPING", "AttemptResult", "Options", "RankExit", "run_attempt", "stop_reason"]


@dataclass
class AttemptResult:
    """How one attempt ended, sent from the guardian to the launcher as JSON."""

    attempt: int
    code: int
    source: Source  # who decided the code
    rank: int | None
    reason: str
    exits: list[RankExit] = field(default_factory=list)
    fabric_ranks: list[int] = field(default_factory=list)  # ranks that brought the fabric up
    interrupted: bool = False  # the user stopped the job: no restart
    stderr_tail: list[str] = field(default_factory=list)
    error_message: str | None = None
    duration: float = 0.0
    hung: bool = False  # no failure, but not ready in time: restartable
    supervisor_lost: bool = False  # the guardian itself was killed: how the ranks ended is unknown
    host: str | None = None  # the host of the failing rank, in a job over several hosts
    # A known failure line in the output (ttmesh.launcher.attempt.failures.match), found on failure only.
    diagnosis: dict[str, Any] | None = None
    # [code, message, hint]: a check still running as the ranks started refused the job (a
    # chip's heartbeat was frozen): nothing of the attempt counts, the launcher refuses.
    refusal: list[Any] | None = None
    # [message, hint]: a rank's program never ran (not found, not executable): nothing ran, the
    # launcher refuses with this one line (code 127 or 126, as a shell), no restart.
    unstarted: list[Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AttemptResult:
        exits = [RankExit(**e) for e in data.pop("exits", [])]
        return cls(**data, exits=exits)


class Pending(Protocol):
    """A check still under way when the ranks start (the chips' heartbeats, read while the
    workers start rather than before: ``ttmesh.launcher.planning.liveness.Liveness``). The guardian asks
    it on its own timer and ends no attempt before it is decided; when it refuses, every
    worker is stopped and the attempt ends with the refusal."""

    refusal: TTMeshError | None  # once decided: why the job may not run

    def step(self) -> float | None:
        """Work on it; seconds until it wants asking again, or None once decided."""
        ...


@dataclass
class Options:
    """How the guardian shows the workers' output."""

    ranks_filter: set[int] | None = None
    log_dir: str | None = None
    quiet: bool = False
    # torchrun's --redirects/--tee, its log layout and line prefix (launcher.attempt.logspec).
    logs: LogSpec | None = None
    # A view of the job (ttmesh.launcher.attempt.events): None keeps the console plain prefixed lines.
    observer: Observer | None = None


# --------------------------------------------------------------------------- front


def run_attempt(
    plan: LaunchPlan,
    attempt: int,
    options: Options,
    base_env: dict[str, str],
    orphaned: Callable[[AttemptResult], int] | None = None,
    host: Host | None = None,
    on_start: Callable[[int], None] | None = None,
    pending: Pending | None = None,
) -> AttemptResult:
    """Run one attempt of the job (every rank once) and return how it ended.

    ``orphaned``: what the guardian does with the attempt's result when the launcher was
    killed while it ran (finish the job in its place); its return value is the exit code.
    ``host`` hears the job's events (workers holding chips, fabric opened and ended).
    ``pending``: a check the guardian completes while the ranks run (:class:`Pending`)."""
    observer = options.observer
    if observer is not None:
        observer.attempt(attempt)
        events_r, events_w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    # If the guardian itself dies, what it left is re-parented here and swept below.
    procs.set_subreaper()
    alive_r, alive_w = os.pipe()
    result_r, result_w = os.pipe()
    # The front says it has the result (a byte); until then the guardian stays, so a front
    # killed between the verdict and taking it over is still a front gone: the guardian
    # finishes the job in its place.
    taken_r, taken_w = os.pipe()
    # A signal for ttmesh that arrives around the fork waits (blocked, pending) until someone
    # handles it: the front's forwarders below, the guardian's handlers (Guardian._signals).
    # Unblocked, it would end the front before its forwarders exist, or the guardian before
    # its own, with the front's handlers (a SIGTERM meant to stop the job gracefully).
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    try:
        pid = os.fork()
    except BaseException:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        raise
    if pid == 0:  # the guardian
        code = 1
        try:
            os.close(alive_w)
            os.close(result_r)
            os.close(taken_w)
            writer = None
            if observer is not None:
                os.close(events_r)
                writer = EventWriter(events_w)
                # The guardian reports through the pipe; stream wrappers a view installed in
                # the front (to print above its table) are the front's.
                sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
            guardian = Guardian(
                plan, attempt, options, base_env, alive_r, host or Host(plan.root), writer, pending
            )
            result = guardian.run()
            code = result.code
            if guardian.front_gone and orphaned is not None:
                code = orphaned(result)
            else:
                try:
                    _write_all(result_w, json.dumps(result.to_json()).encode())
                    os.close(result_w)
                    if writer is not None:
                        writer.close()
                    taken = _taken(taken_r)
                except BrokenPipeError:
                    taken = False
                if not taken:
                    # The front died after the ranks had ended (while the verdict was made, or
                    # before it took the verdict over): finish the job in its place.
                    if orphaned is None:
                        raise BrokenPipeError("the launcher is gone")
                    guardian.front_gone = True
                    code = orphaned(result)
        except BaseException as exc:
            if not isinstance(exc, BrokenPipeError | SystemExit):
                _report_crash(exc)
            with contextlib.suppress(Exception):
                _kill_tree(os.getpid())  # a broken guardian still leaves nothing behind
        finally:
            os._exit(code)
    os.close(alive_r)
    os.close(result_w)
    os.close(taken_r)
    if observer is not None:
        os.close(events_w)
    previous = {}
    stops: list[int] = []  # stop signals forwarded (the guardian may be past acting on them)
    continued: list[int] = []  # the front was stopped (SIGSTOP) and continued meanwhile
    for sig in FORWARDED:
        previous[sig] = signal.signal(sig, functools.partial(_forward, pid, stops))
    previous[signal.SIGCONT] = signal.signal(signal.SIGCONT, lambda *_: continued.append(1))
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    try:
        if on_start is not None:
            on_start(pid)
        if observer is not None:
            try:
                _relay(events_r, observer)
            finally:
                os.close(events_r)
        data = _read_all(result_r)  # until the guardian has written it all, or died
        if data:
            with contextlib.suppress(OSError):
                os.write(taken_w, b"k")
        status = _wait(pid)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        os.close(result_r)
        os.close(taken_w)
        os.close(alive_w)
    _kill_tree(os.getpid())  # whatever reached the front after the guardian ended
    if data:
        result = AttemptResult.from_json(json.loads(data))
        if stops and result.code == 0 and not result.interrupted:
            # Every rank had succeeded before the stop could be acted on (typically: it was
            # sent while ttmesh itself was stopped, SIGSTOP, and every rank ended meanwhile).
            # Nothing was left to stop: say so, rather than drop it silently.
            why = " (sent while ttmesh was stopped)" if continued else ""
            note(
                f"{procs.signal_name(stops[0])}{why} came after every rank had ended: "
                "nothing was left to stop"
            )
        if stops and result.code != 0 and not result.interrupted:
            # A stop the guardian did not act on: it came as a failed attempt ended (the
            # verdict was being made), or while a restartable stop (a hang) was under way.
            # It is still the user's stop: the job ends as stopped, never restarted.
            result = replace(
                result, code=128 + stops[0], source=Source.TTMESH, rank=None,
                reason=stop_reason(stops[0]), interrupted=True, hung=False,
            )  # fmt: skip
        return result
    how = procs.describe_status(status)
    return AttemptResult(
        attempt,
        procs.exit_code(status) or 1,
        Source.TTMESH,
        None,
        f"the supervisor {how}",
        supervisor_lost=True,
    )


def _relay(fd: int, observer: Observer) -> None:
    """The guardian's events to ``observer``, until the guardian closes the pipe (it ended,
    or was killed). A view that fails leaves the console plain for the rest of the attempt."""
    reader = EventReader(observer)
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while True:
            ready = selector.select(TICK)
            try:
                if ready:
                    data = os.read(fd, 65536)
                    if not data:
                        break
                    reader.feed(data)
                reader.observer.tick()
            except Exception as exc:
                if isinstance(reader.observer, _Plain):
                    raise
                reader.observer = _Plain()
                _report_crash(exc, "the live view")


class _Plain:
    """An observer that only writes the console's bytes, as if there were no view."""

    def phase(self, phase: JobPhase, detail: str = "") -> None:
        pass

    def attempt(self, attempt: int) -> None:
        pass

    def rank_started(self, rank: int, pid: int) -> None:
        pass

    def rank_ready(self, rank: int) -> None:
        pass

    def rank_exited(self, rank: int, code: int, how: str, stopped: bool) -> None:
        pass

    def lines(self, last: dict[int, str]) -> None:
        pass

    def output(self, fd: int, data: bytes) -> None:
        with contextlib.suppress(OSError):
            _write_all(fd, data)

    def tick(self) -> None:
        pass


def _report_crash(exc: BaseException, what: str = "supervisor") -> None:
    """A bug in the guardian (or a view): one line (the traceback with TTMESH_DEBUG=1)."""
    if os.environ.get("TTMESH_DEBUG"):
        import traceback

        text = f"ttmesh: {what} error:\n" + traceback.format_exc()
    else:
        text = f"ttmesh: {what} error: {type(exc).__name__}: {exc} (TTMESH_DEBUG=1 shows more)\n"
    with contextlib.suppress(Exception):
        os.write(2, text.encode())


def _forward(pid: int, stops: list[int], sig: int, _frame: object = None) -> None:
    stop = sig == signal.SIGINT or sig in STOPPING
    if stop:
        stops.append(sig)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
    if not stop:
        return
    # A stopped guardian (SIGSTOP) would hold the stop, pending, as long as it stays stopped:
    # continue it, so the job stops (as systemd does after its SIGTERM, systemd.kill(5)).
    state = procs.state(pid)
    if state == "T":  # said first: once continued, the guardian's own lines follow at once
        _say(f"the supervisor (pid {pid}) was stopped (SIGSTOP): continued it, to stop the job")
        procs.continue_stopped(pid)
    elif state == "t":
        _say(f"the supervisor (pid {pid}) is held by a debugger: the stop waits for it")


def _say(message: str) -> None:
    """A line from a signal handler: straight to fd 2 (no stream buffer in between)."""
    with contextlib.suppress(OSError):
        os.write(2, f"ttmesh: {message}\n".encode())


def _wait(pid: int) -> int:
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            return status
        except ChildProcessError:
            return 0
        except InterruptedError:
            continue


def _taken(fd: int) -> bool:
    """Did the front take the result over (a byte), rather than die (the pipe's end)?"""
    try:
        return os.read(fd, 1) == b"k"
    except OSError:
        return False


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _kill_tree(root: int) -> None:
    """SIGKILL every descendant of ``root`` (this process, a subreaper) until none is left.

    Orphans re-parent to it: a walk of the tree can read a dying child (mpirun once the
    guardian is killed) as a zombie just as its children are handed over, and see nothing
    alive. So an empty walk ends the sweep only when no child is left to reap either: a child
    is reapable only once its exit, the hand-over of its children included, is complete."""
    for _ in range(200):
        left = procs.live_descendants(root)
        if left:
            procs.signal_pids(left, signal.SIGKILL)
        procs.reap_all()
        if not left and not procs.has_children():
            break
        time.sleep(0.01)
    procs.reap_all()


# --------------------------------------------------------------------------- guardian


class Phase(StrEnum):
    STARTING = "starting"  # the starter is starting the ranks
    RUNNING = "running"  # ranks run: exits, signals and readiness are watched
    STOPPING = "stopping"  # SIGTERM sent; SIGKILL when the grace ends
    DRAINING = "draining"  # no rank left: sweep every descendant, read the last output
    DONE = "done"


@dataclass
class Stop:
    """Why ttmesh (not a failing rank) stops the attempt, and the code it ends with."""

    reason: str
    code: int
    restartable: bool = (
        False  # not ready in time, unhealthy: a restart may help (not a user's stop)
    )
    user: bool = False  # the user stopped the job (a signal to ttmesh)
    quiet: bool = False  # a refusal: its one line is all that is said (no drain lines)
    # What the ranks are sent first: the user's own signal (torchrun's agent passes it on), or
    # SIGTERM when ttmesh stops them (a failure, a hang, another host).
    sends: int = signal.SIGTERM


class Guardian:
    def __init__(
        self,
        plan: LaunchPlan,
        attempt: int,
        options: Options,
        base_env: dict[str, str],
        alive_fd: int,
        host: Host,
        observer: Observer | None = None,
        pending: Pending | None = None,
    ) -> None:
        self.plan = plan
        self.observer = observer  # the front's view, through the pipe (EventWriter)
        self.pending = pending
        self.pending_due = 0.0  # when to ask it next (monotonic)
        self.polled = 0.0  # when fabric marks and readiness were last looked at (monotonic)
        self.refusal: TTMeshError | None = None
        self.attempt = attempt
        self.options = options
        self.host = host
        self.alive_fd = alive_fd
        self.pid = os.getpid()
        self.started = time.monotonic()
        self.phase = Phase.STARTING
        self.starter: Starter = starter_for(plan)(plan, attempt, base_env, self.pid)
        self.selector = selectors.DefaultSelector()
        self.console: Console | None = None
        self.open: dict[int, tuple[int, str]] = {}  # fd -> (owner, stream name) still open
        self.running: set[int] = set()
        self.exits: dict[int, RankExit] = {}
        self.first_failure: RankExit | None = None
        self.stop: Stop | None = None
        self.deadline: float | None = None  # when SIGTERM was sent: the end of the grace
        self.killed = False  # SIGKILL sent
        # What the drain last said (docs/recovery.md: the words are stable): when, about what
        # ("ranks" still running, or "leftovers" once they ended), and the live view's detail.
        self.drain_said = 0.0
        self.drain_kind = ""
        self.drain_detail = ""
        self.signalled: set[int] = set()  # PIDs sent SIGTERM
        self.fabric: set[int] = set()  # ranks that brought the fabric up
        self.ready: set[int] = set()
        self.registered = False  # the host heard which workers hold which chips
        self.front_gone = False  # the launcher was killed: this guardian finishes the job
        # RE2, linear in the line: a pattern that backtracks must not make the guardian deaf.
        self.ready_re = compile_pattern(plan.ready_pattern) if plan.ready_pattern else None
        self.server: Server | None = None
        if plan.serving is not None:  # a server's readiness and health (HTTP): only for one
            from ttmesh.launcher.serving.server import Server

            self.server = Server(plan.serving)
        # Taken before any rank starts: what a server's profile names that appears in shared
        # memory meanwhile is the server's, removed once nothing uses it. (Open MPI's segments
        # go to the job's run directory: plan.SEGMENT_VAR.)
        self.leftovers = Leftovers(plan.serving.profile.leftovers if plan.serving else ())
        # What the observer was told: ranks started and ready, the phase; lines not yet sent.
        self.shown: dict[str, Any] = {"started": set(), "ready": set(), "phase": None}
        self.last_lines: dict[int, str] = {}

    # -- setup

    def _signals(self) -> None:
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        os.set_blocking(self.wake_r, False)
        for sig in (*FORWARDED, signal.SIGCHLD, PEER_STOP):
            signal.signal(sig, lambda *_: None)
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        self.selector.register(self.wake_r, selectors.EVENT_READ, "signals")
        self.selector.register(self.alive_fd, selectors.EVENT_READ, "front")
        # Blocked since the fork (run_attempt): what arrived meanwhile is delivered now, here.
        # Before the first worker starts: a child inherits the mask, even across exec.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)

    def _start(self) -> None:
        failed = self.starter.start()
        for stream in self.starter.streams:
            self.open[stream.fd] = (stream.owner, stream.name)
            self.selector.register(stream.fd, selectors.EVENT_READ, "output")
        self.running = {r.rank for r in self.plan.ranks} - {e.rank for e in failed}
        if not self.starter.has_launcher:
            self.running &= set(self.starter.pids)
        elif failed:  # mpirun never started: no rank runs (waiting for one would be forever)
            self.running = set()
        self.phase = Phase.RUNNING
        if self.server is not None and 0 in self.starter.pids:
            wake = self.server.start(self.starter.pids[0])
            self.selector.register(wake, selectors.EVENT_READ, "serving")
        for ended in failed:
            if ended.started:  # one that never ran is the launcher's one line (AttemptResult)
                self._emit(f"rank {ended.rank}: {ended.how}")
        self._ended(failed)

    # -- the loop

    def run(self) -> AttemptResult:
        os.setpgid(0, 0)
        procs.set_subreaper()
        self._signals()
        self.console = Console(
            len(self.plan.ranks),
            self.options.ranks_filter,
            self.options.log_dir,
            self.options.quiet,
            self.attempt,
            launcher=self.starter.has_launcher,
            offset=self.plan.rank_offset,
            sink=self.observer.output if self.observer is not None else None,
            spec=self.options.logs,
            local_ranks={i: int(r.env.get("LOCAL_RANK", i)) for i, r in enumerate(self.plan.ranks)},
        )
        self.starter.console = self.console
        if self.ready_re is not None or self.observer is not None:
            self.console.on_line = self._on_line
        self._report()
        self._start()
        self._register()
        self._write_record()
        try:
            self._step()  # a rank that never started may have ended the attempt already
            while self.phase is not Phase.DONE:
                for key, _ in self.selector.select(self._timeout()):
                    if key.data == "signals":
                        self._on_signals()
                    elif key.data == "front":
                        self._on_front_gone()
                    elif key.data == "serving":
                        self._on_server()
                    else:
                        self._on_output(key.fd)
                self._step()
        finally:
            self.console.shutdown()
            self._keep_errors()
            if self.server is not None:
                self.server.close()
            self._report()
        return self._result()

    def _keep_errors(self) -> None:
        """Each rank's recorded exception into torchrun's log layout (logspec.keep_error)."""
        spec = self.options.logs
        if spec is None or spec.dir_fd is None:
            return
        for i, rank in enumerate(self.plan.ranks):
            source = rank.env.get("TORCHELASTIC_ERROR_FILE")
            if source:
                with contextlib.suppress(OSError):  # a full disk loses the copy, not the job
                    spec.keep_error(self.attempt, str(i), source)

    def _step(self) -> None:
        """Move between phases on what time and the host say now."""
        self._ask_pending()
        if not self.registered:
            self._register()
        now = time.monotonic()
        if now - self.polled >= POLL:  # not on every output event: a rank may print 100 MB
            self.polled = now
            self._poll_fabric()
            if self.phase is Phase.RUNNING:
                self._watch_ready()
                if self.server is not None and 0 not in self.ready:
                    progress = self.server.progress(time.monotonic() - self.started)
                    if progress:
                        self._emit(progress)
        if self.deadline is not None and not self.killed and time.monotonic() >= self.deadline:
            left = len(procs.live_descendants(self.pid))
            if left:
                self._say_grace_over(left)
            self._kill()
        if self.running:
            self._say_drain(len(self.running))
        if not self.running and self.phase is not Phase.DRAINING:
            self.phase = Phase.DRAINING
        if self.phase is Phase.DRAINING and self._swept() and self.pending is None:
            self._drain(None)
            self._clean_leftovers()
            self.phase = Phase.DONE
        self._report()

    def _clean_leftovers(self) -> None:
        """Remove what the server left in shared memory and nothing uses, a line each."""
        for path in self.leftovers.clean():
            self._emit(f"removed {path}, left behind by the server")

    def _timeout(self) -> float | None:
        now = time.monotonic()
        waits = []
        if self.deadline is not None and not self.killed:
            waits.append(max(0.0, self.deadline - now))
        if self.running:
            waits.append(POLL)  # rank PIDs, fabric marks, readiness
        if self.phase is Phase.DRAINING:
            waits.append(SWEEP_POLL)
        if self.pending is not None:
            waits.append(max(0.0, self.pending_due - now))
        return min(waits) if waits else None

    def _ask_pending(self) -> None:
        """The check still running since the start: ask it when due; a refusal stops the job
        (whatever the ranks did meanwhile, it decides the attempt). A stop the user asked for
        does not wait for it."""
        if self.pending is None:
            return
        if self.front_gone or (self.stop is not None and self.stop.user):
            self.pending = None
            return
        if time.monotonic() < self.pending_due:
            return
        wait = self.pending.step()
        if wait is not None:
            self.pending_due = time.monotonic() + wait
            return
        self.refusal, self.pending = self.pending.refusal, None
        if self.refusal is not None:
            self._begin_stop(Stop(f"refused: {self.refusal}", self.refusal.code, quiet=True))

    # -- events

    def _on_signals(self) -> None:
        try:
            data = os.read(self.wake_r, 1024)
        except BlockingIOError:
            data = b""
        for sig in data:
            if sig == signal.SIGINT:
                if self.stop is not None or self.first_failure is not None:
                    if self.stop is None:  # a failing rank's teardown: the user's stop wins,
                        self.stop = Stop(stop_reason(sig), 130, user=True)  # as SIGTERM's does
                        self._emit("interrupted while stopping: killing every worker now")
                    else:
                        self._emit("second interrupt: killing every worker now")
                    self._kill()
                else:
                    self._emit("interrupted: stopping every worker (Ctrl-C again to kill at once)")
                    self._begin_stop(Stop(stop_reason(sig), 130, user=True, sends=sig))
            elif sig in STOPPING and self.stop is None:
                why = stop_reason(sig)
                self._emit(f"{why}: stopping every worker")
                self._begin_stop(Stop(why, 128 + sig, user=True, sends=sig))
            elif sig == PEER_STOP and self.stop is None and self.first_failure is None:
                self._begin_stop(
                    Stop("stopped: another host of the job failed", 128 + signal.SIGTERM)
                )
            elif sig in (signal.SIGUSR1, signal.SIGUSR2):
                procs.signal_groups(self.starter.signal_targets(self.running), sig)
        self._reap()

    def _reap(self) -> None:
        for pid, status in procs.reap_all():
            stopping = self.phase is not Phase.RUNNING or pid in self.signalled
            self._ended(self.starter.reaped(pid, status, self.running, stopping, self._drain))

    def _ended(self, batch: list[RankExit]) -> None:
        """Ranks ended; the first failure (one ttmesh did not stop, if any) stops the rest."""
        for ended in batch:
            if ended.rank < 0:
                continue  # the launcher itself (mpirun) failed: it stands for the job
            self._check_fabric(self.plan.ranks[ended.rank])
            self.exits[ended.rank] = ended
            if self.observer is not None:
                self._send_lines()
                self.observer.rank_exited(ended.rank, ended.code, ended.how, ended.stopped)
            self.running.discard(ended.rank)
            if ended.rank in self.fabric and ended.pid > 0:
                self.host.worker_ended(ended.pid, clean=ended.code == 0)
        failures = [e for e in batch if e.code != 0]
        if failures and self.first_failure is None and self.stop is None:
            self.first_failure = next((e for e in failures if not e.stopped), failures[0])
            self._begin_stop(None)

    def _on_front_gone(self) -> None:
        """The ttmesh process vanished (killed): nobody is waiting, so kill everything now."""
        self.selector.unregister(self.alive_fd)
        self.front_gone = True
        if self.stop is None:
            self.stop = Stop("ttmesh was killed", 128 + signal.SIGKILL)
        self._kill()

    def _on_output(self, fd: int) -> None:
        if fd not in self.open:
            return  # already drained and closed while this event was pending
        owner, name = self.open[fd]
        try:
            data = os.read(fd, READ_SIZE)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            self.starter.feed(owner, name, data)
            return
        self.selector.unregister(fd)
        os.close(fd)
        del self.open[fd]
        self.starter.closed(owner, name)

    def _drain(self, owner: int | None) -> None:
        """Read what the pipes of ``owner`` (None: everyone) still hold, briefly."""
        deadline = time.monotonic() + DRAIN

        def pending() -> bool:
            return any(owner is None or o == owner for o, _ in self.open.values())

        while pending() and time.monotonic() < deadline:
            for key, _ in self.selector.select(max(0.0, min(0.05, deadline - time.monotonic()))):
                if key.data == "output" and (
                    owner is None or self.open.get(key.fd, (None,))[0] == owner
                ):
                    self._on_output(key.fd)
                elif key.data == "signals":
                    with contextlib.suppress(BlockingIOError):
                        os.read(self.wake_r, 1024)
                    if owner is None:
                        procs.reap_all()
                elif key.data == "front" and owner is None:
                    self.selector.unregister(self.alive_fd)

    # -- stopping

    def _begin_stop(self, stop: Stop | None) -> None:
        """RUNNING -> STOPPING: SIGTERM (or the user's own signal, as torchrun passes it on) to
        every rank's process group, SIGKILL after the grace."""
        if stop is not None and self.stop is None:
            self.stop = stop
        if self.phase is Phase.RUNNING:
            self.phase = Phase.STOPPING
        if self.deadline is None:
            self.deadline = time.monotonic() + self.plan.grace
            self.signalled.update(
                self.starter.pids[r] for r in self.running if r in self.starter.pids
            )
            # SIGCONT right after: a rank stopped (SIGSTOP) gets to handle its SIGTERM within
            # the grace, rather than sit on it until SIGKILL (systemd.kill(5) does the same).
            if self.server is not None:  # its own drain first: SIGTERM to the main process only
                # (a server drains on SIGTERM, as its makers intend, whatever stopped it)
                main = list(self.starter.pids.values())
                procs.signal_pids(main, signal.SIGTERM)
                procs.signal_pids(main, signal.SIGCONT)
            else:
                first = self.stop.sends if self.stop is not None else signal.SIGTERM
                procs.signal_groups(self.starter.groups(), first)
                procs.signal_groups(self.starter.groups(), signal.SIGCONT)

    def _on_server(self) -> None:
        """The server became ready, or failed a health check, or lost a critical process."""
        assert self.server is not None
        for event in self.server.events():
            if event.kind == "listening":
                self._emit(
                    f"{self.server.name}: listening ({event.detail}), {self.server.phase(True)}"
                )
            elif event.kind == "foreign":  # not the server: it is not ready, waits on
                self._emit(
                    f"{self.server.name}: {event.detail}: not ready until the server answers"
                )
            elif event.kind == "ready":
                self.ready.add(0)
                took = event.at - self.started
                self._emit(
                    f"{self.server.name}: ready after {took:.1f} s at {self.server.spec.url}"
                )
                self._emit(f"try: {self.server.spec.curl()}")
            elif self.stop is None and self.first_failure is None:
                self._emit(f"{self.server.name}: {event.detail}: stopping it")
                self._begin_stop(Stop(f"{event.kind}: {event.detail}", 1, restartable=True))

    def _kill(self) -> None:
        self.killed = True
        if self.phase is Phase.RUNNING:
            self.phase = Phase.STOPPING
        procs.signal_groups(self.starter.groups(), signal.SIGKILL)
        procs.signal_pids(procs.live_descendants(self.pid), signal.SIGKILL)
        self._reap()

    def _swept(self) -> bool:
        """No descendant may survive the ranks: SIGTERM what lingers, SIGKILL at the deadline."""
        self._reap()
        left = procs.live_descendants(self.pid)
        if not left:
            return True
        if self.killed:
            procs.signal_pids(left, signal.SIGKILL)
            return False
        if self.deadline is None:  # every rank succeeded, yet something they started lingers
            self.deadline = time.monotonic() + self.plan.grace
            procs.signal_groups(self.starter.groups(), signal.SIGTERM)
        fresh = [p for p in left if p not in self.signalled]
        self.signalled.update(fresh)
        procs.signal_pids(fresh, signal.SIGTERM)
        procs.signal_pids(fresh, signal.SIGCONT)
        self._say_drain(0, len(left))
        return False

    # -- what a drain says (stable words: docs/recovery.md, "Stopping and draining")

    def _say_drain(self, ranks: int, leftovers: int = 0) -> None:
        """While a grace runs: "draining, N s left" with what is waited for, when the drain
        begins, when it moves from ranks to their leftovers, and every DRAIN_SAY seconds; the
        live view's detail each second."""
        if self.deadline is None or self.killed or not (ranks or leftovers):
            return
        if self.stop is not None and self.stop.quiet:
            return
        now = time.monotonic()
        left = max(0.0, self.deadline - now)
        head = f"draining, {_seconds(left)} s left"
        self.drain_detail = f"draining, {math.ceil(left)} s left"  # the view: once a second
        kind = "ranks" if ranks else "leftovers"
        if kind == self.drain_kind and now - self.drain_said < DRAIN_SAY:
            return
        self.drain_kind, self.drain_said = kind, now
        if ranks:
            what = f"{ranks} rank{'s' if ranks != 1 else ''} still running"
        else:
            what = f"{leftovers} leftover process{'es' if leftovers != 1 else ''}"
        self._emit(f"{head} ({what})")

    def _say_grace_over(self, count: int) -> None:
        if self.stop is not None and self.stop.quiet:
            return
        line = f"grace over: SIGKILL of {count} process{'es' if count != 1 else ''}"
        self.drain_detail = line
        self._emit(line)

    # -- readiness (hang detection)

    def _on_line(self, rank: int, line: str) -> None:
        if (
            rank >= 0
            and self.ready_re is not None
            and rank not in self.ready  # once ready, a rank's lines need no matching
            and self.ready_re.search(line)
        ):
            self.ready.add(rank)
        if rank >= 0 and self.observer is not None:
            self.last_lines[rank] = line[:LINE_WIDTH]

    # -- what the observer hears (a live view in the front)

    def _report(self) -> None:
        """Tell the observer what changed since the last step: ranks started and ready, their
        last lines, the job's phase."""
        observer = self.observer
        if observer is None:
            return
        started, ready = self.shown["started"], self.shown["ready"]
        for rank, pid in sorted(self.starter.pids.items()):
            if rank not in started:
                started.add(rank)
                observer.rank_started(rank, pid)
        if self.plan.ready_timeout is None and self.phase is Phase.RUNNING:
            for rp in self.plan.ranks:  # ready files, watched for the view only
                pending = rp.rank not in self.ready and rp.rank in self.running
                if pending and os.path.exists(rp.env["TTMESH_READY_FILE"]):
                    self.ready.add(rp.rank)
        for rank in sorted(self.ready - ready):
            ready.add(rank)
            observer.rank_ready(rank)
        self._send_lines()
        phase = self._job_phase()
        detail = self.drain_detail if phase in (JobPhase.STOPPING, None) else ""
        if detail and phase is None:  # leftovers of ranks that all succeeded: still a drain
            phase = JobPhase.STOPPING
        shown = (phase, detail)
        if phase is not None and shown != self.shown["phase"]:
            self.shown["phase"] = shown
            observer.phase(phase, detail)

    def _send_lines(self) -> None:
        if self.last_lines and self.observer is not None:
            last, self.last_lines = self.last_lines, {}
            self.observer.lines(last)

    def _job_phase(self) -> JobPhase | None:
        """The attempt's phase as a person sees it (None: no change worth saying)."""
        if self.stop is not None or self.first_failure is not None:
            return JobPhase.STOPPING
        if self.phase is Phase.STARTING:
            return JobPhase.STARTING
        if self.phase is not Phase.RUNNING:
            return None  # every rank ended by itself: the front says how the job ended
        if not self.running:
            return None
        if self.running <= self.ready:
            return JobPhase.READY
        watched = (
            self.plan.ready_timeout is not None
            or self.ready_re is not None
            or self.server is not None
        )
        if watched or not self.running <= set(self.starter.pids):
            return JobPhase.STARTING
        return JobPhase.RUNNING

    def _watch_ready(self) -> None:
        if self.plan.ready_timeout is None:
            return
        for rank in self.plan.ranks:
            if rank.rank not in self.ready and os.path.exists(rank.env["TTMESH_READY_FILE"]):
                self.ready.add(rank.rank)
        waiting = sorted(self.running - self.ready)
        if waiting and time.monotonic() >= self.started + self.plan.ready_timeout:
            names = f"{noun(len(waiting), 'rank')} {', '.join(map(str, waiting))}"
            after = f"{self.plan.ready_timeout:g} s"
            why = self.server.not_ready() if self.server is not None else ""
            after += f" ({why})" if why else ""
            self._emit(f"{names} not ready after {after}: treating the job as hung in bring-up")
            self._begin_stop(Stop(f"hung in bring-up: {names} not ready after {after}", HUNG, True))

    # -- what the host hears: workers holding chips, fabric opened

    def _register(self) -> None:
        """Once every rank's PID is known: the workers hold their chips; a layout that joins
        chips has brought their fabric up (one mark per worker, over every chip of the job
        when the workers form one tt-metal world)."""
        starter = self.starter
        if self.registered or not self.running:
            return
        starter.discover()
        if not starter.known():
            return  # not all ranks started yet (MPI): try again on the next step
        self.registered = True
        pids = starter.pids
        mine = [r for r in self.plan.ranks if r.rank in pids and r.chips]  # a chipless server: none
        self.host.workers_started([(list(r.chips), pids[r.rank]) for r in mine])
        world = Layout(self.plan.layout).one_world
        joined = [r for r in mine if world or r.joins_chips]
        marks = [(self.plan.all_chips() if world else list(r.chips), pids[r.rank]) for r in joined]
        self.host.fabric_opened(marks, owner=self.plan.job, supervisor=self.pid)
        self.fabric.update(r.rank for r in joined)
        if starter.has_launcher:
            self._write_record()

    def _check_fabric(self, rank: RankPlan) -> None:
        """A rank that created its TTMESH_FABRIC_FILE brought the fabric up."""
        pid = self.starter.pids.get(rank.rank)
        if rank.rank in self.fabric or pid is None or not rank.chips:
            return  # a rank with no chip (a chipless server) opens no fabric
        if os.path.exists(rank.env["TTMESH_FABRIC_FILE"]):
            self.fabric.add(rank.rank)
            self.host.fabric_opened(
                [(self.plan.all_chips(), pid)], owner=self.plan.job, supervisor=self.pid
            )

    def _poll_fabric(self) -> None:
        for rank in self.plan.ranks:
            if rank.rank in self.running:
                self._check_fabric(rank)

    # -- records and results

    def _write_record(self) -> None:
        from ttmesh.errors import TTMeshError
        from ttmesh.runtime import jobs

        pids = self.starter.pids
        ranks = [
            {"rank": r.rank, "pid": pids.get(r.rank), "bdfs": list(r.bdfs), "chips": list(r.chips)}
            for r in self.plan.ranks
        ]
        with contextlib.suppress(OSError, TTMeshError):
            jobs.update(self.plan.job, guardian=self.pid, attempt=self.attempt, ranks=ranks)

    def _emit(self, message: str) -> None:
        data = f"ttmesh: {message}\n".encode()
        if self.observer is not None:
            self.observer.output(2, data)
            return
        with contextlib.suppress(OSError):
            os.write(2, data)

    def _result(self) -> AttemptResult:
        result = self._verdict()
        if self.refusal is not None:
            r = self.refusal
            return replace(
                result, code=r.code, source=Source.TTMESH, rank=None, reason=f"refused: {r}",
                interrupted=True, refusal=[r.code, r.message, r.hint],
            )  # fmt: skip
        if result.code != 0:
            result.diagnosis = self._diagnose(result.rank)
        return result

    def _diagnose(self, rank: int | None) -> dict[str, Any] | None:
        """A known failure line in the output that tells: the failing rank's, or every rank's
        when ttmesh ended the attempt (a server is rank 0 of its plan); then mpirun's own. When
        the failing rank's output knows none, the others' (a rank that aborted in a collective
        because a peer failed: the peer says why)."""
        from ttmesh.launcher.attempt import failures

        assert self.console is not None
        everyone = [r.rank for r in self.plan.ranks]
        if self.starter.has_launcher:
            everyone.append(LAUNCHER)
        tries = [everyone] if rank is None else [[rank], [o for o in everyone if o != rank]]
        if rank is not None and self.starter.has_launcher:
            tries[0].append(LAUNCHER)
        server = self.server.name if self.server is not None else None
        try:
            for owners in tries:
                found = failures.match(failures.tails(owners, self.console.tail, server))
                if found is not None:
                    return found
            return None
        except Exception as exc:  # a broken table must not hide how the job ended
            self._emit(f"the table of known failures could not be read: {exc}")
            return None

    def _verdict(self) -> AttemptResult:
        assert self.console is not None
        base = AttemptResult(
            attempt=self.attempt,
            code=0,
            source=Source.WORKER,
            rank=None,
            reason="every rank succeeded",
            exits=[self.exits[r] for r in sorted(self.exits)],
            fabric_ranks=sorted(self.fabric),
            duration=time.monotonic() - self.started,
        )
        if self.stop is not None:
            return replace(
                base, code=self.stop.code, source=Source.TTMESH, reason=self.stop.reason,
                interrupted=not self.stop.restartable, hung=self.stop.code == HUNG,
            )  # fmt: skip
        if self.starter.launcher_error is not None:
            return replace(
                base, code=2, source=Source.TTMESH, interrupted=True,
                reason=f"mpirun failed to start the ranks: {self.starter.launcher_error}",
            )  # fmt: skip
        failure = self.first_failure
        if failure is None:
            return base
        if not failure.started:  # its program never ran: one line, no restart
            rank = self.plan.ranks[failure.rank]
            line = f"rank {failure.rank + self.plan.rank_offset}"
            if rank.bdfs:
                line += f" ({', '.join(rank.bdfs)})"
            line += f" {failure.how}"
            return replace(
                base, code=failure.code, source=Source.TTMESH, rank=failure.rank, reason=line,
                interrupted=True, unstarted=[line, failure.hint],
            )  # fmt: skip
        if failure.rank < 0:  # the launcher itself failed
            return replace(
                base, code=failure.code, source=Source.TTMESH, reason=failure.how,
                stderr_tail=self.console.tail(LAUNCHER)[-10:],
            )  # fmt: skip
        # torch's @record file: a server (stock SGLang keeps no torchrun variable) has none,
        # and its exit code and last stderr lines say why it failed.
        error_file = self.plan.ranks[failure.rank].env.get("TORCHELASTIC_ERROR_FILE")
        error = _error_message(error_file) if error_file else None
        return replace(
            base, code=failure.code, rank=failure.rank, reason=f"rank {failure.rank + self.plan.rank_offset} {failure.how}",  # global rank
            stderr_tail=self.console.tail(failure.rank)[-10:], error_message=error,
        )  # fmt: skip


def _seconds(value: float) -> str:
    """Seconds left as a person reads them, rounded up: "30", "2.5", "0"."""
    if value >= 10:
        return str(math.ceil(value - 1e-9))
    return f"{math.ceil(value * 10 - 1e-9) / 10:.1f}".removesuffix(".0")


def _error_message(path: str) -> str | None:
    """The exception a worker recorded with torch's @record (TORCHELASTIC_ERROR_FILE)."""
    from ttmesh import fileread

    try:  # bounded: a rank may leave anything there (a FIFO would hang the guardian)
        data = json.loads(fileread.read_bytes(path, fileread.MiB, "error file"))
    except (OSError, ValueError):  # fileread.Refused is a ValueError
        return None
    if not isinstance(data, dict):
        return None
    message = data.get("message")
    if isinstance(message, dict):
        return str(message.get("message") or "") or None
    return str(message) if message else None
