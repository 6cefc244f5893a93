"""How a launch runs in each of its modes (:class:`~ttmesh.vocab.JobMode`, decided once by
``planning.options``): one interface, :class:`Mode`, with one implementation per mode.

* :class:`OneHost`: this host's chips, the whole job;
* :class:`C10d`: this host's part of a job over several (an agent of ``--nnodes``), planned as
  one host, then joined with the others at the rendezvous;
* :class:`MeshOverHosts`: one tt-metal mesh over ``--hosts``, planned from every host's report
  and started by one MPMD ``mpirun``;
* :class:`Agents`: ``--hosts`` without a tt-metal mesh: ``mpirun`` starts one agent per host,
  each a c10d launch of its own host;
* :class:`FleetMode`: ``--replicas N`` servers behind SGLang's router.

Each plans (changing nothing), says what it planned, and then either returns the plan
(``--dry-run``) or starts the job and returns how it ended (:class:`Result`). What a caller
shows while the job runs (the command line's live views) it gives as a :class:`View`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

from ttmesh.dataclass import dataclass
from ttmesh.errors import TTMeshError, bad_input
from ttmesh.render import note, plural
from ttmesh.vocab import JobMode

if TYPE_CHECKING:
    from ttmesh.launcher.attempt.events import Observer
    from ttmesh.launcher.attempt.guardian import Options
    from ttmesh.launcher.fleet.run import Watcher
    from ttmesh.launcher.job.run import JobRun
    from ttmesh.launcher.nodes.multihost import MultiHost, Peers
    from ttmesh.launcher.planning.options import Launch
    from ttmesh.launcher.planning.plan import LaunchPlan
    from ttmesh.launcher.planning.prepare import Prepared
    from ttmesh.launcher.planning.request import LaunchRequest
    from ttmesh.launcher.serving.spec import ServingSpec


@dataclass(frozen=True)
class Result:
    """How a launch ended: the code ``ttmesh launch`` exits with, and why.

    ``code`` is the failing worker's exit code (0 when every rank succeeded; 128 + N when
    signal N stopped the job; ttmesh's own codes when ttmesh ended it). A refusal (nothing
    started) is not a result: it is raised as :class:`~ttmesh.errors.LaunchError`."""

    code: int
    mode: JobMode
    job: str = ""  # the job's id (a fleet's; --hosts: the id every agent shares)
    reason: str = ""  # how the job ended, as its last line says it
    rank: int | None = None  # the rank whose end decided the code (None: ttmesh, or success)
    source: str | None = None  # who decided the code: "worker" or "ttmesh" (vocab.Source)
    attempts: int = 0  # the attempts that ran (a restart is one more)
    # A dry run: the plan document it printed (ttmesh.plan/1, or ttmesh.fleet-plan/1 for a
    # fleet); None for a job that ran, and for --hosts (each agent plans its own host).
    plan: Mapping[str, Any] | None = None

    @classmethod
    def of_job(cls, mode: JobMode, job: JobRun, code: int) -> Result:
        final = job.final
        if final is None:
            return cls(code, mode, job.plan.job)
        return cls(
            code, mode, job.plan.job, final.reason, final.rank, str(final.source),
            len(job.results),
        )  # fmt: skip


class View(Protocol):
    """What a caller shows while a launch runs (the command line: its live views)."""

    def started(self) -> None:
        """The job starts: from here its exit code is the launch's, whatever else is lost."""

    def job(self, plan: LaunchPlan) -> AbstractContextManager[Observer | None]:
        """A view of the job planned (``plan``, the global one over several hosts) while it
        runs: the observer it hears (an observer draws a server's start as its checklist, which
        is then not said line by line), or None for plain prefixed lines."""

    def fleet(self, job: str) -> AbstractContextManager[Watcher | None]:
        """A view of fleet ``job`` while it runs, or None for plain lines."""


class Plain:
    """No view: the ranks' prefixed lines on stdout and ttmesh's on stderr."""

    def started(self) -> None:
        return None

    @contextlib.contextmanager
    def job(self, plan: LaunchPlan) -> Iterator[Observer | None]:
        yield None

    @contextlib.contextmanager
    def fleet(self, job: str) -> Iterator[Watcher | None]:
        yield None


