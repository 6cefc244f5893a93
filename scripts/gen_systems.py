#!/usr/bin/env python3
"""Generate ttmesh/configs/systems/*.yaml from real tt-umd cluster descriptors.

Each stock system the simulator can build is derived from one capture in
shared/reference/cluster-descriptors (vendored in tests/data/captures). What a capture does not say
(the driver's card type, PCI addresses some captures omit, unique ids the n150 capture omits) comes
from the table below and is written into the file's ``notes``.

Usage: python scripts/gen_systems.py [--captures DIR] [--out DIR] [--check]
  --check   exit 1 when a generated file differs from the one on disk (used by the tests)
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ttmesh.host import boards as boardfacts  # noqa: E402
from ttmesh.host import clusterdesc  # noqa: E402
from ttmesh.sim.system import from_dict, load_any  # noqa: E402

# name: (capture file, title). The driver's card type comes from each board id's product code
# (bits 36.., as tt-smi and the driver decode it), so tt_card_type, tt-smi's board_type and the
# capture's boards always agree. QuietBox 2's constructed capture keeps the board ids of the two
# p300 cards it was built from, which decode as p300a.
SYSTEMS = {
    "p150": ("p150.yaml", "One p150a card: 1 Blackhole chip"),
    "p300": ("p300.yaml", "One p300a card: 2 Blackhole chips linked on the card"),
    "quietbox2": ("quietbox2.yaml", "QuietBox 2: 2 x p300, 4 Blackhole chips cabled as a 2x2 ring"),
    "p150x4": ("p150x4.yaml", "QuietBox (Blackhole): 4 x p150b cabled as a ring"),
    "p150x8": ("p150x8.yaml", "LoudBox: 8 x p150b, a 2x4 mesh"),
    "n150": ("n150.yaml", "One n150 card: 1 Wormhole chip"),
    "n300": ("n300.yaml", "One n300 card: a PCIe chip and a remote chip"),
    "t3k": ("t3k.yaml", "T3000: 4 x n300, 8 Wormhole chips as a 2x4 mesh"),
    "galaxy-wh": ("galaxy-wh.yaml", "Wormhole 6U Galaxy: 32 chips, 8x4 mesh"),
    "galaxy-bh": ("galaxy-bh.yaml", "Blackhole Galaxy: 32 chips, 8x4 mesh"),
    "n300x2": (
        "n300x2.yaml",
        "tt-umd's 2x2 n300 test fixture (4 Wormhole chips in a ring; not a real capture)",
    ),
    "p300x2-disconnected": (
        "p300x2-disconnected.yaml",
        "2 x p300 without the card-to-card cable (negative case)",
    ),
}


# Systems of several hosts: name -> (one capture per host, title). Each host's capture is what
# tt-umd wrote on that host; its links to remote devices that name a chip of another host of the
# system become cables. A capture listed twice is a second machine of the same kind: its unique
# ids and board serials are invented (product code kept), as a real second machine has its own.
MULTI = {
    "dual-t3k": (
        ["dual-t3k-host0.yaml", "dual-t3k-host1.yaml"],
        "Two T3000s cabled as one Wormhole mesh (tt-metal's dual-T3K: 1x16 over 2 hosts)",
    ),
    "quad-galaxy": (
        [f"quad-galaxy-host{i}.yaml" for i in range(4)],
        "Four Wormhole 6U Galaxies cabled as one 8x16 torus (tt-metal's quad Galaxy: 1x4 hosts)",
    ),
    "quietbox2x2": (
        ["quietbox2.yaml", "quietbox2.yaml"],
        "Two QuietBox 2s without cables between them (torch-style jobs over two hosts)",
    ),
}


def invented_unique_id(system: str, chip: int) -> int:
    digest = hashlib.sha256(f"ttmesh-sim:{system}:{chip}".encode()).hexdigest()
    return int(digest[:11], 16)


def build(name: str, captures: Path) -> dict:
    if name in MULTI:
        return build_multi(name, captures)
    capture, title = SYSTEMS[name]
    return _host(name, title, capture, captures)


def _host(name: str, title: str, capture: str, captures: Path, copy: int = 0) -> dict:
    """One host's system from its capture; ``copy`` > 0: another machine of the same kind."""
    cd = clusterdesc.load(captures / capture)
    if copy:
        import dataclasses

        for c in cd.chips.values():
            c.unique_id = invented_unique_id(f"{name}/{copy}", c.id)
        cd.boards = [
            dataclasses.replace(b, board_id=b.board_id ^ (copy << 8) ^ 0x5A) for b in cd.boards
        ]
    notes: list[str] = []
    chips = []
    missing_uid = [c.id for c in cd.chips.values() if c.unique_id is None]
    if missing_uid:
        notes.append("unique ids invented (the capture has none): " + str(missing_uid))
    invented_bdf = []
    for c in cd.chips.values():
        board = cd.board_of(c.id)
        if board is None:
            raise SystemExit(f"{capture}: chip {c.id} is on no board")
        card = boardfacts.card_for_board_id(board.board_id)
        if card is None or board.board_type != card.umd_board_type:
            raise SystemExit(
                f"{capture}: board {board.board_id} does not decode as {board.board_type}"
            )
        bdf = c.bdf
        if c.mmio_dev is not None and bdf is None:
            bus = int(c.bus_id, 16) if c.bus_id else c.id + 1
            bdf = f"0000:{bus:02x}:00.0"
            invented_bdf.append(c.id)
        location = c.asic_location
        if location is None and board.board_type == "n300":
            location = 0 if c.mmio_dev is not None else 1
        chip = {
            "id": c.id,
            "unique_id": c.unique_id if c.unique_id is not None else invented_unique_id(name, c.id),
            "arch": c.arch,
            "card_type": card.card_type,
            "board_id": board.board_id,
            "bdf": bdf,
            "dev_index": c.mmio_dev,
            "dram_mb": boardfacts.dram_mb(c.arch, int(c.harvesting.get("dram_harvesting_mask", 0))),
            "harvesting": dict(c.harvesting),
        }
        if c.bus_id:
            chip["bus_id"] = c.bus_id
        if location is not None:
            chip["asic_location"] = location
        if c.coords:
            chip["coords"] = list(c.coords)
        chips.append(chip)
    if invented_bdf:
        notes.append(
            "PCI addresses derived (the capture has no chip_pci_bdfs): bus from chip_to_bus_id, "
            "else chip id + 1, for chips " + str(invented_bdf)
        )
    data = {
        "name": name,
        "title": title,
        "source": f"shared/reference/cluster-descriptors/{capture}",
        "notes": notes,
        "driver_version": "2.10.0",
        "fw_bundle_version": "19.10.0.0",
        "chips": chips,
        "boards": [
            {"board_id": b.board_id, "board_type": b.board_type, "chips": list(b.chips)}
            for b in cd.boards
        ],
        "links": [[lk.chip_a, lk.chan_a, lk.chip_b, lk.chan_b] for lk in cd.links],
        "remote_links": [
            [r.chip, r.chan, r.remote_unique_id, r.remote_chan] for r in cd.remote_links
        ],
    }
    from_dict(data, name)  # the generated model must pass the same validation as a user's file
    return data


