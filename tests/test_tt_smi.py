"""The tt-smi stand-in (``<root>/bin/tt-smi``) run as a real subprocess, as ttmesh runs it.

Every case runs with stdin on /dev/null and stdout/stderr on pipes (no terminal), with COLUMNS
unset, and checks the exact bytes (ANSI codes included), the exit code and which files appear.
The expected behaviour is tt-smi 6.8.0's as read from its code (notes/tt-smi-research.md),
including its traps: a reset target list that matches nothing resets every device.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import env_without, scratch
from conftest import stock_model as _model

from ttmesh.cli.hosts import open_host as Host
from ttmesh.sim import core, faults
from ttmesh.sim.create import create

RED, PURPLE, BLUE, GREEN, YELLOW, ENDC = (
    "\x1b[91m",
    "\x1b[95m",
    "\x1b[94m",
    "\x1b[92m",
    "\x1b[93m",
    "\x1b[0m",
)
USAGE = (
    "usage: tt-smi [-h] [-l] [-v] [-s] [-ls] [-f [snapshot filename]] [-c]\n"
    "              [--offline] [-r [TARGETS ...]] [--snapshot_no_tty] [-glx_reset]\n"
    "              [-glx_reset_auto] [-glx_list_tray_to_device] [--no_reinit]\n"
    "              [--use_luwen] [--eth_train_skip]\n"
)
NO_DRIVER = (
    f"{RED} No Tenstorrent driver detected! Please install driver using tt-kmd: "
    f"https://github.com/tenstorrent/tt-kmd  {ENDC}\n"
)
NO_TTY = (
    f"{RED}No TTY detected! Interactive shell required.\nUse tt-smi -s for snapshot output.{ENDC}\n"
)
REINIT = f"{PURPLE} Re-initializing boards after reset.... {ENDC}\n"
INVALID_TARGET = (
    "Invalid device target: '{}'. Use UMD logical ID (integer), PCI BDF (e.g. 0000:0a:00.0), "
    "or /dev/tenstorrent/<integer>."
)
QB2_BDFS = ["0000:01:00.0", "0000:03:00.0", "0000:05:00.0", "0000:07:00.0"]


@dataclass
class Run:
    code: int
    out: str
    err: str
    files: list[str]  # files that appeared under the work dir (cwd and HOME)
    seconds: float


def smi(
    root: Path, *args: str, work: Path, env: dict[str, str] | None = None, fast: bool = True
) -> Run:
    """Run ``root/bin/tt-smi`` with no terminal; ``work`` is both its cwd and its HOME.

    ``fast``: its ``#!/usr/bin/env python3`` finds this interpreter first (skipping slow
    version-manager shims); test_runs_without_ttmesh_installed covers the plain PATH.
    """
    work.mkdir(parents=True, exist_ok=True)
    before = _tree(work)
    full = env_without("COLUMNS", "LINES")
    full.update({"HOME": str(work), **(env or {})})
    if fast:
        full["PATH"] = os.path.dirname(sys.executable) + os.pathsep + full.get("PATH", "")
    t0 = time.monotonic()
    proc = subprocess.run(
        [str(root / "bin" / "tt-smi"), *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        env=full,
        cwd=work,
        timeout=60,
    )
    took = time.monotonic() - t0
    # bytes, decoded without newline translation: "\r" must survive
    return Run(
        proc.returncode,
        proc.stdout.decode(),
        proc.stderr.decode(),
        sorted(_tree(work) - before),
        took,
    )


def _tree(base: Path) -> set[str]:
    return {str(p.relative_to(base)) for p in base.rglob("*") if p.is_file()}


@pytest.fixture
def work(tmp_path: Path) -> Path:
    path = tmp_path / "work"
    path.mkdir()
    return path


@pytest.fixture
def ro(shared_sim: Callable[[str], Path]) -> Iterator[Path]:
    """The shared QuietBox 2; the test must leave its state file as it found it."""
    root = shared_sim("quietbox2")
    before = (root / core.STATE_FILE).read_bytes()
    yield root
    assert (root / core.STATE_FILE).read_bytes() == before


@pytest.fixture(scope="module")
def no_driver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with scratch(tmp_path_factory.mktemp("nodriver")) as base:
        root = create(_model("quietbox2"), base / "quietbox2", config={"reset_seconds": 0.0})
        (root / "sys/module/tenstorrent/version").unlink()
        kill_all(root)
        yield root


def system(root: Path) -> dict:
    return json.loads((root / "sim" / "system.json").read_text())


def chips_by_id(root: Path) -> list[dict]:
    return sorted(system(root)["chips"], key=lambda c: c["id"])


def kill_all(root: Path) -> None:
    """Freeze every chip, so that what a reset revives shows which chips it reset."""
    host = Host(root)
    with host.sim.change() as state:
        for asic, chip in state["chips"].items():
            chip["hb_base"] = host.sim.heartbeat(state, asic)
            chip["alive"] = False


def alive_bdfs(root: Path) -> set[str]:
    return {c["bdf"] for c in faults.show(Host(root))["chips"] if c["alive"] and c["bdf"]}


def resets(root: Path) -> int:
    return len(core.SimRoot(str(root)).read_state()["resets"])


def snapshot(run: Run) -> dict:
    assert run.code == 0, run
    assert run.err == ""
    return json.loads(run.out)


def ls_links(cli: Callable, root: Path) -> dict[frozenset, str]:
    res = cli("ls", "--json", "--root", str(root))
    assert res.code == 0, res.err
    return {
        frozenset(
            {(lk["a"]["asic_id"], lk["a"]["chan"]), (lk["b"]["asic_id"], lk["b"]["chan"])}
        ): lk["state"]
        for lk in json.loads(res.out)["links"]
    }


# --------------------------------------------------------------------------- arguments


@pytest.mark.parametrize("flag", ["-v", "--version"])
def test_version_flags_print_the_version_only(ro: Path, work: Path, flag: str) -> None:
    run = smi(ro, flag, work=work)
    assert (run.code, run.out, run.err, run.files) == (0, "6.8.0\n", "", [])


def test_unknown_option_prints_usage_on_stderr(ro: Path, work: Path) -> None:
    run = smi(ro, "--bogus", work=work)
    assert run.code == 2
    assert run.out == ""
    assert run.err == USAGE + "tt-smi: error: unrecognized arguments: --bogus\n"


def test_an_ambiguous_abbreviation_is_a_usage_error_naming_the_matches(
    ro: Path, work: Path
) -> None:
    run = smi(ro, "--snap", work=work)
    assert run.code == 2
    assert run.out == ""
    assert run.err == (
        USAGE
        + "tt-smi: error: ambiguous option: --snap could match --snapshot, --snapshot_no_tty\n"
    )


def test_unambiguous_abbreviation_is_accepted(ro: Path, work: Path) -> None:
    run = smi(ro, "--snapshot_n", "-s", work=work)
    assert list(snapshot(run)) == ["time", "host_info", "host_sw_vers", "device_info", "processes"]


def test_no_option_and_no_terminal(ro: Path, work: Path) -> None:
    run = smi(ro, work=work)
    assert (run.code, run.out, run.err, run.files) == (1, NO_TTY, "", [])
    # --snapshot_no_tty alone only changes the snapshot's rendering: still no TTY
    run = smi(ro, "--snapshot_no_tty", work=work)
    assert (run.code, run.out, run.err, run.files) == (1, NO_TTY, "", [])


def test_runs_without_ttmesh_installed(ro: Path, work: Path, tmp_path: Path) -> None:
    """bin/tt-smi needs only the standard library and the core copied next to it."""
    env = {"PYTHONPATH": "", "PYTHONNOUSERSITE": "1", "TTMESH_SIM_ROOT": ""}
    probe = subprocess.run(
        ["python3", "-c", "import ttmesh"], cwd=tmp_path, capture_output=True, env=env
    )
    if probe.returncode == 0:
        pytest.skip("the python3 on PATH has ttmesh installed")
    run = smi(ro, "-s", work=work, env=env, fast=False)
    assert len(snapshot(run)["device_info"]) == 4


# tt-smi 6.8.0's -ls on a QuietBox 2 and an n300 at 120 columns, as its own code prints them
# (tests/test_tt_smi_conformance.py runs that code): two rich tables titled "(UMD)", UMD ids in
# PCI order, /dev/tenstorrent/N, a remote chip's N/A, and no remote chip among those to reset.
HEAD = (
    "┏━━━━━━━━━━━━━┳━━━━━━━━━━━━━━┳━━━━━━━━━━━━━━━━━━━━{}┳━━━━━━━━━━━━┳━━━━━━━━━━━━━━━┳"
    "━━━━━━━━━━━━━━━━━━┓\n"
    "┃ UMD Chip ID ┃ PCI BDF      ┃ PCI Dev ID         {}┃ Board Type ┃ Device Series ┃"
    " Board Number     ┃\n"
    "┡━━━━━━━━━━━━━╇━━━━━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━{}╇━━━━━━━━━━━━╇━━━━━━━━━━━━━━━╇"
    "━━━━━━━━━━━━━━━━━━┩\n"
)
FOOT = (
    "└─────────────┴──────────────┴────────────────────{}┴────────────┴───────────────┴"
    "──────────────────┘\n"
)


def _table(title: str, rows: list[str], wide: bool = False) -> str:
    more = ("━━", "  ", "━━") if wide else ("", "", "")
    width = 101 if wide else 99
    pad = width - len(title)
    return (
        " " * (pad // 2) + title + " " * (pad - pad // 2) + "\n" + HEAD.format(*more)
        + "".join(rows) + FOOT.format("──" if wide else "")
    )  # fmt: skip


QB2_ROWS = [
    f"│ {n}           │ {bdf} │ /dev/tenstorrent/{dev} │ Blackhole  │ p300a         │ "
    f"000004513190f00{board} │\n"
    for n, (bdf, dev, board) in enumerate(
        [
            ("0000:01:00.0", 0, 6),
            ("0000:03:00.0", 1, 6),
            ("0000:05:00.0", 3, 7),
            ("0000:07:00.0", 2, 7),
        ]
    )
]
N300_L = "│ 0           │ 0000:41:00.0 │ /dev/tenstorrent/1 {}│ Wormhole   │ n300 L        │ 010001451170c0c4 │\n"
N300_R = "│ 1           │ N/A          │ /dev/tenstorrent/N/A │ Wormhole   │ n300 R        │ 010001451170c0c4 │\n"


def test_list_prints_tt_smis_two_umd_tables(
    ro: Path, shared_sim: Callable[[str], Path], work: Path
) -> None:
    run = smi(ro, "-ls", work=work, env={"COLUMNS": "120"})
    assert (run.code, run.err, run.files) == (0, "", [])
    assert run.out == _table("All available boards on host (UMD):", QB2_ROWS) + _table(
        "Boards that can be reset (UMD):", QB2_ROWS
    )
    run = smi(shared_sim("n300"), "-ls", work=work, env={"COLUMNS": "120"})
    assert run.out == _table(
        "All available boards on host (UMD):", [N300_L.format("  "), N300_R], wide=True
    ) + _table("Boards that can be reset (UMD):", [N300_L.format("")])


def test_list_fits_the_console_as_rich_does(ro: Path, work: Path) -> None:
    """No terminal and no COLUMNS: rich's 80 columns, and cells that do not fit are cut with
    an ellipsis (a script that greps a PCI address from `tt-smi -ls | ...` finds none there)."""
    run = smi(ro, "-ls", work=work)
    assert run.code == 0
    lines = run.out.splitlines()
    assert len(lines) == 20 and all(len(line) <= 80 for line in lines)
    assert lines[2:4] == [
        "┃ UMD Chip   ┃            ┃            ┃            ┃ Device      ┃ Board      ┃",
        "┃ ID         ┃ PCI BDF    ┃ PCI Dev ID ┃ Board Type ┃ Series      ┃ Number     ┃",
    ]
    assert (
        lines[5]
        == "│ 0          │ 0000:01:0… │ /dev/tens… │ Blackhole  │ p300a       │ 000004513… │"
    )
    assert "0000:01:00.0" not in run.out
    run = smi(ro, "-ls", work=work, env={"COLUMNS": "0"})  # rich renders nothing in no width
    assert (run.code, run.out, run.err) == (0, "", "")


def test_reset_n_resets_the_chip_list_calls_umd_id_n(qb2: Path, work: Path) -> None:
    """`tt-smi -r N` resets the chip `tt-smi -ls` lists as UMD Chip ID N (tools such as
    Tenstorrent's `tt` pass their row number), on a host whose /dev numbers are not in PCI
    order."""
    ls = smi(qb2, "-ls", work=work, env={"COLUMNS": "200"})
    rows = [line.split("│")[1:-1] for line in ls.out.splitlines() if line.startswith("│")]
    listed = {int(cells[0]): cells[1].strip() for cells in rows[:4]}
    assert sorted(listed) == [0, 1, 2, 3]
    for umd_id, bdf in listed.items():
        kill_all(qb2)
        run = smi(qb2, "-r", str(umd_id), work=work)
        assert run.out == f"Resetting UMD logical IDs: [{umd_id}]\n" + REINIT
        assert alive_bdfs(qb2) == {bdf}, umd_id


# --------------------------------------------------------------------------- snapshot


def test_snapshot_of_a_quietbox2_has_tt_smis_shape(ro: Path, work: Path) -> None:
    t0 = datetime.datetime.now()
    run = smi(ro, "-s", work=work)
    t1 = datetime.datetime.now()
    doc = snapshot(run)
    assert run.files == []
    assert run.out.startswith('{\n    "time": ')  # 4-space indent, plain (no terminal)
    assert "\x1b" not in run.out
    assert list(doc) == ["time", "host_info", "host_sw_vers", "device_info", "processes"]
    assert t0 <= datetime.datetime.fromisoformat(doc["time"]) <= t1
    assert list(doc["host_info"]) == [
        "OS",
        "Distro",
        "Kernel",
        "Hostname",
        "Platform",
        "Python",
        "Memory",
        "Driver",
    ]
    assert doc["host_info"]["Driver"] == "TT-KMD 2.10.0"
    assert re.fullmatch(r"\d+\.\d\d [KMGT]B", doc["host_info"]["Memory"])
    assert doc["host_sw_vers"] == {"tt_smi": "6.8.0", "pyluwen": "0.10.0", "tt_umd": "0.9.12"}
    assert doc["processes"] == []
    # tt-umd's logical ids: the PCI devices in PCI order (not the descriptor's chip ids)
    assert [d["board_info"]["bus_id"] for d in doc["device_info"]] == QB2_BDFS
    assert [c["bdf"] for c in chips_by_id(ro)] != QB2_BDFS
    for dev in doc["device_info"]:
        assert list(dev) == [
            "smbus_telem",
            "board_info",
            "telemetry",
            "gddr_telemetry",
            "firmwares",
            "limits",
        ]
        assert list(dev["board_info"]) == [
            "bus_id",
            "board_type",
            "board_id",
            "coords",
            "dram_status",
            "dram_speed",
            "pcie_speed",
            "pcie_width",
        ]
        assert list(dev["telemetry"]) == [
            "voltage",
            "current",
            "power",
            "board_power",
            "aiclk",
            "asic_temperature",
            "fan_speed",
            "heartbeat",
        ]
        info = dev["board_info"]
        assert info["board_type"] == "p300a"  # Blackhole: no L/R suffix
        assert info["coords"] == "N/A"
        assert info["pcie_speed"] == 5 and info["pcie_width"] == "16"
        assert re.fullmatch(r"\d+", dev["telemetry"]["heartbeat"])
        smbus = dev["smbus_telem"]
        assert list(smbus)[:3] == ["BOARD_ID_HIGH", "BOARD_ID_LOW", "ASIC_ID"]
        assert list(smbus)[-2:] == ["NUMBER_OF_TAGS", "INPUT_POWER"]
        assert all(v is None or re.fullmatch(r"0x[0-9a-f]+", v) for v in smbus.values())


def test_snapshot_eth_live_status_matches_links(qb2: Path, work: Path, cli: Callable) -> None:
    # take one link down so that both set and cleared link bits are checked
    faults.link_down(Host(qb2), "0000:01:00.0", "0000:03:00.0", channel=8)
    doc = snapshot(smi(qb2, "-s", work=work))
    links = ls_links(cli, qb2)
    assert sorted(links.values()).count("down") == 1
    model = system(qb2)
    ids = {c["id"]: core.asic_hex(c["unique_id"]) for c in model["chips"]}
    by_bdf = {c["bdf"]: c for c in model["chips"]}
    for dev in doc["device_info"]:
        chip = by_bdf[dev["board_info"]["bus_id"]]
        asic = ids[chip["id"]]
        eth = int(dev["smbus_telem"]["ETH_LIVE_STATUS"], 16)
        up = {chan for ends, st in links.items() if st == "up" for a, chan in ends if a == asic}
        assert {c for c in range(16) if eth >> (16 + c) & 1} == up
        chans = {ca for a, ca, _, _ in model["links"] if a == chip["id"]}
        chans |= {cb for _, _, b, cb in model["links"] if b == chip["id"]}
        assert {c for c in range(16) if eth >> c & 1} == chans  # channel heartbeats


@pytest.mark.parametrize(
    ("system_name", "types"),
    [
        ("n300", ["n300 L", "n300 R"]),
        ("t3k", ["n300 L"] * 4 + ["n300 R"] * 4),
        ("n150", ["n150 L"]),
        ("p150", ["p150a"]),
    ],
)
def test_snapshot_board_types_and_remote_chips(
    shared_sim: Callable, work: Path, system_name: str, types: list[str]
) -> None:
    root = shared_sim(system_name)
    doc = snapshot(smi(root, "-s", work=work))
    chips = chips_by_id(root)
    assert [d["board_info"]["board_type"] for d in doc["device_info"]] == types
    for chip, dev in zip(chips, doc["device_info"], strict=True):
        info = dev["board_info"]
        assert info["bus_id"] == (chip["bdf"] or "N/A")
        if chip["bdf"] is None:
            assert (info["pcie_speed"], info["pcie_width"]) == ("N/A", "N/A")
        assert info["board_id"] == format(chip["board_id"], "016x")
        if chip["arch"] == "wormhole_b0":
            assert len(dev["smbus_telem"]) == 52
            assert re.fullmatch(r"\(\d+, \d+, \d+, \d+\)", info["coords"])


@pytest.mark.parametrize("system_name", ["t3k", "quietbox2"])
def test_snapshot_fields_follow_raw_telemetry(
    shared_sim: Callable, work: Path, system_name: str
) -> None:
    """Derived fields are computed from smbus_telem as tt-smi 6.8.0 computes them."""
    root = shared_sim(system_name)
    doc = snapshot(smi(root, "-s", work=work))
    upi_names = {0x14: "n300", 0x18: "n150", 0x46: "p300c", 0x45: "p300a", 0x40: "p150a"}
    for dev in doc["device_info"]:
        t, info, tel = dev["smbus_telem"], dev["board_info"], dev["telemetry"]
        wh = "ARC3_HEALTH" in t
        board_id = f"{int(t['BOARD_ID_HIGH'], 16):08x}{int(t['BOARD_ID_LOW'], 16):08x}"
        assert info["board_id"] == board_id
        name = upi_names[(int(board_id, 16) >> 36) & 0xFFFFF]
        assert info["board_type"].split(" ")[0] == name
        raw = int(t["ARC3_HEALTH" if wh else "TIMER_HEARTBEAT"], 16)
        assert tel["heartbeat"] == str(raw // (5 if wh else 6))
        assert tel["voltage"] == f"{int(t['VCORE'], 16) / 1000:4.2f}"
        assert tel["current"] == f"{int(t['TDC'], 16) & 0xFFFF:5.1f}"
        assert tel["power"] == f"{int(t['TDP'], 16) & 0xFFFF:5.1f}"
        assert tel["board_power"] == f"{int(t['INPUT_POWER'], 16):5.1f}"
        assert tel["aiclk"] == f"{int(t['AICLK'], 16) & 0xFFFF:4.0f}"
        fan = int(t["FAN_SPEED"] if wh else t["FAN_RPM"], 16)
        if wh and info["bus_id"] == "N/A":
            fan >>= 16
        assert tel["fan_speed"] == str(fan & 0xFFFF)
        bundle = int(t["FW_BUNDLE_VERSION" if wh else "FLASH_BUNDLE_VERSION"], 16)
        assert dev["firmwares"]["fw_bundle_version"] == ".".join(
            str(bundle >> s & 0xFF) for s in (24, 16, 8, 0)
        )
        assert dev["gddr_telemetry"]["speed"] == info["dram_speed"]
        if wh:
            ddr = int(t["DDR_STATUS"], 16)
            assert info["dram_status"] is ((ddr & 0xFFFFFF) == 0x222222)
            assert info["dram_speed"] == ["16G", "14G", "12G", "10G", "8G"][ddr >> 24]
            date = int(t["WH_FW_DATE"], 16)
            assert dev["firmwares"]["cm_fw_date"] == (
                f"{(date >> 28) + 2020}-{date >> 24 & 0xF:02d}-{date >> 16 & 0xFF:02d}"
            )
        else:
            speed = int(t["DDR_SPEED"], 16)
            assert info["dram_speed"] == ("16G" if speed % 1000 == 0 else str(speed))


def test_snapshot_agrees_with_sysfs(shared_sim: Callable, work: Path) -> None:
    for name, divisor in (("quietbox2", 6), ("t3k", 5)):
        root = shared_sim(name)
        host = Host(root)
        devs = host.dev_indexes()
        before = {n: int(host.attr(n, "tt_heartbeat")) for n in devs}
        doc = snapshot(smi(root, "-s", work=work))
        # The counter moves (at 10 Hz, a fast tt-smi may finish within one tick): wait for it.
        deadline = time.monotonic() + 10
        while True:
            after = {n: int(host.attr(n, "tt_heartbeat")) for n in devs}
            if all(after[n] > before[n] for n in devs) or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        by_bdf = {d["board_info"]["bus_id"]: d for d in doc["device_info"]}
        assert len(devs) == len(by_bdf) - ("N/A" in by_bdf)
        for n in devs:
            dev = by_bdf[host.bdf_of(n)]
            assert dev["board_info"]["board_id"] == host.attr(n, "tt_serial")
            assert after[n] > before[n]  # the counter moves
            beat = int(dev["telemetry"]["heartbeat"])
            assert before[n] // divisor <= beat <= after[n] // divisor, (name, n)


def test_snapshot_lists_holders_by_dev_number(qb2: Path, work: Path, cli: Callable) -> None:
    res = cli("sim", "fault", "--root", str(qb2), "hold", "0000:05:00.0")
    assert res.code == 0, res.err
    pid = int(re.search(r"pid (\d+)", res.out).group(1))
    try:
        # TT_VISIBLE_DEVICES hides the chip from discovery, not its procfs entry
        for env in ({}, {"TT_VISIBLE_DEVICES": "0000:01:00.0"}):
            doc = snapshot(smi(qb2, "-s", work=work, env=env))
            raw = Path(f"/proc/{pid}/cmdline").read_bytes()
            cmdline = raw.replace(b"\0", b" ").replace(b"\n", b" ").decode().strip()
            user = __import__("pwd").getpwuid(os.stat(f"/proc/{pid}").st_uid).pw_name
            dev = next(n for n in Host(qb2).dev_indexes() if Host(qb2).bdf_of(n) == "0000:05:00.0")
            assert dev == 3  # /dev/tenstorrent/N, not the UMD chip id (2) nor PCI order (2)
            assert doc["processes"] == [
                {"pid": pid, "user": user, "device": dev, "cmdline": cmdline}
            ]
            assert list(doc["processes"][0]) == ["pid", "user", "device", "cmdline"]
    finally:
        assert cli("sim", "clear", "--root", str(qb2)).code == 0
    doc = snapshot(smi(qb2, "-s", work=work))
    assert doc["processes"] == []


# --------------------------------------------------------------------------- -f


def test_snapshot_to_named_file(ro: Path, work: Path) -> None:
    run = smi(ro, "-f", "logs/deep/snap.json", work=work)
    assert run.code == 0
    assert run.err == ""
    assert run.out == f"{PURPLE} Saved tt-smi log to: logs/deep/snap.json {ENDC}\n"
    assert run.files == ["logs/deep/snap.json"]
    doc = json.loads((work / "logs/deep/snap.json").read_text())
    assert list(doc) == ["time", "host_info", "host_sw_vers", "device_info", "processes"]
    assert len(doc["device_info"]) == 4


def test_snapshot_to_default_file(ro: Path, work: Path) -> None:
    t0 = datetime.datetime.now().replace(microsecond=0)
    run = smi(ro, "-f", work=work)
    t1 = datetime.datetime.now()
    assert run.code == 0 and run.err == ""
    assert len(run.files) == 1
    rel = run.files[0]
    m = re.fullmatch(r"tt_smi_logs/(\d\d-\d\d-\d{4}_\d\d:\d\d:\d\d)_results\.json", rel)
    assert m, rel
    assert t0 <= datetime.datetime.strptime(m.group(1), "%m-%d-%Y_%H:%M:%S") <= t1
    assert run.out == f"{PURPLE} Saved tt-smi log to: {work / rel} {ENDC}\n"
    assert len(json.loads((work / rel).read_text())["device_info"]) == 4


def test_snapshot_file_dash_is_stdout(ro: Path, work: Path) -> None:
    run = smi(ro, "-f", "-", work=work)
    assert len(snapshot(run)["device_info"]) == 4
    assert run.files == []


def test_snapshot_wins_over_file(ro: Path, work: Path) -> None:
    run = smi(ro, "-s", "-f", "snap.json", work=work)
    assert len(snapshot(run)["device_info"]) == 4
    assert "Saved tt-smi log" not in run.out
    assert run.files == []


def test_snapshot_no_tty_flag(ro: Path, work: Path) -> None:
    run = smi(ro, "-s", "--snapshot_no_tty", work=work)
    assert len(snapshot(run)["device_info"]) == 4
    assert "\x1b" not in run.out


# --------------------------------------------------------------------------- -r


@pytest.mark.parametrize("args", [["-r"], ["-r", "all"], ["--reset", "ALL"], ["-r", ",all,"]])
def test_reset_all_revives_every_device(qb2: Path, work: Path, args: list[str]) -> None:
    kill_all(qb2)
    run = smi(qb2, *args, work=work)
    assert (run.code, run.err, run.files) == (0, "", [])
    assert run.out == "Resetting all PCI devices: [0, 1, 2, 3]\n" + REINIT
    assert alive_bdfs(qb2) == set(QB2_BDFS)


@pytest.mark.parametrize(
    ("args", "line", "reset"),
    [
        # UMD logical id i = the i-th /dev/tenstorrent device in PCI order; printed sorted
        (["-r", "0,1"], "Resetting UMD logical IDs: [0, 1]", ["0000:01:00.0", "0000:03:00.0"]),
        (["-r", "3,1", "1"], "Resetting UMD logical IDs: [1, 3]", ["0000:03:00.0", "0000:07:00.0"]),
        (["-r", "0000:01:00.0"], "Resetting PCI BDFs: ['0000:01:00.0']", ["0000:01:00.0"]),
        (
            ["-r", "0000:07:00.0", "0000:03:00.0"],
            "Resetting PCI BDFs: ['0000:07:00.0', '0000:03:00.0']",
            ["0000:03:00.0", "0000:07:00.0"],
        ),
        (["-r", "/dev/tenstorrent/1"], "Resetting /dev/tenstorrent IDs: [1]", ["0000:03:00.0"]),
        (["-r", "/dev/tenstorrent/3"], "Resetting /dev/tenstorrent IDs: [3]", ["0000:05:00.0"]),
        # one target matches: the others are skipped, nothing else is reset
        (
            ["-r", "0000:99:00.0,0000:05:00.0"],
            "Resetting PCI BDFs: ['0000:99:00.0', '0000:05:00.0']",
            ["0000:05:00.0"],
        ),
        (["-r", "2,9"], "Resetting UMD logical IDs: [2, 9]", ["0000:05:00.0"]),
    ],
)
def test_reset_targets_revive_only_the_devices_named(
    qb2: Path, work: Path, args: list[str], line: str, reset: list[str]
) -> None:
    kill_all(qb2)
    run = smi(qb2, *args, work=work)
    assert (run.code, run.err, run.files) == (0, "", [])
    assert run.out == line + "\n" + REINIT
    assert alive_bdfs(qb2) == set(reset)


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["-r", "0000:99:00.0"], "Resetting PCI BDFs: ['0000:99:00.0']"),
        (["-r", "7"], "Resetting UMD logical IDs: [7]"),
    ],
)
def test_reset_matching_nothing_resets_every_device(
    qb2: Path, work: Path, args: list[str], line: str
) -> None:
    """tt-umd: an empty list after filtering means every device (research note, DANGER)."""
    kill_all(qb2)
    run = smi(qb2, *args, work=work)
    assert (run.code, run.out, run.err) == (0, line + "\n" + REINIT, "")
    assert alive_bdfs(qb2) == set(QB2_BDFS)


@pytest.mark.parametrize(
    ("args", "line", "reset"),
    [
        # tt-umd is handed /dev numbers as they are: one no device has names nothing, and
        # nothing is reset (only an EMPTY list means every device)
        (["-r", "/dev/tenstorrent/9"], "Resetting /dev/tenstorrent IDs: [9]", set()),
        # a negative UMD id passes tt-umd's range check and indexes before its list: no device
        (["-r", "-1"], "Resetting UMD logical IDs: [-1]", set()),
        (["-r", "-0"], "Resetting UMD logical IDs: [0]", {"0000:01:00.0"}),
        (["-r", "٣"], "Resetting UMD logical IDs: [3]", {"0000:07:00.0"}),  # Python's int()
        (["-r", "/dev/tenstorrent/ 1"], "Resetting /dev/tenstorrent IDs: [1]", {"0000:03:00.0"}),
        (["-r", "0,0", " 00 "], "Resetting UMD logical IDs: [0]", {"0000:01:00.0"}),
        (["-r", "", ","], "Resetting all PCI devices: [0, 1, 2, 3]", set(QB2_BDFS)),
    ],
)
def test_reset_targets_as_tt_smi_and_tt_umd_take_them(
    qb2: Path, work: Path, args: list[str], line: str, reset: set[str]
) -> None:
    kill_all(qb2)
    before = resets(qb2)
    run = smi(qb2, *args, work=work)
    assert (run.code, run.out, run.err) == (0, line + "\n" + REINIT, "")
    assert alive_bdfs(qb2) == reset
    assert resets(qb2) == before + bool(reset)


@pytest.mark.parametrize(
    ("target", "value", "call"),
    [
        ("2147483648", "[2147483648]", "warm_reset_chip_id"),
        ("-2147483649", "[-2147483649]", "warm_reset_chip_id"),
        ("0,99999999999999999999", "[0, 99999999999999999999]", "warm_reset_chip_id"),
        ("/dev/tenstorrent/4294967296", "[4294967296]", "warm_reset"),
    ],
)
def test_an_id_beyond_a_c_int_is_tt_umds_type_error_and_resets_nothing(
    ro: Path, work: Path, target: str, value: str, call: str
) -> None:
    """tt-umd's binding takes each id as a C int: tt-smi prints what it resets, then the
    binding refuses the list (a Python traceback, exit 1) before anything is reset."""
    run = smi(ro, "-r", target, work=work)  # ro: the state file is checked to be unchanged
    kind = "/dev/tenstorrent IDs" if call == "warm_reset" else "UMD logical IDs"
    assert (run.code, run.out) == (1, f"Resetting {kind}: {value}\n")
    assert run.err.startswith("Traceback (most recent call last):\n")
    assert f"\nTypeError: {call}(): incompatible function arguments." in run.err
    assert run.err.endswith("Invoked with types: list, kwargs = { secondary_bus_reset: bool }\n")


@pytest.mark.parametrize(
    ("visible", "args", "line", "reset"),
    [
        ("0000:05:00.0", [], "Resetting all PCI devices: [3]", {"0000:05:00.0"}),
        # UMD ids index the visible devices in PCI order
        ("0000:07:00.0,0000:05:00.0", ["1"], "Resetting UMD logical IDs: [1]", {"0000:07:00.0"}),
    ],
)
def test_reset_honours_visible_devices(
    qb2: Path, work: Path, visible: str, args: list[str], line: str, reset: set[str]
) -> None:
    kill_all(qb2)
    run = smi(qb2, "-r", *args, work=work, env={"TT_VISIBLE_DEVICES": visible})
    assert (run.code, run.out, run.err) == (0, line + "\n" + REINIT, "")
    assert alive_bdfs(qb2) == reset


def test_reset_upper_case_bdf_matches_nothing(make_sim: Callable, work: Path) -> None:
    root = make_sim("p150x4")  # has 0000:c1:00.0
    all_bdfs = {c["bdf"] for c in system(root)["chips"]}
    kill_all(root)
    run = smi(root, "-r", "0000:C1:00.0", work=work)
    assert (run.code, run.err) == (0, "")
    assert run.out == "Resetting PCI BDFs: ['0000:C1:00.0']\n" + REINIT  # as typed
    assert alive_bdfs(root) == all_bdfs  # case-sensitive match failed: EVERY device reset
    kill_all(root)
    run = smi(root, "-r", "0000:c1:00.0", work=work)
    assert alive_bdfs(root) == {"0000:c1:00.0"}


def test_reset_no_reinit_resets_without_reinitialising(qb2: Path, work: Path) -> None:
    kill_all(qb2)
    run = smi(qb2, "-r", "0000:03:00.0", "--no_reinit", work=work)
    assert (run.code, run.err) == (0, "")
    assert run.out == "Resetting PCI BDFs: ['0000:03:00.0']\n"
    assert alive_bdfs(qb2) == {"0000:03:00.0"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-r", "all,0"], "Use 'all' as the only argument to select all devices"),
        (["-r", "0", "all"], "Use 'all' as the only argument to select all devices"),
        (["-r", "foo"], INVALID_TARGET.format("foo")),
        (["-r", "²"], "invalid literal for int() with base 10: '²'"),  # isdigit, not int
        (["-r", "/dev/tenstorrent/²"], "invalid literal for int() with base 10: '²'"),
        (
            ["-r", "/dev/tenstorrent/../0"],
            "Invalid path: /dev/tenstorrent/../0 (expected /dev/tenstorrent/<integer>)",
        ),
        (["-r", "+1"], INVALID_TARGET.format("+1")),
        (["-r", "0x1"], INVALID_TARGET.format("0x1")),
        (["-r", "0000:01:00.0.0"], INVALID_TARGET.format("0000:01:00.0.0")),
        (["-r", "foo,all"], INVALID_TARGET.format("foo")),  # items are checked in order
        (["-r", "0000:1:00.0"], INVALID_TARGET.format("0000:1:00.0")),
        (
            ["-r", "/dev/tenstorrent/x"],
            "Invalid path: /dev/tenstorrent/x (expected /dev/tenstorrent/<integer>)",
        ),
        (
            ["-r", "0", "0000:01:00.0"],
            "Mixed device target kinds are not allowed. Got '0000:01:00.0' which is a PCI_BDF, "
            "but earlier inputs were UMD_LOGICAL_ID. Use only one kind per invocation.",
        ),
        (
            ["-r", "/dev/tenstorrent/1,1"],
            "Mixed device target kinds are not allowed. Got '1' which is a UMD_LOGICAL_ID, "
            "but earlier inputs were DEV_TENSTORRENT_ID. Use only one kind per invocation.",
        ),
    ],
)
def test_bad_reset_targets_fail_in_red_resetting_nothing(
    ro: Path, work: Path, args: list[str], message: str
) -> None:
    run = smi(ro, *args, work=work)  # ro: the state file is checked to be unchanged
    assert (run.code, run.out, run.err, run.files) == (1, f"{RED} {message} {ENDC}\n", "", [])


def test_galaxy_reset_sequence(make_sim: Callable, work: Path) -> None:
    root = make_sim("galaxy-wh")
    n = len(Host(root).dev_indexes())
    assert n == 32
    wait = f"{YELLOW}Waiting for 30 seconds: 0{ENDC}"
    wait += "".join(f"\r{YELLOW}Waiting for 30 seconds: {i}{ENDC}" for i in range(1, 31)) + "\n"
    head = (
        f"{PURPLE} Resetting WH Galaxy trays with reset command... {ENDC}\n"
        f"{BLUE} Issuing RESET_PCIE_LINK on {n} devices before IPMI reset... {ENDC}\n"
        f"{BLUE} Issuing USER_RESET on {n} devices before IPMI reset... {ENDC}\n"
        "Executing command: sudo ipmitool raw 0x30 0x8B 0xF 0xFF 0x3 0xF\n"
        + wait
        + f"{BLUE} Issuing POST_RESET on {n} devices after IPMI reset... {ENDC}\n"
        + REINIT
    )
    kill_all(root)
    run = smi(root, "-glx_reset", work=work)
    assert (run.code, run.err, run.files) == (0, "", [])
    assert run.out == head + f"{GREEN} Re-initialized {n} boards after reset. Exiting... {ENDC}\n"
    assert len(alive_bdfs(root)) == 32
    run = smi(root, "--galaxy_6u_trays_reset", "--no_reinit", work=work)
    assert run.code == 0
    assert run.out == head + (
        f"{GREEN} Exiting after galaxy reset without re-initializing chips. {ENDC}\n"
    )
    # tt-smi -r on a Galaxy warns about the CPLD first; -r is dispatched before -glx_reset
    cpld = (
        f"{YELLOW} CPLD FW v1.16 or higher is required to use tt-smi -r on Galaxy systems. "
        "If tt-smi -r fails, please continue to use tt-smi -glx_reset instead and contact your "
        f"system administrator to request a CPLD update. {ENDC}\n"
    )
    bdf = "0000:41:00.0"
    kill_all(root)
    run = smi(root, "-r", bdf, "-glx_reset", work=work)
    assert (run.code, run.err) == (0, "")
    assert run.out == cpld + f"Resetting PCI BDFs: ['{bdf}']\n" + REINIT
    assert alive_bdfs(root) == {bdf}


# --------------------------------------------------------------------------- no driver


@pytest.mark.parametrize(
    "args",
    [["-s"], ["-r"], ["-r", "foo"], ["-r", "0000:01:00.0"], ["-ls"], ["-f", "x.json"], []],
)
def test_without_the_driver_every_command_fails_and_resets_nothing(
    no_driver: Path, work: Path, args: list[str]
) -> None:
    state = (no_driver / core.STATE_FILE).read_bytes()
    run = smi(no_driver, *args, work=work)
    assert (run.code, run.out, run.err, run.files) == (1, NO_DRIVER, "", [])
    assert (no_driver / core.STATE_FILE).read_bytes() == state  # nothing was reset
    assert alive_bdfs(no_driver) == set()


def test_no_driver_still_parses_arguments(no_driver: Path, work: Path) -> None:
    assert smi(no_driver, "-v", work=work).out == "6.8.0\n"
    run = smi(no_driver, "--bogus", work=work)
    assert (run.code, run.out) == (2, "")
    assert run.err.endswith("tt-smi: error: unrecognized arguments: --bogus\n")
