"""A fleet's recovery where one reset is the whole host (a Galaxy's ``tt-smi -glx_reset``): the
decisions, pure, so they are tested in-process; ``fleet.run`` carries them out.

Each replica's job recovers its own chips where the host's reset domains allow it
(``per-replica``). On a Galaxy every reset takes every chip, so a replica's job never resets by
itself (``launcher.job.repair.defers_reset``): it ends and says in its ``--summary-json`` that
it needs the whole-host reset (``"needs": {"what": "whole-host-reset", ...}``). The fleet then
drains every replica, resets the host once and restarts them all (``drain-all``).

Counting: the replica (or replicas) whose chips needed the reset counts a restart under its
``--max-restarts``; one over it ends the fleet with its code (it cannot serve again without
another host-wide drain, so the fleet stops whole rather than drain the others for nothing).
The replicas that were drained only because they share the host did not fail: their restart
is counted as a drain (``drains``), never against their ``--max-restarts``.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence
from typing import Any

from ttmesh.dataclass import dataclass
from ttmesh.launcher.job.repair import WHOLE_HOST_RESET

DRAIN_ALL = "drain-all"  # one reset is the whole host: all drained, one reset, all restarted
PER_REPLICA = "per-replica"  # each replica's job resets its own chips, the others serving
STOPPED_CODE = 128 + signal.SIGTERM  # how a replica's job the fleet stopped (a drain) ends


def recovery_mode(whole_host_reset: bool) -> str:
    """How the fleet recovers a replica whose chips need a reset (the plan's ``recovery``)."""
    return DRAIN_ALL if whole_host_reset else PER_REPLICA


def needs_whole_host(outcome: Any, stopped: bool = False) -> dict[str, Any] | None:
    """What a replica's ``--summary-json`` (as read: anything) asks of its fleet, when it is
    the whole-host reset; else None. The file is the fleet's own (in its private directory),
    written by its child; anything malformed asks for nothing. ``stopped``: the fleet stopped
    that job (a drain, SIGTERM): it asks only when it had failed by itself first (its code is
    then its own, not 143), not for the links its stop left down, which the reset under way
    covers anyway."""
    if not isinstance(outcome, dict):
        return None
    if stopped and outcome.get("code") == STOPPED_CODE:
        return None
    needs = outcome.get("needs")
    if isinstance(needs, dict) and needs.get("what") == WHOLE_HOST_RESET:
        return needs
    return None


@dataclass(frozen=True)
class Restarts:
    """What a drain-all does with the replicas' restart counts."""

    over: int | None  # a replica whose chips needed the reset and has no restart left
    restarts: list[int]  # every replica's count after this recovery
    budgets: list[int]  # every replica's --max-restarts for its next job (what is left)


def after_drain(restarts: Sequence[int], failed: Sequence[int], max_restarts: int) -> Restarts:
    """``restarts``: each replica's restarts so far (its jobs' own included); ``failed``: the
    replicas whose chips needed the whole-host reset. Each of those counts one restart; the
    first over ``max_restarts`` is ``over`` (the fleet ends with its code)."""
    counts = [n + (1 if k in failed else 0) for k, n in enumerate(restarts)]
    over = next((k for k in sorted(failed) if counts[k] > max_restarts), None)
    budgets = [max(0, max_restarts - n) for n in counts]
    return Restarts(over, counts, budgets)
