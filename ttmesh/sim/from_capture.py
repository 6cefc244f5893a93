"""A simulated host rebuilt from a field capture: ``ttmesh sim create --from-capture FILE``.

The chips come from the capture's cluster descriptor (unique ids, arch, harvesting, boards,
links, PCI addresses) and the driver's files (``/dev/tenstorrent`` numbers, card types, board
ids); without a descriptor (a host without tt-umd), from the driver's files alone, with no
links. Then the state the capture saw, where the simulator can express it: chips whose
heartbeat was frozen are dead, chips the topology had but the driver lost are gone, links the
check found down are down. What it cannot express (holders, leases, links of unknown state, ...)
is listed in ``sim/capture.json`` and shown by ``ttmesh sim show``.

The archive is read by :func:`ttmesh.recovery.capture.read_archive`, which refuses hostile
ones before anything is written; its members are then copied under ``sim/capture/`` of the new
root (files and directories first, links last, none followed).
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import re
from collections import Counter
from pathlib import Path
from typing import Any

from ttmesh import numeric
from ttmesh.dataclass import dataclass, field
from ttmesh.errors import bad_input, from_os_error
from ttmesh.host import boards as boardfacts
from ttmesh.host import clusterdesc
from ttmesh.recovery import capture as cap
from ttmesh.render import escaped, json_text, plural
from ttmesh.sim import core
from ttmesh.sim.system import SystemModel, from_dict

CAPTURE_DIR = "sim/capture"  # the archive's members, under the recreated root
CAPTURE_INFO = core.CAPTURE_INFO
INFO_SCHEMA = "ttmesh.sim-capture/1"
CLASS = f"{cap.HOST_DIR}/sys/class/tenstorrent"
IOMMU_TYPES = ("identity", "DMA", "DMA-FQ", "blocked", "unmanaged")
DEFAULT_HARVESTING = {
    "noc_translation": True,
    "harvest_mask": 0,
    "dram_harvesting_mask": 0,
    "eth_harvesting_mask": 0,
    "pcie_harvesting_mask": 0,
    "l2cpu_harvesting_mask": 0,
}
ALWAYS_NOTED = (
    "faults that show only during a reset (resets that fail, hang or renumber "
    "/dev/tenstorrent) cannot be seen in a capture",
)


@dataclass
class Node:
    """One /dev/tenstorrent/N as the capture's driver files show it."""

    dev: int
    asic: str
    bdf: str | None
    card_type: str | None
    serial: int | None
    heartbeat: int | None
    fw: str | None
    arch: str | None


@dataclass
class LockFile:
    """A tt-umd lock file to write under the recreated root's dev/shm."""

    name: str  # TT_UMD_LOCK.<...>
    type: str  # file, link or dir
    data: bytes | None = None  # a file's bytes (None: ``size`` zero bytes)
    size: int = 0
    mode: int = 0o666


@dataclass
class Recreation:
    model: SystemModel
    locks: list[LockFile] = field(default_factory=list)
    container: dict[str, bytes] = field(default_factory=dict)  # root-relative file -> bytes
    no_node: list[int] = field(default_factory=list)  # /dev/tenstorrent/N the host lacked
    node_modes: dict[int, int] = field(default_factory=dict)  # N -> its mode on the host
    dead: dict[str, int | None] = field(default_factory=dict)  # asic -> frozen heartbeat
    gone: list[str] = field(default_factory=list)
    links_down: list[tuple[str, int, str, int]] = field(default_factory=list)
    reproduced: list[str] = field(default_factory=list)
    not_reproduced: list[str] = field(default_factory=list)


def _hex(text: str | None) -> int | None:
    try:
        return int((text or "").strip(), 16)
    except ValueError:
        return None


def _nodes(ar: cap.Archive, notes: list[str]) -> dict[str, Node]:
    """asic id -> the driver node that shows it."""
    found: dict[str, Node] = {}
    for name in ar.listdir(CLASS):
        match = re.fullmatch(r"tenstorrent!([0-9]{1,6})", name)
        if not match:
            continue
        base = f"{CLASS}/{name}"

        def attr(what: str, base: str = base) -> str | None:
            text = ar.text(f"{base}/{what}")
            return text.strip() if text and text.strip() else None

        asic_value = _hex(attr("tt_asic_id"))
        if asic_value is None or not 0 <= asic_value < 1 << 64:
            notes.append(f"/dev/tenstorrent/{match.group(1)}: no readable unique id: left out")
            continue
        asic = format(asic_value, "016x")
        pci = ar.resolve(f"{base}/device")
        bdf = posixpath.basename(pci).lower() if pci else None
        if bdf is not None and not boardfacts.BDF_RE.match(bdf):
            bdf = None
        device = _hex(ar.text(f"{pci}/device")) if pci else None
        beat = attr("tt_heartbeat")
        found[asic] = Node(
            dev=int(match.group(1)),
            asic=asic,
            bdf=bdf,
            card_type=attr("tt_card_type"),
            serial=_hex(attr("tt_serial")),
            heartbeat=int(beat) if beat and numeric.digits(beat) else None,
            fw=attr("tt_fw_bundle_ver"),
            arch=boardfacts.PCI_DEVICE_IDS.get(device) if device is not None else None,
        )
    return found


