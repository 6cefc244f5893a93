"""One job from its leases to its end: attempts, recovery, restarts and the finish.

:func:`execute` takes a prepared plan, holds the chips' leases for the job's life (restarts
included) and runs the attempts; the exit code is the failing worker's.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import time
from dataclasses import replace
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ttmesh import paths
from ttmesh.errors import BAD_INPUT, TTMeshError, bad_input
from ttmesh.fabric.domains import mesh_peers
from ttmesh.launcher.attempt.front import run_attempt
from ttmesh.launcher.attempt.guardian import Options
from ttmesh.launcher.attempt.record import AttemptResult
from ttmesh.launcher.attempt.signals import STOPPING, Stopped, stop_reason
from ttmesh.launcher.job import errorfile, hostset
from ttmesh.launcher.job.jobstate import JobState
from ttmesh.launcher.job.preflight import run_preflight
from ttmesh.launcher.job.repair import Recovery, after_crash, last_reset_verified
from ttmesh.launcher.job.summary import (
    explain,
    job_facts,
    summarize,
    write_refusal,
    write_summary,
)
from ttmesh.launcher.planning.plan import LaunchPlan
from ttmesh.launcher.planning.prepare import Prepared
from ttmesh.render import note
from ttmesh.runtime import jobs, leases
from ttmesh.states import AttemptEnd, JobPhase
from ttmesh.vocab import Source

if TYPE_CHECKING:
    from ttmesh.launcher.nodes.multihost import Peers


class After(StrEnum):
    """What a job does once an attempt ended, other than succeed."""

    REFUSE = "refuse"  # a check still running at the start refused the job: said as a refusal
    NOT_RUN = "not run"  # a rank's program never ran: refused at the first attempt, else ended
    LEAVE = "leave"  # another tool resets the chips: neither recover nor restart
    END = "end"  # recover the chips, then end: no restart helps
    RESTART = "restart"  # recover the chips, then restart while --max-restarts allows


# How each attempt end is answered (a result with exit code 0 ends the job, whatever its end).
# The modes differ in how they recover and agree (job.hostset), never in what they decide.
AFTER: dict[AttemptEnd, After] = {
    AttemptEnd.COMPLETED: After.END,
    AttemptEnd.FAILED: After.RESTART,
    AttemptEnd.HUNG: After.RESTART,
    AttemptEnd.STOPPED: After.END,
    AttemptEnd.LAUNCHER_FAILED: After.END,
    AttemptEnd.GUARDIAN_LOST: After.END,
    AttemptEnd.REFUSED: After.REFUSE,
    AttemptEnd.UNSTARTED: After.NOT_RUN,
    AttemptEnd.RESET_ELSEWHERE: After.LEAVE,
}


def write_files(plan: LaunchPlan) -> None:
    """The plan's files, inside its run directory (which ``execute`` created) and nowhere else."""
    run_dir = Path(plan.run_dir).resolve()
    for sub in ("mesh", "errors", "ready", "fabric", "mock", "mpi", "shm"):
        (run_dir / sub).mkdir(exist_ok=True, mode=0o700)
    planned = os.path.normpath(plan.run_dir)
    for path, text in plan.files.items():
        # By name, not resolved (two files a rank: resolving each took some ten calls): the
        # run directory is the job's own (0700, locked), so no link in it is another user's,
        # and the file itself is never written through a link.
        within = os.path.relpath(os.path.normpath(path), planned)
        if os.path.isabs(within) or within == ".." or within.startswith(f"..{os.sep}"):
            raise bad_input(f"refusing to write {path}: outside the run directory {run_dir}")
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(run_dir / within, flags, 0o666)
        with os.fdopen(fd, "w") as f:
            f.write(text)


def _clear_attempt_files(plan: LaunchPlan) -> None:
    for sub in ("errors", "ready", "fabric", "shm"):  # shm: the last attempt's MPI segments
        directory = Path(plan.run_dir, sub)
        for entry in directory.iterdir() if directory.is_dir() else ():
            with contextlib.suppress(OSError):
                entry.unlink()


LAUNCHER_KILLED = "launcher killed"
SUPERVISOR_KILLED = "supervisor killed"


def _raise_stopped(sig: int, _frame: object) -> None:
    raise Stopped(sig)


