"""Whether an attempt's ranks are ready: ready files, a ready pattern, a server's health.

A rank is ready when it creates its TTMESH_READY_FILE, prints a line matching
--ready-pattern, or (a server, rank 0) answers its health check. With --ready-timeout, ranks
still not ready when it runs out mean a job hung in bring-up (:data:`HUNG`, restartable); a
server that fails its health checks afterwards is stopped too (restartable). Without a
timeout, ready files are still watched, for the live view only. With --hang-timeout, a job
whose ranks printed nothing for that long is hung too (:meth:`Readiness.silent`).
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from ttmesh.launcher.attempt.record import HUNG
from ttmesh.launcher.attempt.signals import Stop
from ttmesh.launcher.planning.plan import LaunchPlan
from ttmesh.patterns import compile_pattern
from ttmesh.render import clock, noun
from ttmesh.states import AttemptEnd, GuardianPhase, JobPhase

if TYPE_CHECKING:
    from ttmesh.launcher.serving.server import Server


class Readiness:
    """Which ranks of a plan are ready, and what a server's health says."""

    def __init__(self, plan: LaunchPlan, started: float) -> None:
        self.plan = plan
        self.started = started  # monotonic: the ready timeout counts from here
        self.ready: set[int] = set()
        # RE2, linear in the line: a pattern that backtracks must not make the guardian deaf.
        self.pattern = (
            compile_pattern(plan.policy.ready_pattern) if plan.policy.ready_pattern else None
        )
        self.server: Server | None = None
        self.checklist_lines = True  # a finished step of a server's start is one line (a pipe)
        if plan.serving is not None:  # a server's readiness and health (HTTP): only for one
            from ttmesh.launcher.serving.server import Server

            self.server = Server(plan.serving)

    @property
    def watched(self) -> bool:
        """Something tells readiness (else a rank that started is simply running)."""
        return (
            self.plan.policy.ready_timeout is not None
            or self.pattern is not None
            or self.server is not None
        )

    def on_line(self, rank: int, line: str) -> None:
        """A line of a rank's output: it may say the rank is ready."""
        if (
            rank >= 0
            and self.pattern is not None
            and rank not in self.ready
            and self.pattern.search(line)
        ):
            self.ready.add(rank)  # once ready, a rank's lines need no matching

    def files(self, running: set[int]) -> None:
        """Ranks still running that created their ready file are ready."""
        for rp in self.plan.ranks:
            if (
                rp.rank not in self.ready
                and rp.rank in running
                and os.path.exists(rp.env["TTMESH_READY_FILE"])
            ):
                self.ready.add(rp.rank)

    def overdue(self, running: set[int], now: float | None = None) -> tuple[str, Stop] | None:
        """With --ready-timeout: the ranks' files read; when some running ranks are still not
        ready after it, the line to say and the attempt's stop (hung in bring-up)."""
        timeout = self.plan.policy.ready_timeout
        if timeout is None:
            return None
        for rank in self.plan.ranks:
            if rank.rank not in self.ready and os.path.exists(rank.env["TTMESH_READY_FILE"]):
                self.ready.add(rank.rank)
        waiting = sorted(running - self.ready)
        if not waiting or (time.monotonic() if now is None else now) < self.started + timeout:
            return None
        names = f"{noun(len(waiting), 'rank')} {', '.join(map(str, waiting))}"
        after = f"{timeout:g} s"
        why = self.server.not_ready() if self.server is not None else ""
        stuck = self.server.stuck(time.monotonic() if now is None else now) if self.server else ""
        why = (
            f"stuck in {stuck}; {why}" if stuck and why else (f"stuck in {stuck}" if stuck else why)
        )
        after += f" ({why})" if why else ""
        line = f"{names} not ready after {after}: treating the job as hung in bring-up"
        return line, Stop(
            f"hung in bring-up: {names} not ready after {after}", HUNG, AttemptEnd.HUNG
        )

    def silent(
        self, running: set[int], heard: float, now: float | None = None
    ) -> tuple[str, Stop] | None:
        """With --hang-timeout: when no rank has printed anything since ``heard`` (monotonic,
        the last output of any rank, or the start) for that long, the line to say and the
        attempt's stop (hung)."""
        timeout = self.plan.policy.hang_timeout
        if timeout is None or not running:
            return None
        if (time.monotonic() if now is None else now) < heard + timeout:
            return None
        line = f"no output from any rank for {timeout:g} s: treating the job as hung"
        return line, Stop(f"hung: no output from any rank for {timeout:g} s", HUNG, AttemptEnd.HUNG)

    def progress(self) -> str:
        """A server not ready yet: a line saying how its start goes, now and then ("" if not)."""
        if self.server is None or 0 in self.ready:
            return ""
        return self.server.progress(time.monotonic() - self.started) or ""

    def server_events(self, stopping: bool) -> list[tuple[str, Stop | None]]:
        """What the server said (ready, listening, unhealthy): a line each, and the stop an
        unhealthy server brings when the attempt is not ``stopping`` already."""
        server = self.server
        assert server is not None
        said: list[tuple[str, Stop | None]] = []
        for event in server.events():
            if event.kind == "listening":
                said.append(
                    (f"{server.name}: listening ({event.detail}), {server.phase(True)}", None)
                )
            elif event.kind == "foreign":  # not the server: it is not ready, waits on
                said.append(
                    (f"{server.name}: {event.detail}: not ready until the server answers", None)
                )
            elif event.kind == "ready":
                self.ready.add(0)
                took = event.at - self.started
                for row in server.became_ready(event.at):  # the step it was in: done
                    if self.checklist_lines:
                        said.append((f"{server.name}: {server.checklist.said(row)}", None))
                said.append(
                    (f"{server.name}: ready after {clock(took)} at {server.spec.url}", None)
                )
                said.append((f"try: {server.spec.curl()}", None))
            elif event.kind == "hung" and not stopping:
                stop = Stop(f"hung: {event.detail}", HUNG, AttemptEnd.HUNG)
                said.append((f"{server.name}: {event.detail}, though it may still answer "
                             "/health: it is hung: dumping its stacks, then stopping it", stop))  # fmt: skip
                stopping = True
            elif not stopping:
                stop = Stop(f"{event.kind}: {event.detail}", 1, AttemptEnd.FAILED)
                said.append((f"{server.name}: {event.detail}: stopping it", stop))
                stopping = True
        return said

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


def job_phase(
    phase: GuardianPhase,
    stopping: bool,
    running: set[int],
    ready: set[int],
    started: set[int],
    watched: bool,
) -> JobPhase | None:
    """The attempt's phase as a person sees it, from the guardian's (None: no change worth
    saying). ``stopping``: a stop or a failure is under way; ``started``: the ranks whose PID
    is known; ``watched``: something tells readiness."""
    if stopping:
        return JobPhase.STOPPING
    if phase is GuardianPhase.STARTING:
        return JobPhase.STARTING
    if phase is not GuardianPhase.RUNNING or not running:
        return None  # every rank ended by itself: the front says how the job ended
    if running <= ready:
        return JobPhase.READY
    if watched or not running <= started:
        return JobPhase.STARTING
    return JobPhase.RUNNING
