"""A fleet running: one ``ttmesh launch`` per replica, SGLang's router in front of them.

Each replica is a job of its own (``<fleet>-rK``: its leases, pre-flight, readiness, bounded
drain, recovery of its own chips and restarts under ``--max-restarts``, seen by ``ttmesh ps``),
started as a child ``ttmesh launch --chips ... --fleet-of FLEET`` in a session of its own, so a
terminal's Ctrl-C reaches only this process, which stops the router first. This process
relays their output (``[replicaK]`` before each line), says which replicas serve (a replica is
added to the router when its job says it is ready, taken out the moment its job says it is
down or its ``/health`` stops answering, put back when its job says it is ready again),
restarts the router if it dies, and stops everything in order on a stop: the router, then
every replica's drain within --grace. What a replica's job says comes on a pipe of its own
(``launcher.job.feed``: one JSON line per change), never from its output.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import IO, TYPE_CHECKING, Any, Protocol

from ttmesh.dataclass import dataclass, field
from ttmesh.launcher.fleet.between import Between
from ttmesh.launcher.fleet.drain import after_drain, needs_whole_host, recovery_mode
from ttmesh.launcher.fleet.router import (
    ASK_AGAIN,
    DIRECT,
    Router,
    dies_with_this_process,
    how_it_ended,
    shell_code,
)
from ttmesh.launcher.job import feed
from ttmesh.render import json_text, note
from ttmesh.vocab import Source

if TYPE_CHECKING:
    from ttmesh.host.base import Host
    from ttmesh.launcher.fleet.place import FleetPlan, Replica
    from ttmesh.launcher.planning.options import LaunchOptions

GUARD_SCHEMA = "ttmesh.fleet-guard/1"  # fleet.guard.SCHEMA (not imported: the guard's own)
GUARD_WAIT = 5.0  # s for the guard to exit once told the fleet ended by itself
DIR_PREFIX = "ttmesh-fleet-"  # the fleet's private directory in the temp dir
STAGGER_BOUND = 120.0  # s: the next replica starts after this even if the previous is not ready
PROBE_EVERY = 0.5  # s between health probes of a serving replica
PROBE_TIMEOUT = 5.0  # s: SGLang's /health runs a one-token generation, slow on a busy host
PROBE_FAILURES = 3  # in a row take a replica out of the router (a refused connection: one)
ROUTER_STARTS = 6  # a router that dies this often stops the fleet (it cannot serve)
LAST_WIDTH = 200  # characters of a replica's last line kept: its head, as a person reads it

WAITING, STARTING, SERVING, DOWN, EXITED = "waiting", "starting", "serving", "down", "exited"
DRAINING = "draining"  # stopped by the fleet for a whole-host reset (fleet.drain)


class Watcher(Protocol):
    """A live view of the fleet (``ttmesh.cli.fleetview`` draws one on a terminal; without one
    the lines are plain). Called in the main thread under the lock relayed lines are written
    under; must not raise."""

    def show(self, state: dict[str, Any]) -> None:
        """The fleet's state (:meth:`Fleet.state`, as its job record has it) now: on each change,
        and about 5 times a second at least while the fleet runs (its clock, its lines)."""


@dataclass
class Member:
    """One replica's job as the fleet sees it."""

    replica: Replica
    summary: str
    proc: subprocess.Popen[bytes] | None = None
    state: str = WAITING
    restarts: int = 0
    last: str = ""
    started: float = 0.0
    code: int | None = None
    failures: int = 0  # /health failures in a row
    held_out: bool = False  # its job said it is down: out of the router until it says ready
    readers: list[threading.Thread] = field(default_factory=list)
    drains: int = 0  # restarts the fleet made for another replica's whole-host reset
    needs: dict[str, Any] | None = None  # its job ended needing the whole-host reset
    routed: bool = False  # the router lists it (said once: "ready: routed to")
    back: str = ""  # how it came back, said with "routed to" (its /health answers)
    refused: str = ""  # the router's last refusal to add it, said once

    def outcome(self) -> Any:
        """Its job's --summary-json as written (None: not written, or unreadable)."""
        from ttmesh import fileread
        from ttmesh.errors import TTMeshError

        with contextlib.suppress(OSError, ValueError, TTMeshError):  # written by its job
            return json.loads(fileread.read_text(self.summary, 1 << 20, "a summary"))
        return None

    def to_json(self) -> dict[str, Any]:
        r = self.replica
        out: dict[str, Any] = {
            "replica": r.index, "job": r.job, "chips": r.bdfs, "url": r.url, "port": r.port,
            "state": self.state, "restarts": self.restarts, "pid": self.proc.pid if self.proc else None,
            "code": self.code, "last_line": self.last, "drains": self.drains,
            "routed": self.routed,
        }  # fmt: skip
        outcome = self.outcome()
        if outcome is not None:
            out["outcome"] = outcome
        return out


