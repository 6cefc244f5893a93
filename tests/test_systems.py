"""Stock system models: they load, they are up to date with the captures, bad ones are refused.

A system file is user input (``ttmesh sim create --system FILE``), so every problem with one must be
a :class:`TTMeshError` with the bad-input code (2) and a single line that names the problem, and
``sim create`` must leave the target directory as it found it.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import CAPTURES, REPO, STOCK

from ttmesh.errors import BAD_INPUT, TTMeshError
from ttmesh.host import boards as boardfacts
from ttmesh.sim import system

EXTRA = ["n300x2", "p300x2-disconnected"]
MULTI = ["dual-t3k", "quad-galaxy", "quietbox2x2"]

# (chips, PCI chips, local links, links to remote devices, arch): README.md of the captures.
SHAPES = {
    "p150": (1, 1, 0, 0, "blackhole"),
    "p300": (2, 2, 2, 0, "blackhole"),
    "quietbox2": (4, 4, 8, 0, "blackhole"),
    "p150x4": (4, 4, 16, 0, "blackhole"),
    "p150x8": (8, 8, 24, 8, "blackhole"),
    "n150": (1, 1, 0, 0, "wormhole_b0"),
    "n300": (2, 1, 2, 0, "wormhole_b0"),
    "t3k": (8, 4, 20, 0, "wormhole_b0"),
    "galaxy-wh": (32, 32, 208, 0, "wormhole_b0"),
    "galaxy-bh": (32, 32, 140, 32, "blackhole"),
    "n300x2": (4, 2, 8, 0, "wormhole_b0"),
    "p300x2-disconnected": (4, 4, 4, 0, "blackhole"),
}


# --------------------------------------------------------------------------- stock systems


def test_stock_names_are_exactly_the_known_systems() -> None:
    assert system.stock_names() == sorted(STOCK + EXTRA + MULTI)


@pytest.mark.parametrize("name", STOCK + EXTRA)
def test_stock_system_loads(name: str) -> None:
    model = system.load(name)
    chips, pci, links, remote, arch = SHAPES[name]
    assert model.name == name
    assert len(model.chips) == chips
    assert sum(1 for c in model.chips if c.bdf is not None) == pci
    assert len(model.links) == links
    assert len(model.remote_links) == remote
    assert {c.arch for c in model.chips} == {arch}
    assert model.arch == arch
    # The model names the capture it was generated from, and that capture is vendored here.
    assert model.source == f"shared/reference/cluster-descriptors/{name}.yaml"
    assert (CAPTURES / f"{name}.yaml").is_file()
    # Every chip is on exactly one board, and its card type agrees with the board's type.
    on_boards = sorted(cid for b in model.boards for cid in b.chips)
    assert on_boards == sorted(c.id for c in model.chips)
    for c in model.chips:
        board = model.board_of(c.id)
        assert board.board_id == c.board_id
        assert boardfacts.CARDS[c.card_type].umd_board_type == board.board_type
        assert (c.bdf is None) == (c.dev_index is None)
    assert model.driver_version == "2.10.0"


@pytest.mark.parametrize("name", STOCK + EXTRA)
def test_stock_system_round_trips_through_a_user_file(name: str, tmp_path: Path) -> None:
    model = system.load(name)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(model.to_dict(), sort_keys=False))
    again = system.load(str(path))
    assert again.to_dict() == model.to_dict()


def test_n300_remote_chip_is_behind_its_partner() -> None:
    model = system.load("n300")
    remote = [c for c in model.chips if c.bdf is None]
    assert [c.id for c in remote] == [1]
    assert model.chip(0).bdf == "0000:41:00.0"
    assert model.chip(0).dev_index == 1


def test_gen_systems_check_passes() -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gen_systems.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""


def test_gen_systems_check_notices_a_stale_file(tmp_path: Path) -> None:
    out = tmp_path / "systems"
    out.mkdir()
    for p in (REPO / "ttmesh" / "configs" / "systems").glob("*.yaml"):
        (out / p.name).write_text(p.read_text())
    (out / "p300.yaml").write_text((out / "p300.yaml").read_text().replace("8320", "8321"))
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gen_systems.py"), "--check", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert proc.stderr.strip() == "out of date: p300 (run scripts/gen_systems.py)"


# --------------------------------------------------------------------------- bad system files


def _base() -> dict[str, Any]:
    return copy.deepcopy(system.load("quietbox2").to_dict())


def _chip(data: dict[str, Any], cid: int) -> dict[str, Any]:
    return next(c for c in data["chips"] if c["id"] == cid)


def _missing_link_chip(d: dict[str, Any]) -> None:
    d["links"].append([0, 11, 9, 4])


def _duplicate_bdf(d: dict[str, Any]) -> None:
    _chip(d, 2)["bdf"] = _chip(d, 1)["bdf"]


def _duplicate_unique_id(d: dict[str, Any]) -> None:
    _chip(d, 3)["unique_id"] = _chip(d, 0)["unique_id"]


def _channel_twice(d: dict[str, Any]) -> None:
    d["links"].append([0, 2, 2, 11])  # chip 0 ch 2 is already the on-card link to chip 1


def _malformed_bdf(d: dict[str, Any]) -> None:
    _chip(d, 1)["bdf"] = "0000:01:00"


def _remote_channel_twice(d: dict[str, Any]) -> None:
    d["remote_links"].append([1, 9, 1234, 5])  # chip 1 ch 9 is on a local link


def _channel_out_of_range(d: dict[str, Any]) -> None:
    d["links"].append([0, 12, 2, 14])


def _link_to_itself(d: dict[str, Any]) -> None:
    d["links"].append([0, 12, 0, 13])


def _chip_on_no_board(d: dict[str, Any]) -> None:
    d["boards"][0]["chips"].remove(0)


def _board_names_missing_chip(d: dict[str, Any]) -> None:
    d["boards"][0]["chips"].append(7)


def _unknown_card_type(d: dict[str, Any]) -> None:
    _chip(d, 0)["card_type"] = "p999"


def _dev_without_bdf(d: dict[str, Any]) -> None:
    _chip(d, 0)["bdf"] = None


def _duplicate_dev(d: dict[str, Any]) -> None:
    _chip(d, 0)["dev_index"] = _chip(d, 1)["dev_index"]


def _link_not_numbers(d: dict[str, Any]) -> None:
    d["links"].append([0, "x", 2, 11])


def _missing_unique_id(d: dict[str, Any]) -> None:
    del _chip(d, 2)["unique_id"]


def _negative_unique_id(d: dict[str, Any]) -> None:
    _chip(d, 2)["unique_id"] = -5


def _huge_unique_id(d: dict[str, Any]) -> None:
    _chip(d, 2)["unique_id"] = 1 << 64


def _negative_dev(d: dict[str, Any]) -> None:
    _chip(d, 1)["dev_index"] = -1


def _board_id_mismatch(d: dict[str, Any]) -> None:
    _chip(d, 0)["board_id"] += 1


def _card_type_mismatch(d: dict[str, Any]) -> None:
    _chip(d, 0)["card_type"] = "n150"


def _no_chips(d: dict[str, Any]) -> None:
    d["chips"] = []
    d["boards"] = []
    d["links"] = []


BAD = {
    "link-to-missing-chip": (_missing_link_chip, "link 9:4 names chip 9, which is not defined"),
    "duplicate-pci-address": (
        _duplicate_bdf,
        "chips 1 and 2 share the PCI address 0000:01:00.0",
    ),
    "duplicate-unique-id": (
        _duplicate_unique_id,
        "chips 0 and 3 share the unique id 151896654217408",
    ),
    "channel-used-twice": (_channel_twice, "channel 2 of chip 0 is used twice (0:2-1:9)"),
    "malformed-pci-address": (_malformed_bdf, "chip 1: malformed PCI address '0000:01:00'"),
    "remote-channel-used-twice": (
        _remote_channel_twice,
        "channel 9 of chip 1 is used twice (0:2-1:9)",
    ),
    "channel-out-of-range": (_channel_out_of_range, "channel 14 out of range 0..13"),
    "link-to-itself": (_link_to_itself, "link 0:12-0:13 joins a chip to itself"),
    "chip-on-no-board": (_chip_on_no_board, "chip 0 is on no board"),
    "board-names-missing-chip": (
        _board_names_missing_chip,
        "board 4746770444294 lists chip 7, which is not defined",
    ),
    "unknown-card-type": (_unknown_card_type, "chip 0: unknown card type 'p999'"),
    "dev-without-bdf": (
        _dev_without_bdf,
        "chip 0: a PCI address and a /dev/tenstorrent number go together",
    ),
    "duplicate-dev": (_duplicate_dev, "share the /dev/tenstorrent number"),
    "link-not-numbers": (_link_not_numbers, "malformed system description"),
    "missing-unique-id": (_missing_unique_id, "missing 'unique_id'"),
    "negative-unique-id": (_negative_unique_id, "chip 2: unique id -5 is not a 64-bit"),
    "huge-unique-id": (_huge_unique_id, f"chip 2: unique id {1 << 64} is not a 64-bit"),
    "negative-dev": (_negative_dev, "chip 1: chip ids and /dev/tenstorrent numbers are not"),
    "board-id-mismatch": (
        _board_id_mismatch,
        "chip 0 has board_id 4746770444295 but is on board 4746770444294",
    ),
    "card-type-mismatch": (_card_type_mismatch, "chip 0: a n150 card is not a p300 board"),
    "no-chips": (_no_chips, "no chips"),
}


def _assert_bad_input(err: TTMeshError, *needles: str) -> None:
    assert err.code == BAD_INPUT == 2
    text = str(err)
    assert "\n" not in text, text
    for needle in needles:
        assert needle in text, text


@pytest.mark.parametrize("case", list(BAD))
def test_bad_system_file_is_one_line_bad_input(case: str, tmp_path: Path) -> None:
    mutate, expected = BAD[case]
    data = _base()
    mutate(data)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(TTMeshError) as info:
        system.load(str(path))
    _assert_bad_input(info.value, f"{path}: ", expected)


def test_the_unmodified_base_is_accepted(tmp_path: Path) -> None:
    """The mutations above are what is refused, not the file they start from."""
    path = tmp_path / "good.yaml"
    path.write_text(yaml.safe_dump(_base(), sort_keys=False))
    assert len(system.load(str(path)).chips) == 4


def test_unquoted_bus_id_is_kept_as_hex(tmp_path: Path) -> None:
    """``bus_id: 0x0041`` written by hand reads as an int; the descriptor still says "0x0041"."""
    text = yaml.safe_dump(system.load("n300").to_dict(), sort_keys=False)
    assert text.count("bus_id: '0x0041'") == 2
    path = tmp_path / "n300.yaml"
    path.write_text(text.replace("bus_id: '0x0041'", "bus_id: 0x0041"))
    model = system.load(str(path))
    assert [c.bus_id for c in model.chips] == ["0x0041", "0x0041"]
    desc = model.to_cluster_descriptor()
    assert [c.bus_id for c in desc.chips.values()] == ["0x0041", "0x0041"]


def test_unknown_system_name() -> None:
    with pytest.raises(TTMeshError) as info:
        system.load("nosuch")
    _assert_bad_input(info.value, "unknown system 'nosuch'", "known systems: ", *STOCK, *EXTRA)


def test_missing_system_file(tmp_path: Path) -> None:
    with pytest.raises(TTMeshError) as info:
        system.load(str(tmp_path / "none.yaml"))
    _assert_bad_input(info.value, f"system file {tmp_path / 'none.yaml'} does not exist")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("name: x\nchips: [\n", "not valid YAML"),
        ("name: x\n  chips: 1\n bad", "not valid YAML"),
        ("- just\n- a list\n", "not a system description"),
        ("", "not a system description"),
        ("name: x\nboards: []\n", "missing 'chips'"),
    ],
)
def test_a_malformed_system_file_is_refused_naming_it(
    text: str, expected: str, tmp_path: Path
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(TTMeshError) as info:
        system.load(str(path))
    _assert_bad_input(info.value, str(path), expected)


# --------------------------------------------------------------------------- sim create


def _snapshot(root: Path) -> dict[str, Any]:
    """Everything under root (names, link targets, file contents); {} when absent."""
    if not root.exists():
        return {}
    out: dict[str, Any] = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_symlink():
            out[rel] = ("link", str(p.readlink()))
        elif p.is_dir():
            out[rel] = ("dir",)
        else:
            out[rel] = ("file", p.read_bytes())
    return out


def _one_error_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("ttmesh: "), err
    return lines[0]


def test_sim_create_builds_a_root(cli: Callable[..., Any], tmp_path: Path) -> None:
    root = tmp_path / "new" / "qb2"
    r = cli("sim", "create", "--system", "quietbox2", "--root", str(root))
    assert r.code == 0, r.err
    assert r.out.strip() == f"simulated quietbox2 (4 chips) at {root}"
    assert json.loads((root / ".ttmesh-sim").read_text())["system"] == "quietbox2"


@pytest.mark.parametrize("state", ["absent", "empty", "sim"])
def test_sim_create_with_bad_system_file_changes_nothing(
    state: str, cli: Callable[..., Any], tmp_path: Path
) -> None:
    data = _base()
    _missing_link_chip(data)
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(data, sort_keys=False))
    root = tmp_path / "root"
    if state == "empty":
        root.mkdir()
    elif state == "sim":
        assert cli("sim", "create", "--system", "p150", "--root", str(root)).code == 0
    before = _snapshot(root)
    r = cli("sim", "create", "--system", str(bad), "--root", str(root), "--force")
    assert r.code == 2
    line = _one_error_line(r.err)
    assert "link 9:4 names chip 9, which is not defined" in line
    assert str(bad) in line
    assert r.out == ""
    assert root.exists() == (state != "absent")
    assert _snapshot(root) == before


def test_sim_create_with_malformed_yaml(cli: Callable[..., Any], tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nchips: [\n")
    root = tmp_path / "root"
    r = cli("sim", "create", "--system", str(bad), "--root", str(root))
    assert r.code == 2
    assert "not valid YAML" in _one_error_line(r.err)
    assert not root.exists()


def test_sim_create_unknown_system(cli: Callable[..., Any], tmp_path: Path) -> None:
    root = tmp_path / "root"
    r = cli("sim", "create", "--system", "nosuch", "--root", str(root))
    assert r.code == 2
    assert "unknown system 'nosuch'" in _one_error_line(r.err)
    assert not root.exists()


def test_sim_create_refuses_non_empty_non_sim_dir(cli: Callable[..., Any], tmp_path: Path) -> None:
    root = tmp_path / "mine"
    root.mkdir()
    (root / "notes.txt").write_text("keep me\n")
    before = _snapshot(root)
    for extra in ([], ["--force"]):
        r = cli("sim", "create", "--system", "p150", "--root", str(root), *extra)
        assert r.code == 2
        assert "is not empty and is not a simulated host" in _one_error_line(r.err)
        assert _snapshot(root) == before


def test_sim_create_refuses_existing_sim_root_without_force(
    cli: Callable[..., Any], tmp_path: Path
) -> None:
    root = tmp_path / "sim"
    assert cli("sim", "create", "--system", "p150", "--root", str(root)).code == 0
    before = _snapshot(root)
    r = cli("sim", "create", "--system", "p300", "--root", str(root))
    assert r.code == 2
    line = _one_error_line(r.err)
    assert "is already a simulated host" in line
    assert "--force" in line
    assert _snapshot(root) == before


def test_sim_create_force_recreates_a_sim_root(cli: Callable[..., Any], tmp_path: Path) -> None:
    root = tmp_path / "sim"
    assert cli("sim", "create", "--system", "p150", "--root", str(root)).code == 0
    (root / "user-file").write_text("not ours\n")
    r = cli("sim", "create", "--system", "p300", "--root", str(root), "--force")
    assert r.code == 0, r.err
    assert json.loads((root / ".ttmesh-sim").read_text())["system"] == "p300"
    assert sorted(p.name for p in (root / "dev" / "tenstorrent").iterdir()) == ["0", "1", "by-id"]
    assert (root / "user-file").read_text() == "not ours\n"


def test_sim_create_refuses_a_file_as_root(cli: Callable[..., Any], tmp_path: Path) -> None:
    root = tmp_path / "afile"
    root.write_text("data\n")
    r = cli("sim", "create", "--system", "p150", "--root", str(root), "--force")
    assert r.code == 2
    assert "exists and is not a directory" in _one_error_line(r.err)
    assert root.read_text() == "data\n"


# --------------------------------------------------------------------------- several hosts

# system: (each host's capture, cables, the host pairs they join)
CLUSTERS = {
    "dual-t3k": ([f"dual-t3k-host{i}.yaml" for i in range(2)], 8, {(0, 1)}),
    "quad-galaxy": ([f"quad-galaxy-host{i}.yaml" for i in range(4)], 128, {(0, 1), (1, 2), (2, 3), (0, 3)}),
    "quietbox2x2": (["quietbox2.yaml", "quietbox2.yaml"], 0, set()),
}  # fmt: skip


@pytest.mark.parametrize("name", MULTI)
def test_multi_host_system_loads(name: str) -> None:
    captures, cables, pairs = CLUSTERS[name]
    model = system.load_any(name)
    assert isinstance(model, system.ClusterModel)
    assert len(model.hosts) == len(captures)
    assert len(model.cables) == cables
    assert {(c.host_a, c.host_b) for c in model.cables} == pairs
    # Every chip of the system has its own unique id (two machines never share one).
    uids = [c.unique_id for h in model.hosts for c in h.chips]
    assert len(set(uids)) == len(uids) == model.chip_count


@pytest.mark.parametrize("name", ["dual-t3k", "quad-galaxy"])
def test_each_host_is_tt_metals_own_capture_of_that_host(name: str) -> None:
    """Host N's cluster descriptor is, chip for chip and link for link, the file tt-umd wrote on
    host N of tt-metal's own multi-host test system: its chips, the links between them, and every
    cable to another host as a link to a remote device named by the peer's unique id."""
    from ttmesh.host import clusterdesc

    captures, _cables, _pairs = CLUSTERS[name]
    model = system.load_any(name)
    for i, capture in enumerate(captures):
        host = model.host(i)
        assert (host.host, host.hosts, host.name) == (i, len(captures), name)
        ours = host.to_cluster_descriptor()
        theirs = clusterdesc.load(CAPTURES / capture)
        assert {c.id: (c.unique_id, c.mmio_dev, c.arch) for c in ours.chips.values()} == {
            c.id: (c.unique_id, c.mmio_dev, c.arch) for c in theirs.chips.values()
        }
        assert set(ours.links) == set(theirs.links)
        assert sorted(ours.remote_links, key=str) == sorted(theirs.remote_links, key=str)
        assert [(b.board_id, b.board_type, b.chips) for b in ours.boards] == [
            (b.board_id, b.board_type, b.chips) for b in theirs.boards
        ]


