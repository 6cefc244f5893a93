"""Ethernet links: the ones a host should have against the ones its chips report up.

Expected links come from the topology (the cluster descriptor on a simulated host, tt-umd's
discovery on hardware; later a recorded last-known-good topology). Observed state comes from
each chip's ``ETH_LIVE_STATUS`` telemetry: bit ``16 + chan`` set means channel ``chan`` is up.
A link is up when both ends say so, down when either end's firmware says it is not, unknown
when the firmware can't tell (no telemetry, or Blackhole firmware older than 19.9 reporting 0).
"""

from __future__ import annotations

from collections import Counter

from ttmesh.dataclass import dataclass
from ttmesh.fabric.devices import Chip, Inventory, LinkSpec
from ttmesh.vocab import LinkState

UP, DOWN, UNKNOWN = LinkState.UP, LinkState.DOWN, LinkState.UNKNOWN


@dataclass(frozen=True)
class Observed:
    """An expected link and the state its ends report."""

    spec: LinkSpec
    state: LinkState

    def to_json(self) -> dict:
        s = self.spec
        return {
            "a": {"asic_id": s.a, "chan": s.chan_a},
            "b": {"asic_id": s.b, "chan": s.chan_b},
            "state": self.state,
        }


def _fw_reports_links(fw: str | None, arch: str) -> bool:
    if arch != "blackhole" or not fw:
        return True
    try:
        major, minor = (int(p) for p in fw.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (19, 9)


def observe(inv: Inventory, specs: list[LinkSpec] | None = None) -> list[Observed]:
    specs = inv.links if specs is None else specs
    asics = sorted({s.a for s in specs} | {s.b for s in specs})
    known = {c.asic_id: c for c in inv.chips}
    status = inv.host.eth_live_status([a for a in asics if a in known])
    # A chip's firmware matters only when it reports no link at all (older firmware reports
    # none): read then, once a chip, not for every chip every time (three times a launch).
    fw: dict[str, str | None] = {}

    def end(asic: str, chan: int) -> str:
        if asic not in known:
            return DOWN  # the chip is gone
        value = status.get(asic)
        if value is None:
            return UNKNOWN
        if value == 0:
            if asic not in fw:
                fw[asic] = _fw_of(inv, known[asic])
            if not _fw_reports_links(fw[asic], known[asic].arch):
                return UNKNOWN
        return UP if value >> (16 + chan) & 1 else DOWN

    out = []
    for s in specs:
        ends = (end(s.a, s.chan_a), end(s.b, s.chan_b))
        state = DOWN if DOWN in ends else (UNKNOWN if UNKNOWN in ends else UP)
        out.append(Observed(s, state))
    return out


def pair_counts(specs: list[LinkSpec]) -> Counter:
    """Links per unordered chip pair."""
    return Counter(tuple(sorted((s.a, s.b))) for s in specs)


def end_states(inv: Inventory, ends: list[tuple[str, int]]) -> dict[tuple[str, int], LinkState]:
    """The state one end of each link reports, by its own chip's ``ETH_LIVE_STATUS``: a cable
    to another host has only one end here (the other is the peer host's to read)."""
    known = {c.asic_id: c for c in inv.chips}
    asics = sorted({a for a, _c in ends if a in known})
    status = inv.host.eth_live_status(asics) if asics else {}
    out: dict[tuple[str, int], LinkState] = {}
    for asic, chan in ends:
        chip = known.get(asic)
        value = status.get(asic)
        if chip is None:
            out[(asic, chan)] = DOWN  # the chip is gone
        elif value is None or (value == 0 and not _fw_reports_links(_fw_of(inv, chip), chip.arch)):
            out[(asic, chan)] = UNKNOWN
        else:
            out[(asic, chan)] = UP if value >> (16 + chan) & 1 else DOWN
    return out


def _fw_of(inv: Inventory, chip: Chip) -> str | None:
    lead = inv.lead(chip)
    if lead is None or lead.dev_index is None:
        return None
    return inv.host.attr(lead.dev_index, "tt_fw_bundle_ver")


def observe_cables(inv: Inventory) -> list[dict]:
    """This host's end of every cable to another host (a link to a remote device in its
    topology, as tt-umd writes ``ethernet_connections_to_remote_devices``): the local chip (its
    PCI address, or its lead's for a chip reached through another), channel, the peer chip's
    unique id and channel, and the state this end's firmware reports (:func:`end_states`).
    The other end is the peer host's to say: ``ttmesh ls --hosts`` joins both."""
    cd = inv.descriptor
    if cd is None or not cd.remote_links:
        return []
    known = {c.asic_id: c for c in inv.chips}
    ids = {c.id: c.asic_id or "" for c in cd.chips.values()}
    ends = [(ids.get(r.chip, ""), r) for r in cd.remote_links]
    states = end_states(inv, [(a, r.chan) for a, r in ends])
    out = []
    for asic, r in ends:
        chip = known.get(asic)
        lead = inv.lead(chip) if chip is not None else None
        out.append(
            {
                "asic_id": asic,
                "bdf": lead.bdf if lead is not None else None,
                "chan": r.chan,
                "peer": {"asic_id": format(r.remote_unique_id, "016x"), "chan": r.remote_chan},
                "state": states[(asic, r.chan)],
            }
        )
    return out
