"""Every state ttmesh moves things through, in one place, each with the moves it allows.

A state here is a word people read (in output, the live view, JSON), so each enum's values are
the words themselves: changing one changes what users and scripts see. Each machine is an enum
and a table of the moves it allows (``*_MOVES``), and every move ttmesh makes goes through one
door, :func:`move`, which raises :class:`IllegalTransition` (a bug in ttmesh, never a user's
error) for a move the table does not allow, as supervisord's ``states.py`` and
``Subprocess.change_state`` do. A thing that holds its state holds a :class:`Machine` (the
guardian, the attempt's view); a frozen value that is replaced at each move (a chip's
progress in a reset) passes its old and new state through :func:`move` itself.

The other enums here are words, not machines: read afresh or decided once.

This module imports nothing of ttmesh (the bottom layer): every layer may use it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from enum import StrEnum
from typing import Generic, TypeVar


class IllegalTransition(RuntimeError):
    """A move its machine's table does not allow: a bug in ttmesh, not a user's error."""


S = TypeVar("S", bound=StrEnum)


def move(allowed: Mapping[S, frozenset[S]], name: str, old: S, new: S) -> S:
    """The door of every machine: ``new``, when ``allowed`` (each state -> the states it may
    move to; a state missing from the table moves nowhere) lets ``old`` move there;
    :class:`IllegalTransition`, naming the machine ``name``, when it does not."""
    if type(new) is not type(old):  # a StrEnum equals its word: "done" is every machine's DONE
        raise IllegalTransition(f"{name}: {new!r} is not one of its states")
    if new not in allowed.get(old, frozenset()):
        raise IllegalTransition(f"{name}: {old.name} -> {new.name} is not a move it makes")
    return new


class Machine(Generic[S]):
    """One state, changed only through :meth:`change_state` (:func:`move`'s check of the
    previous one). ``on_change(old, new)`` hears every move, once it is made."""

    def __init__(
        self,
        initial: S,
        allowed: Mapping[S, frozenset[S]],
        name: str,
        on_change: Callable[[S, S], None] | None = None,
    ) -> None:
        self._state = initial
        self.allowed = allowed
        self.name = name
        self.on_change = on_change

    @property
    def state(self) -> S:
        return self._state

    def change_state(self, new: S) -> None:
        """Move to ``new``; :class:`IllegalTransition` if the present state does not allow it."""
        old = self._state
        self._state = move(self.allowed, self.name, old, new)
        if self.on_change is not None:
            self.on_change(old, new)

    def __repr__(self) -> str:
        return f"Machine({self.name}: {self._state.name})"


# --------------------------------------------------------------------------- the guardian


class GuardianPhase(StrEnum):
    """The guardian's loop over one attempt (ttmesh.launcher.attempt.guardian)."""

    STARTING = "starting"  # the starter is starting the ranks
    RUNNING = "running"  # ranks run: exits, signals and readiness are watched
    STOPPING = "stopping"  # SIGTERM sent; SIGKILL when the grace ends
    DRAINING = "draining"  # no rank left: sweep every descendant, read the last output
    DONE = "done"


GUARDIAN_MOVES: dict[GuardianPhase, frozenset[GuardianPhase]] = {
    GuardianPhase.STARTING: frozenset({GuardianPhase.RUNNING}),
    # the first failure, a stop signal, a hang; or the last rank ended by itself
    GuardianPhase.RUNNING: frozenset({GuardianPhase.STOPPING, GuardianPhase.DRAINING}),
    GuardianPhase.STOPPING: frozenset({GuardianPhase.DRAINING}),  # the last rank ended
    GuardianPhase.DRAINING: frozenset({GuardianPhase.DONE}),  # nothing left, output read
    GuardianPhase.DONE: frozenset(),
}


# --------------------------------------------------------------------------- the job, as seen


class JobPhase(StrEnum):
    """The job's phase as a person sees it (the live view: ttmesh.launcher.attempt.events)."""

    CHECKING = "checking fabric"  # pre-flight: heartbeats, links, holders
    RESETTING = "resetting"  # --auto-reset: tt-smi -r, then verify
    STARTING = "starting"  # the ranks are starting (or not all ready yet)
    READY = "ready"  # every rank said it is ready (ready file, --ready-pattern, a server's health)
    RUNNING = "running"  # every rank started (nothing tells readiness)
    STOPPING = "stopping"  # SIGTERM sent (a failure, a signal, a hang); the tree is swept
    RECOVERING = "recovering"  # after an abnormal end: the job's chips checked, reset if needed
    RESTARTING = "restarting"  # waiting before the next attempt (--max-restarts)
    DONE = "done"  # the job ended; the detail says how


# What one attempt's guardian shows, from STARTING (ttmesh.launcher.attempt.view): readiness
# only grows, and a stop is the last phase it shows (STOPPING to STOPPING: the drain's detail
# changes). The phases around attempts (CHECKING, RESETTING, RECOVERING, RESTARTING, DONE) are
# words the front says as the job goes (pre-flight, recovery, a restart's wait), no machine.
ATTEMPT_MOVES: dict[JobPhase, frozenset[JobPhase]] = {
    JobPhase.STARTING: frozenset({JobPhase.RUNNING, JobPhase.READY, JobPhase.STOPPING}),
    JobPhase.RUNNING: frozenset({JobPhase.READY, JobPhase.STOPPING}),
    JobPhase.READY: frozenset({JobPhase.STOPPING}),
    JobPhase.STOPPING: frozenset({JobPhase.STOPPING}),
}


