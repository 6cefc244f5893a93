"""The tt-smi stand-in against tt-smi 6.8.0's own code, from the package index (no hardware).

``scripts/conformance/tt-smi-run`` installs ``tt-smi==6.8.0`` into the conformance cache on first
use and runs its ``main()`` on a simulated host with only what touches hardware replaced
(``_tt_smi_run.py``): its argument parser, its ``-r`` target parsing (``device_input.py``) and
dispatch to tt-umd (``reset.py``), its ``-ls`` tables (``backend.py``
``print_all_available_devices_umd``, through rich) and its ``-s`` document (``backend.py``, fed
the stand-in's raw telemetry). The stand-in must print the same bytes and exit with the same
code, and reset the chips tt-umd would for the call tt-smi makes. What runs in C++ cannot run
here; it is read from tt-umd's source instead (``device/warm_reset.cpp``: ``warm_reset_chip_id``
L101-113 maps UMD ids below the device count through ``PCIDevice::enumerate_devices()``,
``warm_reset_pci_bdfs`` L115-128 keeps exact address matches, ``warm_reset`` L52-61 takes an empty
list as every device; ``device/pcie/pci_device.cpp`` ``enumerate_devices`` sorts by PCI address
(tt-umd #2255) and ``send_reset_ioctl_to_devices`` reaches enumerated devices only;
``device/topology/topology_discovery.cpp`` ``get_connected_devices``/``discover_remote_devices``
number the PCI devices first, in that order, then remote chips as discovery reaches them).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import CONFORMANCE, env_without, stock_model

from ttmesh.cli.hosts import open_host as Host
from ttmesh.sim import core
from ttmesh.sim.create import create

pytestmark = pytest.mark.conformance

RUN = CONFORMANCE / "tt-smi-run"
SYSTEMS = ["quietbox2", "t3k", "n300", "galaxy-wh", "p150x4"]
WIDTHS = ["1", "30", "80", "132", "200"]
GALAXY = {"galaxy-wh": 0x35, "galaxy-bh": 0x47}  # PCI subsystem ids tt-smi calls a Galaxy


@pytest.fixture(scope="module")
def theirs(
    shared_sim: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, list[tuple[dict, dict]]]:
    """Every case of this module and tt-smi 6.8.0's own result, run in ONE process of the
    cached tt-smi (installed on first use), by test."""
    proc = subprocess.run([str(RUN), "--python"], capture_output=True, text=True, timeout=1800)
    if proc.returncode == 3:
        pytest.skip(f"conformance prerequisite missing: {proc.stderr.strip()[-300:]}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    groups: dict[str, list[dict]] = {"list": [], "usage": []}
    for name in SYSTEMS:
        root = shared_sim(name)
        snap = ours(root, ["-s"])
        assert snap["code"] == 0, snap
        base = {
            "root": str(root),
            "snapshot": json.loads(snap["out"]),
            "subsystem": GALAXY.get(name, 0),
        }
        groups["list"] += [{**base, "argv": ["-ls"], "env": {"COLUMNS": w}} for w in WIDTHS]
        groups["list"].append({**base, "argv": ["-s"], "env": {}, "ours": snap})
    base_dir = tmp_path_factory.mktemp("resets")
    for name, argvs in RESETS.items():
        root = create(stock_model(name), base_dir / name, config={"reset_seconds": 0.0})
        groups[name] = [
            {"root": str(root), "argv": a, "subsystem": GALAXY.get(name, 0)} for a in argvs
        ]
    bare = create(stock_model("quietbox2"), base_dir / "bare", config={"reset_seconds": 0.0})
    (bare / "sys/module/tenstorrent/version").unlink()
    qb2 = str(shared_sim("quietbox2"))
    groups["usage"] = [{"root": qb2, "argv": a} for a in USAGE]
    groups["usage"] += [{"root": str(bare), "argv": a} for a in NO_DRIVER]
    cases = [c for g in groups.values() for c in g]
    proc = subprocess.run(
        [str(RUN)], input=json.dumps([{k: v for k, v in c.items() if k != "ours"} for c in cases]),
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = iter(json.loads(proc.stdout))
    return {g: [(c, next(results)) for c in group] for g, group in groups.items()}


def ours(root: Path, argv: list[str], env: dict[str, str] | None = None) -> dict:
    full = env_without("COLUMNS", "LINES", "TT_VISIBLE_DEVICES")
    full.update(env or {})
    proc = subprocess.run(
        [str(root / "bin" / "tt-smi"), *argv],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=full,
        timeout=60,
    )
    return {"code": proc.returncode, "out": proc.stdout, "err": proc.stderr}


def test_list_and_snapshot_print_what_tt_smi_prints(theirs: dict) -> None:
    """``-ls`` at several console widths (rich cuts and wraps to fit) and ``-s`` on five
    systems, remote Wormhole chips included: the same bytes and codes as tt-smi 6.8.0's,
    the snapshot's only difference its time; the chips in tt-umd's order."""
    for case, want in theirs["list"]:
        root = Path(case["root"])
        label = (root.name, case["argv"], case["env"])
        if case["argv"] == ["-s"]:
            got = case["ours"]
            a, b = json.loads(want["out"]), json.loads(got["out"])
            assert a.pop("time") and b.pop("time")
            assert b == a, label
            assert got["out"].startswith('{\n    "time": ')  # json.dumps(indent=4), as theirs
            order = [d["board_info"]["bus_id"] for d in b["device_info"]]
            pci = [bdf for bdf in order if bdf != "N/A"]
            # tt-umd's logical ids: the PCI devices first, in PCI order, then remote chips
            assert order == pci + ["N/A"] * (len(order) - len(pci)) and pci == sorted(pci), label
        else:
            got = ours(root, case["argv"], case["env"])
            assert (got["code"], got["out"], got["err"]) == (want["code"], want["out"], ""), label


# Hostile and ordinary -r targets: tt-smi's own parser decides what each means.
TARGETS = [
    [], ["all"], ["ALL"], [""], [","], [" all "], ["all,0"], ["0", "all"], ["0"], ["1"], ["3"],
    ["3,1", "1"], ["0,0", "00"], ["-0"], ["-1"], ["7"], ["2,9"], ["٣"], ["²"], ["+1"], ["0x1"],
    ["1e3"], ["2147483647"], ["2147483648"], ["-2147483649"], ["99999999999999999999999"],
    ["0000:01:00.0"], ["0000:07:00.0", "0000:03:00.0"], ["0000:99:00.0"], ["0000:01:00.0 "],
    ["0000:99:00.0,0000:05:00.0"], ["0000:0A:00.0"], ["0000:1:00.0"], ["01:00.0"],
    ["0000:01:00.0.0"], ["/dev/tenstorrent/1"], ["/dev/tenstorrent/3"], ["/dev/tenstorrent/9"],
    ["/dev/tenstorrent/ 1"], ["/dev/tenstorrent/../0"], ["/dev/tenstorrent/x"],
    ["/dev/tenstorrent/²"], ["/dev/tenstorrent/4294967296"], ["/dev/tenstorrent/"],
    ["/dev/tenstorrent"], ["0", "0000:01:00.0"], ["/dev/tenstorrent/1,1"],
    ["0000:01:00.0", "/dev/tenstorrent/1"], ["foo,all"], ["--", "0"],
]  # fmt: skip
RESETS = {
    "quietbox2": [["-r", *t] for t in TARGETS]
    + [["--reset=0"], ["--res", "2"], ["-r", "0", "--no_reinit"], ["-ls", "-r", "1"]],
    "galaxy-wh": [["-r", "0"], ["-r", "0000:41:00.0"], ["-r"]],  # tt-smi's CPLD warning first
}
USAGE = [["--bogus"], ["--snap"], ["-r", "--5"], ["-v"], ["-ls", "-r", "x"], ["-r", "0", "-x"]]
NO_DRIVER = [["-r", "foo"], ["-s"], ["-ls"], ["-r"]]


def umd_resets(call: list, devices: list[tuple[str, int]]) -> set[str]:
    """The PCI addresses tt-umd resets for tt-smi's call (``devices``: enumerate_devices() as
    (address, /dev number), in PCI order), as read from tt-umd's source (module docstring)."""
    name, ids = call
    chosen: list[int | None]
    if name == "warm_reset_chip_id":
        chosen = [devices[i][1] if i >= 0 else None for i in ids if i < len(devices)]
    elif name == "warm_reset_pci_bdfs":
        chosen = [dev for bdf, dev in devices if bdf in ids]
    else:
        chosen = list(ids)
    if not chosen:
        chosen = [dev for _, dev in devices]
    return {bdf for bdf, dev in devices if dev in chosen}


