"""``ttmesh ls`` on simulated hosts of every stock system, through the real entry point."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import CAPTURES, STOCK, env_without

from ttmesh.host import clusterdesc
from ttmesh.sim import system

# The stock systems plus the two kept as test fixtures (tests/data/captures/README.md).
ALL = [*STOCK, "n300x2", "p300x2-disconnected"]

LsResult = tuple[system.SystemModel, Path, dict[str, Any], str]


def _capture_links_as_asics(model: system.SystemModel) -> set[frozenset[tuple[str, int]]]:
    """The capture's links, named by asic id (the model's where the capture has no unique ids)."""
    cap = clusterdesc.load(CAPTURES / Path(model.source).name)
    asic = {
        cid: c.asic_id if c.asic_id is not None else model.chip(cid).asic_id
        for cid, c in cap.chips.items()
    }
    return {
        frozenset({(asic[lk.chip_a], lk.chan_a), (asic[lk.chip_b], lk.chan_b)}) for lk in cap.links
    }


@pytest.fixture
def ls_json(
    request: pytest.FixtureRequest, make_sim: Callable[..., Path], cli: Callable
) -> LsResult:
    name = request.param
    root = make_sim(name)
    r = cli("ls", "--json", "--root", str(root))
    assert r.code == 0, r.err
    return system.load(name), root, json.loads(r.out), r.err


@pytest.mark.parametrize("ls_json", ALL, indirect=True)
def test_ls_json_reports_every_chip_as_the_system_models_it(ls_json: LsResult) -> None:
    model, root, data, err = ls_json
    assert f"simulated host: {root.resolve()}" in err.splitlines()
    assert data["schema"] == "ttmesh.ls/1"
    assert data["host"] == {
        "root": str(root.resolve()),
        "simulated": True,
        "driver": model.driver_version,
    }
    chips = data["chips"]
    assert len(chips) == len(model.chips)
    assert sorted(c["asic_id"] for c in chips) == sorted(c.asic_id for c in model.chips)
    assert data["missing"] == []

    by_asic = {c["asic_id"]: c for c in chips}
    pci_order = sorted(c.bdf for c in model.chips if c.bdf is not None)
    for mc in model.chips:
        c = by_asic[mc.asic_id]
        assert c["arch"] == mc.arch
        assert c["board_type"] == mc.card_type
        assert c["board_id"] == format(mc.board_id, "016x")
        assert c["dram_mb"] == mc.dram_mb
        assert c["heartbeat"] == "alive"
        assert c["holders"] == []
        assert c["lease"] is None
        assert c["symmetric_dram_mb"] is None
        if mc.bdf is None:
            # A remote chip: no PCI device, reached through the PCI chip of its board.
            partner = [
                model.chip(o)
                for o in model.board_of(mc.id).chips
                if o != mc.id and model.chip(o).bdf is not None
            ]
            assert len(partner) == 1
            assert c["bdf"] is None
            assert c["dev_index"] is None
            assert c["pci_index"] is None
            assert c["mmio"] is False
            assert c["via"] == partner[0].asic_id
        else:
            assert c["bdf"] == mc.bdf
            assert c["dev_index"] == mc.dev_index
            assert c["pci_index"] == pci_order.index(mc.bdf)
            assert c["mmio"] is True
            assert c["via"] is None
            # The driver files of the root say the same.
            node = root / "sys/class/tenstorrent" / f"tenstorrent!{c['dev_index']}"
            assert (node / "tt_asic_id").read_text().strip() == c["asic_id"]
            assert os.path.basename(os.path.realpath(node / "device")) == c["bdf"]
    # Chips are listed in PCI order, each remote chip right after its partner.
    order = [c["bdf"] or by_asic[c["via"]]["bdf"] for c in chips]
    assert order == sorted(order)
    for i, c in enumerate(chips):
        if c["via"] is not None:
            assert chips[i - 1]["asic_id"] == c["via"]

    links = data["links"]
    assert {link["state"] for link in links} <= {"up"}
    got = {
        frozenset({(lk["a"]["asic_id"], lk["a"]["chan"]), (lk["b"]["asic_id"], lk["b"]["chan"])})
        for lk in links
    }
    assert len(got) == len(links)
    assert got == _capture_links_as_asics(model)
    assert len(links) == len(model.links)


@pytest.mark.parametrize("name", ["p300", "n300", "t3k", "galaxy-bh"])
def test_ls_text_names_every_pci_address(
    name: str, make_sim: Callable[..., Path], cli: Callable
) -> None:
    model = system.load(name)
    root = make_sim(name)
    r = cli("ls", "--root", str(root))
    assert r.code == 0, r.err
    assert r.err.splitlines() == [f"simulated host: {root.resolve()}"]
    lines = r.out.splitlines()
    assert lines[0].split() == [
        "DEV",
        "PCI",
        "ASIC",
        "BOARD",
        "ARCH",
        "DRAM",
        "HEARTBEAT",
        "HELD",
        "BY",
        "LEASE",
    ]
    rows = lines[1 : 1 + len(model.chips)]
    for c in model.chips:
        row = next(line for line in rows if c.asic_id in line)
        if c.bdf is not None:
            assert row.split()[:3] == [str(c.dev_index), c.bdf, c.asic_id]
        else:
            partner = next(
                model.chip(o).bdf for o in model.board_of(c.id).chips if model.chip(o).bdf
            )
            assert f"remote via {partner}" in row
    assert f"\nEthernet links: {len(model.links)} up" in r.out


def test_ls_sim_quietbox2_uses_the_cache(cli: Callable) -> None:
    cache = Path(os.environ["XDG_CACHE_HOME"]) / "ttmesh" / "sim" / "quietbox2"
    assert not cache.exists()
    r = cli("ls", "--json", "--sim", "quietbox2")
    assert r.code == 0, r.err
    assert r.err.splitlines() == [f"simulated host: {cache.resolve()}"]
    data = json.loads(r.out)
    assert data["host"]["root"] == str(cache.resolve())
    assert json.loads((cache / ".ttmesh-sim").read_text())["system"] == "quietbox2"
    model = system.load("quietbox2")
    assert sorted(c["bdf"] for c in data["chips"]) == sorted(str(c.bdf) for c in model.chips)
    assert [link["state"] for link in data["links"]] == ["up"] * 8
    # The second run reuses the cached root.
    marker = (cache / ".ttmesh-sim").read_text()
    again = cli("ls", "--sim", "quietbox2")
    assert again.code == 0, again.err
    assert (cache / ".ttmesh-sim").read_text() == marker
    for c in model.chips:
        assert str(c.bdf) in again.out


def test_ls_without_driver_is_bad_input(
    tmp_path: Path, make_sim: Callable[..., Path], cli: Callable
) -> None:
    src = make_sim("p300")
    root = tmp_path / "copy"
    shutil.copytree(src, root, symlinks=True)
    (root / "sys/module/tenstorrent/version").unlink()
    r = cli("ls", "--root", str(root))
    assert r.code == 2
    assert r.out == ""
    lines = [line for line in r.err.splitlines() if not line.startswith("simulated host: ")]
    assert len(lines) == 1, r.err
    assert lines[0].startswith(
        f"ttmesh: no Tenstorrent driver on this host ({root.resolve()}/sys/module/tenstorrent/version"
        " is missing)"
    )
    assert "--sim quietbox2" in lines[0]


def test_ls_malformed_cluster_descriptor_is_bad_input(
    tmp_path: Path, make_sim: Callable[..., Path], cli: Callable
) -> None:
    src = make_sim("p300")
    root = tmp_path / "copy"
    shutil.copytree(src, root, symlinks=True)
    desc = root / "cluster_descriptor.yaml"
    text = desc.read_text()
    assert "chips_with_mmio:\n  - 0: 1\n" in text
    desc.write_text(text.replace("chips_with_mmio:\n  - 0: 1\n", "chips_with_mmio:\n  - 0\n"))
    r = cli("ls", "--json", "--root", str(root))
    assert r.code == 2, r.err
    message = error_doc(r.out)["message"]
    assert message.startswith(f"the simulated host's {desc} is a malformed cluster descriptor")
    assert "Traceback" not in r.err
    lines = [line for line in r.err.splitlines() if not line.startswith("simulated host: ")]
    assert len(lines) == 1, r.err
    assert (
        lines[0]
        == f"ttmesh: {message} (recreate it: ttmesh sim create --force --system p300 --root {root})"
    )


def error_doc(out: str) -> dict:
    """With --json, a failure's ttmesh.error/1 document on stdout."""
    doc = json.loads(out)
    assert list(doc) == ["schema", "code", "message", "hint"] and doc["schema"] == "ttmesh.error/1"
    assert doc["code"] == 2
    return doc


