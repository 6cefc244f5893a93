"""This host's ends of the cables between a job's hosts: which they are, their state, and the
wait for them to train after both ends were reset.

A cable between two hosts shows on each as a link to a remote device (tt-umd's
``ethernet_connections_to_remote_devices``: this chip and channel, the peer chip's unique id and
channel); its state on this side is this chip's ``ETH_LIVE_STATUS`` bit for the channel. A
cable is up only when both ends are: each host reads its own end, and the launcher (or every
agent, through the rendezvous store) joins the two. After a reset of both ends together,
external links train for tens of seconds (``ttmesh.host.boards.link_training``); the wait polls
until every end is up or the board's timeout passes, never a fixed sleep.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import asdict

from ttmesh.dataclass import dataclass
from ttmesh.fabric import links
from ttmesh.fabric.devices import Inventory
from ttmesh.fabric.problem import chip_name
from ttmesh.host import boards
from ttmesh.vocab import LinkState

POLL = 0.2  # seconds between two readings of the ends while they train


@dataclass(frozen=True)
class CableEnd:
    """One end of a cable, on this host: its chip (unique id and how to name it) and channel,
    the peer chip's unique id and channel, and the state this end reports."""

    chip: str
    name: str  # the chip's PCI address (a remote chip: "remote <asic> via <bdf>")
    chan: int
    peer: str
    peer_chan: int
    state: str = LinkState.UNKNOWN

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def ends(inv: Inventory, mine: Iterable[str], peers: Iterable[str] | None = None) -> list[CableEnd]:
    """This host's ends of the job's cables: links to remote devices from a chip of ``mine``
    (the job's chips here) to a chip of ``peers`` (the job's chips on the other hosts; None:
    any chip not here, when the other hosts' chips are not known yet)."""
    cd = inv.descriptor
    if cd is None:
        return []
    here = {c.asic_id for c in inv.chips}
    local_ok = set(mine) & here
    wanted = None if peers is None else set(peers)
    ids = {c.id: c.asic_id for c in cd.chips.values()}
    out = []
    for r in cd.remote_links:
        local = ids.get(r.chip)
        peer = format(r.remote_unique_id, "016x")
        if local not in local_ok or peer in here or (wanted is not None and peer not in wanted):
            continue
        out.append(CableEnd(local, chip_name(inv, local), r.chan, peer, r.remote_chan))
    return sorted(out, key=lambda e: (e.name, e.chan))


def read(inv: Inventory, found: list[CableEnd]) -> list[CableEnd]:
    """``found`` with the state each end reports now (``fabric.links.end_states``)."""
    states = links.end_states(inv, [(e.chip, e.chan) for e in found])
    return [CableEnd(e.chip, e.name, e.chan, e.peer, e.peer_chan, states[(e.chip, e.chan)])
            for e in found]  # fmt: skip


def training_timeout(inv: Inventory, chips: Iterable[str]) -> float:
    """How long the cables of ``chips`` may take to train after a reset of both ends: the
    longest of their architectures' external-link timeouts."""
    arch = {c.asic_id: c.arch for c in inv.chips}
    found = [boards.link_training(arch[a], external=True).timeout for a in chips if a in arch]
    return max(found, default=boards.link_training("", external=True).timeout)


def wait_trained(
    inv: Inventory,
    found: list[CableEnd],
    timeout: float,
    log: Callable[[str], None] | None = None,
) -> tuple[list[CableEnd], float]:
    """Read the ends until every one is up or ``timeout`` seconds pass; the last reading and
    the seconds waited. ``inv``: the host as discovered after its reset (only the chips'
    telemetry is read again: discovery on hardware opens every chip)."""
    start = time.monotonic()
    told = start
    while True:
        now = read(inv, found)
        waited = time.monotonic() - start
        down = [e for e in now if e.state != LinkState.UP]
        if not down or waited >= timeout:
            return now, waited
        if log is not None and time.monotonic() - told >= 10.0:
            told = time.monotonic()
            log(f"waiting for {len(down)} of {len(now)} cable ends to train ({waited:.0f} s)")
        time.sleep(min(POLL, max(0.0, timeout - waited)))