def _card(
    node: Node | None, peers: list[Node], board_id: int, board_type: str | None, arch: str
) -> str | None:
    """The chip's card type: its own driver node's, a board peer's, or the board id's."""
    for n in [node, *peers]:
        if n is not None and n.card_type in boardfacts.CARDS:
            return n.card_type
    card = boardfacts.card_for_board_id(board_id)
    if card is not None:
        return card.card_type
    fits = [
        c.card_type
        for c in boardfacts.CARDS.values()
        if c.arch == arch and (board_type is None or c.umd_board_type == board_type)
    ]
    return fits[0] if fits else None


def _descriptor(ar: cap.Archive) -> clusterdesc.ClusterDescriptor | None:
    text = ar.text(cap.DESCRIPTOR)
    if text is None:
        return None
    try:
        return clusterdesc.loads(text)
    except clusterdesc.DescriptorError as exc:
        raise bad_input(
            f"{ar.path}: the capture's {cap.DESCRIPTOR} is not usable: {exc}"[:400],
            "the host's own topology was broken; the archive still holds it for reading",
        )


def plan(ar: cap.Archive) -> Recreation:
    """The simulated host a capture describes (bad input when it cannot be built)."""
    where = str(ar.path)
    notes: list[str] = []
    nodes = _nodes(ar, notes)
    ls = ar.json(cap.LS) or {}
    check = ar.json(cap.CHECK) or {}
    ls_chips = {c.get("asic_id"): c for c in ls.get("chips") or [] if isinstance(c, dict)}
    cd = _descriptor(ar)
    chips: list[dict[str, Any]] = []
    boards: list[dict[str, Any]] = []
    links: list[list[int]] = []
    remote: list[list[int]] = []
    if cd is None:
        why = next(
            (m.get("why") for m in ar.manifest.get("not_captured") or [] if isinstance(m, dict)
             and m.get("what") == "cluster descriptor"),
            "not in the capture",
        )  # fmt: skip
        notes.append(
            f"no cluster descriptor ({why}): chips from the driver's files only, without "
            "remote chips, links or harvesting"
        )
    else:
        by_dev = {n.dev: n for n in nodes.values()}
        for c in cd.chips.values():
            uid = c.unique_id
            if uid is None and c.mmio_dev is not None and c.mmio_dev in by_dev:
                uid = int(by_dev[c.mmio_dev].asic, 16)
            if uid is None:
                raise bad_input(
                    f"{where}: chip {c.id} of the cluster descriptor has no unique id",
                    "a capture's descriptor names every chip by chip_unique_ids",
                )
            asic = format(uid, "016x")
            node = nodes.get(asic)
            board = cd.board_of(c.id)
            board_id = board.board_id if board else (node.serial if node and node.serial else 0)
            peers = [
                nodes[format(o.unique_id, "016x")]
                for o in cd.chips.values()
                if board and o.id in board.chips and o.id != c.id and o.unique_id is not None
                and format(o.unique_id, "016x") in nodes
            ]  # fmt: skip
            arch = boardfacts.normalize_arch(c.arch)
            bdf = (c.bdf or (node.bdf if node else None) or "").lower() or None
            is_pci = bdf is not None or c.mmio_dev is not None
            if is_pci and bdf is None:
                raise bad_input(
                    f"{where}: chip {asic} is a PCI device with no PCI address in the capture",
                    "its driver node and the descriptor's chip_pci_bdfs are both missing",
                )
            chips.append(
                {
                    "id": c.id,
                    "unique_id": uid,
                    "arch": arch,
                    "card_type": _card(
                        node, peers, board_id, board.board_type if board else None, arch
                    ),
                    "board_id": board_id,
                    "bdf": bdf,
                    "dev_index": node.dev if node else None,
                    "harvesting": dict(c.harvesting),
                    "dram_mb": _dram(ls_chips.get(asic)),
                    "bus_id": c.bus_id,
                    "asic_location": c.asic_location,
                    "coords": c.coords,
                }
            )
        boards = [
            {"board_id": b.board_id, "board_type": b.board_type, "chips": list(b.chips)}
            for b in cd.boards
        ]
        links = [[lk.chip_a, lk.chan_a, lk.chip_b, lk.chan_b] for lk in cd.links]
        remote = [[r.chip, r.chan, r.remote_unique_id, r.remote_chan] for r in cd.remote_links]
    _add_unlisted(chips, boards, nodes, ls_chips, notes, cd is not None)
    if not chips:
        why = ar.manifest.get("driver") is None and "the host had no Tenstorrent driver"
        raise bad_input(
            f"{where}: the capture shows no chips" + (f" ({why})" if why else ""),
            "nothing to simulate; the archive's manifest.json says what was captured",
        )
    # PCI chips the driver lost (gone) still need a /dev number to be modelled: a free one.
    used = {raw["dev_index"] for raw in chips if raw["dev_index"] is not None}
    for raw in chips:
        if raw["bdf"] is not None and raw["dev_index"] is None:
            raw["dev_index"] = next(n for n in range(len(used) + len(chips) + 1) if n not in used)
            used.add(raw["dev_index"])
    manifest = ar.manifest
    host: dict[str, Any] = manifest["host"] if isinstance(manifest.get("host"), dict) else {}
    fws = Counter(n.fw for n in nodes.values() if n.fw)
    driver = (ar.text(f"{cap.HOST_DIR}/sys/module/tenstorrent/version") or "").strip()
    data: dict[str, Any] = {
        "name": "capture",
        "title": _title(host, manifest),
        "source": escaped(f"{ar.path.name} ({ar.top})"),
        "notes": [],
        "driver_version": driver or str(manifest.get("driver") or "2.10.0"),
        "fw_bundle_version": fws.most_common(1)[0][0] if fws else "19.10.0.0",
        "chips": chips,
        "boards": boards,
        "links": links,
        "remote_links": remote,
    }
    said: list[str] = []
    machine = _machine(ar, nodes, said, notes)
    if machine:
        data["machine"] = machine
    model = from_dict(data, where)
    rec = Recreation(model, reproduced=said, not_reproduced=notes)
    _state(rec, nodes, ls, check)
    _dev_nodes(ar, rec, nodes)
    _locks(ar, rec)
    _container(ar, rec)
    rec.not_reproduced.extend(ALWAYS_NOTED)
    return rec


