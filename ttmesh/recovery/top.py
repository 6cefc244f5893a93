"""``ttmesh top``: every chip's telemetry and who has it, sampled again and again.

One sample is a ``ttmesh.top/1`` document (docs/conventions.md): per chip its temperature,
power, clock and voltage, its heartbeat (the counter, and whether it moved since the last
sample), its Ethernet links up out of those expected, the ttmesh job leasing it and the
processes holding it.

Telemetry comes through the host, the same way on every host: the host's tt-smi snapshot
(``tt-smi -s``: on this machine the tt-smi on PATH, on a simulated host its tt-smi stand-in,
which reports the simulated chips), else the driver's own files (hwmon, ``tt_aiclk``). Like
``doctor``'s capture, this lives above ``fabric`` because it runs tt-smi through
:mod:`ttmesh.recovery.reset`.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

from ttmesh import fileread
from ttmesh.errors import TTMeshError
from ttmesh.fabric import health, heartbeat, links
from ttmesh.fabric.devices import Chip, Inventory, discover
from ttmesh.host.base import Host
from ttmesh.host.telemetry import Reading, SmiDevice, parse_snapshot, sysfs_reading
from ttmesh.vocab import Heartbeat

SCHEMA = "ttmesh.top/1"
SMI_TIMEOUT = 30.0  # seconds for one tt-smi -s (it opens every chip)
NO_SMI = "no tt-smi: temperature and power from the driver's files where it has them"


class Sampler:
    """Samples a host again and again; the heartbeat of each sample is judged against the
    previous one (the first waits up to ``first_wait`` for the counters to move)."""

    def __init__(
        self,
        host: Host,
        tt_smi: str | None = None,
        *,
        first_wait: float = 1.0,
        driver_only: bool = False,
    ) -> None:
        """``driver_only``: never run tt-smi and never open a chip (``ttmesh metrics``: a
        poller that opens chips breaks resets, tt-smi#172). Telemetry and heartbeats come from
        the driver's files only; on a host where the topology, Ethernet status and remote
        heartbeats need a chip opened (tt-umd on hardware) those are left out (``links`` is
        None) and a note says so. A sample less than ``first_wait`` after the previous one
        watches the heartbeats again (a counter may not tick in a shorter gap)."""
        from ttmesh.recovery.reset import find_tt_smi

        self.host = host
        self.first_wait = first_wait
        self.driver_only = driver_only
        self.firmware = not (driver_only and host.firmware_opens_chips)
        self.counters: dict[str, int | None] | None = None
        self.counted_at = 0.0
        self.inv: Inventory | None = None
        self.devices: list[tuple[int, str | None]] = []
        self.notes: list[str] = []
        self.tool: str | None = None
        if driver_only:
            return
        try:
            self.tool = find_tt_smi(host, tt_smi)
        except TTMeshError as exc:
            if tt_smi is not None:
                raise  # asked for by name: bad input, said at once
            self.notes.append(f"{NO_SMI} ({exc.message})")

    def _inventory(self) -> Inventory:
        """The host's chips: discovered again only when its PCI devices changed (a reset may
        renumber them), not every sample (on hardware discovery asks tt-umd for the topology)."""
        devices = [(n, self.host.bdf_of(n)) for n in self.host.dev_indexes()]
        if self.inv is None or devices != self.devices:
            self.inv = discover(self.host, topology=self.firmware)
            self.devices = devices
        return self.inv

    def sample(self) -> dict[str, Any]:
        inv = self._inventory()
        smi, note = self._snapshot()
        notes = [*self.notes, *([note] if note else [])]
        counts = heartbeat.read(inv, inv.chips)
        now = time.monotonic()
        if self.counters is None or (self.driver_only and now - self.counted_at < self.first_wait):
            beats = heartbeat.poll(inv, timeout=self.first_wait)
        else:
            beats = {a: _moved(self.counters.get(a), v) for a, v in counts.items()}
        self.counters, self.counted_at = counts, now
        per_chip: dict[str, dict[str, int]] | None = _links(inv) if self.firmware else None
        leased, owners = health.lease_owners(self.host, [c.asic_id for c in inv.chips])
        jobs = health.lease_jobs(leased)
        chips = []
        for c in inv.chips:
            reading, source = _reading(self.host, inv, c, smi)
            held = health.held_by(inv, c, owners, jobs)
            lease = leased.get(c.asic_id)
            chips.append(
                {
                    "asic_id": c.asic_id,
                    "bdf": c.bdf,
                    "dev_index": c.dev_index,
                    "arch": c.arch,
                    "board_type": c.board_type,
                    "via": c.via,
                    **asdict(reading),
                    "telemetry": source,
                    "heartbeat": {
                        "state": beats.get(c.asic_id, Heartbeat.UNKNOWN),
                        "count": counts.get(c.asic_id),
                    },
                    "links": None if per_chip is None else per_chip.get(c.asic_id, _no_links()),
                    "lease": None if lease is None else lease.lease_json(),
                    "holders": None if held is None else [h.to_json(with_job=True) for h in held],
                }
            )
        return {
            "schema": SCHEMA,
            "time": round(time.time(), 3),
            "host": {
                "root": str(self.host.root),
                "simulated": self.host.simulated,
                "driver": inv.driver,
            },
            "source": "tt-smi" if smi is not None else "driver",
            "chips": chips,
            "notes": notes + inv.notes,
        }

    def _snapshot(self) -> tuple[list[SmiDevice] | None, str | None]:
        """The devices of the host's ``tt-smi -s`` (None, and why, when it gave none)."""
        if self.tool is None:
            return None, None
        from ttmesh.recovery.reset import run_tt_smi

        run = run_tt_smi([self.tool, "-s"], SMI_TIMEOUT, env_changes=self.host.tt_smi_env())
        doc = _json_in(run.output)
        if run.code == 0 and doc is not None:
            return parse_snapshot(doc), None
        if run.timed_out:
            why = f"timed out after {SMI_TIMEOUT:g} s"
        elif run.code is None:
            why = run.output.strip() or "could not start"
        else:
            why = f"exit {run.code}" if run.code else "no JSON snapshot"
        return None, f"tt-smi -s gave no telemetry ({why}); the driver's files instead"


