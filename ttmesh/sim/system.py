"""Stock system models: what the simulator builds (never read when discovering a real host).

A system file (``ttmesh/configs/systems/NAME.yaml``) lists every chip with its identity, PCI
address, ``/dev/tenstorrent`` number, harvesting and board, and every Ethernet link by chip and
channel. The stock files are generated from real cluster descriptors by ``scripts/gen_systems.py``.

A system of several hosts (two cabled T3Ks, four cabled Galaxies) lists ``hosts`` (each a system
of its own: chips, boards, links) and the ``cables`` between them, ``[host, chip, chan, host,
chip, chan]``. Each host is simulated in a root of its own (``ttmesh sim create --host N``); a
cable is, on each side, what tt-umd shows on a real multi-host system: a link to a remote device
(``ethernet_connections_to_remote_devices``) named by the peer chip's unique id.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from ttmesh.dataclass import dataclass, field
from ttmesh.errors import bad_input
from ttmesh.host import boards as boardfacts
from ttmesh.host.clusterdesc import Board, CDChip, ClusterDescriptor, Link, RemoteLink

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
    host: int | None = None  # this host's index in a system of several hosts
    hosts: int = 1  # how many hosts that system has
    # The machine around the chips (NUMA nodes, 1 GiB hugepages, IOMMU, per-device firmware and
    # NUMA node), as ``sim.core.SimRoot.render_system`` writes it; {}: its defaults.
    machine: dict[str, Any] = field(default_factory=dict)
    # Every cable of the system this host is part of, by host index, chip unique id and
    # channel (host_a, unique_id_a, chan_a, host_b, unique_id_b, chan_b): the shared cable
    # state (sim/cables.py) is made from it. Not in to_dict: the root's system.json names the
    # shared state's directory instead.
    system_cables: list[tuple[int, int, int, int, int, int]] = field(default_factory=list)

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
        where = {} if self.host is None else {"host": self.host, "hosts": self.hosts}
        return {
            "name": self.name,
            "title": self.title,
            "source": self.source,
            "notes": list(self.notes),
            "driver_version": self.driver_version,
            "fw_bundle_version": self.fw_bundle_version,
            **where,
            **({"machine": self.machine} if self.machine else {}),
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
        machine=dict(data.get("machine") or {}),
    )
    if data.get("host") is not None:
        model.host, model.hosts = _index(data, "host", where), _index(data, "hosts", where)
    validate(model, where)
    return model


def _index(data: dict, key: str, where: str) -> int:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise bad_input(f"{where}: '{key}' must be a whole number, not {value!r}")
    return value


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


# --------------------------------------------------------------------------- several hosts


@dataclass(frozen=True)
class Cable:
    """An Ethernet cable between chips of two hosts (host indexes and host-local chip ids)."""

    host_a: int
    chip_a: int
    chan_a: int
    host_b: int
    chip_b: int
    chan_b: int

    def ends(self) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        return (self.host_a, self.chip_a, self.chan_a), (self.host_b, self.chip_b, self.chan_b)


@dataclass
class ClusterModel:
    """A system of several hosts and the cables between them."""

    name: str
    title: str
    hosts: list[SystemModel]
    cables: list[Cable]
    source: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def arch(self) -> str:
        return self.hosts[0].arch

    @property
    def chip_count(self) -> int:
        return sum(len(h.chips) for h in self.hosts)

    def host(self, index: int) -> SystemModel:
        """Host ``index`` as one simulated host: its chips, and every cable as a link to a
        remote device named by the peer chip's unique id (what tt-umd shows on that host)."""
        if not 0 <= index < len(self.hosts):
            raise bad_input(
                f"{self.name} has no host {index}", f"its hosts are 0..{len(self.hosts) - 1}"
            )
        base = self.hosts[index]
        remote = list(base.remote_links)
        for cable in self.cables:
            for (h, chip, chan), (ph, pchip, pchan) in (cable.ends(), cable.ends()[::-1]):
                if h == index:
                    peer = self.hosts[ph].chip(pchip).unique_id
                    remote.append(RemoteLink(chip, chan, peer, pchan))
        return SystemModel(
            name=self.name,
            title=f"{self.title} (host {index} of {len(self.hosts)})",
            chips=list(base.chips),
            boards=list(base.boards),
            links=list(base.links),
            remote_links=remote,
            source=base.source or self.source,
            notes=[*self.notes, *base.notes],
            driver_version=base.driver_version,
            fw_bundle_version=base.fw_bundle_version,
            host=index,
            hosts=len(self.hosts),
            system_cables=[self._by_unique_id(c) for c in self.cables],
        )

    def _by_unique_id(self, c: Cable) -> tuple[int, int, int, int, int, int]:
        uid_a = self.hosts[c.host_a].chip(c.chip_a).unique_id
        uid_b = self.hosts[c.host_b].chip(c.chip_b).unique_id
        return (c.host_a, uid_a, c.chan_a, c.host_b, uid_b, c.chan_b)

    def to_dict(self) -> dict[str, Any]:
        hosts = []
        for h in self.hosts:
            d = h.to_dict()
            hosts.append({k: v for k, v in d.items() if k not in ("name", "title", "notes")})
        return {
            "name": self.name,
            "title": self.title,
            "source": self.source,
            "notes": list(self.notes),
            "hosts": hosts,
            "cables": [list(c.__dict__.values()) for c in self.cables],
        }