def child_argv(
    o: LaunchOptions, host: Host, fp: FleetPlan, r: Replica, summary: str, events_fd: int = -1,
    max_restarts: int | None = None,
) -> list[str]:  # fmt: skip
    """``ttmesh launch`` of one replica: the user's options that apply to one server, its
    chips, its job, the pipe its events come back on, and the server's command rewritten.
    ``max_restarts``: what is left of the replica's --max-restarts (a job after a whole-host
    reset: ``fleet.drain``)."""
    argv = [sys.executable, "-u", "-m", "ttmesh", "launch", "--no-live", "--fleet-of", fp.job]
    if events_fd >= 0:
        argv.append(f"--events-fd={events_fd}")
    if host.root != "/":
        argv += ["--root", str(host.root)]
    argv += ["--job-id", r.job, "--summary-json", summary]
    if r.bdfs:
        argv += ["--chips", ",".join(r.bdfs)]
    if o.tp_size is not None:
        argv += ["--tp-size", str(o.tp_size)]
    valued = (
        ("--max-restarts", o.max_restarts if max_restarts is None else max_restarts),
        ("--grace", o.grace),
        ("--on-reset-notice", o.on_reset_notice), ("--symmetric-dram-mb", o.symmetric_dram_mb),
        ("--profile", o.profile_name), ("--health-interval", o.health_interval),
        ("--health-failures", o.health_failures), ("--ready-timeout", o.ready_timeout),
        ("--probe-interval", o.probe_interval), ("--probe-timeout", o.probe_timeout),
        ("--ready-pattern", o.ready_pattern), ("--tt-smi", o.tt_smi),
        ("--mesh-shape", o.mesh_shape), ("--log-dir", o.log_dir), ("--workdir", o.workdir),
        ("--launcher", o.launcher),
    )  # fmt: skip
    for flag, value in valued:
        if value is not None:
            argv.append(f"{flag}={value}")
    for item in o.env_items:
        argv.append(f"--env={item}")
    flags = (
        ("--strict", o.strict), ("--strict-links", o.strict_links), ("--auto-reset", o.auto_reset),
        ("--reset-on-failure", o.reset_on_failure), ("--show-env", o.show_env),
        ("--quiet", o.quiet), ("--module", o.module), ("--no-python", o.no_python),
        ("--no-logs", o.no_logs),
    )  # fmt: skip
    argv += [flag for flag, given in flags if given]
    return [*argv, "--", *r.argv]