def _title(host: dict[str, Any], manifest: dict[str, Any]) -> str:
    """Where and when the capture was taken: what the archive says is someone else's text,
    escaped (a host name with a newline must not become a line of its own)."""
    where = f"{host.get('hostname', '?')} ({host.get('root', '?')})"
    return escaped(f"captured on {where} at {manifest.get('time', '?')}")


FW_ATTRS = ("tt_fw_bundle_ver", "tt_arc_fw_ver", "tt_eth_fw_ver", "tt_m3app_fw_ver")
_VERSION = re.compile(r"[0-9]{1,9}(\.[0-9]{1,9}){2,3}")
PAGES = "hugepages/hugepages-1048576kB/nr_hugepages"


def _machine(
    ar: cap.Archive, nodes: dict[str, Node], said: list[str], notes: list[str]
) -> dict[str, Any]:
    """The machine around the chips as the capture's system files show it (the simulator's
    ``machine``: each device's firmware and NUMA node, the NUMA nodes and their 1 GiB
    hugepages, the IOMMU mode). Values that are not what the kernel or driver writes are left
    out, and said."""
    machine: dict[str, Any] = {}
    firmware: dict[str, dict[str, str]] = {}
    numa: dict[str, int] = {}
    types: Counter[str] = Counter()
    for n in nodes.values():
        if not n.bdf:
            continue
        per = {}
        for attr in FW_ATTRS:
            value = (ar.text(f"{CLASS}/tenstorrent!{n.dev}/{attr}") or "").strip()
            if _VERSION.fullmatch(value):
                per[attr] = value
        if per:
            firmware[n.bdf] = per
        pci = f"{cap.HOST_DIR}/sys/bus/pci/devices/{n.bdf}"
        node = (ar.text(f"{pci}/numa_node") or "").strip()
        if re.fullmatch(r"-1|[0-9]{1,4}", node):
            numa[n.bdf] = int(node)
        kind = (ar.text(f"{pci}/iommu_group/type") or "").strip()
        types[kind if kind in IOMMU_TYPES else "none"] += 1
    if firmware:
        machine["firmware"] = firmware
        bundles = Counter(p.get("tt_fw_bundle_ver") for p in firmware.values())
        if len(bundles) > 1:  # one bundle everywhere is what any simulated host has
            said.append(
                "firmware per chip ("
                + ", ".join(f"{v} x{c}" for v, c in bundles.most_common() if v)
                + ")"
            )
    base = f"{cap.HOST_DIR}/sys/devices/system/node"
    node_ids = sorted(int(x[4:]) for x in ar.listdir(base) if re.fullmatch(r"node[0-9]{1,4}", x))
    pages: dict[str, int] = {}
    for i in node_ids:
        value = (ar.text(f"{base}/node{i}/{PAGES}") or "").strip()
        if numeric.digits(value) and len(value) < 7:
            pages[str(i)] = int(value)
    total = (ar.text(f"{cap.HOST_DIR}/sys/kernel/mm/{PAGES}") or "").strip()
    if not pages and numeric.digits(total) and len(total) < 7:
        pages["0"] = int(total)
    if node_ids:
        machine["numa_nodes"] = max(node_ids) + 1
    if pages:
        machine["hugepages"] = pages
    if pages and sum(pages.values()) != 4 * sum(1 for n in nodes.values() if n.bdf):
        said.append(
            "1 GiB hugepages: " + ", ".join(f"{c} on node {n}" for n, c in sorted(pages.items()))
        )
    if numa:
        machine["numa"] = numa
        if len(node_ids) > 1:
            said.append(
                f"{len(node_ids)} NUMA nodes ("
                + ", ".join(f"{b} on node {n}" for b, n in sorted(numa.items()))
                + ")"
            )
    if types:
        kind, _ = types.most_common(1)[0]
        machine["iommu"] = kind
        if kind != "identity":  # a simulated host's default: IOMMU in passthrough
            said.append(f"IOMMU group type {kind}")
        if len(types) > 1:
            notes.append(
                "IOMMU group types differ between devices ("
                + ", ".join(f"{k} x{c}" for k, c in types.most_common())
                + f"): every device is in a group of type {kind}"
            )
    if not pages and not node_ids:
        notes.append(
            "no hugepage files in the capture (made before ttmesh captured them): the "
            "simulator's default hugepages (4 per device) and NUMA layout"
        )
    hwmon = _hwmon(ar, nodes, said, notes)
    if hwmon:
        machine["hwmon"] = hwmon
    by_id = _by_id(ar, nodes, said, notes)
    if by_id is not None:
        machine["by_id"] = by_id
    return machine