def _cluster_from_dict(data: dict, where: str) -> ClusterModel:
    raw_hosts = data["hosts"]
    if not isinstance(raw_hosts, list) or len(raw_hosts) < 2:
        raise bad_input(
            f"{where}: 'hosts' must list two or more hosts",
            "a single host is described without 'hosts'",
        )
    name = str(data.get("name") or Path(where).stem)
    hosts = []
    for i, raw in enumerate(raw_hosts):
        if not isinstance(raw, dict):
            raise bad_input(f"{where}: hosts[{i}] is not a map of chips, boards and links")
        merged = {"name": name, "title": data.get("title") or "", **raw}
        merged.pop("host", None)
        merged.pop("hosts", None)
        hosts.append(from_dict(merged, f"{where}: hosts[{i}]"))
    cables = []
    for raw in data.get("cables") or []:
        if not (
            isinstance(raw, list)
            and len(raw) == 6
            and all(isinstance(v, int) and not isinstance(v, bool) for v in raw)
        ):
            raise bad_input(
                f"{where}: malformed cable {raw!r}"[:300],
                "a cable is [host, chip, chan, host, chip, chan]",
            )
        cables.append(Cable(*raw))
    model = ClusterModel(
        name=name,
        title=str(data.get("title") or ""),
        hosts=hosts,
        cables=cables,
        source=str(data.get("source") or ""),
        notes=[str(n) for n in data.get("notes") or []],
    )
    validate_cluster(model, where)
    return model


def validate_cluster(model: ClusterModel, where: str) -> None:
    """Unique ids are unique across hosts; every cable joins two defined chips of two hosts on
    channels nothing else uses."""

    def fail(what: str, hint: str | None = None) -> None:
        raise bad_input(f"{where}: {what}", hint)

    owner: dict[int, tuple[int, int]] = {}
    for i, host in enumerate(model.hosts):
        for c in host.chips:
            if c.unique_id in owner:
                h, cid = owner[c.unique_id]
                fail(
                    f"host {h} chip {cid} and host {i} chip {c.id} share the unique id {c.unique_id}"
                )
            owner[c.unique_id] = (i, c.id)
    used: dict[tuple[int, int, int], str] = {}
    for i, host in enumerate(model.hosts):
        for lk in host.links:
            used[(i, lk.chip_a, lk.chan_a)] = used[(i, lk.chip_b, lk.chan_b)] = "a link"
        for r in host.remote_links:
            used[(i, r.chip, r.chan)] = "a remote link"
    for cable in model.cables:
        text = "{}:{}:{}-{}:{}:{}".format(*cable.__dict__.values())
        if cable.host_a == cable.host_b:
            fail(
                f"cable {text} joins host {cable.host_a} to itself",
                "list it under the host's links",
            )
        for h, chip, chan in cable.ends():
            if not 0 <= h < len(model.hosts):
                fail(f"cable {text} names host {h}, which is not defined")
            ids = {c.id for c in model.hosts[h].chips}
            if chip not in ids:
                fail(f"cable {text} names chip {chip} of host {h}, which is not defined")
            limit = boardfacts.ARCHS[model.hosts[h].chip(chip).arch].eth_channels
            if not 0 <= chan < limit:
                fail(f"cable {text}: channel {chan} out of range 0..{limit - 1}")
            if (h, chip, chan) in used:
                fail(
                    f"channel {chan} of host {h} chip {chip} is used twice ({used[(h, chip, chan)]} and cable {text})"
                )
            used[(h, chip, chan)] = f"cable {text}"


# --------------------------------------------------------------------------- stock systems


def systems_dir() -> Path:
    """Where the stock system files are (inside the package, so a wheel carries them)."""
    return Path(__file__).resolve().parent.parent / "configs" / "systems"


def stock_names() -> list[str]:
    """The stock systems ``--sim NAME`` and ``sim create --system NAME`` know, by name."""
    return sorted(p.stem for p in systems_dir().glob("*.yaml"))


def _format_hint() -> str:
    return f"a stock system file shows the format: {systems_dir() / 'quietbox2.yaml'}"


def load_any(name_or_path: str) -> SystemModel | ClusterModel:
    """A stock system by name, or a system file by path: one host, or several."""
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
    if isinstance(data, dict) and "hosts" in data:
        return _cluster_from_dict(data, str(path))
    return from_dict(data, str(path))


def load(name_or_path: str) -> SystemModel:
    """A system of one host (a system of several is refused: each host is built on its own)."""
    return load_host(name_or_path, None)


def load_host(name_or_path: str, host: int | None) -> SystemModel:
    """One host: the system itself, or host ``host`` of a system of several."""
    model = load_any(name_or_path)
    if isinstance(model, ClusterModel):
        if host is None:
            raise bad_input(
                f"{model.name} is a system of {len(model.hosts)} hosts: each host is simulated "
                "in a root of its own",
                f"build one with ttmesh sim create --system {name_or_path} --host N --root DIR "
                f"(N = 0..{len(model.hosts) - 1})",
            )
        return model.host(host)
    if host is not None:
        raise bad_input(f"{model.name} is a single host: --host {host} names none", "drop --host")
    return model