def reset_since(root: Path, count: int) -> set[str]:
    """The PCI addresses the stand-in reset after its first ``count`` resets (its log)."""
    sim = core.SimRoot(str(root))
    done = sim.read_state()["resets"][count:]
    bdfs = {sim.chip_by_asic(a).get("bdf") for r in done for a in r["targets"]}
    return {b for b in bdfs if b}


@pytest.mark.parametrize("name", list(RESETS))
def test_reset_targets_are_read_and_dispatched_as_tt_smi_does(theirs: dict, name: str) -> None:
    """Every -r target list: the same lines, stderr's last line and exit code as tt-smi
    6.8.0's, and the stand-in resets what tt-umd resets for the call tt-smi makes (nothing
    when tt-smi refuses, or tt-umd's binding does)."""
    for case, want in theirs[name]:
        root = Path(case["root"])
        host = Host(root)
        devices = sorted((host.bdf_of(n) or "", n) for n in host.dev_indexes())
        count = len(core.SimRoot(str(root)).read_state()["resets"])
        got = ours(root, case["argv"])
        label = case["argv"]
        assert (got["code"], got["out"]) == (want["code"], want["out"]), label
        assert got["err"].strip().splitlines()[-1:] == want["err"].strip().splitlines()[-1:], label
        expected = umd_resets(want["calls"][0], devices) if want["calls"] else set()
        assert reset_since(root, count) == expected, label


def test_usage_errors_and_no_driver_are_tt_smis(theirs: dict) -> None:
    """Arguments argparse refuses (usage on stderr, exit 2), -v, and a host without the
    driver (checked before any reset target is): nothing is reset."""
    for case, want in theirs["usage"]:
        root = Path(case["root"])
        state = (root / "sim/state.json").read_bytes()
        got = ours(root, case["argv"])
        label = (root.name, case["argv"])
        assert (got["code"], got["out"], got["err"]) == (want["code"], want["out"], want["err"]), (
            label
        )
        assert (root / "sim/state.json").read_bytes() == state, label