def _json_in(text: str) -> Any:
    """The JSON document in tt-smi's output (it may print lines before it)."""
    start = text.find("{")
    if start < 0:
        return None
    try:
        return fileread.load_json(text[start:])
    except ValueError:  # fileread.TooDeep too
        return None


def _moved(before: int | None, now: int | None) -> str:
    if before is None or now is None:
        return Heartbeat.UNKNOWN
    return Heartbeat.ALIVE if now != before else Heartbeat.FROZEN


def _reading(
    host: Host, inv: Inventory, chip: Chip, smi: list[SmiDevice] | None
) -> tuple[Reading, str | None]:
    """(the chip's reading, where it came from: "tt-smi", "driver" or None)."""
    if smi is not None:
        found = _match(inv, chip, smi)
        if found is not None:
            return found.reading, "tt-smi"
    if chip.dev_index is not None:
        reading = sysfs_reading(host, chip.dev_index)
        if reading.known():
            return reading, "driver"
    return Reading(), None


def _match(inv: Inventory, chip: Chip, smi: list[SmiDevice]) -> SmiDevice | None:
    """The snapshot's device of ``chip``: by unique id, by PCI address, or (a remote chip) the
    remote device on its board."""
    for d in smi:
        if d.asic_id is not None and d.asic_id == chip.asic_id:
            return d
    if chip.bdf:
        return next((d for d in smi if d.bdf == chip.bdf), None)
    board = [d for d in smi if d.bdf is None and d.board_id == chip.board_id]
    remote = [c for c in inv.chips if not c.bdf and c.board_id == chip.board_id]
    if len(board) == len(remote) and chip in remote:
        return board[remote.index(chip)]
    return None


def _no_links() -> dict[str, int]:
    return {"up": 0, "down": 0, "unknown": 0, "expected": 0}


def _links(inv: Inventory) -> dict[str, dict[str, int]]:
    """Per chip: its expected Ethernet links by state now."""
    out: dict[str, dict[str, int]] = {}
    for seen in links.observe(inv):
        for end in (seen.spec.a, seen.spec.b):
            counts = out.setdefault(end, _no_links())
            counts[str(seen.state)] += 1
            counts["expected"] += 1
    return out
