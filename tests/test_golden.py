"""A simulated host's files against the real captures they were generated from.

The cluster descriptor a simulated root writes must describe the same system as the capture: same
chips, identities, boards, harvesting, MMIO numbering and links, as read both by ttmesh's parser
and by the real tt_umd. The driver files under ``sys/``, ``dev/`` and ``proc/`` must agree with the
system model.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import CAPTURES, STOCK

from ttmesh.host import boards as boardfacts
from ttmesh.host import clusterdesc
from ttmesh.sim import system

# The stock systems plus the two kept as test fixtures (tests/data/captures/README.md).
ALL = [*STOCK, "n300x2", "p300x2-disconnected"]


def _capture_path(model: system.SystemModel) -> Path:
    prefix = "shared/reference/cluster-descriptors/"
    assert model.source.startswith(prefix), model.source
    path = CAPTURES / model.source[len(prefix) :]
    assert path.is_file(), path
    return path


def _undirected(links: list[clusterdesc.Link]) -> set[frozenset[tuple[int, int]]]:
    out = {frozenset({(lk.chip_a, lk.chan_a), (lk.chip_b, lk.chan_b)}) for lk in links}
    assert len(out) == len(links), "a link is listed twice"
    return out


@pytest.fixture
def sim_and_capture(
    request: pytest.FixtureRequest, make_sim: Callable[..., Path]
) -> tuple[system.SystemModel, Path, Path]:
    name = request.param
    model = system.load(name)
    return model, make_sim(name), _capture_path(model)


@pytest.mark.parametrize("sim_and_capture", ALL, indirect=True)
def test_cluster_descriptor_matches_capture(
    sim_and_capture: tuple[system.SystemModel, Path, Path],
) -> None:
    model, root, capture_path = sim_and_capture
    sim = clusterdesc.load(root / "cluster_descriptor.yaml")
    cap = clusterdesc.load(capture_path)

    assert sorted(sim.chips) == sorted(cap.chips)
    assert sorted(sim.chips) == sorted(c.id for c in model.chips)
    for cid, want in cap.chips.items():
        got = sim.chips[cid]
        assert got.arch == boardfacts.normalize_arch(want.arch), cid
        if want.unique_id is not None:
            assert got.unique_id == want.unique_id, cid
        else:
            # The capture has none; the simulator invents one (a chip needs an identity).
            assert got.unique_id == model.chip(cid).unique_id, cid
        assert got.harvesting == want.harvesting, cid
        assert got.mmio_dev == want.mmio_dev, cid
        if want.coords is not None:
            assert got.coords == want.coords, cid
        if want.asic_location is not None:
            assert got.asic_location == want.asic_location, cid
        if want.bus_id is not None:
            assert int(got.bus_id or "-1", 16) == int(want.bus_id, 16), cid
        if want.bdf is not None:
            assert got.bdf == want.bdf.lower(), cid
        # Every PCI chip has an address in the simulator (the driver shows one), no remote chip has.
        assert (got.bdf is not None) == (want.mmio_dev is not None), cid
    # Unique ids are identities: no two chips share one.
    uids = [c.unique_id for c in sim.chips.values()]
    assert len(set(uids)) == len(uids)

    def boards(cd: clusterdesc.ClusterDescriptor) -> set[tuple[int, str, frozenset[int]]]:
        return {(b.board_id, b.board_type, frozenset(b.chips)) for b in cd.boards}

    assert boards(sim) == boards(cap)
    assert len(sim.boards) == len(cap.boards)

    def mmio(cd: clusterdesc.ClusterDescriptor) -> dict[int, int]:
        return {c.id: c.mmio_dev for c in cd.chips.values() if c.mmio_dev is not None}

    assert mmio(sim) == mmio(cap)
    assert mmio(sim) == {c.id: c.dev_index for c in model.chips if c.bdf is not None}
    assert _undirected(sim.links) == _undirected(cap.links)
    assert set(sim.remote_links) == set(cap.remote_links)
    assert len(sim.remote_links) == len(cap.remote_links)


def _umd_view(text: str) -> dict[str, Any]:
    import tt_umd

    cd = tt_umd.ClusterDescriptor.create_from_yaml_content(text)
    links = set()
    for a, chans in cd.get_ethernet_connections().items():
        for ca, (b, cb) in chans.items():
            links.add(frozenset({(a, ca), (b, cb)}))
    return {
        "chips": sorted(cd.get_all_chips()),
        "mmio": dict(cd.get_chips_with_mmio()),
        "uids": dict(cd.get_chip_unique_ids()),
        "links": links,
        "bdfs": {k: v.lower() for k, v in dict(cd.get_chip_pci_bdfs()).items()},
        "boards": {
            c: (cd.get_board_id_for_chip(c), str(cd.get_board_type(c))) for c in cd.get_all_chips()
        },
        "remote": {c: cd.is_chip_remote(c) for c in cd.get_all_chips()},
    }


@pytest.mark.parametrize("sim_and_capture", ALL, indirect=True)
def test_tt_umd_reads_the_same_system(
    sim_and_capture: tuple[system.SystemModel, Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TT_LOGGER_LEVEL", "error")
    model, root, capture_path = sim_and_capture
    sim = _umd_view((root / "cluster_descriptor.yaml").read_text())
    cap = _umd_view(capture_path.read_text())
    ours = clusterdesc.load(capture_path)

    assert sim["chips"] == cap["chips"] == sorted(c.id for c in model.chips)
    assert sim["mmio"] == cap["mmio"]
    for cid, chip in ours.chips.items():
        if chip.unique_id is not None:
            assert sim["uids"][cid] == cap["uids"][cid] == chip.unique_id
        else:
            assert sim["uids"][cid] == model.chip(cid).unique_id
    assert sim["links"] == cap["links"]
    assert len(sim["links"]) == len(model.links)
    # Captures without chip_pci_bdfs get addresses in the simulator; where the capture has them they
    # are the same. tt_umd sees exactly one address per PCI chip.
    for cid, bdf in cap["bdfs"].items():
        assert sim["bdfs"][cid] == bdf
    assert sim["bdfs"] == {c.id: c.bdf for c in model.chips if c.bdf is not None}
    assert sim["boards"] == cap["boards"]
    assert sim["remote"] == cap["remote"]
    assert sim["remote"] == {c.id: c.bdf is None for c in model.chips}


# --------------------------------------------------------------------------- driver files


def _read(path: Path) -> str:
    return path.read_text().strip()


@pytest.mark.parametrize("name", ALL)
def test_sysfs_agrees_with_model(name: str, make_sim: Callable[..., Path]) -> None:
    model = system.load(name)
    root = make_sim(name)
    pci = [c for c in model.chips if c.bdf is not None]

    marker = json.loads((root / ".ttmesh-sim").read_text())
    assert marker["system"] == name
    assert _read(root / "sys/module/tenstorrent/version") == model.driver_version

    class_dir = root / "sys/class/tenstorrent"
    assert sorted(p.name for p in class_dir.iterdir()) == sorted(
        f"tenstorrent!{c.dev_index}" for c in pci
    )
    dev_dir = root / "dev/tenstorrent"
    assert sorted(p.name for p in dev_dir.iterdir() if p.name != "by-id") == sorted(
        str(c.dev_index) for c in pci
    )
    assert sorted(p.name for p in (root / "sys/bus/pci/devices").iterdir()) == sorted(
        c.bdf for c in pci if c.bdf
    )
    device_id = {"blackhole": "0xb140", "wormhole_b0": "0x401e"}
    for c in pci:
        node = class_dir / f"tenstorrent!{c.dev_index}"
        assert _read(node / "tt_asic_id") == c.asic_id
        assert _read(node / "tt_card_type") == c.card_type
        assert _read(node / "tt_serial") == format(c.board_id, "016x")
        assert os.path.basename(os.path.realpath(node / "device")) == c.bdf
        pci_dir = root / "sys/bus/pci/devices" / str(c.bdf)
        assert os.path.realpath(node / "device") == os.path.realpath(pci_dir)
        assert _read(pci_dir / "vendor") == "0x1e52"
        assert _read(pci_dir / "device") == device_id[c.arch]
        assert (root / f"dev/tenstorrent/{c.dev_index}").is_file()
        # tt-kmd's udev rule: {wormhole,blackhole}-%s{tt_asic_id}, the id as %08X%08X
        family = "wormhole" if c.arch.startswith("wormhole") else "blackhole"
        by_id = dev_dir / "by-id" / f"{family}-{c.asic_id.upper()}"
        assert os.path.realpath(by_id) == os.path.realpath(dev_dir / str(c.dev_index))
        assert (root / f"proc/driver/tenstorrent/{c.dev_index}/pids").read_text() == ""
    assert sorted(p.name for p in (root / "proc/driver/tenstorrent").iterdir()) == sorted(
        str(c.dev_index) for c in pci
    )


# --------------------------------------------------------------------------- the parser itself


@pytest.mark.parametrize("capture", sorted(p.name for p in CAPTURES.glob("*.yaml")))
def test_dump_round_trips_every_capture(capture: str) -> None:
    """What ttmesh writes reads back as what it read (the simulator's files depend on it)."""
    first = clusterdesc.load(CAPTURES / capture)
    text = clusterdesc.dump(first)
    again = clusterdesc.loads(text)
    assert again.chips == first.chips
    assert again.links == first.links
    assert again.remote_links == first.remote_links
    assert again.boards == first.boards
    assert clusterdesc.dump(again) == text


@pytest.mark.parametrize(
    "text",
    [
        "arch: {0: blackhole}\nchips: {0: 5}\n",
        "arch: {0: blackhole}\nchips_with_mmio: [0]\n",
        "arch: {0: blackhole}\nharvesting: {0: 5}\n",
        "arch: {0: blackhole}\nethernet_connections: 5\n",
        "arch: [blackhole]\n",
        "arch: {0: blackhole}\nchip_unique_ids: {1: 5}\n",
        "arch: {0: blackhole}\nethernet_connections: [[{chip: 0, chan: 1}]]\n",
        "arch: {0: blackhole}\nboards: [[{board_id: 1}, {board_type: p150}, {chips: 5}]]\n",
        "- not a map\n",
        "arch: {0: blackhole\n",
    ],
)
def test_malformed_descriptor_is_a_descriptor_error(text: str) -> None:
    with pytest.raises(clusterdesc.DescriptorError) as info:
        clusterdesc.loads(text)
    assert "\n" not in str(info.value)