def _arch(n: Node) -> str:
    card = boardfacts.CARDS.get(n.card_type or "")
    return n.arch or (card.arch if card else "wormhole_b0")


def _hwmon(
    ar: cap.Archive, nodes: dict[str, Node], said: list[str], notes: list[str]
) -> dict[str, dict[str, str]]:
    """PCI address -> the hwmon files of its node (the first, as ttmesh reads it), where they
    differ from what the simulator writes; ``{}`` for a device that had no hwmon node."""
    section = (ar.manifest.get("sections") or {}).get("driver files")
    if not isinstance(section, dict) or "hwmon" not in section:
        notes.append(
            "no hwmon files in the capture (made before ttmesh captured them): the simulator's "
            "telemetry (45 °C, 35 W, 0.75 V)"
        )
        return {}
    out: dict[str, dict[str, str]] = {}
    for n in nodes.values():
        pci = ar.resolve(f"{CLASS}/tenstorrent!{n.dev}/device")
        if not n.bdf or not pci:
            continue
        found = [h for h in ar.listdir(f"{pci}/hwmon") if cap.HWMON_NODE.fullmatch(h)]
        files: dict[str, str] = {}
        for name in ar.listdir(f"{pci}/hwmon/{found[0]}") if found else []:
            value = (ar.text(f"{pci}/hwmon/{found[0]}/{name}") or "").strip()
            if not core.HWMON_FILE.fullmatch(name):
                continue
            if core.HWMON_VALUE.fullmatch(value):
                files[name] = value
            else:
                notes.append(f"{n.bdf}: hwmon {name} is not one line of text: left out")
        default = core.hwmon_files({"arch": _arch(n)})
        if files != default:
            out[n.bdf] = files
    if out:
        said.append(
            "hwmon values (temperature, power, voltage) of "
            + ", ".join(f"{b}{'' if v else ' (no hwmon node)'}" for b, v in sorted(out.items()))
        )
    return out


BY_ID = "dev/tenstorrent/by-id"