def test_dual_t3k_cables_are_the_captures_remote_links() -> None:
    model = system.load_any("dual-t3k")
    # host 0 chip 0 ch6/7 <-> host 1 chip 2 ch6/7 and so on: tt-metal's t3k_dual_host capture.
    assert [list(c.__dict__.values()) for c in model.cables] == [
        [0, 0, 6, 1, 2, 6], [0, 0, 7, 1, 2, 7], [0, 1, 6, 1, 3, 6], [0, 1, 7, 1, 3, 7],
        [0, 2, 0, 1, 0, 0], [0, 2, 1, 1, 0, 1], [0, 3, 0, 1, 1, 0], [0, 3, 1, 1, 1, 1],
    ]  # fmt: skip
    host1 = model.host(1)
    assert [r for r in host1.remote_links if r.chip == 2] == [
        system.RemoteLink(2, 6, model.hosts[0].chip(0).unique_id, 6),
        system.RemoteLink(2, 7, model.hosts[0].chip(0).unique_id, 7),
    ]


def test_quietbox2x2_is_two_machines_of_one_kind() -> None:
    model = system.load_any("quietbox2x2")
    one = system.load("quietbox2")
    for host in model.hosts:
        assert [(c.id, c.bdf, c.card_type, c.harvesting) for c in host.chips] == [
            (c.id, c.bdf, c.card_type, c.harvesting) for c in one.chips
        ]
        assert host.links == one.links and host.remote_links == []
    assert [c.unique_id for c in model.hosts[0].chips] == [c.unique_id for c in one.chips]
    assert not {c.unique_id for c in model.hosts[1].chips} & {c.unique_id for c in one.chips}
    # The second machine's board serials still decode as the same card.
    for c in model.hosts[1].chips:
        assert boardfacts.card_for_board_id(c.board_id).card_type == c.card_type