class Mode(ABC):
    """One way a launch runs: planned, said, then returned (a dry run) or started."""

    def __init__(self, launch: Launch, view: View) -> None:
        self.launch = launch
        self.options = launch.options
        self.view = view

    @abstractmethod
    def run(self) -> Result:
        """The launch in this mode, to its end (a refusal raises ``TTMeshError``)."""


# --------------------------------------------------------------------------- a job of ranks


class JobOfRanks(Mode):
    """A job of ranks this ttmesh supervises: planned (``plan``), checked against what could
    only be checked with the plan, then shown or run by ``job.run.JobRun``."""

    rendezvous = False  # it meets other hosts once planned (a dry run does not)

    @abstractmethod
    def plan(self) -> Prepared:
        """Everything before the start, changing nothing."""

    def join(self, prepared: Prepared) -> tuple[Prepared, Peers | None]:
        """The other hosts joined, when the job has some: the job's global plan."""
        return prepared, None

    def run(self) -> Result:
        from ttmesh.launcher.job.preflight import dry_run_checks
        from ttmesh.launcher.job.summary import write_refusal

        o = self.options
        try:
            prepared = self.plan()
            check_planned(self.launch, prepared)
            if o.dry_run:  # every check the launch runs before its start, or why it is skipped
                prepared = dry_run_checks(prepared, o.auto_reset, rendezvous=self.rendezvous)
        except TTMeshError as exc:
            if o.summary_json and not o.dry_run:
                write_refusal(o.summary_json, exc)
            raise
        say_planned(prepared.plan, o.dry_run)
        if o.dry_run:
            return Result(0, self.launch.mode, prepared.plan.job,
                          plan=prepared.plan.to_json(o.show_env))  # fmt: skip
        return self.start(prepared)

    def start(self, prepared: Prepared) -> Result:
        """The job itself: its hosts joined (c10d), its logs' directory, then its attempts."""
        from ttmesh.launcher.job.repair import Recovery

        o, launch = self.options, self.launch
        options = _console(launch)
        recovery = Recovery(
            auto_reset=o.auto_reset, reset_on_failure=o.reset_on_failure, tt_smi=o.tt_smi,
            train_timeout=o.train_timeout, fleet_of=o.fleet_of,
        )  # fmt: skip
        prepared, peers = self.join(prepared)
        if launch.log_dir is not None or (launch.logs is not None and launch.logs.files_wanted):
            from ttmesh.launcher.job import logdir

            assert launch.logs is not None
            logs = logdir.make_run_dir(launch.logs, launch.log_dir, prepared.plan.job)
            options = dataclasses.replace(options, logs=logs)
            note(f"the ranks' logs: {logs.run_dir}/attempt_N/<local rank>/stdout.log, stderr.log")
        self.view.started()

        def job(shown: Options) -> Result:
            from ttmesh.launcher.job.run import JobRun

            run = JobRun(prepared, shown, o.summary_json, recovery, 0.2, peers)
            return Result.of_job(launch.mode, run, run.run())

        if o.events_fd is not None:  # a replica of a fleet: its events on the fleet's pipe
            return _fed(prepared.plan, options, o.events_fd, job)
        with self.view.job(prepared.plan) as observer:
            if observer is None:
                return job(options)
            # the view draws a server's start: no line per step
            return job(dataclasses.replace(options, observer=observer, checklist_drawn=True))


class OneHost(JobOfRanks):
    """This host's chips, the whole job."""

    def plan(self) -> Prepared:
        from ttmesh.launcher.planning import tpsize
        from ttmesh.launcher.planning.prepare import prepare

        o, launch, request = self.options, self.launch, _request(self.launch)
        try:
            prepared = prepare(
                request, o.host, o.chips, o.exclude, repairable=o.auto_reset,
                defer_liveness=not o.dry_run and not self.rendezvous, dry_run=o.dry_run,
            )  # fmt: skip
        except TTMeshError as exc:
            raise tpsize.over_hosts(exc, launch.job_tp, request.tp_hosts, request.tp_size) from None
        if launch.job_tp is not None and request.tp_hosts > 1:
            note = tpsize.note(launch.job_tp, request.tp_hosts)
            plan = dataclasses.replace(prepared.plan, report=prepared.plan.report.noted(note))
            return dataclasses.replace(prepared, plan=plan)
        return prepared


