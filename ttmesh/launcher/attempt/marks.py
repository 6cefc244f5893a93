"""What the host hears of an attempt: which workers hold which chips, and fabric marks.

A worker that brought its chips' fabric up leaves them, if it ends abnormally, with links
that may be down: the host keeps a mark (opened, then ended clean or not) that recovery and
``ttmesh ls`` read, and the attempt's result names the ranks that brought the fabric up
(AttemptResult.fabric_ranks), which decides whether the chips are checked after a crash.
"""

from __future__ import annotations

import os

from ttmesh.host.base import Host
from ttmesh.launcher.attempt.starters import RankExit, Starter
from ttmesh.launcher.planning.plan import LaunchPlan, RankPlan
from ttmesh.vocab import Layout


class FabricMarks:
    """The host's marks for one attempt's workers, and the ranks that brought the fabric up."""

    def __init__(self, plan: LaunchPlan, host: Host, guardian: int) -> None:
        self.plan = plan
        self.host = host
        self.guardian = guardian  # the marks' supervisor: its PID
        self.fabric: set[int] = set()  # ranks that brought the fabric up
        self.registered = False  # the host heard which workers hold which chips

    def register(self, starter: Starter, running: set[int]) -> bool:
        """Once every rank's PID is known: the workers hold their chips; a layout that joins
        chips has brought their fabric up (one mark per worker, over every chip of the job
        when the workers form one tt-metal world). True when it is done by this call."""
        if self.registered or not running:
            return False
        starter.discover()
        if not starter.known():
            return False  # not all ranks started yet (MPI): try again on the next step
        self.registered = True
        pids = starter.pids
        mine = [r for r in self.plan.ranks if r.rank in pids and r.chips]  # a chipless server: none
        self.host.workers_started([(list(r.chips), pids[r.rank]) for r in mine])
        world = Layout(self.plan.layout).one_world
        joined = [r for r in mine if world or r.joins_chips]
        marks = [(self.plan.all_chips() if world else list(r.chips), pids[r.rank]) for r in joined]
        self.host.fabric_opened(marks, owner=self.plan.job, supervisor=self.guardian)
        self.fabric.update(r.rank for r in joined)
        return True

    def check(self, rank: RankPlan, pids: dict[int, int]) -> None:
        """A rank that created its TTMESH_FABRIC_FILE brought the fabric up."""
        pid = pids.get(rank.rank)
        if rank.rank in self.fabric or pid is None or not rank.chips:
            return  # a rank with no chip (a chipless server) opens no fabric
        if os.path.exists(rank.env["TTMESH_FABRIC_FILE"]):
            self.fabric.add(rank.rank)
            self.host.fabric_opened(
                [(self.plan.all_chips(), pid)], owner=self.plan.job, supervisor=self.guardian
            )

    def poll(self, running: set[int], pids: dict[int, int]) -> None:
        for rank in self.plan.ranks:
            if rank.rank in running:
                self.check(rank, pids)

    def ended(self, ended: RankExit, pids: dict[int, int]) -> None:
        """A rank ended: its fabric file is read one last time; its mark ends, clean or not."""
        self.check(self.plan.ranks[ended.rank], pids)
        if ended.rank in self.fabric and ended.pid > 0:
            self.host.worker_ended(ended.pid, clean=ended.code == 0)