@pytest.mark.parametrize("name", MULTI)
def test_multi_host_system_round_trips_through_a_user_file(name: str, tmp_path: Path) -> None:
    model = system.load_any(name)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(model.to_dict(), sort_keys=False))
    again = system.load_any(str(path))
    assert again.to_dict() == model.to_dict()


def _cluster_base() -> dict[str, Any]:
    return copy.deepcopy(system.load_any("dual-t3k").to_dict())


BAD_CLUSTERS = {
    "cable-within-a-host": (
        lambda d: d["cables"].append([1, 0, 12, 1, 1, 12]),
        "cable 1:0:12-1:1:12 joins host 1 to itself",
    ),
    "cable-to-missing-host": (
        lambda d: d["cables"].append([0, 0, 12, 2, 0, 12]),
        "cable 0:0:12-2:0:12 names host 2, which is not defined",
    ),
    "cable-to-missing-chip": (
        lambda d: d["cables"].append([0, 0, 12, 1, 9, 12]),
        "cable 0:0:12-1:9:12 names chip 9 of host 1, which is not defined",
    ),
    "cable-on-a-used-channel": (
        lambda d: d["cables"].append([0, 0, 8, 1, 0, 12]),
        "channel 8 of host 0 chip 0 is used twice (a link and cable 0:0:8-1:0:12)",
    ),
    "two-cables-on-one-channel": (
        lambda d: d["cables"].append([0, 0, 6, 1, 0, 12]),
        "channel 6 of host 0 chip 0 is used twice (cable 0:0:6-1:2:6 and cable 0:0:6-1:0:12)",
    ),
    "malformed-cable": (lambda d: d["cables"].append([0, 0, 6]), "malformed cable [0, 0, 6]"),
    "one-host": (lambda d: d["hosts"].pop(), "'hosts' must list two or more hosts"),
    "unique-id-on-two-hosts": (
        lambda d: d["hosts"][1]["chips"][0].update(
            unique_id=d["hosts"][0]["chips"][0]["unique_id"]
        ),
        "host 0 chip 0 and host 1 chip 0 share the unique id 10226774024",
    ),
    "bad-host-inside": (
        lambda d: d["hosts"][1]["links"].append([0, 12, 9, 4]),
        "hosts[1]: link 9:4 names chip 9, which is not defined",
    ),
}


