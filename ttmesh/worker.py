"""Optional helpers for workers launched by ttmesh. Standard library only, any Python >= 3.8.

Workers need nothing from ttmesh: readiness and fabric state are an environment protocol, and
these functions only wrap it (copy this file into another venv if you like).

* ``ready()`` - create ``TTMESH_READY_FILE``: this rank finished bringing itself up;
* ``fabric_up()`` - create ``TTMESH_FABRIC_FILE``: this rank brought the chips' Ethernet fabric
  up (what a tt-metal or libtt program does on hardware), so a crash now leaves links down;
* ``wait_fabric(timeout)`` - on a simulated host, block while a link between the job's chips is
  down, as a real fabric bring-up hangs; returns True when the links are up, False on timeout.
"""

from __future__ import annotations

import json
import os
import sys
import time

__all__ = ["fabric_up", "ready", "wait_fabric"]


def _touch(var: str) -> bool:
    path = os.environ.get(var)
    if not path:
        return False
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "a"):
        pass
    return True


def ready() -> bool:
    """Tell ttmesh this rank is up. False when not running under ttmesh."""
    return _touch("TTMESH_READY_FILE")


def fabric_up() -> bool:
    """Tell ttmesh this rank brought the fabric up. False when not running under ttmesh."""
    return _touch("TTMESH_FABRIC_FILE")


def _links_down(root: str, chips: list) -> list:
    sys.path.insert(0, os.path.join(root, "bin"))
    try:
        import _ttmesh_simcore as core
    finally:
        sys.path.pop(0)
    sim = core.SimRoot(root)
    state = sim.read_state()
    wanted = set(chips)
    return [
        lk
        for lk in sim.links()
        if lk[0] in wanted and lk[2] in wanted and not sim.link_up(state, lk)
    ]


def _job_chips() -> list:
    record = os.environ.get("TTMESH_JOB_CHIPS")
    return json.loads(record) if record else []


def wait_fabric(timeout: float | None = 60.0, poll: float = 0.05) -> bool:
    """On a simulated host, wait until every link between the job's chips is up."""
    root = os.environ.get("TTMESH_SIM_ROOT")
    chips = _job_chips()
    if not root or not chips:
        return True
    deadline = None if timeout is None else time.monotonic() + timeout
    while _links_down(root, chips):
        if deadline is not None and time.monotonic() >= deadline:
            return False
        time.sleep(poll)
    return True