class C10d(OneHost):
    """This host's part of a job over several (an agent of ``--nnodes``, Slurm's or
    ``--hosts``'): planned as one host, then joined with the others at the rendezvous, whose
    global plan it runs."""

    rendezvous = True

    def __init__(self, launch: Launch, view: View) -> None:
        super().__init__(launch, view)
        from ttmesh.launcher.nodes import multihost

        self.multihost = _multihost(launch)
        multihost.check(self.multihost)

    def join(self, prepared: Prepared) -> tuple[Prepared, Peers | None]:
        """The other hosts joined: the plan becomes the job's global one."""
        from ttmesh.launcher.nodes.multihost import Peers

        peers = Peers(self.multihost, self.launch.rdzv_job)
        try:
            joined = dataclasses.replace(prepared, plan=peers.join(prepared.plan))
        except BaseException:
            peers.coord.close()
            raise
        return joined, peers


class MeshOverHosts(JobOfRanks):
    """--hosts with a tt-metal mesh: one global plan over the hosts' reports, one mpirun."""

    def __init__(self, launch: Launch, view: View) -> None:
        super().__init__(launch, view)
        from ttmesh.launcher.nodes import meshhosts

        o = self.options
        assert o.hosts is not None
        self.hosts = meshhosts.setup(meshhosts.parse_hosts(o.hosts), agent=o.launch_agent,
                                     tcp_interface=o.tcp_interface)  # fmt: skip

    def plan(self) -> Prepared:
        from ttmesh.launcher.nodes import meshhosts

        o, request = self.options, _request(self.launch)
        if o.chips or o.exclude:
            raise bad_input("--chips/--exclude name one host's chips", "drop them with --hosts")
        return meshhosts.prepare(dataclasses.replace(request, mpirun=self.hosts.mpirun), self.hosts)


def check_planned(launch: Launch, prepared: Prepared) -> None:
    """The options that could only be checked against the plan."""
    o = launch.options
    serving = prepared.plan.serving
    if serving is not None and serving.profile.extra.get("failures") is not None:
        from ttmesh.launcher.attempt import failures  # its own known lines: read before the start

        where = f"profile {serving.profile.path or serving.profile.name}: failures"
        failures.profile_entries(serving.profile.extra["failures"], where)
    if prepared.plan.chipless:  # no chip to recover (chipless refuses the rest)
        for flag, given in (
            ("--reset-on-failure", o.reset_on_failure),
            ("--tt-smi", o.tt_smi),
            ("--train-timeout", o.train_timeout is not None),
        ):
            if given:
                assert prepared.plan.serving is not None
                raise bad_input(f"{flag}: {prepared.plan.serving.chipless_what}", "drop it")
    shown_ranks = launch.shown_ranks
    if shown_ranks is not None:
        world = len(prepared.plan.ranks)
        extra = sorted(r for r in shown_ranks if not 0 <= r < world)
        if extra:
            err = bad_input(
                f"--ranks-filter {o.ranks_filter}: no rank {', '.join(map(str, extra))} "
                f"in a job of {plural(world, 'rank')}",
                f"ranks are 0..{world - 1}",
            )
            raise prepared.liveness.first(err) if prepared.liveness else err


def say_planned(plan: LaunchPlan, dry_run: bool) -> None:
    """What a launch says of its plan before it starts: the chips passed over (a dry run lists
    them in its plan), the program profile's stack, the server's profile and its findings."""
    if plan.report.passed_over and not dry_run:
        note(plan.passed_over_line())
    program = plan.program
    if program is not None:  # a program profile's job: which, why, and its stack
        note(f"{program.profile.name}: {program.profile.title}, chosen because {program.why}")
        for n in program.notes:
            note(f"note: {n}")
    if plan.serving is not None:
        say_serving(plan.serving)


def say_serving(serving: ServingSpec) -> None:
    """A server's profile, its notes and its findings."""
    note(f"{serving.profile.name}: {serving.profile.title}")
    for n in (*serving.notes, *([serving.budget_note] if serving.budget_note else [])):
        note(f"note: {n}")
    for f in serving.findings:
        note(f"{f.severity}: {f.message} (fix: {f.fix})")


def _console(launch: Launch) -> Options:
    """How the job's output is shown and kept (the guardian's options)."""
    from ttmesh.launcher.attempt.guardian import Options
    from ttmesh.runtime import joblogs

    o = launch.options
    return Options(
        ranks_filter=launch.shown_ranks, quiet=o.quiet, logs=launch.logs, keep_logs=not o.no_logs,
        log_limits=joblogs.limits() if not o.no_logs else None,
    )  # fmt: skip


