"""Supervising one attempt: the ranks' process trees, watched to the last descendant.

Two processes share the work:

* the **front** (:mod:`ttmesh.launcher.attempt.front`) is the ``ttmesh`` process the user
  started. It forks the guardian, forwards signals to it, waits for it and returns its
  verdict. It is a child subreaper, so if the guardian is killed, everything orphaned comes to
  it and is killed.
* the **guardian** (forked, in its own process group, a child subreaper) is the parent of every
  worker. Workers start through a :mod:`starter <ttmesh.launcher.attempt.starters>`; every orphaned
  descendant, even one that called ``setsid``, is re-parented to the guardian, so a sweep of its
  subtree finds everything. Exits arrive as SIGCHLD through a wakeup fd, at once. If the front
  disappears (even by SIGKILL), a pipe the front held closes and the guardian kills the tree,
  then finishes the job in its place (see :class:`ttmesh.launcher.job.run.JobRun`).

The guardian is one loop over explicit phases (:class:`ttmesh.states.GuardianPhase`, changed
only through its machine's door): STARTING -> RUNNING -> STOPPING (SIGTERM sent, SIGKILL at the
end of the grace) -> DRAINING (no rank left: sweep every descendant, read the last output) ->
DONE. The first failing rank, a stop signal or a job that never gets ready moves RUNNING to
STOPPING; the last rank's end moves to DRAINING. The guardian coordinates; each concern is a
module of its own: :mod:`signals <ttmesh.launcher.attempt.signals>` (what a signal does),
:mod:`readiness <ttmesh.launcher.attempt.readiness>` (ready files, patterns, a server's health),
:mod:`marks <ttmesh.launcher.attempt.marks>` (fabric marks), :mod:`record
<ttmesh.launcher.attempt.record>` (the job record and the verdict).
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ttmesh import procs
from ttmesh.dataclass import dataclass
from ttmesh.errors import TTMeshError
from ttmesh.fabric.chipwatch import READ_EVERY, ChipWatch
from ttmesh.fabric.devices import Inventory
from ttmesh.host.base import Host
from ttmesh.launcher.attempt import dumps, record
from ttmesh.launcher.attempt.bringup import BringUp
from ttmesh.launcher.attempt.events import Observer
from ttmesh.launcher.attempt.logs import Console
from ttmesh.launcher.attempt.marks import FabricMarks
from ttmesh.launcher.attempt.readiness import Readiness, job_phase
from ttmesh.launcher.attempt.record import HUNG, AttemptResult
from ttmesh.launcher.attempt.signals import (
    PEER_STOP,
    STOPPING,
    Stop,
    Wakeups,
    react,
    stop_reason,
)
from ttmesh.launcher.attempt.starters import RankExit, Starter, starter_for
from ttmesh.launcher.attempt.view import AttemptView, DrainWords
from ttmesh.launcher.planning.liveness import Liveness
from ttmesh.launcher.planning.logspec import LogSpec
from ttmesh.launcher.planning.plan import LaunchPlan
from ttmesh.runtime.joblogs import JobLogs, owner_name
from ttmesh.runtime.leftovers import Leftovers
from ttmesh.states import (
    GUARDIAN_MOVES,
    AttemptEnd,
    GuardianPhase,
    JobPhase,
    Machine,
)
from ttmesh.vocab import Source

if TYPE_CHECKING:
    from ttmesh.runtime.joblogs import Limits

Phase = GuardianPhase  # the guardian's phases (ttmesh.states)
POLL = 0.05  # while ranks run: rank PIDs to find, fabric marks, readiness
SWEEP_POLL = 0.02
DRAIN = 0.5  # seconds to read what the pipes still hold once every process is gone
# A known fatal line seen (attempt.failures.LiveLines): the job is stopped this long after it,
# unless its process ends first (one that exits on its own keeps its exit code).
FATAL_SETTLE = 2.0
READ_SIZE = 1 << 20  # a rank's pipe may hold up to 1 MiB (starters._pipe_size)

__all__ = [
    "HUNG",
    "PEER_STOP",
    "STOPPING",
    "AttemptResult",
    "Guardian",
    "Options",
    "RankExit",
    "stop_reason",
]


@dataclass(frozen=True)
class Options:
    """How the guardian shows the workers' output. Frozen: what is decided later (the view a
    job is drawn in, the job's own logs) makes a new one (``dataclasses.replace``)."""

    ranks_filter: frozenset[int] | None = None
    log_dir: str | None = None
    quiet: bool = False
    # torchrun's --redirects/--tee, its log layout and line prefix (launcher.planning.logspec).
    logs: LogSpec | None = None
    # A view of the job (ttmesh.launcher.attempt.events): None keeps the console plain prefixed lines.
    observer: Observer | None = None
    # The job's own copy of every stream (runtime.joblogs, ttmesh logs), opened by the job (its
    # copy of these options holds it); keep_logs False (--no-logs): none; log_limits: its
    # bounds (joblogs.limits()).
    keep: JobLogs | None = None
    keep_logs: bool = True
    log_limits: Limits | None = None
    # The view draws a server's start as its checklist: its finished steps are not said as lines.
    checklist_drawn: bool = False


