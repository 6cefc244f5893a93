"""Discovery: which chips a host has, how they are reached and how they are wired.

A chip is an ASIC, known by its unique id (``asic_id``, 16 hex digits). A PCI device is what the
driver exposes as ``/dev/tenstorrent/N``, known by its PCI address. Most chips are their own PCI
device; the right-hand chip of an n300 is remote, reached through its partner, and has no
address. ``/dev/tenstorrent`` numbers are read fresh every time: they change across resets.

Sources, in order: the driver's files (PCI devices, always); the topology (remote chips and
Ethernet links) from the cluster descriptor on a simulated host, from tt-umd's topology
discovery on a real host when the ``hw`` extra is installed, else none (said in ``notes``).
"""

from __future__ import annotations

import re

from ttmesh.dataclass import dataclass, field
from ttmesh.errors import bad_input
from ttmesh.host import boards as boardfacts
from ttmesh.host import clusterdesc
from ttmesh.host.base import CLASS_DIR, Host

ASIC_ID = re.compile(r"[0-9a-f]{1,16}")  # the driver writes 16 hex digits
BDF = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
PCI_ID = re.compile(r"0x[0-9a-f]{1,4}")
NO_TOPOLOGY = (
    "remote chips and Ethernet links left out: on this host they are read through tt-umd, "
    "which opens the chips"
)


@dataclass(frozen=True)
class Chip:
    """One ASIC of the host, as discovery found it."""

    asic_id: str
    bdf: str | None  # None for a remote chip
    dev_index: int | None  # N of /dev/tenstorrent/N now (never store it)
    pci_index: (
        int | None
    )  # position in the PCI-address-sorted device list (TT_VISIBLE_DEVICES ints)
    arch: str  # blackhole | wormhole_b0
    board_type: str  # the driver's card type: p300c, n300, galaxy-wormhole, ...
    board_id: str  # 16 hex digits
    dram_mb: int
    umd_id: int | None = None  # chip id in the host's cluster descriptor
    via: str | None = None  # a remote chip's PCI partner (asic id)
    asic_location: int | None = None
    by_id: str | None = None  # its /dev/tenstorrent/by-id name (tt-kmd's udev rules), if any

    @property
    def mmio(self) -> bool:
        return self.bdf is not None

    @property
    def label(self) -> str:
        """How to name the chip to a user: its PCI address, or 'remote <asic> via <bdf>'."""
        return self.bdf or f"remote {self.asic_id}"


@dataclass(frozen=True)
class LinkSpec:
    """An expected Ethernet link between two chips of this host."""

    a: str  # asic id
    chan_a: int
    b: str
    chan_b: int

    def key(self) -> tuple[str, int, str, int]:
        return (self.a, self.chan_a, self.b, self.chan_b)


@dataclass
class Inventory:
    """What a host has: its chips, the links expected between them, and their source."""

    host: Host
    driver: str
    chips: list[Chip]
    links: list[LinkSpec]
    topology: str  # "cluster-descriptor" | "tt_umd" | "none"
    missing: list[str] = field(default_factory=list)  # asic ids the topology has but the host lost
    notes: list[str] = field(default_factory=list)
    beats: dict[str, str] = field(default_factory=dict)  # heartbeat states seen at discovery time
    descriptor: clusterdesc.ClusterDescriptor | None = None  # the topology, as discovered

    def chip(self, asic: str) -> Chip:
        for c in self.chips:
            if c.asic_id == asic:
                return c
        raise KeyError(asic)

    def by_bdf(self) -> dict[str, Chip]:
        return {c.bdf: c for c in self.chips if c.bdf}

    def lead(self, chip: Chip) -> Chip | None:
        """The PCI device that reaches ``chip``: the chip itself, or a remote chip's partner."""
        if chip.bdf:
            return chip
        return next((c for c in self.chips if c.asic_id == chip.via and c.bdf), None)

    def board_peers(self, chip: Chip) -> list[Chip]:
        """Chips driven through the same PCI device (an n300's two chips)."""
        lead = chip.via or chip.asic_id
        return [c for c in self.chips if c.asic_id == lead or c.via == lead]


BY_ID_DIR = "/dev/tenstorrent/by-id/"


def by_id_chip(inv: Inventory, item: str) -> Chip | None:
    """The chip a ``/dev/tenstorrent/by-id`` name names (any case): the bare name, its path
    on the host (``/dev/tenstorrent/by-id/NAME``) or under a simulated root; None otherwise."""
    name = item.strip().lower()
    for prefix in (BY_ID_DIR, str(inv.host.path(BY_ID_DIR)).lower() + "/"):
        if name.startswith(prefix):
            name = name[len(prefix) :]
            break
    return next((c for c in inv.chips if c.by_id and c.by_id.lower() == name), None)


def require_driver(host: Host) -> str:
    version = host.driver_version()
    if version is None:
        raise bad_input(
            f"no Tenstorrent driver on this host ({host.path('sys/module/tenstorrent/version')} is missing)",
            "install tt-kmd, or try ttmesh on a simulated host: --sim quietbox2",
        )
    return version