def _by_id(
    ar: cap.Archive, nodes: dict[str, Node], said: list[str], notes: list[str]
) -> dict[str, list[str]] | None:
    """asic id -> its /dev/tenstorrent/by-id names as the capture's listing shows them, where
    they differ from what tt-kmd's udev rules (and the simulator) make; None: the same. A link
    is data here: one that does not lead to a /dev/tenstorrent/N of a chip is named, not made."""
    listing = ar.json(cap.DEV_LISTING)
    if not isinstance(listing, dict) or listing.get("exists") is not True:
        return None
    entries = [e for e in listing.get("entries") or [] if isinstance(e, dict)]
    by_dev = {n.dev: n.asic for n in nodes.values() if n.bdf}
    names: dict[str, list[str]] = {asic: [] for asic in by_dev.values()}
    for e in entries:
        path = str(e.get("path"))
        if posixpath.dirname(path) != BY_ID or e.get("kind") != "link":
            continue
        name, target = posixpath.basename(path), e.get("target")
        shown = repr(str(target))[:120]
        if not core.BY_ID_NAME.fullmatch(name) or not isinstance(target, str):
            notes.append(f"/{path[:160]!r}: not a name tt-kmd's udev rules make: not made")
            continue
        lands = posixpath.normpath(posixpath.join(BY_ID, target))
        match = re.fullmatch(r"dev/tenstorrent/([0-9]{1,6})", lands)
        if target.startswith("/") or not match or int(match.group(1)) not in by_dev:
            notes.append(
                f"/{path} led to {shown}, not a chip's /dev/tenstorrent/N (ttmesh refuses such a "
                "link): not made"
            )
            continue
        names[by_dev[int(match.group(1))]].append(name)
    default = {
        n.asic: [f"{'blackhole' if _arch(n) == 'blackhole' else 'wormhole'}-{n.asic.upper()}"]
        for n in nodes.values()
        if n.bdf
    }
    if {a: sorted(v) for a, v in names.items()} == default:
        return None
    made = sorted(x for v in names.values() for x in v)
    said.append(
        "/dev/tenstorrent/by-id: "
        + (", ".join(made) if made else "none (the driver's udev rules were not there)")
    )
    return {a: sorted(v) for a, v in names.items() if v}


def _dev_nodes(ar: cap.Archive, rec: Recreation, nodes: dict[str, Node]) -> None:
    """/dev/tenstorrent/N the driver listed but the host did not have (a container started
    before a reset made them), and nodes of another mode than udev's 0666."""
    listing = ar.json(cap.DEV_LISTING)
    if not isinstance(listing, dict) or listing.get("exists") is not True:
        return
    seen: dict[int, int] = {}
    for e in listing.get("entries") or []:
        if not isinstance(e, dict):
            continue
        match = re.fullmatch(r"dev/tenstorrent/([0-9]{1,6})", str(e.get("path")))
        mode = str(e.get("mode"))
        if match and e.get("kind") in ("char", "file"):  # a device; a simulated host's file
            seen[int(match.group(1))] = (
                int(mode, 8) & 0o777 if re.fullmatch("[0-7]{4}", mode) else 0o666
            )
    gone = {nodes[a].dev for a in rec.gone if a in nodes}
    for n in sorted(x.dev for x in nodes.values() if x.bdf):
        if n not in seen and n not in gone:
            rec.no_node.append(n)
        elif n in seen and seen[n] != 0o666:
            rec.node_modes[n] = seen[n]
    if rec.no_node:
        rec.reproduced.append(
            "no device node (the driver has the chip, /dev has no node): "
            + ", ".join(f"/dev/tenstorrent/{n}" for n in rec.no_node)
            + " (sim clear or a reset makes it)"
        )
    if rec.node_modes:
        rec.reproduced.append(
            "device node modes: "
            + ", ".join(f"/dev/tenstorrent/{n} {m:04o}" for n, m in sorted(rec.node_modes.items()))
        )


LOCK_NAME = re.compile(r"TT_UMD_LOCK\.[A-Za-z0-9][A-Za-z0-9_.+-]{0,199}")
MAX_LOCK_BYTES = 64  # tt-umd's largest lock file
MAX_ZEROS = 1 << 20  # a file of another size is made of zeros up to this size


