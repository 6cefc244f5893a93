"""The hosts a job runs on, behind one small protocol: a job (``job/run.py``) asks them the
same questions whatever its mode, and each mode answers in its own way.

* :class:`OneHost`: the job's chips are this host's; nothing to agree with anyone.
* :class:`C10dHosts`: c10d agents (``--nnodes``, ``--hosts``, Slurm), one ttmesh per host,
  each with its own chips: every host agrees before each start, checks and recovers its chips
  together with the others after a failure, and hears how the others' attempts ended
  (``launcher.nodes.multihost.Peers``, through the rendezvous store).
* :class:`MeshOverHosts`: one tt-metal mesh over several hosts under one mpirun: this ttmesh
  plans and supervises every rank, and each host's duties (leases, pre-flight) run on that
  host in the rank's own ttmesh (``ttmesh _rank``); before the start and after a failure every
  host checks and recovers its chips of the job (``launcher.nodes.hostrecovery``).

The questions, in the order a job asks them: :meth:`HostSet.before_start` (the checks before
the first start, said in one refusal), :meth:`~HostSet.watch` and :meth:`~HostSet.started`
(an attempt begins), :meth:`~HostSet.refused` (a rank refused on its own host),
:meth:`~HostSet.ended` (the attempt's end as every host saw it), :meth:`~HostSet.recover`
(after a failure), :meth:`~HostSet.agree` (before a restart) and :meth:`~HostSet.close`."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from ttmesh.errors import TTMeshError, refused
from ttmesh.launcher.job.repair import (
    Recovery,
    after_crash,
    rank_refused,
    recover_hosts,
    recover_with_peers,
)
from ttmesh.states import JobPhase

if TYPE_CHECKING:
    from ttmesh.launcher.attempt.events import Observer
    from ttmesh.launcher.attempt.record import AttemptResult
    from ttmesh.launcher.job.jobstate import JobState
    from ttmesh.launcher.nodes.multihost import Peers
    from ttmesh.launcher.planning.prepare import Prepared

Check = Callable[[], None]  # raises a TTMeshError to refuse


class HostSet(Protocol):
    """What a job asks of the hosts it runs on."""

    def leases_here(self) -> bool:
        """Whether this ttmesh leases the job's chips and runs pre-flight on them itself."""
        ...

    def before_start(self, preflight: Check | None, metal: Check) -> None:
        """Every check before the first start (``preflight``: this host's, None when it has
        none to run; ``metal``: tt-metal's verdict on the ranks' files); raises to refuse."""
        ...

    def agree(self, name: str, check: Check) -> None:
        """Run this host's ``check`` before a restart; every host must pass it."""
        ...

    def watch(self, attempt: int) -> None:
        """An attempt is about to start."""
        ...

    def started(self, pid: int) -> None:
        """The attempt's guardian was forked."""
        ...

    def refused(self, result: AttemptResult) -> str | None:
        """A rank refused on its own host before its command ran: why (its hosts recovered
        first), else None."""
        ...

    def ended(self, attempt: int, result: AttemptResult) -> AttemptResult:
        """The attempt's end as the job's hosts saw it."""
        ...

    def recover(self, result: AttemptResult, always: bool, name: str) -> str | None:
        """After an attempt that failed: the chips checked and recovered where needed; what
        is still wrong (no restart then), else None."""
        ...

    def close(self, attempts: int) -> None:
        """The job ends here after ``attempts`` attempts (0: before its first)."""
        ...


class OneHost:
    """The job's chips are this host's."""

    def __init__(
        self,
        prepared: Prepared,
        state: JobState,
        recovery: Recovery,
        observer: Observer | None,
    ) -> None:
        self.prepared = prepared
        self.state = state  # the job's own (its chips now, its resets)
        self.recovery = recovery
        self.observer = observer

    def leases_here(self) -> bool:
        return True

    def before_start(self, preflight: Check | None, metal: Check) -> None:
        if preflight is None:  # a server that drives no chip: nothing to check
            return
        preflight()
        metal()

    def agree(self, name: str, check: Check) -> None:
        check()

    def watch(self, attempt: int) -> None:
        pass

    def started(self, pid: int) -> None:
        pass

    def refused(self, result: AttemptResult) -> str | None:
        return None

    def ended(self, attempt: int, result: AttemptResult) -> AttemptResult:
        return result

    def recover(self, result: AttemptResult, always: bool, name: str) -> str | None:
        return after_crash(
            self.prepared, self.state, self.recovery, result, always=always,
            observer=self.observer, name=name,
        )  # fmt: skip

    def close(self, attempts: int) -> None:
        pass


