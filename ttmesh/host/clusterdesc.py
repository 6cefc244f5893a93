"""tt-umd's cluster descriptor: the topology interchange format of Tenstorrent's software.

tt-umd writes it after topology discovery and tt-metal reads it in mock mode
(``TT_METAL_MOCK_CLUSTER_DESC_PATH``). ttmesh reads it (a simulated host's topology, per-rank mock
clusters) and writes it (the simulator, per-rank files for multi-process meshes). :func:`dump`
writes the same layout, key order and quoting as tt-umd so our files read like real captures
(tests/data/captures/README.md).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ttmesh.dataclass import dataclass, field
from ttmesh.render import escaped

# The order tt-umd writes the top-level keys in.
KEY_ORDER = (
    "arch",
    "chips",
    "chip_unique_ids",
    "ethernet_connections",
    "ethernet_connections_to_remote_devices",
    "chips_with_mmio",
    "io_device_type",
    "harvesting",
    "chip_to_bus_id",
    "boards",
    "asic_locations",
    "chip_pci_bdfs",
)
HARVESTING_KEYS = (
    "noc_translation",
    "harvest_mask",
    "dram_harvesting_mask",
    "eth_harvesting_mask",
    "pcie_harvesting_mask",
    "l2cpu_harvesting_mask",
)


class DescriptorError(ValueError):
    """The file is not a cluster descriptor ttmesh can use; the message says what is wrong."""


@dataclass
class CDChip:
    """One chip as the descriptor sees it. ``id`` is the host-local UMD chip id."""

    id: int
    arch: str
    unique_id: int | None = None
    coords: list[int] | None = None  # Wormhole Ethernet coordinates [x, y, rack, shelf]
    mmio_dev: int | None = None  # N of /dev/tenstorrent/N when the chip is its own PCI device
    harvesting: dict[str, Any] = field(default_factory=dict)
    bus_id: str | None = None
    asic_location: int | None = None
    bdf: str | None = None

    @property
    def asic_id(self) -> str | None:
        return None if self.unique_id is None else format(self.unique_id, "016x")


@dataclass(frozen=True)
class Link:
    """One Ethernet link between two chips of the same descriptor, written once."""

    chip_a: int
    chan_a: int
    chip_b: int
    chan_b: int


@dataclass(frozen=True)
class RemoteLink:
    """A link from a local chip to a chip outside this descriptor, known by its unique id."""

    chip: int
    chan: int
    remote_unique_id: int
    remote_chan: int


@dataclass(frozen=True)
class Board:
    """A board and the chips on it (by descriptor chip id)."""

    board_id: int
    board_type: str
    chips: tuple[int, ...]


@dataclass
class ClusterDescriptor:
    """A whole cluster descriptor: chips, links (local and remote) and boards."""

    chips: dict[int, CDChip]
    links: list[Link] = field(default_factory=list)
    remote_links: list[RemoteLink] = field(default_factory=list)
    boards: list[Board] = field(default_factory=list)
    io_device_type: str | None = "PCIe"
    # Keys outside tt-umd's current set that a capture carried (e.g. chip_to_boardtype); kept so
    # a parsed file can be written back without losing them.
    extra: dict[str, Any] = field(default_factory=dict)

    def board_of(self, chip: int) -> Board | None:
        for board in self.boards:
            if chip in board.chips:
                return board
        return None

    def by_unique_id(self) -> dict[int, CDChip]:
        return {c.unique_id: c for c in self.chips.values() if c.unique_id is not None}


# --------------------------------------------------------------------------- parsing


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise DescriptorError(f"{what}: expected an integer, got {value!r}")
    return value


def _chip_map(data: dict, key: str) -> dict[int, Any]:
    value = data.get(key) or {}
    if not isinstance(value, dict):
        raise DescriptorError(f"{key}: expected a map of chip id to value")
    return {_int(k, key): v for k, v in value.items()}


def from_dict(data: Any) -> ClusterDescriptor:
    """Build a descriptor from parsed YAML, checking the structure tt-umd relies on."""
    try:
        return _from_dict(data)
    except DescriptorError:
        raise
    except (TypeError, ValueError, AttributeError, KeyError) as exc:
        # A value of the wrong shape (a list where a map belongs, ...): still one clear error.
        raise DescriptorError(f"malformed cluster descriptor: {exc}") from exc


def _from_dict(data: Any) -> ClusterDescriptor:
    if not isinstance(data, dict) or "arch" not in data:
        raise DescriptorError("not a cluster descriptor (no 'arch' map)")
    archs = _chip_map(data, "arch")
    chips = {cid: CDChip(id=cid, arch=str(arch).lower()) for cid, arch in archs.items()}

    def chip(cid: int, key: str) -> CDChip:
        if cid not in chips:
            raise DescriptorError(f"{key}: chip {cid} is not listed under 'arch'")
        return chips[cid]

    for cid, coords in _chip_map(data, "chips").items():
        chip(cid, "chips").coords = [int(v) for v in coords]
    for cid, uid in _chip_map(data, "chip_unique_ids").items():
        chip(cid, "chip_unique_ids").unique_id = _int(uid, "chip_unique_ids")
    for entry in data.get("chips_with_mmio") or []:
        for cid, dev in entry.items():
            chip(_int(cid, "chips_with_mmio"), "chips_with_mmio").mmio_dev = _int(
                dev, "chips_with_mmio"
            )
    for cid, harvesting in _chip_map(data, "harvesting").items():
        chip(cid, "harvesting").harvesting = dict(harvesting or {})
    for cid, bus in _chip_map(data, "chip_to_bus_id").items():
        chip(cid, "chip_to_bus_id").bus_id = bus if isinstance(bus, str) else f"0x{bus:04x}"
    for cid, loc in _chip_map(data, "asic_locations").items():
        chip(cid, "asic_locations").asic_location = _int(loc, "asic_locations")
    for cid, bdf in _chip_map(data, "chip_pci_bdfs").items():
        chip(cid, "chip_pci_bdfs").bdf = str(bdf)

    links = []
    for entry in data.get("ethernet_connections") or []:
        try:
            (a, b) = entry[:2]
            link = Link(
                _int(a["chip"], "link"),
                _int(a["chan"], "link"),
                _int(b["chip"], "link"),
                _int(b["chan"], "link"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise DescriptorError(f"ethernet_connections: malformed entry {entry!r}") from exc
        chip(link.chip_a, "ethernet_connections")
        chip(link.chip_b, "ethernet_connections")
        links.append(link)
    remote_links = []
    for entry in data.get("ethernet_connections_to_remote_devices") or []:
        try:
            (a, b) = entry[:2]
            remote = RemoteLink(
                _int(a["chip"], "remote link"),
                _int(a["chan"], "remote link"),
                _int(b["remote_chip_id"], "remote link"),
                _int(b["chan"], "remote link"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise DescriptorError(
                f"ethernet_connections_to_remote_devices: malformed entry {entry!r}"
            ) from exc
        chip(remote.chip, "ethernet_connections_to_remote_devices")
        remote_links.append(remote)
    boards = []
    for entry in data.get("boards") or []:
        try:
            fields = {k: v for item in entry for k, v in item.items()}
            board = Board(
                _int(fields["board_id"], "boards"),
                str(fields["board_type"]),
                tuple(_int(c, "boards") for c in fields["chips"]),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise DescriptorError(f"boards: malformed entry {entry!r}") from exc
        for cid in board.chips:
            chip(cid, "boards")
        boards.append(board)
    extra = {k: v for k, v in data.items() if k not in KEY_ORDER}
    return ClusterDescriptor(
        chips=dict(sorted(chips.items())),
        links=links,
        remote_links=remote_links,
        boards=boards,
        io_device_type=data.get("io_device_type"),
        extra=extra,
    )


def loads(text: str) -> ClusterDescriptor:
    from ttmesh import yamlio

    try:
        return from_dict(yamlio.loads(text))
    except ValueError as exc:
        raise DescriptorError(str(exc)) from exc


MAX_BYTES = 16 * 1024 * 1024  # a Galaxy's is about 100 KiB


def load(path: str | Path, within: str | None = None) -> ClusterDescriptor:
    """Read a descriptor file, bounded (a FIFO, a device or a huge file is a DescriptorError,
    as is text that is not UTF-8, and with ``within`` a file outside that directory); a missing
    file is an OSError."""
    from ttmesh import fileread

    try:
        text = fileread.read_text(path, MAX_BYTES, "cluster descriptor", within)
    except fileread.Refused as exc:
        raise DescriptorError(exc.why) from None
    return loads(text)


def to_plain(cd: ClusterDescriptor) -> dict[str, Any]:
    return asdict(cd)


def from_plain(data: dict[str, Any]) -> ClusterDescriptor:
    return ClusterDescriptor(
        chips={int(k): CDChip(**v) for k, v in data["chips"].items()},
        links=[Link(**x) for x in data["links"]],
        remote_links=[RemoteLink(**x) for x in data["remote_links"]],
        boards=[Board(b["board_id"], b["board_type"], tuple(b["chips"])) for b in data["boards"]],
        io_device_type=data["io_device_type"],
        extra=data["extra"],
    )


def load_cached(path: Path, cache: Path, within: str | None = None) -> ClusterDescriptor:
    """:func:`load`, remembering the parsed result in ``cache`` (JSON) while the file is unchanged.

    Parsing YAML costs tens of milliseconds on every launch; the cache is keyed by the file's
    modification time and size, so a rewritten descriptor is parsed again. The cache is written
    only into a directory of this user's, as a new file (never through a link another user put
    at its temporary name), then renamed into place.
    """
    from ttmesh import fileread

    st = path.stat()
    key = [st.st_mtime_ns, st.st_size, str(path)]
    try:
        data = json.loads(fileread.read_bytes(cache, 4 * MAX_BYTES, "parsed descriptor", within))
        if data.get("key") == key:
            return from_plain(data["descriptor"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    cd = load(path, within)
    try:
        if os.lstat(cache.parent).st_uid != os.geteuid():
            return cd  # another user's host: read it, never write into it
        tmp = cache.with_name(f".{cache.name}.{os.getpid()}")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)  # left by a killed process with this PID (this user's directory)
        with os.fdopen(os.open(tmp, flags, 0o644), "w") as f:
            f.write(json.dumps({"key": key, "descriptor": to_plain(cd)}))
        os.replace(tmp, cache)
    except OSError:
        pass
    return cd


# --------------------------------------------------------------------------- writing


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def dump(cd: ClusterDescriptor, header: Iterable[str] = ()) -> str:
    """Write ``cd`` in tt-umd's layout. ``header`` lines are written first as ``# `` comments
    (each one comment: a newline in one, e.g. a captured host's name in a title, would end the
    comment and write YAML)."""
    out: list[str] = [f"# {escaped(line)}".rstrip() for line in header]
    chips = [cd.chips[k] for k in sorted(cd.chips)]

    def chip_map(key: str, pairs: list[tuple[int, str]]) -> None:
        out.append(f"{key}:")
        if not pairs:
            out.append("  {}")
        out.extend(f"  {cid}: {text}" for cid, text in pairs)

    chip_map("arch", [(c.id, c.arch) for c in chips])
    coords = [c for c in chips if c.coords is not None]
    out.append("chips:")
    if not coords:
        out.append("  {}")
    for c in coords:
        out.append(f"  {c.id}:")
        out.extend(f"    - {v}" for v in c.coords or [])
    if any(c.unique_id is not None for c in chips):
        # tt-umd writes unique ids from the highest chip id down.
        chip_map(
            "chip_unique_ids",
            [(c.id, str(c.unique_id)) for c in reversed(chips) if c.unique_id is not None],
        )
    out.append("ethernet_connections:")
    if not cd.links:
        out.append("  []")
    for link in cd.links:
        out += [
            "  -",
            f"    - chip: {link.chip_a}",
            f"      chan: {link.chan_a}",
            f"    - chip: {link.chip_b}",
            f"      chan: {link.chan_b}",
        ]
    out.append("ethernet_connections_to_remote_devices:")
    if not cd.remote_links:
        out.append("  []")
    for remote in cd.remote_links:
        out += [
            "  -",
            f"    - chip: {remote.chip}",
            f"      chan: {remote.chan}",
            f"    - remote_chip_id: {remote.remote_unique_id}",
            f"      chan: {remote.remote_chan}",
        ]
    out.append("chips_with_mmio:")
    mmio = [c for c in chips if c.mmio_dev is not None]
    if not mmio:
        out.append("  []")
    out.extend(f"  - {c.id}: {c.mmio_dev}" for c in mmio)
    if cd.io_device_type:
        out.append(f"io_device_type: {cd.io_device_type}")
    out.append("harvesting:")
    for c in chips:
        out.append(f"  {c.id}:")
        keys = [k for k in HARVESTING_KEYS if k in c.harvesting]
        keys += [k for k in c.harvesting if k not in HARVESTING_KEYS]
        out.extend(f"    {k}: {_scalar(c.harvesting[k])}" for k in keys)
    for key, value in cd.extra.items():
        if isinstance(value, dict):
            chip_map(key, [(k, _scalar(v)) for k, v in value.items()])
    if any(c.bus_id for c in chips):
        chip_map("chip_to_bus_id", [(c.id, f'"{c.bus_id}"') for c in chips if c.bus_id])
    if cd.boards:
        out.append("boards:")
        for board in cd.boards:
            out += [
                "  -",
                f"    - board_id: {board.board_id}",
                f"    - board_type: {board.board_type}",
                "    - chips:",
            ]
            out.extend(f"        - {cid}" for cid in board.chips)
    if any(c.asic_location is not None for c in chips):
        chip_map(
            "asic_locations",
            [(c.id, str(c.asic_location)) for c in chips if c.asic_location is not None],
        )
    if any(c.bdf for c in chips):
        chip_map("chip_pci_bdfs", [(c.id, c.bdf) for c in chips if c.bdf])
    return "\n".join(out) + "\n"
