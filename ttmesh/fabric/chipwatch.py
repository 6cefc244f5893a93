"""The job's chips, watched while its ranks run: a heartbeat that stops, a chip gone from the
PCI bus, the links between the job's chips going down.

Pre-flight reads the chips before the start and the recovery after the end; in between a chip
could freeze (its firmware hangs) and a server go on answering ``/health`` from its host
process while every request waits on the device (tt-xla#5828, tt-inference-server#4985). So
the guardian reads the job's chips on its timer, as pre-flight does, and stops the job the
moment one fails (:class:`ttmesh.launcher.attempt.guardian.Guardian`).

How often, and what counts (docs/recovery.md, "Chips watched while the job runs"):

* every :data:`READ_EVERY` (1 s), and never faster than the firmware updates its telemetry
  (Blackhole: every 100 ms, ``UPDATE_TELEM_SPEED``; the heartbeat advances once per update,
  tenstorrent/tt-zephyr-platforms ``lib/tenstorrent/bh_arc/telemetry.c``): a read is a few
  of the driver's sysfs files, never a chip opened;
* a heartbeat is **frozen** when it has not moved for :func:`frozen_after`: two reads at least
  (2 s), or twice the interval the firmware reports when that is longer (the pre-flight rule,
  ``fabric.heartbeat.TICKS``); seen within 3 s;
* a chip is **gone** when its driver node no longer names it (``/dev/tenstorrent/N`` and its
  sysfs entry vanished: the device fell off the bus): seen at the next read, within 1 s;
* a link between two of the job's chips that reads down (pre-flight saw every one of them
  up, or refused the start): said at the read after the one that first saw it down, once both
  ends' heartbeats moved in between (within 2 s); a hung chip takes its links down with it,
  so an end whose heartbeat stands still is given the heartbeat's verdict first (within 3 s).
  Links that fell as a process ended whose end the job's own watch decides on (a rank that
  failed: the guardian hears it first; a server's critical process, ``ended``: a scheduler
  killed with the fabric open takes its links down) are that process's end, not the chip's.
  That knowledge is the job's own, kept from each process's start, never a sample of who
  holds the chips: a process that opened them and died between two reads leaves no trace in
  the driver's holder lists. Any other link down is said, whatever else ended meanwhile (a
  helper that held a chip, a rank that ended cleanly): nothing else would stop the job.
  Links are read where that opens no chip: a simulated host. On a real host the Ethernet
  status is read through tt-umd, which opens the chips the job holds (``ttmesh metrics``
  leaves them out there too); the recovery after the end reads them.

Remote chips (an n300's right-hand chip) are read through tt-umd on a real host too: only
their PCI partner is watched there.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ttmesh.dataclass import dataclass
from ttmesh.fabric.devices import Chip, Inventory, LinkSpec
from ttmesh.fabric.heartbeat import TICKS
from ttmesh.render import noun

READ_EVERY = 1.0  # seconds between reads (at least the firmware's update interval)
FROZEN_MIN = 2.0  # a heartbeat unmoved this long (two reads at least) is frozen


@dataclass(frozen=True)
class Finding:
    """A chip of the job that failed under it: which, and what was seen."""

    chip: str  # its PCI address (a remote chip: "remote ASIC via BDF")
    what: str  # "its heartbeat stopped (at 5123, unmoved for 2.0 s)"
    kind: str  # frozen | gone | links

    @property
    def line(self) -> str:
        return f"chip {self.chip} failed under the job: {self.what}"


def frozen_after(interval: float | None) -> float:
    """Seconds a heartbeat may stand still before it is frozen: FROZEN_MIN, or TICKS of the
    interval the firmware reports when that is longer."""
    return max(FROZEN_MIN, TICKS * interval) if interval else FROZEN_MIN


class ChipWatch:
    """The job's chips (``asics``, of ``inv``), read on a timer: :meth:`due` says when the next
    read is, :meth:`step` reads and returns the first failure seen (None: all well).

    ``ended``: the process of the job that ended and whose end the job's own watch decides on
    (a server's critical process: its name), None while there is none; links down then are
    that process's end. Asked when links read down, so a process that died a moment before
    is known whatever the reads saw of it."""

    def __init__(
        self,
        inv: Inventory,
        asics: list[str],
        now: float | None = None,
        ended: Callable[[], str | None] | None = None,
    ) -> None:
        host = inv.host
        self.host = host
        known = {c.asic_id: c for c in inv.chips}
        chips = [known[a] for a in dict.fromkeys(asics) if a in known]
        remote_ok = not host.firmware_opens_chips  # remote chips: read through tt-umd there
        self.chips = [c for c in chips if c.dev_index is not None or remote_ok]
        self.names = {c.asic_id: self._name(inv, c) for c in self.chips}
        # Each PCI chip's device node now (its number can change only across a reset).
        self.devs = self._devs(self.chips)
        mine = {c.asic_id for c in chips}
        self.specs: list[LinkSpec] = (
            [s for s in inv.links if s.a in mine and s.b in mine] if remote_ok else []
        )
        self.inv = inv
        intervals = host.heartbeat_intervals([(c.asic_id, c.dev_index) for c in self.chips])
        slowest = max((v for v in intervals.values() if v), default=None)
        self.every = max(READ_EVERY, slowest or 0.0)
        self.frozen = frozen_after(slowest)
        self.beats: dict[str, tuple[int, float]] = {}  # asic -> (value, when it last moved)
        self.moved: set[str] = set()  # the chips whose heartbeat moved since links went down
        self.links_down_since: float | None = None
        self.ended = ended
        self.next = time.monotonic() if now is None else now

    @staticmethod
    def _name(inv: Inventory, chip: Chip) -> str:
        if chip.bdf:
            return chip.bdf
        lead = inv.lead(chip)
        return f"remote {chip.asic_id}" + (f" via {lead.bdf}" if lead and lead.bdf else "")

    def _devs(self, chips: list[Chip]) -> dict[str, int]:
        """PCI address -> its /dev/tenstorrent number, read from the driver now."""
        wanted = {c.bdf for c in chips if c.bdf}
        found: dict[str, int] = {}
        for dev in self.host.dev_indexes():
            bdf = self.host.bdf_of(dev)
            if bdf in wanted:
                found[bdf] = dev
        return found

    def due(self) -> float:
        """When the next read is (monotonic)."""
        return self.next

    def step(self, now: float | None = None) -> Finding | None:
        """Read the chips if a read is due: the first failure seen, else None."""
        now = time.monotonic() if now is None else now
        if now < self.next:
            return None
        self.next = now + self.every
        return self._gone() or self._heartbeats(now) or self._links(now)

    def _gone(self) -> Finding | None:
        for c in self.chips:
            if c.bdf is None:
                continue
            dev = self.devs.get(c.bdf)
            if dev is None or self.host.bdf_of(dev) != c.bdf:
                return Finding(
                    self.names[c.asic_id],
                    "it is gone from the PCI bus (the driver lists it no more: no "
                    "/dev/tenstorrent node, no sysfs entry)",
                    "gone",
                )
        return None

    def _read(self) -> dict[str, int | None]:
        values: dict[str, int | None] = {}
        remote = []
        for c in self.chips:
            if c.bdf is None:
                remote.append(c.asic_id)
                continue
            text = self.host.attr(self.devs[c.bdf], "tt_heartbeat")
            try:
                values[c.asic_id] = int(text) if text is not None else None
            except ValueError:
                values[c.asic_id] = None
        if remote:
            values.update(self.host.remote_heartbeats(remote))
        return values

    def _heartbeats(self, now: float) -> Finding | None:
        for asic, value in self._read().items():
            if value is None:
                continue  # cannot be read: unknown, never frozen
            last = self.beats.get(asic)
            if last is None or last[0] != value:
                self.beats[asic] = (value, now)
                if last is not None and self.links_down_since is not None:
                    self.moved.add(asic)
                continue
            if now - last[1] >= self.frozen:
                return Finding(
                    self.names[asic],
                    f"its heartbeat stopped (at {value}, unmoved for {now - last[1]:.1f} s; "
                    "its firmware hangs)",
                    "frozen",
                )
        return None

    def _links(self, now: float) -> Finding | None:
        if not self.specs:
            return None
        from ttmesh.fabric import links
        from ttmesh.vocab import LinkState

        states = links.observe(self.inv, self.specs)
        down = [o.spec for o in states if o.state == LinkState.DOWN]
        if not down:
            self.links_down_since = None
            return None
        if self.ended is not None and self.ended() is not None:
            # They fell as a process of the job ended (a scheduler killed with the fabric
            # open): its end is the job's own watch's to say, the recovery after it the
            # chips'. (A frozen or vanished chip is still said: read before the links.)
            return None
        if self.links_down_since is None:  # first seen now: are both ends' firmware alive?
            self.links_down_since, self.moved = now, set()
            return None
        ends = {s.a for s in down} | {s.b for s in down}
        if not ends <= self.moved and now - self.links_down_since < self.frozen:
            # An end whose heartbeat has not moved since the links went down may be frozen
            # (a hung chip takes its links with it): its verdict names the cause. The links
            # are said once both ends' heartbeats moved after it, or after that wait.
            return None
        named = [self._oriented(s) for s in down]  # each from its end named first
        first = named[0]
        pair = [s for s in named if (s.a, s.b) == (first.a, first.b)]
        chans = ", ".join(f"ch{s.chan_a}<->ch{s.chan_b}" for s in pair)
        return Finding(
            self.names.get(first.a, first.a),
            f"{len(pair)} {noun(len(pair), 'link')} to {self.names.get(first.b, first.b)} went "
            f"down ({chans})",
            "links",
        )

    def _oriented(self, spec: LinkSpec) -> LinkSpec:
        """``spec`` from the end whose name sorts first (a PCI address reads left to right)."""
        if self.names.get(spec.a, spec.a) <= self.names.get(spec.b, spec.b):
            return spec
        return LinkSpec(spec.b, spec.chan_b, spec.a, spec.chan_a)