class C10dHosts(OneHost):
    """c10d agents: one ttmesh per host, meeting in the rendezvous store (``peers``)."""

    def __init__(
        self,
        prepared: Prepared,
        state: JobState,
        recovery: Recovery,
        observer: Observer | None,
        peers: Peers,
    ) -> None:
        super().__init__(prepared, state, recovery, observer)
        self.peers = peers

    def before_start(self, preflight: Check | None, metal: Check) -> None:
        # With --auto-reset every host checks its chips and cable ends and they reset together
        # what needs it (a host's pre-flight alone would reset its cables' ends without their
        # far ends); one that stays wrong refuses the start on every host.
        if self.recovery.auto_reset and preflight is not None:
            if self.observer is not None:
                self.observer.phase(JobPhase.CHECKING, "checking the chips with every host")
            left = recover_with_peers(
                self.prepared, self.state, self.recovery, self.peers, "recover-start"
            )
            if left is not None:
                raise refused(
                    f"pre-flight: {left}",
                    "see ttmesh check on each host, then reset them together; nothing started "
                    "anywhere",
                )
        self.agree("start", preflight or (lambda: None))
        metal()

    def agree(self, name: str, check: Check) -> None:
        try:
            check()
        except TTMeshError as exc:
            self.peers.agree(name, str(exc))
            raise
        self.peers.agree(name, None)

    def watch(self, attempt: int) -> None:
        self.peers.watch(attempt)

    def started(self, pid: int) -> None:
        self.peers.started(pid)

    def ended(self, attempt: int, result: AttemptResult) -> AttemptResult:
        return self.peers.ended(attempt, result)

    def recover(self, result: AttemptResult, always: bool, name: str) -> str | None:
        return after_crash(
            self.prepared, self.state, self.recovery, result, always=always,
            observer=self.observer, peers=self.peers, name=name,
        )  # fmt: skip

    def close(self, attempts: int) -> None:
        if attempts:
            self.peers.close(attempts - 1)
        else:  # stopped before this host's first attempt: no end to wait for
            self.peers.coord.close()


class MeshOverHosts(OneHost):
    """One tt-metal mesh over several hosts under one mpirun, planned and supervised here."""

    def leases_here(self) -> bool:
        return False  # each host's, in the rank's own ttmesh there

    def before_start(self, preflight: Check | None, metal: Check) -> None:
        # Links down between the job's chips on a host (its report says so) refuse the start
        # in one line naming the host; with --auto-reset every host checks its chips of the job
        # and resets them where needed, and a host whose chips stay wrong refuses.
        if not self.recovery.auto_reset:
            if self.prepared.hosts_not_ready:
                name, what, fix = self.prepared.hosts_not_ready[0]
                raise refused(
                    f"host {name} is not ready: pre-flight: {what}",
                    f"on {name}: {fix}, or add --auto-reset to recover the chips first; "
                    "nothing started anywhere",
                )
            return
        if self.observer is not None:
            self.observer.phase(JobPhase.CHECKING, "checking the chips on every host")
        left = recover_hosts(self.prepared, self.recovery, always=False, before_start=True)
        if left is not None:
            raise refused(
                f"pre-flight: {left}",
                "see ttmesh check --hosts, then ttmesh reset --hosts; nothing started anywhere",
            )

    def refused(self, result: AttemptResult) -> str | None:
        # A rank's ttmesh stopped before its command ran (pre-flight there, a lease, the wrong
        # host): a refusal, as on one host. Ranks that had started on the other hosts were
        # stopped: their hosts check (and recover) their chips first.
        why = rank_refused(result)
        if why is not None:
            recover_hosts(self.prepared, self.recovery, always=False)
        return why


def of(
    prepared: Prepared,
    state: JobState,
    recovery: Recovery,
    observer: Observer | None,
    peers: Peers | None,
) -> HostSet:
    """The hosts of the job ``prepared`` plans (``state``: the job's own, as it runs): c10d
    ``peers``, a mesh over the plan's hosts, or this host alone."""
    if peers is not None:
        return C10dHosts(prepared, state, recovery, observer, peers)
    if prepared.plan.hosts:
        return MeshOverHosts(prepared, state, recovery, observer)
    return OneHost(prepared, state, recovery, observer)