@pytest.mark.parametrize("case", list(BAD_CLUSTERS))
def test_bad_multi_host_file_is_one_line_bad_input(case: str, tmp_path: Path) -> None:
    mutate, expected = BAD_CLUSTERS[case]
    data = _cluster_base()
    mutate(data)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(TTMeshError) as info:
        system.load_any(str(path))
    _assert_bad_input(info.value, f"{path}: ", expected)


def test_sim_create_builds_one_host_of_several(cli: Callable[..., Any], tmp_path: Path) -> None:
    from ttmesh.host import clusterdesc

    root = tmp_path / "t3k-b"
    r = cli("sim", "create", "--system", "dual-t3k", "--host", "1", "--root", str(root))
    assert r.code == 0, r.err
    assert r.out.splitlines() == [
        f"simulated dual-t3k host 1 of 2 (8 chips) at {root}",
        f"cables to the other hosts: {tmp_path / 'dual-t3k.cables'} (give every host of dual-t3k "
        "the same --cables DIR)",
    ]
    assert json.loads((root / ".ttmesh-sim").read_text())["host"] == 1
    written = clusterdesc.load(root / "cluster_descriptor.yaml")
    theirs = clusterdesc.load(CAPTURES / "dual-t3k-host1.yaml")
    assert sorted(written.remote_links, key=str) == sorted(theirs.remote_links, key=str)
    assert len(written.remote_links) == 8
    show = cli("sim", "show", "--root", str(root))
    assert show.out.splitlines()[0] == f"dual-t3k host 1 at {root}"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--system", "dual-t3k"], "dual-t3k is a system of 2 hosts: each host is simulated in a "
         "root of its own (build one with ttmesh sim create --system dual-t3k --host N --root DIR "
         "(N = 0..1))"),
        (["--system", "quad-galaxy", "--host", "4"], "quad-galaxy has no host 4 (its hosts are 0..3)"),
        (["--system", "t3k", "--host", "0"], "t3k is a single host: --host 0 names none (drop --host)"),
        (["--from-capture", "x.tar.gz", "--host", "1"], "--host goes with --system (a capture is one host: drop --host)"),
    ],
)  # fmt: skip
def test_sim_create_host_mistakes(
    args: list[str], needle: str, cli: Callable[..., Any], tmp_path: Path
) -> None:
    root = tmp_path / "root"
    r = cli("sim", "create", *args, "--root", str(root))
    assert r.code == 2
    assert _one_error_line(r.err) == f"ttmesh: {needle}"
    assert not root.exists()


def test_sim_flag_refuses_a_system_of_several_hosts(cli: Callable[..., Any]) -> None:
    r = cli("ls", "--sim", "quad-galaxy")
    assert r.code == 2
    assert "quad-galaxy is a system of 4 hosts" in _one_error_line(r.err)


def test_sim_systems_lists_hosts(cli: Callable[..., Any]) -> None:
    r = cli("sim", "systems")
    assert r.code == 0, r.err
    rows = {line.split()[0]: line.split()[1:4] for line in r.out.splitlines()[1:]}
    assert rows["dual-t3k"] == ["2", "2", "x"]
    assert rows["quad-galaxy"][:2] == ["4", "4"] and "4 x 32" in r.out
    assert rows["t3k"] == ["1", "8", "wormhole_b0"]
