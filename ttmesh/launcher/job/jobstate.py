"""What a job learns and does as it runs, beside the frozen values it was given.

Planning hands the job frozen values (``Prepared``: the plan and the inventory it was made
from; ``job.repair.Recovery``: what to do about the chips). What changes while the job runs is
kept here, in one place the job owns: the chips as a reset renumbered them, the resets run,
the reset a fleet's replica leaves to its fleet, whether the system warnings were said, and the
two things planning started that the job takes once (the heartbeats still being read,
tt-metal's pending verdict).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:
    from ttmesh.fabric.devices import Inventory
    from ttmesh.launcher.planning.liveness import Liveness
    from ttmesh.launcher.planning.metalcheck import Pending
    from ttmesh.launcher.planning.prepare import Prepared


class ResetEntry(TypedDict):
    """One reset the job ran, as its record and ``--summary-json`` keep it."""

    at: float  # when it began (Unix time)
    when: str  # "before the start" or "after an attempt"
    why: str | None
    chips: list[str]  # each by its PCI address (a chip without one: its ASIC id)
    recovered: bool  # verified healthy after it
    seconds: float | None  # how long it took (None: refused)
    refused: str | None  # why it did not run


class Deferred(TypedDict):
    """What a fleet's replica leaves its fleet to do (its ``--summary-json``'s ``needs``)."""

    what: str  # launcher.job.repair.WHOLE_HOST_RESET
    fleet: str | None
    chips: list[str]  # the PCI addresses that reach the chips needing it
    why: str | None


class JobState:
    """One job's changing state (one per job: a restart keeps it)."""

    def __init__(
        self, inv: Inventory, liveness: Liveness | None = None, metal: Pending | None = None
    ) -> None:
        # The host's chips now: the plan's inventory until a reset renumbers the devices.
        self.inv = inv
        # The chips' heartbeats still being read as the workers start (planning.liveness):
        # pre-flight reads the others meanwhile; the first attempt (or a refusal) takes them.
        self.liveness = liveness
        # tt-metal's verdict on the ranks' files, asked while planning went on: waited for
        # once before the start, closed if the job ends before that.
        self.metal = metal
        self.warned = False  # pre-flight's system warnings said: a restart's says them no more
        # Every reset the job ran (before a start, after a crash): when, why, verified or not,
        # how long; for the job's record and --summary-json.
        self.resets: list[ResetEntry] = []
        # A fleet's replica on a host whose reset is the whole host: what it needs of its fleet
        # (its --summary-json's "needs"), once a reset was wanted.
        self.deferred: Deferred | None = None

    @classmethod
    def of(cls, prepared: Prepared) -> JobState:
        """The state a job starts from: the prepared launch's inventory and hand-offs."""
        return cls(prepared.inv, prepared.liveness, prepared.metal)

    def take_liveness(self) -> Liveness | None:
        """The heartbeats still being read, handed on once (None after)."""
        liveness, self.liveness = self.liveness, None
        return liveness

    def take_metal(self) -> Pending | None:
        """tt-metal's pending verdict, handed on once (None after)."""
        metal, self.metal = self.metal, None
        return metal