class JobRun:
    """One job from its leases to its end: attempts, recovery, and the finish.

    The finish (job record closed, summary written, leases released, run directory removed) is
    done by whichever ttmesh process survives: normally the launcher; the guardian when the
    launcher was killed while workers ran (it was forked from the launcher, so it holds the same
    leases, run directory lock and plan).

    The values it is given (``prepared``, ``recovery``) are frozen: what changes as the job
    runs (its chips after a reset, the resets run, the heartbeats and tt-metal's verdict taken
    once) is its :class:`~ttmesh.launcher.job.jobstate.JobState`, ``self.state``."""

    def __init__(
        self,
        prepared: Prepared,
        options: Options,
        summary_json: str | None,
        recovery: Recovery,
        restart_backoff: float,
        peers: Peers | None = None,
    ) -> None:
        self.prepared = prepared
        self.plan = prepared.plan
        self.options = options
        self.summary_json = summary_json
        # The launcher's leases are the job's own, also for a guardian finishing in its place.
        self.recovery = replace(recovery, own_pids=(*recovery.own_pids, os.getpid()))
        self.restart_backoff = restart_backoff
        self.state = JobState.of(prepared)  # what the job learns and does as it runs
        # Whether this ttmesh runs pre-flight on the job's chips (not for a chipless server,
        # nor for a mesh over several hosts: each host runs its own).
        self.preflight = recovery.preflight
        self.observer = options.observer  # the front's view of the job (None: plain lines)
        # The hosts the job runs on (this one; c10d peers; a mesh over hosts), asked the same
        # questions whatever the mode.
        self.hosts = hostset.of(prepared, self.state, self.recovery, self.observer, peers)
        self.results: list[AttemptResult] = []
        self.stop: AttemptResult | None = None  # a stop signal between attempts ended the job
        self.held: leases.LeaseSet | None = None
        self.run_dir: paths.RunDir | None = None
        self.status: str | None = None  # how the job ended, when it ends before its finish
        # Refused for a frozen chip: no job record stays behind (reading the heartbeats first,
        # the launch never got as far as writing one).
        self.unrecorded = False
        self.logs: Any = None  # runtime.joblogs.JobLogs: the job's own copy of its output
        self.started = time.time()
        self.times: dict[int, tuple[float, float]] = {}  # attempt -> (started, ended)
        self.restarts: list[dict[str, Any]] = []  # {attempt, at, after}
        self.final: AttemptResult | None = None  # how the job ended, once it has

    def run(self) -> int:
        try:
            return self._run()
        finally:
            pending = self.state.take_metal()
            if pending is not None:  # refused or stopped before it answered
                pending.close()

    def _metal(self) -> None:
        """tt-metal's verdict on the ranks' files, before any rank starts (a refusal: exit 3)."""
        pending = self.state.take_metal()
        if pending is not None:
            pending.wait()  # passed: quietly, as pre-flight is

    def _run(self) -> int:
        plan = self.plan
        if plan.chipless:
            # A server that drives no Tenstorrent chip: nothing to lease or check before the
            # start (nor to recover after it: after_crash); the host is never read.
            self.preflight = False
        elif not self.hosts.leases_here():
            # A mesh over several hosts: each host's duties (leases, pre-flight) run on that
            # host, in the rank's own ttmesh (``ttmesh _rank``), never through this one.
            self.preflight = False
        else:
            inv = self.state.inv
            try:
                inv.host.check_changeable()
                self.held = leases.acquire(
                    inv.host,
                    plan.all_chips(),
                    plan.job,
                    cmd=" ".join(plan.ranks[0].argv),
                    symmetric_dram_mb=plan.symmetric_dram_mb,
                    labels={c.asic_id: c.label for c in inv.chips},
                    uses=mesh_peers(inv, plan.all_chips()),
                )
            except TTMeshError as exc:
                raise self._frozen_first(exc) from None
        try:
            self.run_dir = jobs.create_run_dir(plan.job)
            if str(self.run_dir.path) != plan.run_dir:
                raise bad_input(
                    f"the plan's run directory {plan.run_dir} is not {self.run_dir.path}"
                )
        except BaseException as exc:
            self._release()
            if isinstance(exc, TTMeshError):
                raise self._frozen_first(exc) from None
            raise
        self._open_logs()
        ok = False
        # A stop signal between attempts stops the job as one during an attempt does (an
        # attempt forwards it to its guardian): Ctrl-C raises KeyboardInterrupt, these Stopped.
        previous = {sig: signal.signal(sig, _raise_stopped) for sig in STOPPING}
        try:
            try:
                try:
                    self._record()
                except TTMeshError as exc:  # a job ps and stop cannot see must not start
                    raise self._refuse(exc) from None
                preflight = None
                if self.preflight:

                    def preflight() -> None:
                        run_preflight(self.prepared, self.state, self.recovery, self.observer)

                try:
                    self.hosts.before_start(preflight, self._metal)
                except TTMeshError as exc:
                    raise self._refuse(self._frozen_first(exc, summary=False)) from None
                write_files(plan)
                self._attempts()
            except (KeyboardInterrupt, Stopped) as exc:
                self._stopped(exc.sig if isinstance(exc, Stopped) else signal.SIGINT)
            ok = True
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if not ok:
                self._release(self.status or "ttmesh failed before the job ended", None)
        return self.finish()

    def _stopped(self, sig: int) -> None:
        """A stop signal outside an attempt ends the job there, and says how it ended (it is
        not an attempt: the attempts that ran stay as they ended)."""
        reason = stop_reason(sig)
        note(f"{reason}: stopping the job")
        self.stop = AttemptResult(
            len(self.results), 128 + sig, Source.TTMESH, None, reason, AttemptEnd.STOPPED
        )

    def _frozen_first(self, exc: TTMeshError, summary: bool = True) -> TTMeshError:
        """What stops the launch before its start, once the heartbeats still being read are in:
        a frozen chip's refusal came first when they were read before anything else (and left
        the outcome for scripts: ``summary``), so it still does."""
        liveness = self.state.take_liveness()
        if liveness is None:
            return exc
        refusal = liveness.wait()
        if refusal is None:
            return exc
        self.unrecorded = True
        if summary and self.summary_json:
            write_refusal(self.summary_json, refusal)
        return refusal

    def _refuse(self, exc: TTMeshError) -> TTMeshError:
        """Nothing runs: the job record says why, and so does --summary-json."""
        self.status = f"refused: {exc}"
        if self.summary_json:
            write_refusal(self.summary_json, exc, self.state.deferred, job=self.plan.job)
        return exc

    def _open_logs(self) -> None:
        """The job's own copy of its output (``ttmesh logs``), unless --no-logs; a directory
        that cannot be made is said, and the job runs without it."""
        if not self.options.keep_logs:
            return
        from ttmesh.runtime import joblogs

        try:
            self.logs = joblogs.JobLogs.create(self.plan.job, self.options.log_limits)
        except (OSError, TTMeshError) as exc:
            note(f"warning: the job's output is not kept (ttmesh logs has none): {exc}")
            return
        self.options = replace(self.options, keep=self.logs)  # the job's copy: its own logs

    def _record(self) -> None:
        """The job's record (``ttmesh ps``, ``ttmesh stop``); one that cannot be written
        raises (jobs.unrecordable): the job is refused before anything starts."""
        plan = self.plan
        jobs.write(
            {
                "job": plan.job,
                "pid": os.getpid(),
                "guardian": None,
                "root": plan.root,
                "layout": plan.layout,
                "attempt": 0,
                "started": self.started,
                "command": list(plan.ranks[0].argv) if plan.ranks else [],
                "ranks": [
                    {"rank": r.rank, "pid": None, "bdfs": list(r.bdfs), "chips": list(r.chips)}
                    for r in plan.ranks
                ],
                "symmetric_dram_mb": plan.symmetric_dram_mb,
                # What `ttmesh ps JOB` says of a job, running or ended (runtime.jobs).
                **job_facts(self.prepared, self.logs),
            }
        )

    def _attempts(self) -> None:
        plan = self.plan
        base_env = dict(plan.environ)  # what the plan (and --dry-run) was made from
        for attempt in range(plan.policy.max_restarts + 1):
            _clear_attempt_files(plan)
            self.hosts.watch(attempt)
            liveness = self.state.take_liveness()  # the first attempt reads the rest of them
            inv = self.state.inv
            began = time.time()
            result = run_attempt(
                plan, attempt, self.options, base_env, self._orphaned, inv.host,
                on_start=self._guardian_started, liveness=liveness, inv=inv,
            )  # fmt: skip
            self.times[attempt] = (began, time.time())
            if not self._after(attempt, result):
                break

    def _after(self, attempt: int, result: AttemptResult) -> bool:
        """What the job does once an attempt ended (:data:`AFTER`, by how it ended): whether
        it starts another."""
        plan, recovery = self.plan, self.recovery
        after = AFTER[result.end]
        if after is After.REFUSE:
            # A chip's heartbeat was frozen: the guardian stopped the workers. Leave the chips
            # as a stopped job does, then refuse as the heartbeats read first did.
            after_crash(self.prepared, self.state, recovery, result)
            self.unrecorded = True
            raise self._refuse(result.error or TTMeshError(result.reason, None, result.code))
        if after is After.NOT_RUN:
            # A rank's program never ran (not found, not executable): nothing to restart, one
            # line as a shell gives, exit 127 or 126. Ranks started before it were stopped:
            # their chips are checked as after any crash.
            error = result.error or TTMeshError(result.reason, None, result.code)
            if any(e.pid > 0 for e in result.exits):
                after_crash(self.prepared, self.state, recovery, result, observer=self.observer)
            if attempt == 0:
                raise self._refuse(error)
            note(f"not restarting: {error.message}")
            self.results.append(result)
            return False
        why = self.hosts.refused(result)
        if why is not None:  # a rank refused on its own host: a refusal, as on one host
            if attempt == 0:
                raise self._refuse(TTMeshError(why, None, result.code))
            note(f"not restarting: {why}")
            return False
        result = self.hosts.ended(attempt, result)
        self.results.append(result)
        if result.code == 0:
            return False
        after = AFTER[result.end]  # as every host saw it
        if after is After.LEAVE:
            # Another tool resets the chips now (its notice stopped the ranks): a reset of
            # ttmesh's on top of it would race it. Its end is for `ttmesh check` to see.
            note("the chips are being reset by another tool: ttmesh leaves them to it "
                 "(see ttmesh check once it is done)")  # fmt: skip
            return False
        # A server's processes may have held the chips to the end (SGLang SIGKILLs its
        # schedulers, which never close the chips): check them whatever the layout. So for
        # a chip that failed under the job (fabric.chipwatch), whatever it brought up.
        lost = result.end is AttemptEnd.GUARDIAN_LOST
        always = lost or plan.serving is not None or result.chip_fault is not None
        left = self.hosts.recover(result, always, f"recover{attempt}")
        if after is not After.RESTART:  # the user's stop, mpirun, the guardian lost
            return False
        if attempt >= plan.policy.max_restarts:
            return False
        if left is not None:
            note(f"not restarting: {left}")
            return False
        wait = min(self.restart_backoff * (2**attempt), 10.0)
        note(
            f"attempt {attempt + 1} of {plan.policy.max_restarts + 1} failed ({result.reason}); "
            f"restarting every rank in {wait:.1f} s"
        )
        self.restarts.append(
            {"attempt": attempt + 1, "at": round(time.time(), 3), "after": result.reason}
        )
        self._wait(wait, attempt + 2)
        again = replace(recovery, auto_reset=True)
        try:
            self.hosts.agree(
                f"restart{attempt + 1}",
                functools.partial(run_preflight, self.prepared, self.state, again, self.observer)
                if self.preflight
                else (lambda: None),
            )
        except TTMeshError as exc:  # (a reset left to the fleet is in self.state.deferred)
            note(f"not restarting: {exc}")
            return False
        return True

    def _guardian_started(self, pid: int) -> None:
        """In the front, right after an attempt's guardian is forked: the guardian shares the
        leases (their records name it, so they stay this job's if the front is killed)."""
        if self.held is not None:
            self.held.add_guardian(pid)
        self.hosts.started(pid)

    def _wait(self, seconds: float, next_attempt: int) -> None:
        """The pause before a restart (a view keeps its clock running meanwhile)."""
        if self.observer is None:
            time.sleep(seconds)
            return
        total = self.plan.policy.max_restarts + 1
        self.observer.phase(JobPhase.RESTARTING, f"attempt {next_attempt} of {total}")
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            time.sleep(min(left, 0.1))
            self.observer.tick()

    def _orphaned(self, result: AttemptResult) -> int:
        """In the guardian, once its workers are down: the launcher was killed, finish here."""
        result = replace(result, reason=f"{LAUNCHER_KILLED} ({result.reason})")
        self.results.append(result)
        self.observer = None  # the view was the launcher's (the front's), and it is gone
        note("the launcher was killed: its guardian stopped the workers and finishes the job")
        with contextlib.suppress(Exception):
            after_crash(self.prepared, self.state, self.recovery, result, always=True)
        return self.finish(LAUNCHER_KILLED)

    def _release(
        self, status: str | None = None, code: int | None = None, ended: dict | None = None
    ) -> None:
        # The record is closed last: a job ps calls ended has left nothing behind (its leases,
        # its run directory with the ranks' TMPDIRs, its logs closed), also when its guardian
        # finishes it after the launcher was killed.
        if self.held is not None:
            self.held.release()
        if self.run_dir is not None:
            self.run_dir.remove()
        self._close_logs()
        if self.unrecorded:
            with contextlib.suppress(OSError, TTMeshError):
                jobs.remove(self.plan.job)
        elif status is not None:
            with contextlib.suppress(OSError, TTMeshError):
                jobs.close(self.plan.job, status, code, ended)

    def _close_logs(self) -> None:
        """The job's log directory closed; other jobs' logs beyond the bounds removed."""
        if self.logs is None:
            return
        self.logs.close()
        self.logs = None
        from ttmesh.runtime import joblogs

        with contextlib.suppress(OSError, TTMeshError):
            joblogs.prune(self.options.log_limits)

    def ended_facts(self, final: AttemptResult, diagnosis: Any) -> dict[str, Any]:
        """How the job went, for its record and --summary-json: each attempt's times, the
        restarts and resets with theirs, the diagnosis, the phases (when told)."""
        attempts = []
        for r in self.results:
            began, ended = self.times.get(r.attempt, (None, None))
            attempts.append({
                "attempt": r.attempt, "started": began and round(began, 3),
                "ended": ended and round(ended, 3), "code": r.code, "rank": r.rank,
                "reason": r.reason,
            } | ({"phases": r.phases} if r.phases is not None else {}))  # fmt: skip
        facts: dict[str, Any] = {
            "ended": round(time.time(), 3),
            "attempts": attempts,
            "restarts": list(self.restarts),
            "resets": list(self.state.resets),
            "diagnosis": diagnosis.to_json() if diagnosis else None,
        }
        if final.phases is not None:  # a server's start, step by step (its checklist)
            facts["phases"] = final.phases
        return facts

    def _reset_after(self, final: AttemptResult) -> bool:
        """The chips were reset and verified after the last attempt ended."""
        times = self.times.get(final.attempt)
        return times is not None and last_reset_verified(self.state, times[1])

    def finish(self, status: str | None = None) -> int:
        final = self.final = self.stop or self.results[-1]
        self.hosts.close(len(self.results))
        if status is None:
            lost = final.end is AttemptEnd.GUARDIAN_LOST
            status = SUPERVISOR_KILLED if lost else final.reason
        unwritten_error = errorfile.write(final, self.plan)  # the ranks' files go next
        diagnosis = explain(self.plan, self.state.inv, final, reset_done=self._reset_after(final))
        facts = {**job_facts(self.prepared, self.logs), "started": round(self.started, 3),
                 **self.ended_facts(final, diagnosis)}  # fmt: skip
        self._release(status, final.code, facts)
        if self.observer is not None:  # the final frame, above the summary
            self.observer.phase(JobPhase.DONE, f"exit {final.code}")
        code = final.code
        if self.summary_json:
            unwritten = write_summary(
                self.summary_json,
                final,
                self.results,
                diagnosis,
                self.state.deferred,
                facts,
                job=self.plan.job,
            )
            if unwritten is not None:
                # Said, never silent; a job that failed keeps its code (the worker's is what
                # matters), one that succeeded ends 2: a script must not take 0 for a summary.
                note(unwritten)
                code = code or BAD_INPUT
        if unwritten_error is not None:
            note(unwritten_error)
        summarize(self.prepared, self.results, diagnosis, final)  # its exit line comes last
        return code


def execute(
    prepared: Prepared,
    options: Options,
    summary_json: str | None = None,
    restart_backoff: float = 0.2,
    recovery: Recovery | None = None,
    peers: Peers | None = None,
) -> int:
    """Lease the plan's chips, run its attempts (with recovery and restarts), return the code.

    ``peers`` (launcher.nodes.multihost.Peers): the other hosts of a job over several hosts."""
    return JobRun(
        prepared, options, summary_json, recovery or Recovery(), restart_backoff, peers
    ).run()