def _fed(plan: LaunchPlan, options: Options, fd: int, run: Callable[[Options], Result]) -> Result:
    """The job with its events written to its fleet's pipe (``launcher.job.feed``), the last
    one its exit code: also when it is refused, or stopped between attempts."""
    from ttmesh.launcher.job.feed import Feed

    url = plan.serving.url if plan.serving is not None else None
    feed = Feed(fd, url, [b for r in plan.ranks for b in r.bdfs], options.observer)
    code = 1
    try:
        result = run(dataclasses.replace(options, observer=feed))
        code = result.code
    except TTMeshError as exc:
        code = exc.code
        raise
    finally:
        feed.ended(code)
    return result


def _request(launch: Launch) -> LaunchRequest:
    assert launch.request is not None  # every mode but --hosts has one
    return launch.request


def _multihost(launch: Launch) -> MultiHost:
    """How this agent joins the job, as the rendezvous takes it."""
    from ttmesh.launcher.nodes.multihost import MultiHost

    join = launch.join
    assert join is not None
    return MultiHost(
        nnodes=join.nnodes,
        node_rank=join.node_rank,
        endpoint=join.endpoint,
        token=join.token,
        local_addr=join.local_addr,
        join_timeout=join.join_timeout,
        heartbeat_timeout=join.heartbeat_timeout,
        tp_size=launch.job_tp or 0,
    )


# --------------------------------------------------------------------------- agents, a fleet


class Agents(Mode):
    """--hosts: mpirun starts one agent per host, each a c10d launch of its own host."""

    def run(self) -> Result:
        from ttmesh.launcher.nodes import agents

        o, join = self.options, self.launch.join
        assert join is not None and o.hosts is not None
        if not o.argv:
            raise bad_input(
                "--hosts without a tt-metal mesh reruns ttmesh launch on every host, and this "
                "launch has no command line to rerun (LaunchOptions.argv)",
                "give argv: the ttmesh launch command line each host's agent runs",
            )
        code = agents.start(o.hosts, _multihost(self.launch), join.job, list(o.argv),
                            dry_run=o.dry_run)  # fmt: skip
        return Result(code, self.launch.mode, join.job)


class FleetMode(Mode):
    """--replicas N: N servers on their own chips behind SGLang's router (launcher.fleet)."""

    def run(self) -> Result:
        from ttmesh.launcher.fleet import place, router
        from ttmesh.launcher.job.summary import write_refusal

        o = self.options
        try:
            if not o.dry_run:
                router.check_installed()  # before the host is read or anything is planned
            fp = place.plan_fleet(self.launch, o.host)
            if not o.dry_run:
                from ttmesh.launcher.planning import ports

                ports.check_server_port(fp.host, fp.port)  # the router's: the user's --host:--port
                if fp.router_opts is not None:
                    from ttmesh.launcher.fleet import routeropts

                    routeropts.check_free(fp.router_opts)  # its metrics port, when given
        except TTMeshError as exc:
            if o.summary_json and not o.dry_run:
                write_refusal(o.summary_json, exc)
            raise
        serving = fp.replicas[0].prepared.plan.serving
        assert serving is not None  # a fleet's replicas are servers
        say_serving(serving)
        for n in fp.notes:
            note(f"note: {n}")
        if fp.router_opts is not None:
            note(f"router: Prometheus metrics at {fp.router_opts.announced}")
        if o.dry_run:
            return Result(0, self.launch.mode, fp.job, plan=fp.to_json(o.show_env))
        from ttmesh.launcher.fleet.run import Fleet

        self.view.started()
        with self.view.fleet(fp.job) as watcher:
            return Result(Fleet(o, o.host, fp, watcher).run(), self.launch.mode, fp.job)


# How each mode runs (``Launch.mode``, decided once by launcher.planning.options).
MODES: dict[JobMode, type[Mode]] = {
    JobMode.ONE_HOST: OneHost,
    JobMode.C10D: C10d,
    JobMode.HOSTS: Agents,
    JobMode.MESH_OVER_HOSTS: MeshOverHosts,
    JobMode.FLEET: FleetMode,
}
