"""``ttmesh ls``: what a host has, in the ``ttmesh.ls/1`` shape (docs/conventions.md)."""

from __future__ import annotations

from typing import Any

from ttmesh.fabric import domains, heartbeat, holders, links
from ttmesh.fabric.devices import Inventory, discover
from ttmesh.host.base import Host

SCHEMA = "ttmesh.ls/1"


def report(host: Host, timeout: float = 1.0) -> dict[str, Any]:
    inv = discover(host)
    return build(inv, timeout)


def without_driver(host: Host, why: str) -> dict[str, Any]:
    """The ttmesh.ls/1 document of a host without the Tenstorrent driver: no chips, and why."""
    return {
        "schema": SCHEMA,
        "host": {"root": str(host.root), "simulated": host.simulated, "driver": None},
        "topology": "none",
        "chips": [],
        "links": [],
        "cables": [],
        "missing": [],
        "notes": [why],
        "reset_domains": [],
        "links_left_down": [],
    }


def build(inv: Inventory, timeout: float = 1.0) -> dict[str, Any]:
    from ttmesh.runtime import leases, leftdown

    beats = heartbeat.poll(inv, timeout=timeout)
    held = leases.probe(inv.host, [c.asic_id for c in inv.chips])
    chips = []
    for c in inv.chips:
        hs = holders.holders(inv, c)
        lease = held.get(c.asic_id)
        chips.append(
            {
                "asic_id": c.asic_id,
                "bdf": c.bdf,
                "by_id": c.by_id,
                "dev_index": c.dev_index,
                "pci_index": c.pci_index,
                "arch": c.arch,
                "board_type": c.board_type,
                "board_id": c.board_id,
                "mmio": c.mmio,
                "dram_mb": c.dram_mb,
                "heartbeat": beats.get(c.asic_id, heartbeat.UNKNOWN),
                "holders": None if hs is None else [h.to_json() for h in hs],
                "lease": None if lease is None else lease.lease_json(),
                "symmetric_dram_mb": None if lease is None else lease.symmetric_dram_mb,
                "via": c.via,
                "umd_id": c.umd_id,
            }
        )
    return {
        "schema": SCHEMA,
        "host": {
            "root": str(inv.host.root),
            "simulated": inv.host.simulated,
            "driver": inv.driver,
        },
        "topology": inv.topology,
        "chips": chips,
        "links": [ls.to_json() for ls in links.observe(inv)],
        # This host's end of each cable to another host (ls --hosts shows both ends).
        "cables": links.observe_cables(inv),
        "missing": inv.missing,
        "notes": inv.notes,
        "reset_domains": [d.to_json() for d in domains.domains(inv)],
        "links_left_down": [e.to_json() for e in leftdown.read(inv.host)],
    }