def _locks(ar: cap.Archive, rec: Recreation) -> None:
    """tt-umd's lock files the capture recorded, checked as user input: a name that is no lock
    file's (``../x``, a path) or bytes no lock file has refuse the archive."""
    doc = ar.json(cap.UMD_LOCKS)
    if doc is None:
        return
    entries = doc.get("locks") if isinstance(doc, dict) else None
    if not isinstance(entries, list) or len(entries) > umdlocks_max():
        raise cap._refuse(ar.path, f"{cap.UMD_LOCKS} is not a list of lock files")
    said, cannot = rec.reproduced, rec.not_reproduced
    names = set()
    for item in entries:
        name = item.get("file") if isinstance(item, dict) else None
        if not isinstance(name, str) or not LOCK_NAME.fullmatch(name) or name in names:
            raise cap._refuse(ar.path, f"{cap.UMD_LOCKS} names {str(name)[:80]!r}, no lock file")
        names.add(name)
        kind, state, size = item.get("type"), item.get("state"), item.get("size")
        if kind == "file":
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise cap._refuse(ar.path, f"{cap.UMD_LOCKS}: {name} has no size")
            mode = str(item.get("mode", "0666"))
            lock = LockFile(name, "file", size=size,
                            mode=int(mode, 8) & 0o777 if re.fullmatch("[0-7]{4}", mode) else 0o666)  # fmt: skip
            hexed = item.get("bytes")
            if hexed is not None:
                try:
                    data = bytes.fromhex(hexed) if isinstance(hexed, str) else None
                except ValueError:
                    data = None
                if data is None or len(data) > MAX_LOCK_BYTES or len(data) != size:
                    raise cap._refuse(
                        ar.path, f"{cap.UMD_LOCKS}: {name} has bytes no lock file has"
                    )
                if state == "held":
                    # No process holds it here: the kernel's mark of an owner that died.
                    word = int.from_bytes(data[:4], "little") | 0x40000000
                    data = word.to_bytes(4, "little") + data[4:]
                    cannot.append(
                        f"tt-umd lock {name} was held by pid {item.get('owner_pid')} "
                        f"({item.get('user', '?')}: {str(item.get('cmd', '?'))[:80]}): no process "
                        "holds it here, it is left as a dead owner's (its lock word marked "
                        "owner-died)"
                    )
                lock.data = data
            elif size > MAX_ZEROS:
                cannot.append(f"tt-umd lock {name} ({size} bytes, not tt-umd's): not made")
                continue
            elif size in (48, 56, 64):
                cannot.append(f"tt-umd lock {name}: its bytes were not readable: not made")
                continue
            rec.locks.append(lock)
        elif kind in ("link", "dir", "other"):
            # Only what ttmesh concluded is reproduced: a link to nowhere, a directory.
            rec.locks.append(LockFile(name, "link" if kind == "link" else "dir"))
        else:
            cannot.append(f"tt-umd lock {name}: not readable on the host: not made")
    if rec.locks:
        states = Counter(
            str(i.get("state")) for i in entries if isinstance(i, dict)
            and any(lk.name == i.get("file") for lk in rec.locks)
        )  # fmt: skip
        said.append(
            f"tt-umd lock files in dev/shm: {len(rec.locks)} ("
            + ", ".join(f"{k} x{v}" for k, v in sorted(states.items()))
            + ")"
        )


def umdlocks_max() -> int:
    from ttmesh.fabric import umdlocks

    return umdlocks.MAX_FILES


def _container(ar: cap.Archive, rec: Recreation) -> None:
    """The container the capture ran in, as the simulator models one (``sim fault container``):
    the marker files, proc/1/cgroup and proc/self/mountinfo as captured."""
    doc = ar.json(cap.CONTAINER)
    if not isinstance(doc, dict) or doc.get("container") is not True:
        return
    markers = doc.get("markers")
    if not isinstance(markers, dict):
        markers = {}
    for rel in (".dockerenv", "run/.containerenv"):
        if rel in markers:
            rec.container[rel] = b""
    for rel in ("proc/1/cgroup", "proc/self/mountinfo"):
        text = ar.files.get(ar.resolve(f"{cap.HOST_DIR}/{rel}") or "")
        if text is not None:
            rec.container[rel] = text
    signs = [str(s)[:200] for s in doc.get("signs") or []]
    rec.reproduced.append("a container (" + "; ".join(signs) + ")")


def _dram(ls_chip: dict[str, Any] | None) -> int | None:
    value = (ls_chip or {}).get("dram_mb")
    return value if isinstance(value, int) and value > 0 else None


