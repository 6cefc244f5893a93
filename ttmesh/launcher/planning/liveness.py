"""The heartbeats of a job's chips, still being read when its workers start (the deferred check)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ttmesh.errors import TTMeshError
from ttmesh.fabric import heartbeat
from ttmesh.launcher.planning.plan import LaunchPlan
from ttmesh.vocab import StartMode

if TYPE_CHECKING:
    pass


def can_start_unverified(plan: LaunchPlan) -> bool:
    """Workers may start before their chips' heartbeats are known when stopping them leaves
    the chips as they were: one process per chip of its own, started directly. A job that
    brings the fabric up at its start (meshes, boards of two chips, a server) would leave the
    links down if stopped for a frozen chip: it waits for the verdict, as every job did."""
    return plan.launcher == StartMode.DIRECT and plan.serving is None and not plan.fabric_at_start


class Liveness:
    """The heartbeats of a job's chips, still being read when its workers start.

    A chip is alive when its heartbeat counter moves: at two ticks a second that takes up to
    half a second, which every launch would otherwise wait before starting anything. Used only
    when the verdict cannot change which chips the job gets, only refuse it: the guardian asks
    :meth:`step` as it supervises (it is the one process that can stop every worker), stops
    the job when a chip is frozen and does not end the attempt before the verdict; the launcher
    then refuses with what it said when it read the heartbeats first (exit 3). Anything else that
    would stop the launch before its start waits for the verdict too (:meth:`first`)."""

    def __init__(
        self, watch: heartbeat.Watch, decide: Callable[[dict[str, str]], TTMeshError | None]
    ) -> None:
        self.watch = watch
        self.decide = decide
        self.decided = False
        self.refusal: TTMeshError | None = None

    def step(self) -> float | None:
        """Read the heartbeats if due; seconds until the next reading, None once decided."""
        wait = self.watch.step()
        if wait is None and not self.decided:
            self.decided = True
            self.refusal = self.decide(self.watch.states)
        return wait

    def wait(self) -> TTMeshError | None:
        """The verdict (waiting for it): the refusal, or None."""
        while (wait := self.step()) is not None:
            time.sleep(wait)
        return self.refusal

    def first(self, exc: TTMeshError) -> TTMeshError:
        """What stops the launch before its start: a frozen chip's refusal if there is one (it
        came first when the heartbeats were read before anything else), else ``exc``."""
        return self.wait() or exc

    def known(self) -> dict[str, str]:
        return self.watch.known()
