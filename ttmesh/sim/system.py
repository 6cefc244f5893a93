"""Stock system models: what the simulator builds (never read when discovering a real host).

A system file (``ttmesh/configs/systems/NAME.yaml``) lists every chip with its identity, PCI
address, ``/dev/tenstorrent`` number, harvesting and board, and every Ethernet link by chip and
channel. The stock files are generated from real cluster descriptors by ``scripts/gen_systems.py``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ttmesh.errors import bad_input
from ttmesh.host import boards as boardfacts
from ttmesh.host.clusterdesc import Board, CDChip, ClusterDescriptor, Link, RemoteLink
from ttmesh.sim.roots import stock_names, systems_dir

BDF_RE = boardfacts.BDF_RE


@dataclass(frozen=True)
class SimChip:
    id: int  # UMD chip id in the capture
    unique_id: int
    arch: str
    card_type: str  # the driver's tt_card_type (p300c, n300, galaxy-wormhole, ...)
    board_id: int
    bdf: str | None  # None for a remote chip (the right-hand chip of an n300)
    dev_index: int | None  # N of /dev/tenstorrent/N at creation
    harvesting: dict[str, Any]
    dram_mb: int
    bus_id: str | None = None
    asic_location: int | None = None
    coords: list[int] | None = None

    @property
    def asic_id(self) -> str:
        return format(self.unique_id, "016x")


@dataclass
class SystemModel:
    name: str
    title: str
    chips: list[SimChip]
    boards: list[Board]
    links: list[Link]
    remote_links: list[RemoteLink] = field(default_factory=list)
    source: str = ""
    notes: list[str] = field(default_factory=list)
    driver_version: str = "2.10.0"
    fw_bundle_version: str = "19.10.0.0"

    @property
    def arch(self) -> str:
        return self.chips[0].arch

    def chip(self, cid: int) -> SimChip:
        return next(c for c in self.chips if c.id == cid)

    def board_of(self, cid: int) -> Board:
        return next(b for b in self.boards if cid in b.chips)

    def to_cluster_descriptor(self) -> ClusterDescriptor:
        chips = {
            c.id: CDChip(
                id=c.id,
                arch=c.arch,
                unique_id=c.unique_id,
                coords=list(c.coords) if c.coords else None,
                mmio_dev=c.dev_index if c.bdf else None,
                harvesting=dict(c.harvesting),
                bus_id=c.bus_id,
                asic_location=c.asic_location,
                bdf=c.bdf,
            )
            for c in self.chips
        }
        return ClusterDescriptor(
            chips=dict(sorted(chips.items())),
            links=list(self.links),
            remote_links=list(self.remote_links),
            boards=list(self.boards),
            io_device_type="PCIe",
        )

    def to_dict(self) -> dict[str, Any]:
        """A plain form (JSON or YAML) that :func:`from_dict` reads back."""
        return {
            "name": self.name,
            "title": self.title,
            "source": self.source,
            "notes": list(self.notes),
            "driver_version": self.driver_version,
            "fw_bundle_version": self.fw_bundle_version,
            "chips": [
                {k: v for k, v in asdict(c).items() if v is not None or k in ("bdf", "dev_index")}
                for c in sorted(self.chips, key=lambda c: c.id)
            ],
            "boards": [
                {"board_id": b.board_id, "board_type": b.board_type, "chips": list(b.chips)}
                for b in self.boards
            ],
            "links": [[lk.chip_a, lk.chan_a, lk.chip_b, lk.chan_b] for lk in self.links],
            "remote_links": [
                [r.chip, r.chan, r.remote_unique_id, r.remote_chan] for r in self.remote_links
            ],
        }


def _need(d: dict, key: str, where: str) -> Any:
    if key not in d:
        raise bad_input(f"{where}: missing '{key}'", _format_hint())
    return d[key]


SHAPES = {
    "chips": "a list of chips, each a map with id, unique_id, arch, card_type, board_id",
    "boards": "a list of boards, each a map with board_id, board_type and chips",
    "links": "a list of links, each [chip_a, chan_a, chip_b, chan_b]",
    "remote_links": "a list of [chip, chan, remote_unique_id, remote_chan]",
}


def _check_shape(data: dict, where: str) -> None:
    """Each section has the type it must have, said in words (not a Python error)."""
    hint = _format_hint()
    for key, what in SHAPES.items():
        value = data.get(key)
        if value is None and key in ("links", "remote_links"):
            continue
        items = value if isinstance(value, list) else None
        if key in ("chips", "boards"):
            ok = items is not None and all(isinstance(v, dict) for v in items)
        else:
            ok = items is not None and all(
                isinstance(v, list) and len(v) == 4 and all(isinstance(x, int) for x in v)
                for v in items
            )
        if value is None:
            raise bad_input(f"{where}: missing '{key}'", hint)
        if not ok:
            bad = (
                next((v for v in items if not isinstance(v, dict | list)), value)
                if items
                else value
            )
            raise bad_input(
                f"{where}: malformed system description: '{key}' must be {what}, not {bad!r}"[:300],
                hint,
            )
    for raw in data["boards"]:
        if not isinstance(raw.get("chips"), list):
            raise bad_input(
                f"{where}: board {raw.get('board_id')!r}: 'chips' must be a list of chip ids", hint
            )


def from_dict(data: Any, where: str) -> SystemModel:
    """Build and validate a model; every problem is a one-line bad-input error naming ``where``."""
    if not isinstance(data, dict):
        raise bad_input(f"{where}: not a system description (expected a YAML map)")
    _check_shape(data, where)
    try:
        chips = []
        for raw in _need(data, "chips", where):
            arch = boardfacts.normalize_arch(str(_need(raw, "arch", where)))
            harvesting = dict(raw.get("harvesting") or {})
            bdf = raw.get("bdf")
            if bdf is not None:
                bdf = str(bdf).lower()
                if not BDF_RE.match(bdf):
                    raise bad_input(
                        f"{where}: chip {raw.get('id')}: malformed PCI address {bdf!r}",
                        "write it as DDDD:BB:DD.F, e.g. 0000:01:00.0",
                    )
            chips.append(
                SimChip(
                    id=int(_need(raw, "id", where)),
                    unique_id=int(_need(raw, "unique_id", where)),
                    arch=arch,
                    card_type=str(_need(raw, "card_type", where)),
                    board_id=int(_need(raw, "board_id", where)),
                    bdf=bdf,
                    dev_index=None if raw.get("dev_index") is None else int(raw["dev_index"]),
                    harvesting=harvesting,
                    dram_mb=int(
                        raw.get("dram_mb")
                        or boardfacts.dram_mb(arch, int(harvesting.get("dram_harvesting_mask", 0)))
                    ),
                    # An unquoted 0x0041 reads as an int; tt-umd writes the bus id as hex text.
                    bus_id=(
                        f"0x{raw['bus_id']:04x}"
                        if isinstance(raw.get("bus_id"), int)
                        else raw.get("bus_id")
                    ),
                    asic_location=raw.get("asic_location"),
                    coords=list(raw["coords"]) if raw.get("coords") else None,
                )
            )
        board_list = [
            Board(int(b["board_id"]), str(b["board_type"]), tuple(int(c) for c in b["chips"]))
            for b in _need(data, "boards", where)
        ]
        links = [Link(*(int(v) for v in lk)) for lk in data.get("links") or []]
        remote = [RemoteLink(*(int(v) for v in r)) for r in data.get("remote_links") or []]
    except (TypeError, ValueError, KeyError) as exc:
        raise bad_input(f"{where}: malformed system description: {exc}")
    model = SystemModel(
        name=str(data.get("name") or Path(where).stem),
        title=str(data.get("title") or ""),
        chips=chips,
        boards=board_list,
        links=links,
        remote_links=remote,
        source=str(data.get("source") or ""),
        notes=[str(n) for n in data.get("notes") or []],
        driver_version=str(data.get("driver_version") or "2.10.0"),
        fw_bundle_version=str(data.get("fw_bundle_version") or "19.10.0.0"),
    )
    validate(model, where)
    return model


def validate(model: SystemModel, where: str) -> None:
    """Reject a model the simulator could not build faithfully."""

    def fail(what: str, hint: str | None = None) -> None:
        raise bad_input(f"{where}: {what}", hint)

    if not model.chips:
        fail("no chips")
    seen: dict[str, dict[Any, int]] = {"id": {}, "unique id": {}, "PCI address": {}, "dev": {}}
    for c in model.chips:
        for what, value in (
            ("id", c.id),
            ("unique id", c.unique_id),
            ("PCI address", c.bdf),
            ("dev", c.dev_index),
        ):
            if value is None:
                continue
            if value in seen[what]:
                label = "/dev/tenstorrent number" if what == "dev" else what
                fail(f"chips {seen[what][value]} and {c.id} share the {label} {value}")
            seen[what][value] = c.id
        if c.arch not in boardfacts.ARCHS:
            fail(f"chip {c.id}: unknown arch {c.arch!r}", "use blackhole or wormhole_b0")
        if c.card_type not in boardfacts.CARDS:
            fail(
                f"chip {c.id}: unknown card type {c.card_type!r}",
                "one of " + ", ".join(sorted(boardfacts.CARDS)),
            )
        if (c.bdf is None) != (c.dev_index is None):
            fail(f"chip {c.id}: a PCI address and a /dev/tenstorrent number go together")
        if not 0 <= c.unique_id < 1 << 64:
            fail(f"chip {c.id}: unique id {c.unique_id} is not a 64-bit unsigned number")
        if c.id < 0 or (c.dev_index is not None and c.dev_index < 0):
            fail(f"chip {c.id}: chip ids and /dev/tenstorrent numbers are not negative")
    ids = set(seen["id"])
    on_board: dict[int, int] = {}
    for b in model.boards:
        for cid in b.chips:
            if cid not in ids:
                fail(f"board {b.board_id} lists chip {cid}, which is not defined")
            if cid in on_board:
                fail(f"chip {cid} is on two boards")
            on_board[cid] = b.board_id
            chip = model.chip(cid)
            if chip.board_id != b.board_id:
                fail(f"chip {cid} has board_id {chip.board_id} but is on board {b.board_id}")
            if boardfacts.CARDS[chip.card_type].umd_board_type != b.board_type:
                fail(f"chip {cid}: a {chip.card_type} card is not a {b.board_type} board")
    for c in model.chips:
        if c.id not in on_board:
            fail(f"chip {c.id} is on no board", "tt-umd rejects a chip without a board type")
        if c.bdf is None and not any(
            model.chip(o).bdf for o in model.board_of(c.id).chips if o != c.id
        ):
            fail(f"remote chip {c.id} has no chip with a PCI address on its board")
    used: dict[tuple[int, int], str] = {}
    for lk in model.links:
        for cid, chan in ((lk.chip_a, lk.chan_a), (lk.chip_b, lk.chan_b)):
            if cid not in ids:
                fail(f"link {cid}:{chan} names chip {cid}, which is not defined")
            if (cid, chan) in used:
                fail(f"channel {chan} of chip {cid} is used twice ({used[(cid, chan)]})")
            used[(cid, chan)] = f"{lk.chip_a}:{lk.chan_a}-{lk.chip_b}:{lk.chan_b}"
        if lk.chip_a == lk.chip_b:
            fail(f"link {lk.chip_a}:{lk.chan_a}-{lk.chip_b}:{lk.chan_b} joins a chip to itself")
    for r in model.remote_links:
        if r.chip not in ids:
            fail(f"remote link names chip {r.chip}, which is not defined")
        if (r.chip, r.chan) in used:
            fail(f"channel {r.chan} of chip {r.chip} is used twice ({used[(r.chip, r.chan)]})")
        used[(r.chip, r.chan)] = f"{r.chip}:{r.chan}-remote"
    for c in model.chips:
        limit = boardfacts.ARCHS[c.arch].eth_channels
        for cid, chan in used:
            if cid == c.id and not 0 <= chan < limit:
                fail(f"chip {c.id}: channel {chan} out of range 0..{limit - 1}")


# --------------------------------------------------------------------------- stock systems


def _format_hint() -> str:
    return f"a stock system file shows the format: {systems_dir() / 'quietbox2.yaml'}"


def load(name_or_path: str) -> SystemModel:
    """A stock system by name, or a system file by path."""
    from ttmesh import yamlio

    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        if name_or_path not in stock_names():
            raise bad_input(
                f"unknown system {name_or_path!r}",
                "known systems: " + ", ".join(stock_names()),
            )
        path = systems_dir() / f"{name_or_path}.yaml"
    try:
        data = yamlio.load_file(path, "system file")
    except ValueError as exc:
        raise bad_input(f"{path}: not valid YAML: {exc}")
    return from_dict(data, str(path))