def _add_unlisted(
    chips: list[dict[str, Any]],
    boards: list[dict[str, Any]],
    nodes: dict[str, Node],
    ls_chips: dict[Any, dict[str, Any]],
    notes: list[str],
    had_descriptor: bool,
) -> None:
    """Chips the driver shows that the descriptor does not (or every chip, without one)."""
    listed = {format(c["unique_id"], "016x") for c in chips}
    extra = sorted((n for n in nodes.values() if n.asic not in listed), key=lambda n: n.bdf or "")
    next_id = max((c["id"] for c in chips), default=-1) + 1
    by_board: dict[int, dict[str, Any]] = {}
    for n in extra:
        card = boardfacts.CARDS.get(n.card_type or "")
        arch = n.arch or (card.arch if card else None)
        if arch is None:
            notes.append(f"chip {n.asic} (/dev/tenstorrent/{n.dev}): arch unknown: left out")
            continue
        if card is None:
            card = boardfacts.card_for_board_id(n.serial or 0)
        if card is None:
            notes.append(f"chip {n.asic} (/dev/tenstorrent/{n.dev}): card type unknown: left out")
            continue
        if had_descriptor:
            notes.append(
                f"chip {n.asic} ({n.bdf}) is in the driver's files but not in the cluster "
                "descriptor: added without links or harvesting"
            )
        board_id = n.serial or 0
        chips.append(
            {
                "id": next_id,
                "unique_id": int(n.asic, 16),
                "arch": arch,
                "card_type": card.card_type,
                "board_id": board_id,
                "bdf": n.bdf,
                "dev_index": n.dev,
                "harvesting": dict(DEFAULT_HARVESTING),
                "dram_mb": _dram(ls_chips.get(n.asic)),
                "bus_id": f"0x{int(n.bdf.split(':')[1], 16):04x}" if n.bdf else None,
            }
        )
        board = next((b for b in boards if b["board_id"] == board_id), None)
        if board is None:
            board = by_board.setdefault(
                board_id,
                {"board_id": board_id, "board_type": card.umd_board_type, "chips": []},
            )
            if board not in boards:
                boards.append(board)
        board["chips"].append(next_id)
        next_id += 1


def _state(rec: Recreation, nodes: dict[str, Node], ls: dict, check: dict) -> None:
    """What the capture saw that the simulator can set (and, in words, what it cannot)."""
    model = rec.model
    say, cannot = rec.reproduced, rec.not_reproduced
    name = {c.asic_id: c.bdf or f"remote {c.asic_id}" for c in model.chips}
    bdfs = {c.asic_id: c.bdf for c in model.chips}
    asics = set(name)
    # Gone: PCI chips without a driver node, remote chips whose board has no PCI chip left.
    for c in model.chips:
        if c.bdf is not None and c.asic_id not in nodes:
            rec.gone.append(c.asic_id)
    for c in model.chips:
        if c.bdf is None:
            leads = [o for o in model.board_of(c.id).chips if model.chip(o).bdf]
            if leads and all(model.chip(o).asic_id in rec.gone for o in leads):
                rec.gone.append(c.asic_id)
    for asic in ls.get("missing") or []:
        if asic in asics and asic not in rec.gone:
            rec.gone.append(asic)
    if rec.gone:
        say.append(
            "gone (the topology has them, the driver lost them; a reset does not bring them "
            "back): " + ", ".join(name[a] for a in rec.gone)
        )
    views = [v for v in (check, ls) if isinstance(v.get("chips"), list)]
    beats: dict[str, str] = {}
    for view in reversed(views):  # check's word wins over ls's
        for chip in view["chips"]:
            if isinstance(chip, dict) and chip.get("asic_id") in asics:
                beats[chip["asic_id"]] = str(chip.get("heartbeat"))
    for asic, beat in beats.items():
        if beat == "frozen" and asic not in rec.gone:
            node = nodes.get(asic)
            rec.dead[asic] = node.heartbeat if node else None
        elif beat == "unknown" and asic not in rec.gone:
            cannot.append(f"{name[asic]}: heartbeat unknown on the host: simulated alive")
    if rec.dead:
        say.append(
            "dead (heartbeat frozen; whether a reset revived them on the host cannot be seen, "
            "here it does): " + ", ".join(name[a] for a in rec.dead)
        )
    for view in views:
        for chip in view["chips"]:
            if not isinstance(chip, dict) or chip.get("asic_id") not in asics:
                continue
            bdf = bdfs[chip["asic_id"]]
            for h in chip.get("holders") or [] if bdf else []:  # a remote chip: its lead's
                if isinstance(h, dict):
                    what = f"pid {h.get('pid')} ({h.get('user', '?')}: {h.get('cmd', '?')})"
                    line = (
                        f"{bdf} was held by {what}: no process holds it here "
                        f"(ttmesh sim fault hold {bdf} models one)"
                    )
                    if line not in cannot:
                        cannot.append(line)
            lease = chip.get("lease")
            if isinstance(lease, dict):
                line = (
                    f"{name[chip['asic_id']]} was leased by ttmesh job {lease.get('job')} "
                    f"(pid {lease.get('pid')}): not leased here"
                )
                if line not in cannot:
                    cannot.append(line)
    down_chips = set(rec.gone) | set(rec.dead)
    known = {
        frozenset({(model.chip(lk.chip_a).asic_id, lk.chan_a), (model.chip(lk.chip_b).asic_id, lk.chan_b)})
        for lk in model.links
    }  # fmt: skip
    view = next((v for v in (check, ls) if isinstance(v.get("links"), list)), {})
    unknown = 0
    for link in view.get("links") or []:
        try:
            a, b = link["a"], link["b"]
            ends = ((str(a["asic_id"]), int(a["chan"])), (str(b["asic_id"]), int(b["chan"])))
            state = link["state"]
        except (KeyError, TypeError, ValueError):
            continue
        if frozenset(ends) not in known:
            if state != "up":
                cannot.append(f"link {ends[0]}-{ends[1]} ({state}) is not in the topology")
            continue
        if state == "down" and not ({ends[0][0], ends[1][0]} & down_chips):
            rec.links_down.append((ends[0][0], ends[0][1], ends[1][0], ends[1][1]))
        elif state == "unknown":
            unknown += 1
    if rec.links_down:
        say.append(
            f"{plural(len(rec.links_down), 'link')} down (why they went down, a fault or a job killed "
            "with the fabric open, cannot be told apart)"
        )
    if unknown:
        cannot.append(
            f"{plural(unknown, 'link')} of unknown state (firmware that cannot tell): simulated up"
        )


