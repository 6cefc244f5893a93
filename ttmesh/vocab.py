"""The words every layer shares: the states and kinds ttmesh reports, as string enums.

Each member is its own JSON value (``StrEnum``), so documents and messages stay exactly as they
were when these were bare strings. See docs/launch.md for what each state means.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from ttmesh.dataclass import dataclass


class Layout(StrEnum):
    """How a selected mesh is split over processes (``--mesh-layout``)."""

    ISOLATED = "isolated"  # each worker its own unit and one-unit mesh
    SINGLE_PROCESS = "single-process"  # one worker drives every chip
    MESH = "mesh"  # one mesh split over the workers (one tt-metal world: MPI)
    MULTI_MESH = "multi-mesh"  # one mesh per worker in a FABRIC graph (one world: MPI)
    RANK_BINDING = "rank-binding"  # the ranks a tt-run rank-binding file gives (not a choice)

    @property
    def one_world(self) -> bool:
        """The workers form one tt-metal world, which only an MPI launcher can start."""
        return self in (Layout.MESH, Layout.MULTI_MESH)


LAYOUTS = tuple(str(layout) for layout in Layout if layout != Layout.RANK_BINDING)
MPI_LAYOUTS = tuple(str(layout) for layout in Layout if layout.one_world)


class StartMode(StrEnum):
    """How a job's ranks start (``--launcher``)."""

    DIRECT = "direct"  # one process per rank, spawned by the guardian
    MPI = "mpi"  # one MPMD mpirun command for every rank


class JobMode(StrEnum):
    """Where a launch's job runs, decided once from the flags (``launcher.planning.options``):
    each mode is started its own way, and a mix of flags no mode takes is refused there."""

    ONE_HOST = "one-host"  # this host's chips (the default)
    C10D = "c10d"  # one agent per host, joined through the rendezvous (--nnodes, Slurm)
    HOSTS = "hosts"  # --hosts: mpirun starts one agent (a c10d launch) per host
    MESH_OVER_HOSTS = "mesh-over-hosts"  # --hosts with a tt-metal world: one MPMD mpirun
    FLEET = "fleet"  # --replicas N > 1: N servers on their own chips behind SGLang's router


class Heartbeat(StrEnum):
    ALIVE = "alive"  # the counter moved
    FROZEN = "frozen"  # it did not within the poll
    UNKNOWN = "unknown"  # it cannot be read


class LinkState(StrEnum):
    UP = "up"
    DOWN = "down"
    UNKNOWN = "unknown"  # the firmware cannot tell


class Severity(StrEnum):
    ERROR = "error"
    WARNING = "warning"


class Source(StrEnum):
    """Who decided a job's exit code (``--summary-json``)."""

    WORKER = "worker"
    TTMESH = "ttmesh"


class Role(StrEnum):
    """How a process stands to a chip."""

    HOLDER = "holder"  # it has the chip's device open
    LEASE = "lease"  # a ttmesh job leases the chip (this is the lease's holder, verified)
    LOCK = "lock"  # a process holds the chip's lease file locked, and it is no ttmesh lease
    WORKER = "job"  # a worker of a ttmesh job holds it
    UNKNOWN = "unknown"  # the holders can't be seen (permissions)


@dataclass(frozen=True)
class ChipProcess:
    """A process on a chip: a holder of its device, the holder of its lease, or a blocker."""

    pid: int | None
    user: str = "?"
    cmd: str = "?"
    start: int | None = None  # clock ticks since boot: check it before signalling the PID
    job: str | None = None  # the ttmesh job it belongs to
    asic: str = ""
    role: Role = Role.HOLDER
    symmetric_dram_mb: int | None = None  # what a lease's job reserved per chip
    uid: int | None = None  # the user it runs as (a lease: the user whose job it is)
    verified: bool = False  # a lease whose record, file owner and live holder agree
    related: tuple[int, ...] = ()  # a lease: every process of its job that holds it
    # a lease: the chips its job's mesh reaches over Ethernet from this chip (None: the record
    # does not say, so every link of the chip counts as used)
    uses: tuple[str, ...] | None = None

    @property
    def who(self) -> str:
        return f"pid {self.pid} ({self.user}: {self.cmd})"

    @property
    def holder(self) -> str:
        """Who holds a lease (LEASE) or the lock on a lease file (LOCK), for messages."""
        if self.role == Role.LEASE:
            return f"job {self.job} of user {self.user} (pid {self.pid}: {self.cmd})"
        if self.pid:
            return f"locked by pid {self.pid} ({self.user}: {self.cmd}), not a ttmesh lease"
        return "locked by a process ttmesh cannot see, not a ttmesh lease"

    def lease_json(self) -> dict[str, Any]:
        """The ``lease`` of a chip in ``ttmesh.ls/1`` and ``ttmesh.top/1``."""
        return {
            "job": self.job if self.verified else None,
            "pid": self.pid,
            "user": self.user if self.user != "?" else None,
            "uid": self.uid,
            "verified": self.verified,
        }

    def to_json(self, with_job: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {"pid": self.pid, "user": self.user, "cmd": self.cmd}
        if with_job:
            out["job"] = self.job
        return out

    def describe(self, name: str) -> str:
        """One line naming the process and how it stands to chip ``name``."""
        if self.role == Role.LEASE:
            return f"{name} is leased by {self.holder}"
        if self.role == Role.LOCK:
            return f"{name} is {self.holder}"
        if self.role == Role.WORKER:
            return f"{name} is held by {self.who}, a worker of ttmesh job {self.job}"
        if self.role == Role.UNKNOWN:
            return f"cannot tell which processes hold {name} (permissions)"
        return f"{name} is held by {self.who}"


# The pseudo-rank of an external launcher's own output (mpirun's lines, beside the ranks').
LAUNCHER = -1