@pytest.mark.parametrize("kind", ["file", "missing"])
def test_ls_root_not_a_directory(kind: str, tmp_path: Path, cli: Callable) -> None:
    root = tmp_path / "root"
    if kind == "file":
        root.write_text("x\n")
    r = cli("ls", "--json", "--root", str(root))
    assert r.code == 2
    assert error_doc(r.out)["message"] == f"root {root} is not a directory"
    lines = r.err.splitlines()
    assert len(lines) == 1, r.err
    assert lines[0].startswith(f"ttmesh: root {root} is not a directory")


def test_ls_unknown_sim_lists_known_systems(cli: Callable) -> None:
    r = cli("ls", "--sim", "nosuch")
    assert r.code == 2
    assert r.out == ""
    lines = r.err.splitlines()
    assert len(lines) == 1, r.err
    assert "unknown system 'nosuch'" in lines[0]
    known = lines[0].split("known systems: ", 1)[1].rstrip(")").split(", ")
    assert known == system.stock_names()
    assert not (Path(os.environ["XDG_CACHE_HOME"]) / "ttmesh" / "sim" / "nosuch").exists()


def test_help_imports_nothing_heavy() -> None:
    code = (
        "import sys, io, contextlib\n"
        "import ttmesh.cli\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out):\n"
        "    rc = ttmesh.cli.run(['--help'])\n"
        "assert rc == 0, rc\n"
        "assert 'ls' in out.getvalue(), out.getvalue()\n"
        "heavy = ('torch', 'yaml', 'rich', 'psutil', 'google.protobuf')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
        "print(sorted(m for m in sys.modules if m.startswith('ttmesh.launcher')))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:2] == ["[]", "[]"], proc.stdout


def test_help_lists_each_command_as_its_own_help_says() -> None:
    """``ttmesh --help`` lists the commands from a table, without importing them: the table
    says what each command's own help says."""
    import click

    from ttmesh import cli

    ctx = click.Context(cli.main)
    for name, (_module, _attr, text) in cli.COMMANDS.items():
        command = cli.main.get_command(ctx, name)
        assert command is not None and command.name == name
        first = (command.help or "").split("\n\n")[0]
        assert " ".join(first.split()) == text, name
    assert cli.main.list_commands(ctx) == sorted(cli.COMMANDS)


def test_tables_are_drawn_on_a_terminal_plain_when_piped(qb2: Path) -> None:
    """The same cells either way: rich on a terminal, aligned plain columns in a pipe."""
    import pty
    import re
    import subprocess
    import sys

    argv = [sys.executable, "-m", "ttmesh", "ls", "--root", str(qb2)]
    env = env_without("NO_COLOR", "TERM")
    piped = subprocess.run(argv, capture_output=True, text=True, env=env)
    assert piped.returncode == 0
    assert "\x1b[" not in piped.stdout and "─" not in piped.stdout
    leader, follower = pty.openpty()
    proc = subprocess.Popen(argv, stdout=follower, stderr=subprocess.DEVNULL, env=env)
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    os.close(leader)
    assert proc.wait() == 0
    drawn = b"".join(chunks).decode()
    assert "─" in drawn and "\x1b[" in drawn  # a rich table, with a bold header
    plain_cells = [ln.split() for ln in piped.stdout.splitlines() if ln.startswith(("0 ", "1 "))]
    text = re.sub(r"\x1b\[[0-9;]*m", "", drawn)
    for cells in plain_cells:
        assert all(cell in text for cell in cells), cells
