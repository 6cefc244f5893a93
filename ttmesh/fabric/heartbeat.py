"""Is a chip's firmware alive? Its heartbeat counter advances while it lives.

A single read says nothing, so chips are polled together until each counter has moved. How long
to wait before calling a chip frozen comes from its firmware where it says: Blackhole's updates
its telemetry, heartbeat included, every 100 ms and reports that interval
(``Host.heartbeat_intervals``), so the watch waits :data:`TICKS` of them (200 ms); where nothing
is reported (Wormhole, whose ``ARC0_HEALTH`` rate is not published; no tt-umd) it assumes
``timeout`` (about 1 s by the conventions). Chips with a driver node are read from sysfs; remote
chips from firmware telemetry (tt_umd on hardware, the simulator's state on a simulated host).
"""

from __future__ import annotations

import time

from ttmesh.fabric.devices import Chip, Inventory
from ttmesh.vocab import Heartbeat

ALIVE, FROZEN, UNKNOWN = Heartbeat.ALIVE, Heartbeat.FROZEN, Heartbeat.UNKNOWN
TICKS = 2  # updates a live chip's counter is given to move (firmware jitter: one more than needed)
MIN_WAIT = 0.05  # never less, whatever the reported interval (a read itself takes time)
MAX_WAIT = 30.0  # never more: a reported interval beyond 15 s is not believed further


def frozen_after(inv: Inventory, chips: list[Chip], assumed: float) -> float:
    """Seconds without a move after which these chips are frozen: TICKS of the slowest
    interval their firmware reports, or ``assumed`` when any of them reports none."""
    reported = inv.host.heartbeat_intervals([(c.asic_id, c.dev_index) for c in chips])
    if not chips or any(reported.get(c.asic_id) is None for c in chips):
        return assumed
    slowest = max(v for v in reported.values() if v is not None)
    return min(max(TICKS * slowest, MIN_WAIT), MAX_WAIT)


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
    return Watch(inv, chips, timeout).wait()


class Watch:
    """Heartbeats under watch: read once when created, then again each time :meth:`step` is
    called once its next reading is due (2 ms, then twice as long each time, up to 50 ms
    apart), until every counter has moved (alive) or ``timeout`` has passed since the first
    reading (frozen). :func:`poll` waits for the verdict; a launcher can take the first reading,
    start its workers and ask the watch between other work (a chip whose heartbeat ticks twice
    a second takes up to half a second to show it is alive). ``timeout`` is the wait assumed
    when the firmware reports no update interval (:func:`frozen_after`)."""

    def __init__(self, inv: Inventory, chips: list[Chip] | None = None, timeout: float = 1.0):
        self.inv = inv
        chips = inv.chips if chips is None else chips
        self.first = read(inv, chips)
        self.states: dict[str, str] = {
            a: (UNKNOWN if v is None else FROZEN) for a, v in self.first.items()
        }
        self.pending = [c for c in chips if self.first.get(c.asic_id) is not None]
        now = time.monotonic()
        self.timeout = frozen_after(inv, self.pending, timeout) if self.pending else timeout
        self.deadline = now + self.timeout
        self.delay = 0.002
        self.due = now + self.delay

    @property
    def done(self) -> bool:
        return not self.pending

    def only(self, asics: list[str]) -> None:
        """Watch only these chips (the others' verdicts no longer matter)."""
        keep = set(asics)
        self.pending = [c for c in self.pending if c.asic_id in keep]

    def known(self) -> dict[str, str]:
        """The verdicts so far: alive, frozen (only once the watch is done) or unknown."""
        pending = {c.asic_id for c in self.pending}
        return {a: s for a, s in self.states.items() if a not in pending}

    def step(self) -> float | None:
        """Read the pending counters if a reading is due; seconds until the next one is (0 when
        overdue), or None once every chip is decided."""
        if not self.pending:
            return None
        now = time.monotonic()
        if now >= self.due:
            values = read(self.inv, self.pending)
            still = []
            for c in self.pending:
                value = values.get(c.asic_id)
                if value is None:
                    self.states[c.asic_id] = UNKNOWN
                elif value != self.first[c.asic_id]:
                    self.states[c.asic_id] = ALIVE
                else:
                    still.append(c)
            self.pending = [] if now >= self.deadline else still  # the rest: frozen
            self.delay = min(self.delay * 2, 0.05)
            self.due = min(now + self.delay, self.deadline)
            if not self.pending:
                return None
        return max(0.0, self.due - time.monotonic())

    def wait(self) -> dict[str, str]:
        """Every chip's verdict, reading until they are all decided."""
        while (wait := self.step()) is not None:
            time.sleep(wait)
        return dict(self.states)
