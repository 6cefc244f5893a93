"""Stable chip names: tt-kmd's ``/dev/tenstorrent/by-id`` links (udev-50-tenstorrent.rules),
made by the simulator, shown by ``ttmesh ls`` and accepted by ``--chips``."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest

NAME = re.compile(r"(blackhole|wormhole)-[0-9A-F]{16}")


def _links(root: Path) -> dict[str, str]:
    folder = root / "dev/tenstorrent/by-id"
    return {name: os.readlink(folder / name) for name in sorted(os.listdir(folder))}


@pytest.mark.parametrize("system", ["quietbox2", "n300x2"])
def test_sim_makes_the_links_udev_makes(make_sim: Callable[..., Path], system: str) -> None:
    root = make_sim(system)
    links = _links(root)
    assert links
    for name, target in links.items():
        assert NAME.fullmatch(name), name
        n = re.fullmatch(r"\.\./(\d+)", target)
        assert n, target  # relative to the node, as udev makes it
        asic = (root / f"sys/class/tenstorrent/tenstorrent!{n.group(1)}/tt_asic_id").read_text()
        assert name.split("-", 1)[1] == asic.strip().upper()
        arch = "wormhole" if system == "n300x2" else "blackhole"
        assert name.startswith(arch + "-")


def test_ls_shows_by_id(make_sim: Callable[..., Path], cli: Callable) -> None:
    root = make_sim("n300x2")
    r = cli("ls", "--json", "--root", str(root))
    assert r.code == 0, r.err
    chips = json.loads(r.out)["chips"]
    links = _links(root)
    for c in chips:
        if c["bdf"] is None:
            assert c["by_id"] is None  # a remote chip has no node, so no link
        else:
            assert c["by_id"] == f"wormhole-{c['asic_id'].upper()}"
            assert links[c["by_id"]] == f"../{c['dev_index']}"
    text = cli("ls", "--root", str(root))
    assert text.code == 0, text.err
    for c in chips:
        if c["by_id"]:
            assert f"  {c['by_id']}  {c['bdf']}" in text.out.splitlines()


def test_chips_accepts_by_id_names(qb2: Path, cli: Callable) -> None:
    chips = json.loads(cli("ls", "--json", "--root", str(qb2)).out)["chips"]
    a, b = chips[0], chips[1]
    spelled = f"{a['by_id'].lower()},/dev/tenstorrent/by-id/{b['by_id']}"
    r = cli("check", "--json", "--root", str(qb2), "--chips", spelled)
    assert r.code == 0, r.err
    assert [c["asic_id"] for c in json.loads(r.out)["chips"]] == [a["asic_id"], b["asic_id"]]
    under_root = str(qb2.resolve() / "dev/tenstorrent/by-id" / a["by_id"])
    r = cli("check", "--json", "--root", str(qb2), "--chips", under_root)
    assert r.code == 0, r.err
    assert [c["asic_id"] for c in json.loads(r.out)["chips"]] == [a["asic_id"]]
    plan = cli(
        "launch", "--root", str(qb2), "--chips", spelled, "--dry-run", "--json", "--", "true"
    )
    assert plan.code == 0, plan.err
    ranks = json.loads(plan.out)["ranks"]
    assert sorted(bdf for r in ranks for bdf in r["bdfs"]) == sorted([a["bdf"], b["bdf"]])
    dup = cli("check", "--root", str(qb2), "--chips", f"{a['by_id']},{a['bdf']}")
    assert dup.code == 2 and "duplicate chip" in dup.err


def test_a_link_out_of_the_root_is_refused(qb2: Path, cli: Callable) -> None:
    folder = qb2 / "dev/tenstorrent/by-id"
    name = sorted(os.listdir(folder))[0]
    os.unlink(folder / name)
    os.symlink("/dev/null", folder / name)  # planted: the machine's file, not the root's
    for args in (("ls",), ("ls", "--json"), ("check",)):
        r = cli(*args, "--root", str(qb2))
        assert r.code == 2, (args, r.out, r.err)
        lines = r.err.strip().splitlines()
        assert len(lines) == 1 or lines[-1].startswith("ttmesh: "), r.err
        assert "leads out of" in lines[-1] and "Traceback" not in r.err


def test_a_by_id_directory_out_of_the_root_is_refused(
    qb2: Path, cli: Callable, tmp_path: Path
) -> None:
    """A by-id directory planted as a link to one outside the root (whose links point at
    ``../0`` there) is refused too: the links are judged by where they lead in this root."""
    elsewhere = tmp_path / "elsewhere" / "by-id"
    elsewhere.mkdir(parents=True)
    os.symlink("../0", elsewhere / "blackhole-0000000000000000")
    folder = qb2 / "dev/tenstorrent/by-id"
    for name in os.listdir(folder):
        os.unlink(folder / name)
    folder.rmdir()
    folder.symlink_to(elsewhere)
    r = cli("ls", "--root", str(qb2))
    assert r.code == 2 and "by-id leads out of" in r.err.splitlines()[-1], r.err


def test_a_chips_address_is_its_device_links_last_name_or_where_a_chain_leads(
    make_sim: Callable[..., Path],
) -> None:
    """The simulator writes each chip's ``device`` link as sysfs does (kernfs_get_target_path:
    ``../../../<address>``), whose last name is the address; a link whose last name is not an
    address (a link to a link) is resolved whole."""
    from ttmesh.cli.hosts import open_host

    root = make_sim("quietbox2")
    host = open_host(root)
    dev = host.dev_indexes()[0]
    link = root / f"sys/class/tenstorrent/tenstorrent!{dev}/device"
    target = os.readlink(link)
    assert re.fullmatch(r"\.\./\.\./\.\./[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", target)
    bdf = target.rsplit("/", 1)[1]
    assert host.bdf_of(dev) == bdf and link.resolve().name == bdf
    alias = link.resolve().parent / "alias"
    alias.symlink_to(bdf)
    link.unlink()
    link.symlink_to("../../../alias")
    assert host.bdf_of(dev) == bdf
