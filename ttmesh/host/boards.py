"""Facts about Tenstorrent chips and boards that no host file states directly.

Sources: the kernel driver, tt-umd and tt-smi, and the real cluster descriptors in
tests/data/captures (see docs/simulator.md, "Stock systems"). Entries marked
"unsure" were inferred, not observed; everything else was seen in a real tool or capture.
"""

from __future__ import annotations

import re

from ttmesh.dataclass import dataclass

# A PCI address as the kernel writes it: domain:bus:device.function, lower-case hex.
BDF_RE = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")

VENDOR_ID = 0x1E52
PCI_DEVICE_IDS = {0x401E: "wormhole_b0", 0xB140: "blackhole", 0xFACA: "grayskull"}
PCI_DEVICE_FOR_ARCH = {arch: dev for dev, arch in PCI_DEVICE_IDS.items()}


@dataclass(frozen=True)
class ArchFacts:
    """What an architecture's chips have: Ethernet and DRAM channels, and its names."""

    name: str  # as tt-umd spells it
    mgd_name: str  # as tt-metal's mesh graph descriptor spells it
    eth_channels: int
    dram_channels: int
    dram_mb_per_channel: int


ARCHS = {
    "blackhole": ArchFacts("blackhole", "BLACKHOLE", 14, 8, 4096),
    "wormhole_b0": ArchFacts("wormhole_b0", "WORMHOLE_B0", 16, 6, 2048),
}


def normalize_arch(arch: str) -> str:
    """tt-umd accepts ``Wormhole`` as well as ``wormhole_b0``."""
    low = arch.strip().lower()
    return "wormhole_b0" if low.startswith("wormhole") else low


def dram_mb(arch: str, dram_harvesting_mask: int = 0) -> int:
    """DRAM of one chip: its GDDR channels minus the harvested ones."""
    facts = ARCHS[normalize_arch(arch)]
    usable = facts.dram_channels - bin(
        dram_harvesting_mask & ((1 << facts.dram_channels) - 1)
    ).count("1")
    return usable * facts.dram_mb_per_channel


@dataclass(frozen=True)
class CardFacts:
    """A card type as the driver, tt-umd and tt-smi name it, and what it carries."""

    card_type: str  # the driver's tt_card_type
    umd_board_type: str  # the cluster descriptor's board_type
    smi_board_type: str  # what tt-smi prints as board_info.board_type (before " L"/" R")
    arch: str
    chips: int  # ASICs on the card
    upi: int  # the board id's product code ((board_id >> 36) & 0xFFFFF); PCI subsystem id


CARDS = {
    c.card_type: c
    for c in (
        CardFacts("n150", "n150", "n150", "wormhole_b0", 1, 0x18),
        CardFacts("n300", "n300", "n300", "wormhole_b0", 2, 0x14),
        CardFacts("p100a", "p100", "p100a", "blackhole", 1, 0x43),
        CardFacts("p150a", "p150", "p150a", "blackhole", 1, 0x40),
        CardFacts("p150b", "p150", "p150b", "blackhole", 1, 0x41),
        CardFacts("p150c", "p150", "p150c", "blackhole", 1, 0x42),
        CardFacts("p300a", "p300", "p300a", "blackhole", 2, 0x45),
        CardFacts("p300b", "p300", "p300b", "blackhole", 2, 0x44),
        CardFacts("p300c", "p300", "p300c", "blackhole", 2, 0x46),
        CardFacts("galaxy-wormhole", "ubb", "tt-galaxy-wh", "wormhole_b0", 32, 0x35),
        CardFacts("galaxy-blackhole", "ubb_blackhole", "tt-galaxy-bh", "blackhole", 32, 0x47),
    )
}
CARD_BY_UPI = {c.upi: c for c in CARDS.values()}


def upi(board_id: int) -> int:
    """The product code in a board id (tt-smi's utils.get_board_type)."""
    return (board_id >> 36) & 0xFFFFF


def card_for_board_id(board_id: int) -> CardFacts | None:
    return CARD_BY_UPI.get(upi(board_id))


def card_dram_mb(card_type: str) -> int | None:
    """DRAM per chip from the card type alone (a real host without tt_umd)."""
    card = CARDS.get(card_type)
    if card is None:
        return None
    return 28672 if card_type == "p100a" else dram_mb(card.arch)


# A Wormhole Galaxy (``ubb``) has four trays of eight chips; tt-umd reads a chip's tray from the
# top two bits of its PCI bus number (``ClusterDescriptor.get_tray_id``: bus 0x0N -> tray 3,
# 0x4N -> 4, 0x8N -> 2, 0xcN -> 1; the conformance suite checks it against the real tt-umd).
# Its place on the tray is the descriptor's ``asic_locations`` (1..8).
WH_GALAXY_TRAY_OF_BUS = {0x00: 3, 0x40: 4, 0x80: 2, 0xC0: 1}


def wh_galaxy_tray(bus_id: str | None) -> int | None:
    """The tray of a Wormhole Galaxy chip from its bus id (``0x0041``), as tt-umd reads it."""
    if not bus_id:
        return None
    try:
        return WH_GALAXY_TRAY_OF_BUS[int(bus_id, 16) & 0xC0]
    except ValueError:
        return None


# --------------------------------------------------------------------------- Ethernet training
# How long links take to train after a reset, and how long to wait before calling one down.
# Sources (../shared/reference/field.md): tt-umd's ETH_TRAINING_TIMEOUT is 900 s, and it waits
# 60 s for Blackhole's links (tt-umd PR#531); on n300, links within a host train at once, while
# external links (cables between hosts) take 40-180 s after an asymmetric reset and often fail
# (tt-system-firmware#1271); users' multi-host runbooks reset both hosts of a cable together and
# then wait about 90 s. Blackhole's external figures are not published: "unsure", taken as
# Blackhole's 60 s timeout with twice the slack.


@dataclass(frozen=True)
class TrainingFacts:
    """Ethernet training after a reset of both ends: ``typical`` seconds until the links are up,
    ``timeout`` seconds after which a link that has not come up is down (bad cable, one end not
    reset, firmware), and where the figures come from."""

    typical: float
    timeout: float
    source: str


TRAINING = {
    ("wormhole_b0", False): TrainingFacts(1.0, 60.0, "n300 internal links train at once"),
    ("wormhole_b0", True): TrainingFacts(
        90.0, 180.0, "external links 40-180 s (tt-system-firmware#1271); runbooks wait 90 s"
    ),
    ("blackhole", False): TrainingFacts(3.0, 60.0, "tt-umd waits 60 s on Blackhole (PR#531)"),
    ("blackhole", True): TrainingFacts(60.0, 120.0, "unsure: Blackhole's 60 s, doubled"),
}


def link_training(arch: str, *, external: bool) -> TrainingFacts:
    """Training facts for links of ``arch`` within a host (``external=False``) or on cables
    between hosts (``external=True``); unknown architectures get tt-umd's own 900 s bound."""
    facts = TRAINING.get((normalize_arch(arch), external))
    return facts or TrainingFacts(90.0, 900.0, "tt-umd's ETH_TRAINING_TIMEOUT (900 s)")
