"""Is a chip's firmware alive? Its heartbeat counter advances while it lives.

A single read says nothing, so chips are polled together until each counter has moved, up to
``timeout`` (about 1 s by the conventions). Chips with a driver node are read from sysfs; remote
chips from firmware telemetry (tt_umd on hardware, the simulator's state on a simulated host).
"""

from __future__ import annotations

import time

from ttmesh.fabric.devices import Chip, Inventory
from ttmesh.vocab import Heartbeat

ALIVE, FROZEN, UNKNOWN = Heartbeat.ALIVE, Heartbeat.FROZEN, Heartbeat.UNKNOWN


def read(inv: Inventory, chips: list[Chip]) -> dict[str, int | None]:
    """Each chip's heartbeat counter now (None: it cannot be read)."""
    values: dict[str, int | None] = {}
    remote = []
    for c in chips:
        if c.dev_index is None:
            remote.append(c.asic_id)
            continue
        text = inv.host.attr(c.dev_index, "tt_heartbeat")
        try:
            values[c.asic_id] = int(text) if text is not None else None
        except ValueError:
            values[c.asic_id] = None
    if remote:
        values.update(inv.host.remote_heartbeats(remote))
    return values


def poll(inv: Inventory, chips: list[Chip] | None = None, timeout: float = 1.0) -> dict[str, str]:
    """State per asic id: alive (counter moved), frozen (did not within timeout), unknown."""
    chips = inv.chips if chips is None else chips
    first = read(inv, chips)
    result: dict[str, str] = {a: (UNKNOWN if v is None else FROZEN) for a, v in first.items()}
    pending = [c for c in chips if first.get(c.asic_id) is not None]
    deadline = time.monotonic() + timeout
    delay = 0.002
    while pending and time.monotonic() < deadline:
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
        now = read(inv, pending)
        still = []
        for c in pending:
            value = now.get(c.asic_id)
            if value is None:
                result[c.asic_id] = UNKNOWN
            elif value != first[c.asic_id]:
                result[c.asic_id] = ALIVE
            else:
                still.append(c)
        pending = still
    return result