class Fleet:
    """The replicas' jobs and the router, from the first start to the last stop."""

    def __init__(
        self, o: LaunchOptions, host: Host, fp: FleetPlan, view: Watcher | None = None
    ) -> None:
        self.o, self.host, self.fp, self.view = o, host, fp, view
        sweep_dirs()  # of fleets of this user's that ttmesh and its guard both left behind
        self.dir = tempfile.mkdtemp(prefix=f"{DIR_PREFIX}{fp.job[:40]}-")
        self.dir_lock = _lock_dir(self.dir)  # held by this process and its guard
        self.guard: subprocess.Popen[bytes] | None = None
        self.guard_pipe = -1  # the write end of the guard's standard input
        self.guard_lost = False  # the guard ended while the fleet ran (said once)
        self.between: Between | None = None  # the fleet's last check of its chips
        self.members = [Member(r, os.path.join(self.dir, f"r{r.index}.json")) for r in fp.replicas]
        extra = fp.router_opts.args if fp.router_opts is not None else list(o.router_args)
        self.router = Router(fp.host, fp.port, extra,
                             os.path.join(self.dir, "router.log"), self.say)  # fmt: skip
        # A replica's relayed line (its last line) or an event its job sent (launcher.job.feed).
        self.events: queue.Queue[tuple[int, str | dict[str, Any]]] = queue.Queue()
        self.lock = threading.Lock()
        self.stop_sig: int | None = None
        self.failed: str | None = None  # why the fleet stops itself (its router cannot run)
        self.probes: queue.Queue[tuple[int, bool, bool]] = queue.Queue()
        self.done = threading.Event()
        self.started = 0.0
        self.failed_code: int | None = None  # the code the fleet ends with when it stops itself
        self.draining = False  # every replica is being drained for a whole-host reset
        self.stopping = False  # the fleet's own stop runs: a job's needs are the stop's to meet
        self.resetting = False  # the fleet runs the whole-host reset now
        self.host_resets: list[dict[str, Any]] = []  # each whole-host reset: when, for whom, how

    # ------------------------------------------------------------------ output

    def say(self, message: str) -> None:
        with self.lock:
            note(message)

    def _relay(self, k: int, stream: IO[bytes], out: IO[str]) -> None:
        """One stream of replica ``k``'s job, line by line, prefixed; each line is only its
        last line for ``ps`` (what it says of its state comes on its event channel)."""
        for raw in iter(stream.readline, b""):
            line = raw.decode(errors="replace").rstrip("\n")
            with self.lock, contextlib.suppress(OSError, ValueError):
                out.write(f"[replica{k}] {line}\n")
                out.flush()
            self.events.put((k, line))
        stream.close()

    def _intake(self, k: int, fd: int) -> None:
        """Replica ``k``'s event channel (the pipe this fleet made for it), until its job and
        every process holding the write end have closed it; junk is said and ignored."""
        feed.read_events(
            fd,
            lambda event: self.events.put((k, event)),
            lambda why: self.say(f"replica {k}: ignoring a line on its event channel: {why}"),
        )

    # ------------------------------------------------------------------ replicas

    def _start(self, m: Member) -> None:
        read, write = os.pipe()  # its events: only this pipe, made here, is believed
        left = max(0, self.o.max_restarts - m.restarts)  # a replica's budget spans its jobs
        argv = child_argv(self.o, self.host, self.fp, m.replica, m.summary, write, left)
        try:
            m.proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                start_new_session=True, preexec_fn=dies_with_this_process(), pass_fds=(write,),
            )  # fmt: skip
        except BaseException:
            os.close(read)
            raise
        finally:
            os.close(write)  # the child's end: its end of the channel is the job's end
        intake = threading.Thread(target=self._intake, args=(m.replica.index, read), daemon=True)
        intake.start()
        m.readers.append(intake)
        m.state, m.started = STARTING, time.monotonic()
        self.record()
        chips = f" on {','.join(m.replica.bdfs)}" if m.replica.bdfs else ""
        self.say(f"replica {m.replica.index} ({m.replica.job}): starting{chips} at {m.replica.url}")
        assert m.proc.stdout is not None and m.proc.stderr is not None
        for stream, out in ((m.proc.stdout, sys.stdout), (m.proc.stderr, sys.stderr)):
            t = threading.Thread(
                target=self._relay, args=(m.replica.index, stream, out), daemon=True
            )
            t.start()
            m.readers.append(t)

    def _next_to_start(self) -> None:
        waiting = [m for m in self.members if m.state == WAITING]
        if not waiting:
            return
        if self.o.replicas_parallel:
            for m in waiting:
                self._start(m)
            return
        started = [m for m in self.members if m.state != WAITING]
        last = started[-1] if started else None
        if (
            last is None
            or last.state in (SERVING, EXITED)
            or (time.monotonic() - last.started > STAGGER_BOUND)
        ):
            self._start(waiting[0])

    def _event(self, k: int, item: str | dict[str, Any]) -> None:
        """A relayed line (replica ``k``'s last line) or an event from its job."""
        m = self.members[k]
        if isinstance(item, str):
            m.last = item[:LAST_WIDTH]
            return
        event = item["event"]
        if event == "ready" and item["url"] != m.replica.url:
            self.say(f"replica {k}: ignoring its ready at {item['url'][:100]}: it serves at "
                     f"{m.replica.url}")  # fmt: skip
        elif event == "ready" and m.state in (STARTING, DOWN):
            m.state, m.failures, m.held_out, m.back = SERVING, 0, False, ""
            self._route()  # "routed to" is said once the router lists it (_announce)
            self.record()
        elif event == "ready":
            m.held_out = False
        elif event == "down" and m.state in (STARTING, SERVING, DOWN):
            m.held_out = True  # out until its job says ready again, whatever /health says
            if m.state == SERVING:
                self._down(m, f"its job says it is down ({item['why'][:200]})")
        elif event == "restarting":
            m.restarts += 1
            self.record()

    def _down(self, m: Member, why: str) -> None:
        m.state, m.routed, m.refused = DOWN, False, ""
        self.say(f"replica {m.replica.index}: {why}: taken out of the router")
        if self.router.running():
            self.router.remove(m.replica.url)
        self.record()

    def _prober(self) -> None:
        """In a thread of its own (a slow /health must not hold up the others): every
        serving or taken-out replica's /health, each answer queued for the main loop."""
        while not self.done.wait(PROBE_EVERY):
            for m in list(self.members):
                if m.state not in (SERVING, DOWN):
                    continue
                serving = m.replica.prepared.plan.serving
                path = (serving.profile.ready_path if serving is not None else None) or "/health"
                refused = False
                try:
                    with DIRECT.open(m.replica.url + path, timeout=PROBE_TIMEOUT) as r:
                        ok = r.status == 200
                except ConnectionRefusedError:
                    ok, refused = False, True  # nothing listens: the server is gone
                except OSError:  # an HTTP error, or no answer within the timeout
                    ok = False
                except ValueError:
                    ok = False
                self.probes.put((m.replica.index, ok, refused))

    def _probed(self, k: int, ok: bool, refused: bool) -> None:
        """A /health answer: ``PROBE_FAILURES`` failures in a row (or a refused connection)
        take a serving replica out of the router; a taken-out one that answers goes back."""
        m = self.members[k]
        if ok:
            m.failures = 0
            if m.state == DOWN and not m.held_out:
                m.state, m.back = SERVING, " (its /health answers)"
                self._route()
                self.record()
            return
        m.failures += 1
        if m.state == SERVING and (refused or m.failures >= PROBE_FAILURES):
            why = (
                "nothing listens at its port"
                if refused
                else (f"its /health failed {m.failures} times in a row")
            )
            self._down(m, why)

    def _reap(self) -> None:
        for m in self.members:
            if m.proc is not None and m.state != EXITED and m.proc.poll() is not None:
                ended, m.code = m.proc.returncode, shell_code(m.proc.returncode)
                if m.state == SERVING and self.router.running():
                    self.router.remove(m.replica.url)
                m.routed, m.refused = False, ""
                drained, m.state = m.state == DRAINING, EXITED
                for t in m.readers:
                    t.join(timeout=5)
                m.readers = []
                if not self._ending():  # one the fleet drained counts only its own failure
                    m.needs = needs_whole_host(m.outcome(), stopped=drained)
                left = self._left_serving(m) if m.needs is None and not drained else ""
                how = f"exit {m.code}" if ended >= 0 else how_it_ended(ended)
                self.say(f"replica {m.replica.index}: its job ended ({how}){left}")
                self.record()
        if not self.draining and any(m.needs for m in self.members) and not self._ending():
            self._drain_all()

    def _left_serving(self, m: Member) -> str:
        """After a replica's job ended by itself: why it is not started again, and how many
        serve (said, so a fleet running on fewer replicas is never a surprise)."""
        if self._ending() or m.code == 0:
            return ""
        serving = sum(1 for x in self.members if x.state == SERVING)
        return (
            f"; not restarted (its --max-restarts {self.o.max_restarts} used: raise it to "
            f"restart a replica): {serving} of {len(self.members)} replicas serve"
        )

    # ------------------------------------------------------------------ a whole-host reset

    def _ending(self) -> bool:
        """The fleet stops (asked, or by itself): a job's needs are then its stop's to meet."""
        return self.stopping or self.stop_sig is not None or self.failed is not None

    def _drain_all(self) -> None:
        """A replica's chips need a reset and this host's one reset is the whole host
        (``fleet.drain``): every replica out of the router and drained within --grace, one
        reset of the host (``launcher.job.repair.reset_chips``, verified), then every replica
        started again as at the fleet's start (staggered unless --replicas-parallel)."""
        failed = [m for m in self.members if m.needs is not None]
        names = ", ".join(str(m.replica.index) for m in failed)
        said = f"replica {names}'s chips need a reset, and this host's reset is the whole host"
        if self._no_restart_left(failed, said):
            return  # the fleet's stop drains the others and checks every chip together
        self.say(f"{said}: draining every replica")
        back = self._drain(failed)
        # A replica that failed by itself as it was drained counts its restart too.
        failed = [m for m in self.members if m.needs is not None]
        why = next((m.needs.get("why") for m in failed if m.needs and m.needs.get("why")), None)
        if self._no_restart_left(failed, said):
            return
        counted = after_drain([m.restarts for m in self.members],
                              [m.replica.index for m in failed], self.o.max_restarts)  # fmt: skip
        for m, n in zip(self.members, counted.restarts, strict=True):
            m.restarts, m.needs = n, None  # the failed ones' restart, counted as it is made
        if self.stop_sig is not None:
            return  # the stop checks every chip together (and resets them where needed)
        if not self._reset_host(failed[0].replica.index, why):
            return
        if self.stop_sig is not None:  # asked during the reset, which ran to its end first
            self.say(
                "the whole host is reset and verified; stopping as asked (no replica restarted)"
            )
            return
        how = "together" if self.o.replicas_parallel else "one after the other"
        self.say(f"the whole host is reset and verified: every replica restarting, {how}")
        for m in back:
            with contextlib.suppress(OSError):
                os.unlink(m.summary)  # its last job's: the next one writes its own
            m.state, m.code, m.proc, m.last, m.failures = WAITING, None, None, "", 0
            m.held_out = False
        self.record()

    def _no_restart_left(self, failed: list[Member], said: str) -> bool:
        """Whether a replica whose chips need the reset is over its --max-restarts: then the
        fleet ends with its code (its stop checks and resets every chip together)."""
        counted = after_drain([m.restarts for m in self.members],
                              [m.replica.index for m in failed], self.o.max_restarts)  # fmt: skip
        if counted.over is None:
            return False
        over = self.members[counted.over]
        self.failed = (f"replica {counted.over} needs the whole-host reset and has no restart "
                       f"left (--max-restarts {self.o.max_restarts})")  # fmt: skip
        self.failed_code = over.code or 1
        self.say(f"{said}; replica {counted.over} has no restart left: stopping the fleet "
                 "(every replica drained, then every chip checked and reset together)")  # fmt: skip
        for m in self.members:
            m.needs = None
        self.record()
        return True

    def _drain(self, failed: list[Member]) -> list[Member]:
        """Every replica out of the router, every running one stopped (its own drain within
        --grace, SIGTERM as on a stop), each waited for; the replicas to start again."""
        self.draining = True
        try:
            alive = [m for m in self.members if m.proc is not None and m.proc.poll() is None]
            for m in alive:
                if self.router.running() and m.state in (SERVING, DOWN):
                    self.router.remove(m.replica.url)
                m.state, m.routed, m.refused = DRAINING, False, ""
                m.drains += 1
                self.say(f"replica {m.replica.index}: draining (the whole host is reset next)")
                with contextlib.suppress(ProcessLookupError):
                    m.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
            self.record()
            for m in alive:
                assert m.proc is not None
                m.proc.wait()
            self._reap()
        finally:
            self.draining = False
        again = {id(m) for m in (*alive, *failed)}
        return [m for m in self.members if id(m) in again or m.state == WAITING]

    def _reset_host(self, k: int, why: str | None) -> bool:
        """The one whole-host reset, through the job's recovery (its plan, refusals, tt-smi
        call and verification); whether it recovered. Refused or unverified: the fleet ends."""
        from ttmesh.errors import TTMeshError
        from ttmesh.fabric.devices import discover
        from ttmesh.launcher.job.jobstate import JobState
        from ttmesh.launcher.job.repair import Recovery, reset_chips

        asics = [a for r in self.fp.replicas for a in r.prepared.plan.all_chips()]
        entry: dict[str, Any] = {"at": time.time(), "replica": k, "why": why,
                                 "recovered": False, "seconds": 0.0}  # fmt: skip
        self.host_resets.append(entry)
        self.resetting = True
        self.record()
        t0 = time.monotonic()
        outcome = None
        try:
            again = Recovery(tt_smi=self.o.tt_smi, train_timeout=self.o.train_timeout)
            outcome = reset_chips(JobState(discover(self.host)), again, asics, why=why)
        except (OSError, TTMeshError) as exc:
            self.say(f"the whole-host reset could not run: {exc}")
        finally:
            self.resetting = False
        entry["seconds"] = round(time.monotonic() - t0, 3)
        entry["recovered"] = bool(
            outcome is not None and outcome.recovered and not outcome.unreached
        )  # a chip the host lost was never reset nor verified
        self.record()
        if entry["recovered"]:
            return True
        self.failed = ("the whole-host reset was refused" if outcome is None
                       else "the chips did not verify after the whole-host reset")  # fmt: skip
        self.failed_code = 3 if outcome is None else 1
        self.say(f"{self.failed}: every replica stays stopped (see ttmesh check)")
        return False

    def _recovery_json(self) -> dict[str, Any]:
        """How a replica's chips are recovered here, and every whole-host reset so far."""
        return {
            "recovery": recovery_mode(self.fp.whole_host_reset),
            "resetting": self.resetting,
            "host_resets": list(self.host_resets),
        }

    # ------------------------------------------------------------------ the router

    def _serving(self) -> list[str]:
        return [m.replica.url for m in self.members if m.state == SERVING]

    def _route(self) -> None:
        serving = self._serving()
        if not self.router.running():
            code = self.router.died()
            if code is None and not serving:
                return  # started when the first replica is ready
            if code is not None:
                said = how_it_ended(code)
                if code > 0:  # it ended by itself: its last word says why
                    said += f": {self.router.last_line() or 'no output'}"
                self.say(f"router: died ({said})")
                if self.router.starts >= ROUTER_STARTS:
                    self.failed = f"the router died {self.router.starts} times"
                    return
                time.sleep(0.5)
            self.router.start(serving)
            self._told_guard()
            self.record()
            return
        if self.router.reconcile(serving):
            self._announce()

    def _announce(self) -> None:
        """What the router said of each serving replica, once each: ``routed to`` when it
        lists it (never before: an add it refused, or has not made yet, routes nothing), or
        its refusal (status and reason) while it does not."""
        for m in self.members:
            if m.state != SERVING:
                continue
            url = m.replica.url
            if url in self.router.listed and not m.routed:
                m.routed, m.refused = True, ""
                self.say(f"replica {m.replica.index}: ready: routed to at {url}{m.back}")
                self.record()
            refusal = self.router.refusals.get(url, "")
            if refusal and not m.routed and refusal != m.refused:
                m.refused = refusal
                self.say(f"replica {m.replica.index}: ready, but the router refuses to route to "
                         f"it ({refusal}): asking again every {ASK_AGAIN:g} s")  # fmt: skip

    # ------------------------------------------------------------------ the whole

    def _handler(self, sig: int, _frame: object) -> None:
        self.stop_sig = sig
        if self.resetting:  # said at once: the reset may take a minute (os.write: no lock)
            with contextlib.suppress(OSError):
                os.write(2, b"ttmesh: stopping once the whole-host reset has ended and is "
                         b"verified (one cut short leaves every chip unusable)\n")  # fmt: skip

    def record(self, first: bool = False) -> None:
        """The fleet's job record (``ttmesh ps``: each replica and the router; ``ttmesh stop
        FLEET`` stops them all), and the live view. Each replica's own job has its record too.
        The ``first`` that cannot be written refuses the fleet (a fleet ps and stop cannot
        see must not start); a later one that fails leaves the last written."""
        from ttmesh.errors import TTMeshError
        from ttmesh.runtime import jobs

        self._show()
        with contextlib.nullcontext() if first else contextlib.suppress(OSError, TTMeshError):
            jobs.write(
                {
                    "job": self.fp.job, "pid": os.getpid(),
                    "guardian": self.guard.pid if self.guard is not None else None,
                    "root": str(self.host.root), "layout": "fleet", "attempt": 0,
                    "started": self.started, "command": list(self.o.command), "ranks": [],
                    "fleet": self.state(),
                }
            )  # fmt: skip

    def _metrics(self) -> dict[str, Any] | None:
        ro = self.fp.router_opts
        return ro.to_json() if ro is not None else None

    def _show(self) -> None:
        """The live view told the state now (it draws only what changed, on its own time)."""
        if self.view is not None:
            state = self.state()
            with self.lock:
                self.view.show(state)

    def _router_state(self) -> str:
        """waiting (for the first replica), running, down (died: started again), stopped."""
        r = self.router
        if r.running():
            return "running"
        return "down" if r.proc is not None else "stopped" if r.starts else "waiting"

    def state(self) -> dict[str, Any]:
        return {
            "router": {
                "url": self.fp.url, "pid": self.router.pid, "running": self.router.running(),
                "state": self._router_state(), "restarts": max(0, self.router.starts - 1),
                "metrics": self._metrics(), "metrics_url": (self._metrics() or {}).get("url"),
            },
            "replicas": [m.to_json() for m in self.members],
            **self._recovery_json(),
        }  # fmt: skip

    def run(self) -> int:
        self.started = time.time()
        try:
            self.record(first=True)  # before anything starts
        except BaseException:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise
        stops = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        previous = {sig: signal.signal(sig, self._handler) for sig in stops}
        self._start_guard()
        self.record()  # with its guard
        threading.Thread(target=self._prober, daemon=True).start()
        try:
            self._loop()
        finally:
            self.done.set()
            try:
                self._stop_all()
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)
        return self._finish()

    def _loop(self) -> None:
        last_route = 0.0
        while self.stop_sig is None and self.failed is None:
            self._next_to_start()
            with contextlib.suppress(queue.Empty):
                k, line = self.events.get(timeout=0.2)
                self._event(k, line)
                while True:
                    self._event(*self.events.get_nowait())
            self._reap()
            with contextlib.suppress(queue.Empty):
                while True:
                    self._probed(*self.probes.get_nowait())
            if time.monotonic() - last_route > 1.0:
                self._route()
                last_route = time.monotonic()
            if all(m.state == EXITED for m in self.members):
                break
            self._guard_gone()
            self._show()  # the last lines, and its clock

    def _stop_all(self) -> None:
        """The router first (no request reaches a replica that drains), then every replica's
        job, each draining its server within --grace and checking its chips."""
        self.stopping = True
        if self.router.proc is not None:
            self.say("router: stopping (it takes no more requests)")
        self.router.stop(grace=5.0)
        alive = [m for m in self.members if m.proc is not None and m.proc.poll() is None]
        sig = self.stop_sig or signal.SIGTERM
        for m in alive:
            with contextlib.suppress(ProcessLookupError):
                m.proc.send_signal(signal.SIGINT if sig == signal.SIGINT else signal.SIGTERM)  # type: ignore[union-attr]
        for m in alive:
            assert m.proc is not None
            m.proc.wait()
        self._reap()
        with contextlib.suppress(queue.Empty):
            while True:  # the last lines relayed: each replica's last line is its job's end
                k, line = self.events.get_nowait()
                if isinstance(line, str):
                    self.members[k].last = line[:LAST_WIDTH]
        self._links_between()

    def _links_between(self) -> None:
        """Once every replica is stopped: each reset only its own chips, so a link between two
        replicas' chips may be down (it was in no replica's mesh). Now no replica runs, the
        fleet's chips are checked together and reset together where something is wrong; the
        chips it could not recover are kept for the last line (``fleet.between``)."""
        from ttmesh.errors import TTMeshError
        from ttmesh.launcher.fleet import between

        if self.fp.replicas[0].prepared.plan.chipless:
            return
        try:
            self.between = between.check(
                self.host, self._asics(), self._names(), tt_smi=self.o.tt_smi,
                train_timeout=self.o.train_timeout, own_pids=(os.getpid(),), say=self.say,
            )  # fmt: skip
        except (OSError, TTMeshError) as exc:
            self.say(f"the fleet's chips could not be checked: {exc} (see ttmesh check)")

    def _asics(self) -> list[str]:
        return [a for r in self.fp.replicas for a in r.prepared.plan.all_chips()]

    def _names(self) -> dict[str, str]:
        """Each of the fleet's chips by the PCI address the plan found it at (a chip the host
        has lost since is still named by it)."""
        out: dict[str, str] = {}
        for r in self.fp.replicas:
            inv = r.prepared.inv
            for asic in r.prepared.plan.all_chips():
                with contextlib.suppress(KeyError):
                    lead = inv.lead(inv.chip(asic))
                    if lead is not None and lead.bdf:
                        out[asic] = lead.bdf
        return out

    # ------------------------------------------------------------------ its guard

    def _start_guard(self) -> None:
        """The fleet's guard (``fleet.guard``), told what to do should this process die: it
        holds the fleet's directory lock and reads the pipe only this process writes."""
        read, write = os.pipe()
        spec = {
            "schema": GUARD_SCHEMA, "job": self.fp.job, "root": str(self.host.root),
            "dir": self.dir, "dir_id": list(_identity(self.dir)),
            "asics": [] if self.fp.replicas[0].prepared.plan.chipless else self._asics(),
            "names": self._names(), "tt_smi": self.o.tt_smi,
            "train_timeout": self.o.train_timeout, "summary": self.o.summary_json,
            "recovery": recovery_mode(self.fp.whole_host_reset),
            "replicas": [
                {"replica": m.replica.index, "job": m.replica.job, "chips": m.replica.bdfs,
                 "url": m.replica.url, "port": m.replica.port, "summary": m.summary}
                for m in self.members
            ],
        }  # fmt: skip
        try:
            self.guard = subprocess.Popen(
                [sys.executable, "-m", "ttmesh", "_fleet-guard"], stdin=read,
                stdout=subprocess.DEVNULL, start_new_session=True, pass_fds=(self.dir_lock,),
            )  # fmt: skip
        except OSError as exc:
            os.close(write)
            self.say(f"the fleet's guard could not start ({exc}): if ttmesh is killed, the "
                     "links between replicas are left to ttmesh check")  # fmt: skip
            return
        finally:
            os.close(read)
        self.guard_pipe = write
        self._tell_guard(spec)

    def _tell_guard(self, message: dict[str, Any]) -> None:
        if self.guard_pipe < 0:
            return
        try:
            os.write(self.guard_pipe, (json.dumps(message) + "\n").encode())
        except OSError:  # the guard is gone (said by _guard_gone): the fleet runs on
            os.close(self.guard_pipe)
            self.guard_pipe = -1

    def _guard_gone(self) -> None:
        """A guard that ended while the fleet runs (killed) is said once: the fleet runs on,
        and should ttmesh be killed now, nobody resets the links between replicas."""
        if self.guard is not None and not self.guard_lost and self.guard.poll() is not None:
            self.guard_lost = True
            self.say(f"the fleet's guard (pid {self.guard.pid}) has gone "
                     f"({how_it_ended(self.guard.returncode)}): should ttmesh be killed now, "
                     "the links between replicas are left to ttmesh check")  # fmt: skip

    def _told_guard(self) -> None:
        """The router's PID and start time, for the guard to stop it should this process die."""
        from ttmesh import procs

        pid = self.router.pid
        if pid is not None:
            self._tell_guard({"router": {"pid": pid, "start": procs.start_time(pid)}})

    def _release_guard(self) -> None:
        """The fleet has ended by itself: the guard is told so and exits."""
        self._tell_guard({"done": True})
        if self.guard_pipe >= 0:
            os.close(self.guard_pipe)
            self.guard_pipe = -1
        if self.guard is not None:
            try:
                self.guard.wait(timeout=GUARD_WAIT)
            except subprocess.TimeoutExpired:
                self.guard.kill()
                self.guard.wait()

    def _finish(self) -> int:
        if self.stop_sig is not None:
            code, reason = 128 + self.stop_sig, f"stopped ({signal.Signals(self.stop_sig).name})"
        elif self.failed is not None:
            code, reason = self.failed_code or 1, self.failed
        else:
            codes = [m.code for m in self.members if m.code]
            code = codes[0] if codes else 0
            reason = "every replica's job ended"
        if self.between is not None and self.between.lost:
            reason += f"; {self.between.clause()}"
            if code == 0 or self.stop_sig is not None:  # a replica's own failing code is kept
                code = 1  # the fleet's chips are not recovered (docs/serving.md)
        summary = self.to_json(code, reason)
        from ttmesh import paths
        from ttmesh.errors import BAD_INPUT, TTMeshError
        from ttmesh.runtime import jobs

        if self.o.summary_json:
            try:  # never through a link another user planted (paths.write_text)
                text = json_text(summary, indent=2) + "\n"
                paths.write_text(self.o.summary_json, text, "--summary-json")
            except TTMeshError as err:
                self.say(str(err))  # said, never silent; a fleet that succeeded then ends 2
                code = code or BAD_INPUT

        self.record()
        with contextlib.suppress(OSError, TTMeshError):
            jobs.close(self.fp.job, reason, code)
        shutil.rmtree(self.dir, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.close(self.dir_lock)
        self._release_guard()
        self.say(f"fleet {self.fp.job}: exit {code}: {reason}")
        return code

    def to_json(self, code: int, reason: str) -> dict[str, Any]:
        return {
            "schema": "ttmesh.fleet/1",
            "job": self.fp.job,
            "source": str(Source.TTMESH) if self.stop_sig or self.failed else "worker",
            "code": code,
            "reason": reason,
            "router": {
                "url": self.fp.url,
                "starts": self.router.starts,
                "restarts": max(0, self.router.starts - 1),
                "last_line": self.router.last_line(),
                "metrics": self._metrics(),
            },
            "replicas": [m.to_json() for m in self.members],
            "chips": self.between.to_json() if self.between is not None else None,
            **self._recovery_json(),
        }


def _lock_dir(path: str) -> int:
    """The fleet directory's lock (``paths.LOCK``, as a job's run directory has), held by the
    fleet and its guard: a directory whose lock nobody holds is left over (``sweep_dirs``)."""
    import fcntl

    from ttmesh import paths

    dir_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        fd = os.open(paths.LOCK, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600, dir_fd=dir_fd)  # fmt: skip
    finally:
        os.close(dir_fd)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def _identity(path: str) -> tuple[int, int]:
    st = os.lstat(path)
    return st.st_dev, st.st_ino


def sweep_dirs() -> list[str]:
    """Remove this user's fleet directories in the temp dir whose fleet and guard are both
    gone (their lock free): what a fleet whose ttmesh and guard were both killed left."""
    from pathlib import Path

    from ttmesh import paths

    base = Path(tempfile.gettempdir())
    try:
        names = [n for n in os.listdir(base) if n.startswith(DIR_PREFIX)]
    except OSError:
        return []
    removed = []
    for name in names:
        path = base / name
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not os.path.isdir(path) or os.path.islink(path) or st.st_uid != os.getuid():
            continue
        if not os.path.lexists(path / paths.LOCK):
            continue  # made by a ttmesh without the lock: whether its fleet runs is unknown
        if paths.is_stale(path) and paths.remove_tree(path, (st.st_dev, st.st_ino)):
            removed.append(str(path))
    return removed