# --------------------------------------------------------------------------- an attempt's end


class AttemptEnd(StrEnum):
    """How one attempt ended (AttemptResult.end; its error says more where one is due), and
    so how a stop ttmesh makes ends it (attempt.signals.Stop.end). A word, not a machine: an
    attempt ends once."""

    COMPLETED = "completed"  # every rank succeeded
    FAILED = "failed"  # a rank (or the launcher, or a server's health) failed: restartable
    HUNG = "hung"  # no failure, but not ready in time: restartable
    STOPPED = "stopped"  # ttmesh stopped it for good: the user's signal, another host, no restart
    LAUNCHER_FAILED = "launcher failed"  # mpirun could not start the ranks: no restart
    REFUSED = "refused"  # a check still running at the start refused the job (a frozen chip)
    UNSTARTED = "unstarted"  # a rank's program never ran (not found, not executable)
    GUARDIAN_LOST = (
        "guardian lost"  # the guardian itself was killed: how the ranks ended is unknown
    )
    # Another tool announced a reset of the job's chips (tt-umd's notice): the ranks were
    # stopped for it; that tool resets the chips, so ttmesh neither recovers nor restarts.
    RESET_ELSEWHERE = "reset by another tool"

    @property
    def restartable(self) -> bool:
        """A restart (--max-restarts) may help."""
        return self in (AttemptEnd.FAILED, AttemptEnd.HUNG)

    @property
    def interrupted(self) -> bool:
        """Ended for good before the job could end by itself (the user, a refusal, a program
        that never ran, mpirun): no restart, and each host of a job says its own."""
        return self in (
            AttemptEnd.STOPPED,
            AttemptEnd.RESET_ELSEWHERE,
            AttemptEnd.LAUNCHER_FAILED,
            AttemptEnd.REFUSED,
            AttemptEnd.UNSTARTED,
        )


# --------------------------------------------------------------------------- a chip's reset


class ResetStage(StrEnum):
    """Where each chip of a reset is, as it goes (ttmesh.recovery.reset.ChipProgress.stage,
    moved as RESET_MOVES allows)."""

    QUEUED = "queued"
    STOPPING = "stopping holders"
    RESETTING = "resetting"  # tt-smi runs
    WAIT_PCI = "waiting for PCI"  # the driver does not list the chip's device (yet)
    WAIT_HEARTBEAT = "waiting for heartbeat"  # back, but its firmware heartbeat does not move
    WAIT_LINKS = "waiting for links"  # alive, but Ethernet links of the set are down
    RETRYING = "retrying"  # the attempt did not recover the set; another follows
    DONE = "done"  # verified (or, heartbeat unknown, as far as can be told)
    FAILED = "failed"  # not recovered when the reset ended


_WAITS = frozenset({ResetStage.WAIT_PCI, ResetStage.WAIT_HEARTBEAT, ResetStage.WAIT_LINKS})
_ENDS = frozenset({ResetStage.DONE, ResetStage.FAILED})
# After tt-smi, each reading of the chips puts each in the stage it waits for, or DONE, until
# the set is verified or the attempt gives up (RETRYING); the next attempt resets every chip
# of the set again (RESETTING), DONE ones included. The reset's end is DONE or FAILED.
_OBSERVED = _WAITS | _ENDS | {ResetStage.RETRYING, ResetStage.RESETTING}
RESET_MOVES: dict[ResetStage, frozenset[ResetStage]] = {
    ResetStage.QUEUED: frozenset({ResetStage.STOPPING, ResetStage.RESETTING}) | _ENDS,
    ResetStage.STOPPING: frozenset({ResetStage.RESETTING}) | _ENDS,
    ResetStage.RESETTING: _OBSERVED,  # RESETTING <-> WAIT_PCI while tt-smi runs
    ResetStage.WAIT_PCI: _OBSERVED,
    ResetStage.WAIT_HEARTBEAT: _OBSERVED,
    ResetStage.WAIT_LINKS: _OBSERVED,
    ResetStage.DONE: _OBSERVED,
    ResetStage.RETRYING: frozenset({ResetStage.RESETTING}) | _ENDS,
    ResetStage.FAILED: frozenset(),
}


class ResetStatus(StrEnum):
    """A chip's status in a reset's report, worst first (ttmesh.recovery.reset)."""

    GONE = "gone"
    FROZEN = "frozen"
    LINKS_DOWN = "links down"
    UNKNOWN = "unknown"
    OK = "ok"
    NOT_RESET = "not reset"  # after: the reset did not run to its end (tt-smi timed out or failed)


# --------------------------------------------------------------------------- a chip, for a job


class ChipUnavailable(StrEnum):
    """Why a chip cannot be given to a job (ttmesh.launcher.planning.choose; the `why` of
    the chips ``ttmesh launch`` and ``ttmesh ls`` name as unavailable). Not a machine: a
    chip's word is read afresh at each launch."""

    LEASED = "leased"  # another ttmesh job's lease
    LOCKED = "locked"  # a process that is no ttmesh job holds its lease file
    HELD = "held"  # a process has the chip's device open
    DEAD = "dead"  # its heartbeat is frozen
    EXCLUDED = "excluded"  # --exclude
