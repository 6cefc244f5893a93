"""Spawning, watching and tearing down a job's workers, to the last descendant.

Two processes share the work of one attempt:

* the **front** is the ``ttmesh`` process the user started. It forks the guardian, forwards
  SIGINT/SIGTERM/SIGHUP/SIGUSR1/SIGUSR2 to it, waits for it and returns its verdict. It is a
  child subreaper, so if the guardian is killed, everything orphaned comes to it and is killed.
* the **guardian** (forked, in its own process group, a child subreaper) is the parent of every
  worker. Workers start from its main thread in their own sessions with a parent-death signal;
  every orphaned descendant, even one that called ``setsid``, is re-parented to it, so a sweep
  of its process subtree finds everything. Exits arrive as SIGCHLD through a wakeup fd, at once.
  If the front disappears (even by SIGKILL), a pipe the front held closes, and the guardian
  kills the whole tree before it leaves.

First failure: SIGTERM to every worker's process group (the failed one's too, which reaches its
grandchildren), SIGKILL after the grace period, then a sweep until no descendant is left.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import selectors
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from ttmesh.launcher import procs
from ttmesh.launcher.logs import LAUNCHER, Console
from ttmesh.launcher.plan import LaunchPlan, RankPlan

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
# Signals sent to ttmesh that stop the job gracefully (exit 128 + signal); SIGUSR1/2 are passed
# on to the workers, SIGINT is Ctrl-C (a second one kills at once).
STOPPING = {signal.SIGTERM: "terminated", signal.SIGHUP: "hangup"}
FABRIC_POLL = 0.05
HUNG = 124  # ttmesh's code for a job that never became ready (as timeout(1) uses it)
SWEEP_POLL = 0.02


@dataclass
class RankExit:
    rank: int
    pid: int
    code: int  # as a shell reports it: exit code, or 128 + signal
    how: str  # "exited with code 3", "killed by SIGTERM"
    stopped: bool  # ttmesh signalled it before it ended


@dataclass
class AttemptResult:
    attempt: int
    code: int
    source: str  # "worker" | "ttmesh"
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

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AttemptResult:
        exits = [RankExit(**e) for e in data.pop("exits", [])]
        return cls(**data, exits=exits)


@dataclass
class Options:
    ranks_filter: set[int] | None = None
    log_dir: str | None = None
    quiet: bool = False


# --------------------------------------------------------------------------- front


def run_attempt(
    plan: LaunchPlan,
    attempt: int,
    options: Options,
    base_env: dict[str, str],
    orphaned: Callable[[AttemptResult], int] | None = None,
) -> AttemptResult:
    """Run one attempt of the job (every rank once) and return how it ended.

    ``orphaned``: what the guardian does with the attempt's result when the launcher was
    killed while it ran (finish the job in its place); its return value is the exit code."""
    sys.stdout.flush()
    sys.stderr.flush()
    # If the guardian itself dies, what it left is re-parented here and swept below.
    procs.set_subreaper()
    alive_r, alive_w = os.pipe()
    result_r, result_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the guardian
        code = 1
        try:
            os.close(alive_w)
            os.close(result_r)
            guardian = Guardian(plan, attempt, options, base_env, alive_r)
            result = guardian.run()
            code = result.code
            if guardian.front_gone and orphaned is not None:
                code = orphaned(result)
            else:
                _write_all(result_w, json.dumps(result.to_json()).encode())
        except BaseException as exc:
            if not isinstance(exc, BrokenPipeError | SystemExit):
                with contextlib.suppress(Exception):
                    os.write(2, ("ttmesh: supervisor error:\n" + traceback.format_exc()).encode())
            with contextlib.suppress(Exception):
                _kill_tree(os.getpid())  # a broken guardian still leaves nothing behind
        finally:
            os._exit(code)
    os.close(alive_r)
    os.close(result_w)
    previous = {}
    for sig in FORWARDED:
        previous[sig] = signal.signal(sig, lambda s, _f, pid=pid: _forward(pid, s))
    try:
        status = _wait(pid)
        data = _read_all(result_r)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        os.close(result_r)
        os.close(alive_w)
    _sweep_orphans()
    if data:
        return AttemptResult.from_json(json.loads(data))
    how = procs.describe_status(status)
    return AttemptResult(
        attempt,
        procs.exit_code(status) or 1,
        "ttmesh",
        None,
        f"the supervisor {how}",
        supervisor_lost=True,
    )


def _forward(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _wait(pid: int) -> int:
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            return status
        except ChildProcessError:
            return 0
        except InterruptedError:
            continue


def _read_all(fd: int) -> bytes:
    chunks = []
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _kill_tree(root: int) -> None:
    """SIGKILL every descendant of ``root`` until none is left (orphans re-parent to it)."""
    for _ in range(200):
        left = procs.live_descendants(root)
        if not left:
            break
        procs.signal_pids(left, signal.SIGKILL)
        procs.reap_all()
        time.sleep(0.01)
    procs.reap_all()


def _sweep_orphans() -> None:
    """Whatever reached the front (it is a subreaper) after the guardian ended is killed."""
    _kill_tree(os.getpid())


# --------------------------------------------------------------------------- guardian


class Guardian:
    def __init__(
        self,
        plan: LaunchPlan,
        attempt: int,
        options: Options,
        base_env: dict[str, str],
        alive_fd: int,
    ) -> None:
        self.plan = plan
        self.attempt = attempt
        self.options = options
        self.base_env = base_env
        self.alive_fd = alive_fd
        self.pid = os.getpid()
        self.by_pid: dict[int, RankPlan] = {}
        self.pids: dict[int, int] = {}  # rank -> pid
        self.running: set[int] = set()  # ranks still running
        self.exits: dict[int, RankExit] = {}
        self.first_failure: RankExit | None = None
        self.stop_reason: str | None = None
        self.stop_code: int | None = None
        self.deadline: float | None = None
        self.killed = False
        self.signalled: set[int] = set()
        self.fabric_seen: set[int] = set()
        self.sim = None
        self.console: Console | None = None
        self.selector = selectors.DefaultSelector()
        self.open_streams: dict[int, tuple[int, str]] = {}
        self.start = time.monotonic()
        self.mpi_pid: int | None = None  # the MPI start mode's mpirun
        self.launcher_error: str | None = None  # mpirun could not start the ranks
        self.ready: set[int] = set()
        self.hung = False
        self.ready_deadline = (
            self.start + plan.ready_timeout if plan.ready_timeout is not None else None
        )
        self.ready_re = re.compile(plan.ready_pattern) if plan.ready_pattern else None
        self.demux = None
        self.sim_registered = False
        self.front_gone = False  # the launcher was killed: this guardian finishes the job

    # -- setup

    def _signals(self) -> None:
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        os.set_blocking(self.wake_r, False)
        for sig in (*FORWARDED, signal.SIGCHLD):
            signal.signal(sig, lambda *_: None)
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        self.selector.register(self.wake_r, selectors.EVENT_READ, "signals")
        self.selector.register(self.alive_fd, selectors.EVENT_READ, "front")

    def _watch_output(self, proc: subprocess.Popen, rank: int) -> None:
        for name, stream in (("stdout", proc.stdout), ("stderr", proc.stderr)):
            assert stream is not None
            fd = os.dup(stream.fileno())
            stream.close()
            os.set_blocking(fd, False)
            self.open_streams[fd] = (rank, name)
            self.selector.register(fd, selectors.EVENT_READ, "output")

    def _spawn_mpi(self) -> None:
        from ttmesh.launcher import mpi

        assert self.console is not None
        console = self.console
        self.demux = mpi.Demux(console.feed)
        for rank in self.plan.ranks:
            if rank.workdir:
                os.makedirs(rank.workdir, exist_ok=True)
        try:
            proc = mpi.start(self, self.plan.mpirun)
        except OSError as exc:
            self._emit(f"cannot start mpirun ({self.plan.mpirun}): {exc.strerror}")
            self.exits[0] = RankExit(0, -1, 127, f"mpirun could not start ({exc.strerror})", False)
            self.first_failure = self.exits[0]
            return
        proc.returncode = 0
        self.mpi_pid = proc.pid
        self.running.update(r.rank for r in self.plan.ranks)
        self._watch_output(proc, LAUNCHER)

    def _spawn(self) -> None:
        if self.plan.launcher == "mpi":
            self._spawn_mpi()
            return
        preexec = procs.pdeathsig_preexec(self.pid)
        for rank in self.plan.ranks:
            env = self.plan.rank_env(rank, self.base_env, self.attempt)
            try:
                if rank.workdir:
                    os.makedirs(rank.workdir, exist_ok=True)
                proc = subprocess.Popen(
                    list(rank.argv),
                    env=env,
                    cwd=rank.workdir or self.plan.cwd or None,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,
                    preexec_fn=preexec,
                    close_fds=True,
                )
            except OSError as exc:
                self._emit(f"rank {rank.rank}: cannot start {rank.argv[0]}: {exc.strerror}")
                self.exits[rank.rank] = RankExit(
                    rank.rank, -1, 127, f"could not start ({exc.strerror})", False
                )
                if self.first_failure is None:
                    self.first_failure = self.exits[rank.rank]
                self._begin_stop(None, None)
                return
            proc.returncode = 0  # reaped by the guardian's own waitpid, never by Popen
            self.by_pid[proc.pid] = rank
            self.pids[rank.rank] = proc.pid
            self.running.add(rank.rank)
            self._watch_output(proc, rank.rank)

    def _register_sim(self) -> None:
        """On a simulated host, the workers hold their chips; a layout that joins chips has
        brought their fabric up (one mark per worker, over every chip of the job when the
        workers form one tt-metal world)."""
        if self.mpi_pid is not None and len(self.pids) < len(self.plan.ranks) and self.running:
            from ttmesh.launcher import mpi

            self.pids.update(mpi.rank_pids(self.mpi_pid, len(self.plan.ranks)))
            if len(self.pids) < len(self.plan.ranks):
                return  # not all ranks started yet: try again on the next tick
            if not self.plan.simulated:
                self.sim_registered = True
                self._write_record()
        if not self.plan.simulated or self.sim_registered:
            return
        from ttmesh.sim.core import SimRoot

        self.sim = SimRoot(self.plan.root)
        self.sim_registered = True
        holders = [
            (list(r.chips), self.pids[r.rank]) for r in self.plan.ranks if r.rank in self.pids
        ]
        if holders:
            self.sim.add_holders(holders)
        world = self.plan.layout in ("mesh", "multi-mesh")
        joined = [
            (self.plan.all_chips() if world else list(r.chips), self.pids[r.rank])
            for r in self.plan.ranks
            if (world or r.joins_chips) and r.rank in self.pids
        ]
        if joined:
            self.sim.mark_fabric_many(joined, owner=self.plan.job, supervisor=self.pid)
            self.fabric_seen.update(
                r.rank for r in self.plan.ranks if (world or r.joins_chips) and r.rank in self.pids
            )
        if self.mpi_pid is not None:
            self._write_record()

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
            launcher=self.plan.launcher == "mpi",
        )
        if self.ready_re is not None:
            self.console.on_line = self._on_line
        self._spawn()
        self._register_sim()
        self._write_record()
        try:
            self._loop()
        finally:
            self.console.shutdown()
        return self._result()

    def _loop(self) -> None:
        while True:
            timeout = self._timeout()
            for key, _ in self.selector.select(timeout):
                if key.data == "signals":
                    self._on_signals()
                elif key.data == "front":
                    self._on_front_gone()
                else:
                    self._on_output(key.fd)
            if not self.sim_registered:
                self._register_sim()
            self._poll_fabric()
            self._watch_ready()
            now = time.monotonic()
            if self.deadline is not None and now >= self.deadline and not self.killed:
                self._kill_all()
            if not self.running and self._sweep_done():
                self._drain_output()
                return

    def _timeout(self) -> float | None:
        waits = []
        if self.deadline is not None and not self.killed:
            waits.append(max(0.0, self.deadline - time.monotonic()))
        if self.ready_deadline is not None and self.running and not self.hung:
            waits.append(min(FABRIC_POLL, max(0.0, self.ready_deadline - time.monotonic())))
        watching = self.plan.simulated or self.mpi_pid is not None
        if (
            watching
            and self.running
            and (
                not self.sim_registered
                or (self.plan.simulated and len(self.fabric_seen) < len(self.plan.ranks))
            )
        ):
            waits.append(FABRIC_POLL)
        if not self.running:
            waits.append(SWEEP_POLL)
        return min(waits) if waits else None

    def _on_signals(self) -> None:
        try:
            data = os.read(self.wake_r, 1024)
        except BlockingIOError:
            data = b""
        for sig in data:
            if sig == signal.SIGCHLD:
                continue
            if sig == signal.SIGINT:
                if self.stop_reason is not None or self.first_failure is not None:
                    self._emit("second interrupt: killing every worker now")
                    self._kill_all()
                else:
                    self._emit("interrupted: stopping every worker (Ctrl-C again to kill at once)")
                    self._begin_stop("interrupted (SIGINT)", 130)
            elif sig in STOPPING:
                if self.stop_reason is None:
                    name = STOPPING[sig]
                    why = f"{name} ({signal.Signals(sig).name})"
                    self._emit(f"{why}: stopping every worker")
                    self._begin_stop(why, 128 + sig)
            elif sig in (signal.SIGUSR1, signal.SIGUSR2):
                # Under MPI the rank PIDs may not all be known yet: mpirun forwards the rest.
                targets = [self.pids[r] for r in self.running if r in self.pids]
                if self.mpi_pid is not None:
                    targets.append(self.mpi_pid)
                procs.signal_groups(targets, sig)
        self._reap()

    def _reap(self) -> None:
        for pid, status in procs.reap_all():
            if pid == self.mpi_pid:
                self._mpirun_ended(status)
                continue
            rank = self.by_pid.get(pid)
            if rank is None:
                continue  # an orphaned descendant re-parented to us
            self._check_fabric(rank)
            code = procs.exit_code(status)
            stopped = (
                pid in self.signalled
                or self.stop_reason is not None
                or (self.first_failure is not None)
            )
            ended = RankExit(rank.rank, pid, code, procs.describe_status(status), stopped)
            self.exits[rank.rank] = ended
            self.running.discard(rank.rank)
            if self.sim is not None and rank.rank in self.fabric_seen:
                if code == 0:
                    self.sim.clear_fabric(pid)
                else:
                    self.sim.abandon_fabric(pid)
            if code != 0 and self.first_failure is None and self.stop_reason is None:
                self.first_failure = ended
                self._begin_stop(None, None)

    def _on_front_gone(self) -> None:
        """The ttmesh process vanished (killed): nobody is waiting, so kill everything now."""
        self.selector.unregister(self.alive_fd)
        self.front_gone = True
        if self.stop_reason is None:
            self.stop_reason = "ttmesh was killed"
            self.stop_code = 128 + signal.SIGKILL
        self._kill_all()

    def _on_output(self, fd: int) -> None:
        if fd not in self.open_streams:
            return  # already drained and closed while this event was pending
        rank, name = self.open_streams[fd]
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        assert self.console is not None
        if data:
            if rank == LAUNCHER and self.demux is not None:
                self.demux.data(name, data)
            else:
                self.console.feed(rank, name, data)
            return
        self.selector.unregister(fd)
        os.close(fd)
        del self.open_streams[fd]
        if rank == LAUNCHER and self.demux is not None:
            self.demux.flush()
            for r in self.plan.ranks:
                self.console.close(r.rank, name)
        self.console.close(rank, name)

    def _drain_output(self) -> None:
        deadline = time.monotonic() + 0.5
        while self.open_streams and time.monotonic() < deadline:
            events = self.selector.select(max(0.0, deadline - time.monotonic()))
            for key, _ in events:
                if key.data == "output":
                    self._on_output(key.fd)
                elif key.data == "signals":
                    with contextlib.suppress(BlockingIOError):
                        os.read(self.wake_r, 1024)
                    procs.reap_all()
                elif key.data == "front":
                    self.selector.unregister(self.alive_fd)

    # -- stopping

    def _groups(self) -> list[int]:
        groups = list(self.pids.values())
        if self.mpi_pid is not None:
            groups.append(self.mpi_pid)
        return groups

    def _mpirun_ended(self, status: int) -> None:
        """mpirun is gone: every rank is. Its report names the first rank that failed."""
        assert self.demux is not None
        # Read what mpirun said before judging: its report may still sit in the pipes.
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline and any(
            r == LAUNCHER for r, _ in self.open_streams.values()
        ):
            for key, _ in self.selector.select(0.05):
                if key.data == "output" and self.open_streams.get(key.fd, (0,))[0] == LAUNCHER:
                    self._on_output(key.fd)
        self.demux.flush()
        code = procs.exit_code(status)
        if code != 0 and not self.pids and self.stop_reason is None:
            # mpirun failed before any rank existed: the launcher, not a worker, failed.
            said = "".join(self.demux.text).strip().splitlines()
            self.launcher_error = said[-1] if said else procs.describe_status(status)
        failed = self.demux.first_failure()
        if code != 0 and failed is None:
            failed = (0, code) if len(self.plan.ranks) == 1 else None
        for rank in self.plan.ranks:
            if rank.rank not in self.running:
                continue
            pid = self.pids.get(rank.rank, -1)
            if failed is not None and rank.rank == failed[0]:
                how = procs.describe_status(
                    (failed[1] - 128) if failed[1] > 128 else (failed[1] << 8)
                )
                ended = RankExit(rank.rank, pid, failed[1], how, False)
            elif code == 0:
                ended = RankExit(rank.rank, pid, 0, "exited with code 0", False)
            else:
                ended = RankExit(rank.rank, pid, 143, "stopped by mpirun", True)
            self.exits[rank.rank] = ended
            if self.sim is not None and rank.rank in self.fabric_seen and pid > 0:
                if code == 0:
                    self.sim.clear_fabric(pid)
                else:
                    self.sim.abandon_fabric(pid)
        self.running.clear()
        if code != 0 and self.first_failure is None and self.stop_reason is None:
            if failed is not None:
                self.first_failure = self.exits[failed[0]]
            else:
                self.first_failure = RankExit(
                    -1, self.mpi_pid or -1, code, f"mpirun {procs.describe_status(status)}", False
                )
            self._begin_stop(None, None)

    def _begin_stop(self, reason: str | None, code: int | None) -> None:
        if reason is not None and self.stop_reason is None:
            self.stop_reason, self.stop_code = reason, code
        if self.deadline is None:
            self.deadline = time.monotonic() + self.plan.grace
            self.signalled.update(self.pids[r] for r in self.running if r in self.pids)
            procs.signal_groups(self._groups(), signal.SIGTERM)

    def _kill_all(self) -> None:
        self.killed = True
        procs.signal_groups(self._groups(), signal.SIGKILL)
        procs.signal_pids(procs.live_descendants(self.pid), signal.SIGKILL)
        self._reap()

    def _sweep_done(self) -> bool:
        """After the workers: no descendant may survive (SIGTERM, then SIGKILL at the deadline)."""
        self._reap()
        left = procs.live_descendants(self.pid)
        if not left:
            return True
        if self.killed:
            procs.signal_pids(left, signal.SIGKILL)
            return False
        if self.deadline is None:  # every rank succeeded, yet something they started lingers
            self.deadline = time.monotonic() + self.plan.grace
            procs.signal_groups(self._groups(), signal.SIGTERM)
        fresh = [p for p in left if p not in self.signalled]
        self.signalled.update(fresh)
        procs.signal_pids(fresh, signal.SIGTERM)
        return False

    # -- readiness (hang detection)

    def _on_line(self, rank: int, line: str) -> None:
        if rank >= 0 and self.ready_re is not None and self.ready_re.search(line):
            self.ready.add(rank)

    def _watch_ready(self) -> None:
        if self.ready_deadline is None or self.hung or self.stop_reason or self.first_failure:
            return
        for rank in self.plan.ranks:
            if rank.rank not in self.ready and os.path.exists(rank.env["TTMESH_READY_FILE"]):
                self.ready.add(rank.rank)
        waiting = [
            r.rank for r in self.plan.ranks if r.rank not in self.ready and r.rank in self.running
        ]
        if waiting and time.monotonic() >= self.ready_deadline:
            self.hung = True
            names = ", ".join(str(r) for r in waiting)
            self._emit(
                f"rank(s) {names} not ready after {self.plan.ready_timeout:g} s: "
                "treating the job as hung in bring-up"
            )
            self._begin_stop(
                f"hung in bring-up: rank(s) {names} not ready after {self.plan.ready_timeout:g} s",
                HUNG,
            )

    # -- fabric marks on a simulated host

    def _check_fabric(self, rank: RankPlan) -> None:
        if self.sim is None or rank.rank in self.fabric_seen:
            return
        if os.path.exists(rank.env["TTMESH_FABRIC_FILE"]):
            self.fabric_seen.add(rank.rank)
            self.sim.mark_fabric(
                self.plan.all_chips(), self.pids[rank.rank], self.plan.job, self.pid
            )

    def _poll_fabric(self) -> None:
        if self.sim is None:
            return
        for rank in self.plan.ranks:
            if rank.rank in self.running:
                self._check_fabric(rank)

    # -- records and results

    def _write_record(self) -> None:
        from ttmesh.errors import TTMeshError
        from ttmesh.launcher import jobs

        ranks = [
            {
                "rank": r.rank,
                "pid": self.pids.get(r.rank),
                "bdfs": list(r.bdfs),
                "chips": list(r.chips),
            }
            for r in self.plan.ranks
        ]
        with contextlib.suppress(OSError, TTMeshError):
            jobs.update(self.plan.job, guardian=self.pid, attempt=self.attempt, ranks=ranks)

    def _emit(self, message: str) -> None:
        with contextlib.suppress(OSError):
            os.write(2, f"ttmesh: {message}\n".encode())

    def _result(self) -> AttemptResult:
        exits = [self.exits[r] for r in sorted(self.exits)]
        duration = time.monotonic() - self.start
        fabric = sorted(self.fabric_seen)
        if self.stop_reason is not None and self.stop_code is not None:
            return AttemptResult(
                self.attempt,
                self.stop_code,
                "ttmesh",
                None,
                self.stop_reason,
                exits,
                fabric,
                interrupted=not self.hung,
                duration=duration,
                hung=self.hung,
            )
        if self.launcher_error is not None:
            return AttemptResult(
                self.attempt,
                2,
                "ttmesh",
                None,
                f"mpirun failed to start the ranks: {self.launcher_error}",
                exits,
                fabric,
                interrupted=True,
                duration=duration,
            )
        failure = self.first_failure
        if failure is None:
            return AttemptResult(
                self.attempt,
                0,
                "worker",
                None,
                "every rank succeeded",
                exits,
                fabric,
                duration=duration,
            )
        assert self.console is not None
        if failure.rank < 0:  # the launcher itself failed
            return AttemptResult(
                self.attempt,
                failure.code,
                "ttmesh",
                None,
                failure.how,
                exits,
                fabric,
                stderr_tail=self.console.tail(LAUNCHER)[-10:],
                duration=duration,
            )
        error = _error_message(self.plan.ranks[failure.rank].env["TORCHELASTIC_ERROR_FILE"])
        return AttemptResult(
            self.attempt,
            failure.code,
            "worker",
            failure.rank,
            f"rank {failure.rank} {failure.how}",
            exits,
            fabric,
            stderr_tail=self.console.tail(failure.rank)[-10:],
            error_message=error,
            duration=duration,
        )


def _error_message(path: str) -> str | None:
    """The exception a worker recorded with torch's @record (TORCHELASTIC_ERROR_FILE)."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    message = data.get("message")
    if isinstance(message, dict):
        return str(message.get("message") or "") or None
    return str(message) if message else None