# --------------------------------------------------------------------------- guardian


def _leftovers(plan: LaunchPlan) -> list[str]:
    """What the job's profile says its processes leave in shared memory: a server's globs, a
    program profile's files of the job's chips (libtt's mock chips: tt_device_<id>_memory)."""
    if plan.serving is not None:
        return list(plan.serving.profile.leftovers)
    if plan.program is not None:
        return plan.program.profile.leftover_paths(plan.all_chips())
    return []


class Guardian:
    """One attempt's ranks, from their start to the last descendant's end: the coordination of
    its parts (signals, readiness, fabric marks, the record) over one loop."""

    def __init__(
        self,
        plan: LaunchPlan,
        attempt: int,
        options: Options,
        base_env: dict[str, str],
        alive_fd: int,
        host: Host,
        observer: Observer | None = None,
        liveness: Liveness | None = None,
        inv: Inventory | None = None,
    ) -> None:
        self.plan = plan
        self.observer = observer  # the front's view, through the pipe (EventWriter)
        self.liveness = liveness  # the chips' heartbeats, still being read
        self.liveness_due = 0.0  # when to ask it next (monotonic)
        self.polled = 0.0  # when fabric marks and readiness were last looked at (monotonic)
        self.refusal: TTMeshError | None = None
        self.attempt = attempt
        self.options = options
        self.alive_fd = alive_fd
        self.pid = os.getpid()
        self.started = time.monotonic()
        self.phases = Machine(Phase.STARTING, GUARDIAN_MOVES, "the guardian")
        self.starter: Starter = starter_for(plan)(plan, attempt, base_env, self.pid)
        self.selector = selectors.DefaultSelector()
        self.wakeups: Wakeups | None = None
        self.console: Console | None = None
        self.open: dict[int, tuple[int, str]] = {}  # fd -> (owner, stream name) still open
        self.running: set[int] = set()
        self.exits: dict[int, RankExit] = {}
        self.first_failure: RankExit | None = None
        self.stop: Stop | None = None
        self.deadline: float | None = None  # when SIGTERM was sent: the end of the grace
        self.killed = False  # SIGKILL sent
        # Ranks bringing up the fabric (tt-metal's lines, their fabric marks); when the grace
        # ends with some in it, they get --fabric-grace more (fabric_wait: until when).
        self.bringup: BringUp | None = None
        if plan.policy.fabric_grace > 0 and not plan.chipless:
            self.bringup = BringUp(
                (r.rank for r in plan.ranks if r.chips),
                {r.rank: r.env.get("TTMESH_FABRIC_FILE", "") for r in plan.ranks},
            )
        self.fabric_wait: float | None = None
        self.dumped: list[str] = []  # the files the stacks were dumped to (attempt.dumps)
        self.drain = DrainWords(self._emit)  # what the drain says (stable words)
        self.signalled: set[int] = set()  # PIDs sent SIGTERM
        self.marks = FabricMarks(plan, host, self.pid)
        self.readiness = Readiness(plan, self.started)
        self.readiness.checklist_lines = not options.checklist_drawn
        self.front_gone = False  # the launcher was killed: this guardian finishes the job
        # Taken before any rank starts: what a server's profile names that appears in shared
        # memory meanwhile is the server's, removed once nothing uses it. (Open MPI's segments
        # go to the job's run directory: plan.SEGMENT_VAR.)
        self.leftovers = Leftovers(_leftovers(plan))
        # What the observer was told, and the lines not yet sent.
        self.view = AttemptView(observer) if observer is not None else None
        # tt-umd's reset notices, heard while the ranks run (chips on this host only).
        self.host = host
        self.resets: Any = None  # attempt.resetwatch.ResetWatch, once listening
        # The job's chips, read on a timer while the ranks run (fabric.chipwatch), once the
        # start's own heartbeat check (liveness) is done; what failed under the job, if one did.
        self.inv = inv
        self.chipwatch: ChipWatch | None = None
        self.chipwatch_from: float | None = None  # when its first read is (monotonic)
        self.chips_watched = not (plan.chipless or plan.hosts or not plan.all_chips())
        self.chip_fault: str | None = None
        # Known lines matched as they arrive (attempt.failures.LiveLines), the fatal one seen
        # and when it stops the job.
        self.live: Any = None
        self.fatal: Any = None  # failures.Hit
        self.fatal_due: float | None = None

    @property
    def phase(self) -> GuardianPhase:
        return self.phases.state

    @property
    def ready(self) -> set[int]:
        return self.readiness.ready

    @property
    def server(self) -> Any:
        return self.readiness.server

    # -- setup

    def _signals(self) -> None:
        self.wakeups = Wakeups()
        self.selector.register(self.wakeups.read_fd, selectors.EVENT_READ, "signals")
        self.selector.register(self.alive_fd, selectors.EVENT_READ, "front")
        self.wakeups.install()

    def _start(self) -> None:
        failed = self.starter.start()
        if self.starter.notice is not None and self.attempt == 0:  # said once for the job
            self._emit(self.starter.notice)
        for stream in self.starter.streams:
            self.open[stream.fd] = (stream.owner, stream.name)
            self.selector.register(stream.fd, selectors.EVENT_READ, "output")
        self.running = {r.rank for r in self.plan.ranks} - {e.rank for e in failed}
        if not self.starter.has_launcher:
            self.running &= set(self.starter.pids)
        elif failed:  # mpirun never started: no rank runs (waiting for one would be forever)
            self.running = set()
        self.phases.change_state(Phase.RUNNING)
        if self.server is not None and 0 in self.starter.pids:
            wake = self.server.start(self.starter.pids[0])
            self.selector.register(wake, selectors.EVENT_READ, "serving")
        for ended in failed:
            if ended.started:  # one that never ran is the launcher's one line (AttemptResult)
                self._emit(f"rank {ended.rank}: {ended.how}")
        self._ended(failed)

    def _listen_for_resets(self) -> None:
        """Listen for tt-umd's reset notices while the ranks run (a job over several
        hosts: each rank's own host runs its chips; a chipless server has none)."""
        if self.plan.chipless or self.plan.hosts:
            return
        from ttmesh.launcher.attempt.resetwatch import ResetWatch  # (in the guardian only)

        bdfs = [b for r in self.plan.ranks for b in r.bdfs]
        passing = self.plan.policy.on_reset_notice == "pass"
        self.resets = ResetWatch(self.host, bdfs, os.getuid(), self._emit, passing=passing)
        if self.resets.listening:
            self.selector.register(self.resets.fileno(), selectors.EVENT_READ, "resets")

    def _on_reset_notice(self) -> None:
        """Another tool is about to reset the job's chips: stop the ranks now (the resetter
        waits its grace, 2 s, then resets whatever still runs on them)."""
        assert self.resets is not None
        reason = self.resets.heard()  # None with --on-reset-notice pass: the watch said it
        if reason is None or self.stop is not None or self.phase not in (
            Phase.STARTING, Phase.RUNNING
        ):  # fmt: skip
            return
        self._emit(f"{reason}: stopping every worker")
        self._begin_stop(Stop(reason, 128 + signal.SIGTERM, AttemptEnd.RESET_ELSEWHERE))

    # -- the loop

    def run(self, own_group: bool = True) -> AttemptResult:
        """The attempt, to its end. ``own_group``: lead a process group of its own and be the
        subreaper of what the ranks leave (the forked guardian); without it (a guardian run
        inside another program: the tests), the process's signal handling is restored after."""
        if own_group:
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
            keep=self._kept_files(),
        )
        self.starter.console = self.console
        self.console.bringup = self.bringup
        if self.readiness.pattern is not None or self.observer is not None:
            self.console.on_line = self._on_line
        try:
            self._report()
            self._start()
            # The known lines to watch as they arrive: read once the ranks are on their way
            # (the table and RE2 cost some milliseconds; no output is read before the loop).
            self.live = self._live_lines()
            if self.live or (self.server is not None and self.server.checklist):
                self.console.on_block = self._on_block
            self._listen_for_resets()  # once the ranks are on their way (a notice in between
            # those few milliseconds is not heard: the ranks have not opened their chips yet)
            self._register()
            record.write_record(self.plan, self.pid, self.attempt, self.starter.pids, "starting")
            self._step()  # a rank that never started may have ended the attempt already
            while self.phase is not Phase.DONE:
                for key, _ in self.selector.select(self._timeout()):
                    if key.data == "signals":
                        self._on_signals()
                    elif key.data == "front":
                        self._on_front_gone()
                    elif key.data == "serving":
                        self._on_server()
                    elif key.data == "resets":
                        self._on_reset_notice()
                    else:
                        self._on_output(key.fd)
                self._step()
        finally:
            self.starter.close()
            self.console.shutdown()
            record.keep_errors(self.plan, self.attempt, self.options.logs)
            self.readiness.close()
            if self.resets is not None:
                self.resets.close()
            self._report()
            if not own_group and self.wakeups is not None:
                self.wakeups.restore()
        return self._result()

    def _kept_files(self) -> Any:
        """This attempt's files in the job's own logs (None: --no-logs, or not writable)."""
        if self.options.keep is None:
            return None
        owners = [owner_name(r.rank) for r in self.plan.ranks]
        owners += [owner_name(-1)] if self.starter.has_launcher else []
        return self.options.keep.attempt(self.attempt, owners)

    def _step(self) -> None:
        """Move between phases on what time and the host say now."""
        self._ask_liveness()
        self._watch_chips()
        self._stop_for_fatal()
        self._register()
        if self.resets is not None:
            self.resets.tick()
        now = time.monotonic()
        if now - self.polled >= POLL:  # not on every output event: a rank may print 100 MB
            self.polled = now
            if self.console is not None:
                self.console.flush_kept()
            self.marks.poll(self.running, self.starter.pids)
            if self.phase is Phase.RUNNING:
                heard = (self.console.heard if self.console else 0.0) or self.started
                overdue = self.readiness.overdue(self.running) or self.readiness.silent(
                    self.running, heard
                )
                if overdue is not None:
                    self._emit(overdue[0])
                    self._dump()  # the stacks of a hung job, before it is stopped
                    self._begin_stop(overdue[1])
                if progress := self.readiness.progress():
                    self._emit(progress)
        if self.fabric_wait is not None and not self.killed and not self._in_bringup():
            self.deadline = now  # no rank is bringing up the fabric any more: kill now
        due = self.deadline is not None and not self.killed and time.monotonic() >= self.deadline
        if due and not self._wait_for_fabric():
            left = len(procs.live_descendants(self.pid))
            if left:
                self._say_grace_over(left)
            self._kill()
        if self.running:
            self._say_drain(len(self.running))
        if not self.running and self.phase in (Phase.RUNNING, Phase.STOPPING):
            self.phases.change_state(Phase.DRAINING)
        if self.phase is Phase.DRAINING and self._swept() and self.liveness is None:
            self._drain(None)
            self._clean_leftovers()
            self.phases.change_state(Phase.DONE)
        self._report()

    def _clean_leftovers(self) -> None:
        """Remove what the server (or a program profile's ranks: libtt's mock chips) left in
        shared memory and nothing uses, a line each."""
        whose = "the server" if self.plan.serving is not None else "the ranks"
        for path in self.leftovers.clean():
            self._emit(f"removed {path}, left behind by {whose}")

    def _timeout(self) -> float | None:
        now = time.monotonic()
        waits = []
        if self.deadline is not None and not self.killed:
            waits.append(max(0.0, self.deadline - now))
        if self.running:
            waits.append(POLL)  # rank PIDs, fabric marks, readiness
        if self.phase is Phase.DRAINING:
            waits.append(SWEEP_POLL)
        if self.liveness is not None:
            waits.append(max(0.0, self.liveness_due - now))
        if self.phase is Phase.RUNNING:
            due = self.chipwatch.due() if self.chipwatch is not None else self.chipwatch_from
            if due is not None:
                waits.append(max(0.0, due - now))
        if self.fatal_due is not None:
            waits.append(max(0.0, self.fatal_due - now))
        return min(waits) if waits else None

    def _live_lines(self) -> Any:
        """The known lines watched as they arrive (a profile's own first); none when the
        table cannot be read (said once: the job goes on, its failures explained as before)."""
        from ttmesh.launcher.attempt import failures

        try:
            own = self.plan.serving.profile.extra.get("failures") if self.plan.serving else None
            path = self.plan.serving.profile.path if self.plan.serving else ""
            return failures.live_lines(failures.profile_entries(own, f"profile {path}: failures"))
        except Exception as exc:  # a broken table must not stop the job
            self._emit(f"the table of known failures could not be read: {exc}")
            return None

    def _on_block(self, owner: int, stream: str, block: bytes) -> None:
        """A block of output: a known fatal line stops the job (FATAL_SETTLE after it, unless
        its process ends first), a note is said once."""
        if self.phase not in (Phase.STARTING, Phase.RUNNING):
            return
        if owner == 0 and self.server is not None:  # its start's steps, from its own lines
            for row in self.server.scan(block, time.monotonic()):
                if self.readiness.checklist_lines:
                    self._emit(f"{self.server.name}: {self.server.checklist.said(row)}")
        if not self.live:
            return
        from ttmesh.launcher.attempt import failures

        server = self.server.name if self.server is not None else None
        for hit in self.live.scan(block, failures.where(owner, stream, server)):
            entry = hit.entry
            if entry.live == "note":
                if self.live.first_note(hit):
                    fix = self._filled(hit.found())
                    self._emit(f"note: {hit.where}: {hit.line[:300]}: {entry.cause} (fix: {fix})")
                continue
            if self.fatal is not None or self.stop is not None or self.first_failure is not None:
                continue
            self.fatal, self.fatal_due = hit, time.monotonic() + FATAL_SETTLE
            self.chip_fault = f"fatal line ({entry.id}): {hit.line[:300]}"
            self._emit(f"fatal line in {hit.where} ({entry.id}): {hit.line[:300]}: "
                       "stopping every worker")  # fmt: skip

    def _filled(self, found: dict[str, Any]) -> str:
        """A fix with its placeholders filled for this job's chips (as the summary fills it)."""
        from ttmesh.launcher.attempt import failures

        if self.inv is not None:
            with contextlib.suppress(Exception):
                explained = failures.explain(found, self.inv, self.plan.all_chips())
                if explained is not None:
                    return explained.fix
        return str(found["fix"]).format(flag="", reset="ttmesh reset")

    def _stop_for_fatal(self) -> None:
        """The fatal line's settle is over and its process did not end: stop the job."""
        if self.fatal is None or self.fatal_due is None or time.monotonic() < self.fatal_due:
            return
        self.fatal_due = None
        self._reap()
        if (
            self.stop is not None
            or self.first_failure is not None
            or self.phase is not Phase.RUNNING
        ):
            return
        hit = self.fatal
        self._begin_stop(
            Stop(f"fatal line ({hit.entry.id}): {hit.line[:300]}", 1, AttemptEnd.FAILED)
        )

    def _watch_chips(self) -> None:
        """The job's chips, read when due while the ranks run (fabric.chipwatch): one that
        failed (its heartbeat stopped, it left the bus, its links went down) stops the job at
        once, named with what was seen. A rank that ended meanwhile is heard first: its own end
        decides the attempt; so does a server's critical process that ended (links that fell
        with it are its end: _critical_ended)."""
        if not self.chips_watched or self.phase is not Phase.RUNNING or self.liveness is not None:
            return
        if self.stop is not None or self.first_failure is not None or self.front_gone:
            return
        if self.chipwatch is None:
            # The start's own check has just read the chips (pre-flight, or the liveness the
            # guardian completed): the watch's first read is one interval on, as its next
            # would be. Every bound of fabric.chipwatch holds from there; a job that ends
            # within its first second (most failures to start do) is not read again.
            now = time.monotonic()
            if self.chipwatch_from is None:
                self.chipwatch_from = now + READ_EVERY
            if now >= self.chipwatch_from:
                self.chipwatch = self._chip_watch()
            return
        finding = self.chipwatch.step()
        if finding is None:
            return
        self._reap()
        if self.stop is not None or self.first_failure is not None:
            return
        self.chip_fault = finding.line
        self._emit(f"{finding.line}: stopping every worker")
        self._begin_stop(Stop(finding.line, 1, AttemptEnd.FAILED))

    def _chip_watch(self) -> ChipWatch | None:
        """The watch, its first read taken (None when the host cannot be read: nothing to
        watch then, and the job goes on)."""
        from ttmesh.fabric.devices import discover

        try:
            inv = self.inv
            if inv is None:  # (a guardian run on its own: tests) read without opening a chip
                inv = discover(self.host, topology=not self.host.firmware_opens_chips)
            watch = ChipWatch(inv, self.plan.all_chips(), ended=self._critical_ended)
            watch.step()
        except (OSError, TTMeshError) as exc:
            self._emit(f"the job's chips cannot be watched while it runs: {exc}")
            self.chips_watched = False
            return None
        return watch

    def _critical_ended(self) -> str | None:
        """A server's critical process that ended while it ran (its watch says it died, or
        the server's exit comes first): the job's own end, which links that fell with it are
        part of. None when every one lives, or nothing is followed (no server, no health URL)."""
        watch = self.server.watch if self.server is not None else None
        return watch.ended() if watch is not None else None

    def _ask_liveness(self) -> None:
        """The chips' heartbeats, still being read since the start: ask when due; a refusal
        stops the job (whatever the ranks did meanwhile, it decides the attempt). A stop the
        user asked for does not wait for it. The guardian ends no attempt before it is decided."""
        if self.liveness is None:
            return
        if self.front_gone or (self.stop is not None and self.stop.user):
            self.liveness = None
            return
        if time.monotonic() < self.liveness_due:
            return
        wait = self.liveness.step()
        if wait is not None:
            self.liveness_due = time.monotonic() + wait
            return
        self.refusal, self.liveness = self.liveness.refusal, None
        if self.refusal is not None:
            self._begin_stop(
                Stop(f"refused: {self.refusal}", self.refusal.code, AttemptEnd.REFUSED)
            )

    # -- events

    def _on_signals(self) -> None:
        assert self.wakeups is not None
        for sig in self.wakeups.heard():
            reaction = react(sig, self.stop, self.first_failure is not None, *self._whom())
            if reaction.say:
                self._emit(reaction.say)
            if reaction.kill:
                if reaction.stop is not None and self.stop is None:
                    self.stop = reaction.stop
                self._kill()
            elif reaction.stop is not None:
                if reaction.stop.user and self.stop is None and dumps.asked(self.plan):
                    self._dump()  # ttmesh stop --dump: the stacks first
                self._begin_stop(reaction.stop)
            elif reaction.forward:
                procs.signal_groups(self.starter.signal_targets(self.running), sig)
        self._reap()

    def _whom(self) -> tuple[str, str]:
        """What a stop the user asks for stops, and how: a server drains on SIGTERM."""
        if self.server is None:
            return "every worker", ""
        return "the server", f"SIGTERM: its own drain, up to {self.plan.policy.grace:g} s"

    def _reap(self) -> None:
        for pid, status in procs.reap_all():
            stopping = self.phase is not Phase.RUNNING or pid in self.signalled
            self._ended(self.starter.reaped(pid, status, self.running, stopping, self._drain))

    def _ended(self, batch: list[RankExit]) -> None:
        """Ranks ended; the first failure (one ttmesh did not stop, if any) stops the rest."""
        for ended in batch:
            if ended.rank < 0:
                continue  # the launcher itself (mpirun) failed: it stands for the job
            self.exits[ended.rank] = ended
            if self.view is not None:
                self.view.exited(ended.rank, ended.code, ended.how, ended.stopped)
            self.running.discard(ended.rank)
            self.marks.ended(ended, self.starter.pids)
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
                    assert self.wakeups is not None
                    self.wakeups.heard()
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
            self.phases.change_state(Phase.STOPPING)
        if self.deadline is None:
            self.deadline = time.monotonic() + self.plan.policy.grace
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

    def _in_bringup(self) -> list[int]:
        return self.bringup.ranks(self.running) if self.bringup is not None else []

    def _wait_for_fabric(self) -> bool:
        """The grace is over: a rank still bringing up the fabric gets --fabric-grace more to
        finish or abort (killed mid bring-up it leaves the Ethernet cores wedged); the other
        ranks are killed now. Under mpirun the world is one: every rank waits with them.
        True when the kill waits."""
        holding = self._in_bringup()
        if self.fabric_wait is not None or not holding or self.front_gone:
            return False
        assert self.bringup is not None
        now = time.monotonic()
        self.fabric_wait = self.deadline = now + self.plan.policy.fabric_grace
        others = self.running - set(holding)
        if others and not self.starter.has_launcher:
            groups = self.starter.signal_targets(others)
            self._say_grace_over(len(groups))
            procs.signal_groups(groups, signal.SIGKILL)
        for rank in holding:
            self._emit(
                f"rank {rank + self.plan.rank_offset} is bringing up the fabric: waiting up to "
                f"{self.plan.policy.fabric_grace:g} s before killing it"
            )
        return True

    def _dump(self) -> None:
        """Every running rank's Python stacks (py-spy) and tt-triage, before a hung job is
        killed (attempt.dumps)."""
        pids = {r: p for r, p in self.starter.pids.items() if r in self.running}
        self.dumped.extend(dumps.take(self.plan, pids, self.attempt, self._emit))

    def _on_server(self) -> None:
        """The server became ready, or failed a health check, or lost a critical process."""
        stopping = self.stop is not None or self.first_failure is not None
        was_ready = 0 in self.ready
        events = self.readiness.server_events(stopping)
        if not was_ready and 0 in self.ready:  # ttmesh ps: it serves (said before the line is)
            record.write_server(self.plan, "serving")
        for line, stop in events:
            self._emit(line)
            if stop is not None and stop.end is AttemptEnd.HUNG:
                # Hung but healthy: out of service first (a fleet takes the replica out of its
                # router on the stop the view hears), then its stacks, then the stop.
                self.stop = stop
                self._report()
                self._dump()
            if stop is not None:
                self._begin_stop(stop)

    def _kill(self) -> None:
        self.killed = True
        if self.phase is Phase.RUNNING:
            self.phases.change_state(Phase.STOPPING)
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
            self.deadline = time.monotonic() + self.plan.policy.grace
            procs.signal_groups(self.starter.groups(), signal.SIGTERM)
        fresh = [p for p in left if p not in self.signalled]
        self.signalled.update(fresh)
        procs.signal_pids(fresh, signal.SIGTERM)
        procs.signal_pids(fresh, signal.SIGCONT)
        self._say_drain(0, len(left))
        return False

    # -- what a drain says (stable words: docs/recovery.md, "Stopping and draining")

    def _say_drain(self, ranks: int, leftovers: int = 0) -> None:
        """While a grace runs (view.DrainWords); a refusal's one line is all that is said."""
        if self.deadline is None or self.killed or not (ranks or leftovers):
            return
        if self.stop is not None and self.stop.quiet:
            return
        self.drain.draining(self.deadline, ranks, leftovers)

    def _say_grace_over(self, count: int) -> None:
        if self.stop is not None and self.stop.quiet:
            return
        self.drain.grace_over(count)

    def _on_line(self, rank: int, line: str) -> None:
        self.readiness.on_line(rank, line)
        if self.view is not None:
            self.view.line(rank, line)

    # -- what the observer hears (a live view in the front)

    def _report(self) -> None:
        """Tell the observer what changed since the last step: ranks started and ready, their
        last lines, the job's phase (view.AttemptView: a person's phases only move on)."""
        if self.view is None:
            return
        if self.plan.policy.ready_timeout is None and self.phase is Phase.RUNNING:
            self.readiness.files(self.running)  # ready files, watched for the view only
        stopping = self.stop is not None or self.first_failure is not None
        phase = job_phase(
            self.phase, stopping, self.running, self.ready, set(self.starter.pids),
            self.readiness.watched,
        )  # fmt: skip
        detail = self.drain.detail if phase in (JobPhase.STOPPING, None) else ""
        if detail and phase is None:  # leftovers of ranks that all succeeded: still a drain
            phase = JobPhase.STOPPING
        told = self.view.phase
        if phase is JobPhase.STOPPING and (told is None or told.state is not JobPhase.STOPPING):
            detail = self._stopping_why() or detail  # its first stopping report says why
        self.view.report(self.starter.pids, self.ready, phase, detail)
        if self.server is not None and self.server.checklist.changed:
            self.server.checklist.changed = False
            self.view.checklist(self.server.checklist.to_json(), self.plan.policy.ready_timeout)

    def _stopping_why(self) -> str:
        """Why the attempt stops, in the words of its end (a fleet takes the replica out on it)."""
        if self.stop is not None:
            return self.stop.reason
        failure = self.first_failure
        return f"rank {failure.rank} {failure.how}" if failure is not None else ""

    # -- what the host hears: workers holding chips, fabric opened

    def _register(self) -> None:
        """Once every rank's PID is known: the host hears the workers and their fabric marks
        (marks.FabricMarks.register); under mpirun, the job record learns the PIDs then."""
        if self.marks.register(self.starter, self.running) and self.starter.has_launcher:
            record.write_record(self.plan, self.pid, self.attempt, self.starter.pids)

    # -- records and results

    def _emit(self, message: str) -> None:
        data = f"ttmesh: {message}\n".encode()
        if self.observer is not None:
            self.observer.output(2, data)
            return
        with contextlib.suppress(OSError):
            os.write(2, data)

    def _result(self) -> AttemptResult:
        assert self.console is not None
        base = AttemptResult(
            attempt=self.attempt,
            code=0,
            source=Source.WORKER,
            rank=None,
            reason="every rank succeeded",
            end=AttemptEnd.COMPLETED,
            exits=[self.exits[r] for r in sorted(self.exits)],
            fabric_ranks=sorted(self.marks.fabric),
            duration=time.monotonic() - self.started,
            dumps=list(self.dumped),
            chip_fault=self.chip_fault,
            asked=self.stop is not None and self.stop.user,
            phases=self.server.checklist.to_json()
            if self.server is not None and self.server.checklist
            else None,
        )
        tail = self.console.tail
        result = record.verdict(
            self.plan, base, self.stop, self.first_failure, self.starter.launcher_error, tail
        )
        if self.refusal is not None:
            return record.refused(result, self.refusal)
        if result.code != 0 and self.fatal is not None:
            return replace(result, diagnosis=self.fatal.found())  # the line seen as it came
        if result.code != 0:
            server = self.server.name if self.server is not None else None
            found = record.diagnose(
                self.plan, result.rank, tail, self.starter.has_launcher, server, self._emit
            )
            return replace(result, diagnosis=found)
        return result