def build_multi(name: str, captures: Path) -> dict:
    files, title = MULTI[name]
    hosts = []
    for i, capture in enumerate(files):
        copy = files[:i].count(capture)
        host = _host(name, title, capture, captures, copy)
        if copy:
            host["notes"].append(
                f"a second {capture.removesuffix('.yaml')}: unique ids and board serials invented"
            )
        hosts.append(host)
    where = {c["unique_id"]: (h, c["id"]) for h, host in enumerate(hosts) for c in host["chips"]}
    cables, seen = [], set()
    remote = [list(host["remote_links"]) for host in hosts]
    for h, host in enumerate(hosts):
        kept = []
        for chip, chan, uid, peer_chan in host["remote_links"]:
            if uid not in where:
                kept.append([chip, chan, uid, peer_chan])  # outside the system: stays remote
                continue
            ph, pchip = where[uid]
            mine = next(c["unique_id"] for c in host["chips"] if c["id"] == chip)
            back = [r for r in remote[ph] if r[:2] == [pchip, peer_chan]]
            if back != [[pchip, peer_chan, mine, chan]]:
                raise SystemExit(f"{name}: host {h} chip {chip} ch{chan} has no matching far end")
            key = tuple(sorted([(h, chip, chan), (ph, pchip, peer_chan)]))
            if key not in seen:
                seen.add(key)
                cables.append([*key[0], *key[1]])
        host["remote_links"] = kept
    shared = {capture for capture, _title in SYSTEMS.values()}
    sources = [
        f"shared/reference/cluster-descriptors/{f}" if f in shared else f"tests/data/captures/{f}"
        for f in files
    ]
    for host, src in zip(hosts, sources, strict=True):
        host["source"] = src
        for key in ("name", "title"):
            host.pop(key)
    data = {
        "name": name,
        "title": title,
        "source": ", ".join(dict.fromkeys(sources)),
        "notes": [],
        "hosts": [{k: v for k, v in h.items() if k != "notes" or v} for h in hosts],
        "cables": sorted(cables),
    }
    return data


def render(data: dict) -> str:
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    def flow_list(dumper: yaml.SafeDumper, value: list) -> yaml.Node:
        flow = all(isinstance(v, int) for v in value)
        return dumper.represent_sequence("tag:yaml.org,2002:seq", value, flow_style=flow)

    Dumper.add_representer(list, flow_list)
    head = (
        f"# {data['title']}\n"
        f"# Generated by scripts/gen_systems.py from {data['source']}.\n"
        "# Change the generator (or the capture), not this file. Links: [chip, chan, chip, chan];\n"
        "# remote_links: [chip, chan, remote unique id, remote chan].\n"
    )
    if "hosts" in data:
        head += "# cables (between hosts): [host, chip, chan, host, chip, chan].\n"
    return head + yaml.dump(data, Dumper=Dumper, sort_keys=False, width=100)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--captures", type=Path, default=REPO / "tests" / "data" / "captures")
    parser.add_argument("--out", type=Path, default=REPO / "ttmesh" / "configs" / "systems")
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    stale = []
    for name in [*SYSTEMS, *MULTI]:
        text = render(build(name, args.captures))
        target = args.out / f"{name}.yaml"
        if args.check:
            if not target.exists() or target.read_text() != text:
                stale.append(name)
        else:
            target.write_text(text)
            load_any(str(target))  # as ttmesh reads it (a system of several hosts validated whole)
    if stale:
        print("out of date: " + ", ".join(stale) + " (run scripts/gen_systems.py)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