def recreate(archive: Path, root: Path, force: bool = False) -> tuple[Recreation, Path]:
    """Build the simulated host ``archive`` describes under ``root``."""
    from ttmesh.sim.create import create

    ar = cap.read_archive(archive)
    rec = plan(ar)
    path = create(rec.model, root, force=force)
    sim = core.SimRoot(str(path))
    try:
        with sim.change() as state:
            for asic, beat in rec.dead.items():
                chip = state["chips"][asic]
                if beat is not None:
                    chip["hb_base"] = beat
                chip["alive"] = False
            for asic in rec.gone:
                chip = state["chips"][asic]
                chip["alive"] = chip["present"] = False
                if asic not in state["faults"]["permanent"]:
                    state["faults"]["permanent"].append(asic)
            state["links_down"] = sorted({sim.link_key(*lk) for lk in rec.links_down})
            sim.render(state)
        _host_files(rec, path)
        _extract(ar, path / CAPTURE_DIR)
        info = {
            "schema": INFO_SCHEMA,
            "archive": str(Path(archive).resolve()),
            "top": ar.top,
            "captured": ar.manifest.get("time"),
            "host": ar.manifest.get("host"),
            "ttmesh": ar.manifest.get("ttmesh"),
            "reproduced": rec.reproduced,
            "not_reproduced": rec.not_reproduced,
        }
        (path / CAPTURE_INFO).write_text(json_text(info, indent=1) + "\n")
    except OSError as exc:
        raise from_os_error(exc, "write the simulated host")
    return rec, path


def _host_files(rec: Recreation, root: Path) -> None:
    """What the capture saw outside the driver's tree, written into the new root: tt-umd's lock
    files, the container's files, device nodes missing or of another mode. Created exclusively,
    never through a link (the root is new)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    if rec.locks:
        shm = root / "dev/shm"
        shm.mkdir(parents=True, exist_ok=True)
        for lock in rec.locks:
            target = shm / lock.name
            if lock.type == "link":
                os.symlink(f"{lock.name}.target-not-recreated", target)
            elif lock.type == "dir":
                target.mkdir()
            else:
                fd = os.open(target, flags, 0o600)
                with os.fdopen(fd, "wb") as f:
                    if lock.data is not None:
                        f.write(lock.data)
                    else:
                        f.truncate(lock.size)
                os.chmod(target, lock.mode)
    for rel, data in rec.container.items():
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(target, flags, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    for n in rec.no_node:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(root / f"dev/tenstorrent/{n}")
    for n, mode in rec.node_modes.items():
        with contextlib.suppress(FileNotFoundError):
            os.chmod(root / f"dev/tenstorrent/{n}", mode)


def _extract(ar: cap.Archive, dest: Path) -> None:
    """The archive's members under ``dest`` (a new directory): directories and files first,
    created exclusively and never through a link, then the links (already checked to stay
    inside the archive by :func:`~ttmesh.recovery.capture.read_archive`)."""
    os.mkdir(dest, 0o755)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    for rel, data in sorted(ar.files.items()):
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(target, flags, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    for rel, link in sorted(ar.links.items()):
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(link, target)


def capture_info(root: str | os.PathLike[str]) -> dict[str, Any] | None:
    """What ``sim/capture.json`` says of a host recreated from a capture (None otherwise)."""
    try:
        data = core.read_json(str(root), CAPTURE_INFO, "capture record")
    except (OSError, core.SimError):  # none, or not readable: not a recreated host
        return None
    return data if isinstance(data, dict) and data.get("schema") == INFO_SCHEMA else None