def discover(host: Host, *, topology: bool = True) -> Inventory:
    """The host's chips. ``topology=False``: the driver's PCI devices only, without asking
    for the topology (on hardware tt-umd's discovery opens every chip; ``ttmesh metrics``
    must not): no remote chips and no expected links, said in ``notes``."""
    driver = require_driver(host)
    devs = host.dev_indexes()
    pci = []
    for n in devs:
        bdf = host.bdf_of(n)
        asic = host.attr(n, "tt_asic_id")
        if bdf is None or asic is None:
            continue
        node = host.path(f"{CLASS_DIR}/tenstorrent!{n}")
        if not BDF.fullmatch(bdf.lower()):
            raise host.corrupt(f"{node}/device", f"leads to {bdf[:60]!a}, not a PCI device")
        if not ASIC_ID.fullmatch(asic.lower()):
            why = f"holds {asic[:40]!a}, not a chip's unique id (16 hex digits)"
            raise host.corrupt(f"{node}/tt_asic_id", why)
        pci.append((bdf.lower(), n, asic.lower()))
    pci.sort()
    pci_index = {bdf: i for i, (bdf, _, _) in enumerate(pci)}

    by_id = host.by_id_links()
    if topology:
        topo, topo_name, notes = host.topology()
    else:
        topo, topo_name, notes = None, "none", [NO_TOPOLOGY]
    by_uid = topo.by_unique_id() if topo else {}
    chips: list[Chip] = []
    seen: set[str] = set()
    for bdf, n, asic in pci:
        card = host.attr(n, "tt_card_type") or "unknown"
        device = (host.pci_attr(bdf, "device") or "").lower()
        if device and not PCI_ID.fullmatch(device):
            where = str(host.path(f"sys/bus/pci/devices/{bdf}/device"))
            raise host.corrupt(where, f"holds {device[:40]!a}, not a PCI device id (e.g. 0xb140)")
        arch = boardfacts.PCI_DEVICE_IDS.get(int(device, 16) if device else -1) or (
            boardfacts.CARDS[card].arch if card in boardfacts.CARDS else "unknown"
        )
        cd_chip = by_uid.get(int(asic, 16))
        dram = _dram(arch, card, cd_chip)
        chips.append(
            Chip(
                asic_id=asic,
                bdf=bdf,
                dev_index=n,
                pci_index=pci_index[bdf],
                arch=arch,
                board_type=card,
                board_id=_hex16(host.attr(n, "tt_serial")),
                dram_mb=dram,
                umd_id=cd_chip.id if cd_chip else None,
                asic_location=cd_chip.asic_location if cd_chip else None,
                by_id=by_id.get(n),
            )
        )
        seen.add(asic)
    missing: list[str] = []
    if topo is not None:
        by_umd = {c.umd_id: c for c in chips if c.umd_id is not None}
        for cd_chip in topo.chips.values():
            asic = cd_chip.asic_id
            if asic is None or asic in seen:
                continue
            if cd_chip.mmio_dev is not None:
                missing.append(asic)  # a PCI chip the topology knows but the driver lost
                continue
            board = topo.board_of(cd_chip.id)
            partner = next((by_umd[o] for o in (board.chips if board else ()) if o in by_umd), None)
            if partner is None:
                missing.append(asic)
                continue
            chips.append(
                Chip(
                    asic_id=asic,
                    bdf=None,
                    dev_index=None,
                    pci_index=None,
                    arch=boardfacts.normalize_arch(cd_chip.arch),
                    board_type=partner.board_type,
                    board_id=partner.board_id,
                    dram_mb=_dram(cd_chip.arch, partner.board_type, cd_chip),
                    umd_id=cd_chip.id,
                    via=partner.asic_id,
                    asic_location=cd_chip.asic_location,
                )
            )
            seen.add(asic)
    links: list[LinkSpec] = []
    if topo is not None:
        ids = {c.id: c.asic_id for c in topo.chips.values()}
        for lk in topo.links:
            a, b = ids.get(lk.chip_a), ids.get(lk.chip_b)
            if a and b:
                links.append(LinkSpec(a, lk.chan_a, b, lk.chan_b))
    # PCI chips in PCI order, each remote chip right after its partner.
    bdf_of = {c.asic_id: c.bdf for c in chips if c.bdf}
    chips.sort(key=lambda c: (c.bdf or bdf_of.get(c.via or "", ""), c.via is not None, c.asic_id))
    return Inventory(host, driver, chips, links, topo_name, missing, notes, descriptor=topo)


def _hex16(text: str | None) -> str:
    if not text:
        return ""
    try:
        return format(int(text, 16), "016x")
    except ValueError:
        return text


def _dram(arch: str, card: str, cd_chip: clusterdesc.CDChip | None) -> int:
    arch = boardfacts.normalize_arch(arch)
    if cd_chip is not None and arch in boardfacts.ARCHS:
        return boardfacts.dram_mb(arch, int(cd_chip.harvesting.get("dram_harvesting_mask", 0)))
    return boardfacts.card_dram_mb(card) or 0
