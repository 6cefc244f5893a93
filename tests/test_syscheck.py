"""System pre-flight (issue 26): firmware and driver versions, 1 GiB hugepages per NUMA node or
an IOMMU that makes them unnecessary, and the checks a profile lists, in ``check`` (and its
``--json``), launch pre-flight and ``doctor``, all read from the driver's and kernel's files of
a simulated root; the simulator's faults ``no-hugepages``, ``fw-mismatch`` and ``old-kmd``;
a capture that carries them; and hostile files in their place.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import REPO, run_cli, scratch, stock_model
from users import NEEDS_NOBODY, can_switch, users_fixture  # noqa: F401

from ttmesh.sim.create import create

C01, C03, C05, C07 = "0000:01:00.0", "0000:03:00.0", "0000:05:00.0", "0000:07:00.0"
OK = [sys.executable, "-c", "pass"]
FAKES = str(REPO / "tests" / "fakes")
JAX = [sys.executable, "-m", "sgl_jax.launch_server", "--model-path", "m", "--device", "tt"]


@pytest.fixture
def build(tmp_path: Path) -> Iterator[Callable[..., Path]]:
    """A QuietBox 2 (four p300 chips), optionally with a machine of its own (NUMA, hugepages,
    IOMMU) in its system file."""
    with scratch(tmp_path / "roots") as base:

        def make(name: str = "qb2", **machine: object) -> Path:
            # a copy: the stock model is cached and shared by every test of the session
            model = dataclasses.replace(stock_model("quietbox2"), machine=dict(machine))
            return create(model, base / name, config={"reset_seconds": 0.0})

        yield make


def fault(root: Path, *args: str) -> None:
    res = run_cli("sim", "fault", "--root", str(root), *args)
    assert res.code == 0, res.err


def check(root: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, dict]:
    res = run_cli("check", "--root", str(root), "--json", *args, env=env)
    assert "Traceback" not in res.err, res.err
    return res.code, json.loads(res.out)


def problems(data: dict, severity: str | None = None) -> list[dict]:
    return [p for p in data["problems"] if severity is None or p["severity"] == severity]


def ttmesh_lines(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith("ttmesh:")]


# --------------------------------------------------------------------------- firmware, driver


def test_firmware_that_differs_is_a_warning_and_the_versions_are_shown(build) -> None:
    root = build()
    code, data = check(root)
    assert code == 0 and not problems(data), data["problems"]
    devices = {d["bdf"]: d for d in data["system"]["devices"]}
    assert set(devices) == {C01, C03, C05, C07}
    assert data["system"]["driver"] == "2.10.0"
    assert {d["firmware"]["fw_bundle"] for d in devices.values()} == {"19.10.0.0"}
    fault(root, "fw-mismatch", C05, "--version", "18.6.0.0")
    assert (root / f"sys/bus/pci/devices/{C05}/tenstorrent").is_dir()
    code, data = check(root)
    assert code == 0, data
    (warning,) = problems(data, "warning")
    assert "different firmware bundles" in warning["what"]
    assert f"18.6.0.0 on {C05}" in warning["what"], warning
    assert "tt-flash" in warning["fix"] and f"ttmesh reset --root {root}" in warning["fix"]
    res = run_cli("check", "--root", str(root))
    (line,) = [ln for ln in res.out.splitlines() if ln.startswith("System:")]
    assert line == (
        "System: driver 2.10.0, firmware 19.10.0.0 (3 devices), 18.6.0.0 (1 device), "
        "1 GiB hugepages 16, IOMMU identity"
    ), line
    res = run_cli("check", "--root", str(root), "--strict")  # warnings are errors
    assert res.code == 1
    # firmware survives a reset, as flashed firmware does
    assert run_cli("reset", "--root", str(root), "--chips", C05).code == 0
    assert check(root)[1]["problems"][0]["what"] == warning["what"]


def test_a_driver_older_than_tt_umd_needs_is_an_error(build) -> None:
    root = build()
    fault(root, "old-kmd")
    assert (root / "sys/module/tenstorrent/version").read_text() == "1.34.0\n"
    code, data = check(root)
    assert code == 1
    (error,) = problems(data, "error")
    assert error["what"] == "the tenstorrent driver is 1.34.0, older than the 2.0.0 tt-umd needs"
    assert "modprobe -r tenstorrent" in error["fix"]
    res = run_cli("launch", "--root", str(root), "--", *OK)
    assert res.code == 3, res.err
    (line,) = ttmesh_lines(res.err)
    assert line.startswith("ttmesh: pre-flight: the tenstorrent driver is 1.34.0"), line
    assert "install tt-kmd 2.0.0 or later" in line
    assert "--auto-reset" not in line  # a reset does not fix a driver
    res = run_cli("sim", "fault", "--root", str(root), "old-kmd", "--version", "1e5")
    assert res.code == 2 and ttmesh_lines(res.err) == [
        "ttmesh: --version '1e5': not a version (give dotted numbers, e.g. --version 1.34.0)"
    ], res.err
    assert run_cli("sim", "clear", "--root", str(root)).code == 0
    assert check(root)[0] == 0


def test_launch_says_a_firmware_warning_once_and_runs(build) -> None:
    root = build()
    fault(root, "fw-mismatch", C03)
    env = {"PYTHONUNBUFFERED": ""}
    res = run_cli(
        "launch", "--root", str(root), "--max-restarts", "1", "--", sys.executable, "-c",
        "import sys; sys.exit(3)", env=env,
    )  # fmt: skip
    assert res.code == 3, res.err
    said = [ln for ln in res.err.splitlines() if "different firmware bundles" in ln]
    assert len(said) == 1, res.err
    assert said[0].startswith("ttmesh: pre-flight: warning: the chips run different firmware")
    assert "(fix: flash every chip" in said[0]


# --------------------------------------------------------------------------- hugepages


def test_no_hugepages_refuses_the_launch_with_the_fix(build) -> None:
    root = build()
    pages = root / "sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages"
    assert pages.read_text() == "16\n"  # hugepages-setup.sh: 4 per device
    assert "Hugetlb:        16777216 kB" in (root / "proc/meminfo").read_text()
    fault(root, "no-hugepages")
    assert pages.read_text() == "0\n"
    node = root / "sys/devices/system/node/node0/hugepages/hugepages-1048576kB/nr_hugepages"
    assert node.read_text() == "0\n"
    code, data = check(root)
    assert code == 1
    (error,) = problems(data, "error")
    assert error["what"].startswith("no 1 GiB hugepages for 0000:01:00.0")
    assert (
        "echo 16 | sudo tee /sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages"
        in (error["fix"])
    )
    assert data["system"]["hugepages"]["total"] == 0
    res = run_cli("launch", "--root", str(root), "--chips", C01, "--", *OK)
    assert res.code == 3, res.err
    (line,) = ttmesh_lines(res.err)
    assert line.startswith(f"ttmesh: pre-flight: no 1 GiB hugepages for {C01},"), line
    assert "echo 4 | sudo tee" in line, line
    res = run_cli("launch", "--root", str(root), "--dry-run", "--", *OK)
    assert res.code == 3 and "no 1 GiB hugepages" in res.err
    res = run_cli("launch", "--root", str(root), "--auto-reset", "--", *OK)
    assert res.code == 3 and "resetting" not in res.err, res.err  # no reset makes hugepages


def test_hugepages_count_on_each_chips_numa_node(build) -> None:
    numa = {C01: 0, C03: 0, C05: 1, C07: 1}
    root = build(numa_nodes=2, numa=numa, hugepages={"0": 8, "1": 2})
    assert (root / f"sys/bus/pci/devices/{C05}/numa_node").read_text() == "1\n"
    code, data = check(root)
    assert code == 0, data["problems"]
    (warning,) = problems(data, "warning")
    assert warning["what"].startswith(
        f"2 1 GiB hugepages on NUMA node 1 for 2 chips ({C05}, {C07})"
    )
    assert "node1/hugepages/hugepages-1048576kB/nr_hugepages" in warning["fix"]
    assert data["system"]["hugepages"]["nodes"] == {"0": 8, "1": 2}
    root = build("empty-node", numa_nodes=2, numa=numa, hugepages={"0": 16, "1": 0})
    code, data = check(root)
    assert code == 1
    (error,) = problems(data, "error")
    assert error["what"].startswith(f"no 1 GiB hugepages on NUMA node 1 for {C05}, {C07}")
    res = run_cli("launch", "--root", str(root), "--chips", f"{C01},{C03}", "--", *OK)
    assert res.code == 0, res.err  # node 0's chips have node 0's pages


def test_an_iommu_that_translates_needs_no_hugepages(build) -> None:
    root = build(iommu="DMA-FQ", hugepages={"0": 0})
    group = os.readlink(root / f"sys/devices/pci0000:00/{C01}/iommu_group")
    assert group.startswith("../../../kernel/iommu_groups/")
    assert (root / "sys/kernel/iommu_groups/0/type").read_text() == "DMA-FQ\n"
    code, data = check(root)
    assert code == 0 and not problems(data), data["problems"]
    assert any("DMA translation mode (DMA-FQ)" in n for n in data["notes"]), data["notes"]
    res = run_cli("launch", "--root", str(root), "--", *OK)
    assert res.code == 0, res.err
    root = build("passthrough", iommu="identity", hugepages={"0": 0})
    assert check(root)[0] == 1


# --------------------------------------------------------------------------- profiles


def _profile(tmp_path: Path, system: str) -> dict[str, str]:
    """sglang-jax (a server driving chips) with ``system:`` of its own."""
    directory = tmp_path / "profiles"
    directory.mkdir(exist_ok=True)
    stock = (REPO / "ttmesh/configs/profiles/sglang-jax.yaml").read_text()
    body = stock.replace("name: sglang-jax", "name: mine").replace("priority: 20", "priority: 99")
    (directory / "mine.yaml").write_text(body + "flags: sglang-jax\n" + system)
    return {"PYTHONPATH": FAKES, "TTMESH_PROFILES": str(directory)}


def test_a_profile_lists_the_checks_it_needs(build, tmp_path: Path) -> None:
    root = build()
    env = _profile(tmp_path, 'system:\n  min_fw_bundle: "19.0.0.0"\n  hugepages_per_chip: 8\n')
    fault(root, "fw-mismatch", C03, "--version", "18.6.0.0")
    code, data = check(root, env=env)
    assert code == 0, data["problems"]  # no profile: defaults only
    code, data = check(root, "--profile", "mine", env=env)
    assert code == 1
    errors = problems(data, "error")
    assert [p["what"] for p in errors] == [
        f"firmware bundle older than the 19.0.0.0 profile mine needs: {C03} (18.6.0.0)",
        f"16 1 GiB hugepages for 4 chips ({C01}, {C03}, {C05}, {C07}): 8 per chip "
        "(profile mine) is 32",
    ], errors
    assert all(p["fix"] for p in errors)
    assert data["system"]["requires"] == {
        "min_kmd": "2.0.0", "min_fw_bundle": "19.0.0.0", "hugepages_per_chip": 8,
        "source": "profile mine",
    }  # fmt: skip
    res = run_cli("check", "--root", str(root), "--profile", "mine", env=env)
    assert res.code == 1 and "error: firmware bundle older than the 19.0.0.0" in res.out
    # a launch of that profile's server refuses, naming the first
    for extra in (["--dry-run"], []):
        res = run_cli("launch", "--root", str(root), *extra, "--", *JAX, "--tp-size", "4", env=env)
        assert res.code == 3, res.err
        line = ttmesh_lines(res.err)[-1]
        assert line.startswith("ttmesh: pre-flight: firmware bundle older than the 19.0.0.0"), line


@pytest.mark.parametrize(
    ("system", "said"),
    [
        ("system: {min_fw: 1}\n", "system: a map of min_kmd, min_fw_bundle, hugepages_per_chip"),
        ('system: {min_kmd: "two"}\n', "system.min_kmd: 'two' is not a version"),
        ("system: {hugepages_per_chip: -1}\n", "system.hugepages_per_chip"),
    ],
)
def test_a_profile_with_bad_checks_is_one_line(build, tmp_path: Path, system: str, said: str):
    root = build()
    res = run_cli("check", "--root", str(root), "--profile", "mine", env=_profile(tmp_path, system))
    assert res.code == 2, res.err
    (line,) = res.err.strip().splitlines()[-1:]
    assert said in line and "Traceback" not in res.err, res.err


# --------------------------------------------------------------------------- capture


def test_a_capture_carries_the_system_files_and_the_replica_says_the_same(
    build, tmp_path: Path
) -> None:
    root = build(numa_nodes=2, numa={C01: 0, C03: 0, C05: 1, C07: 1}, hugepages={"0": 8, "1": 0})
    fault(root, "fw-mismatch", C07, "--version", "18.2.0.0")
    fault(root, "old-kmd", "--version", "1.33.0")
    archive = tmp_path / "cap.tar.gz"
    res = run_cli("doctor", "--root", str(root), "--capture", str(archive))
    assert res.code == 0, res.err
    assert "system files" in res.out
    assert "  system: error: the tenstorrent driver is 1.33.0, older than the 2.0.0" in res.out
    assert "  system: warning: the chips run different firmware bundles" in res.out
    assert "  system: error: no 1 GiB hugepages on NUMA node 1" in res.out, res.out
    import tarfile

    with tarfile.open(archive) as tar:
        names = {m.name.split("/", 1)[1] for m in tar.getmembers() if "/" in m.name}
    for rel in (
        "host/sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages",
        "host/sys/devices/system/node/node1/hugepages/hugepages-1048576kB/nr_hugepages",
        "host/sys/devices/system/node/online",
        "host/proc/meminfo",
        f"host/sys/devices/pci0000:00/{C05}/numa_node",
        f"host/sys/devices/pci0000:00/{C05}/iommu_group",
        "host/sys/kernel/iommu_groups/2/type",
    ):
        assert rel in names, rel
    replica = tmp_path / "replica"
    res = run_cli("sim", "create", "--from-capture", str(archive), "--root", str(replica))
    assert res.code == 0, res.err
    _, before = check(root)
    _, after = check(replica)
    assert [(p["severity"], p["what"]) for p in after["problems"]] == [
        (p["severity"], p["what"]) for p in before["problems"]
    ]
    assert len(after["problems"]) == 3  # the driver, node 1's pages, the firmware
    assert after["system"]["hugepages"] == {**before["system"]["hugepages"],
                                            "source": after["system"]["hugepages"]["source"]}  # fmt: skip
    assert [d["firmware"] for d in after["system"]["devices"]] == [
        d["firmware"] for d in before["system"]["devices"]
    ]


# --------------------------------------------------------------------------- hostile files


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _zero(path: Path) -> None:
    path.unlink()
    path.symlink_to("/dev/zero")


def _garbage(path: Path) -> None:
    path.write_bytes(b"\x00\xffnot a number\n")


def _huge(path: Path) -> None:
    path.write_bytes(b"1" * (2 << 20))


HOSTILE = {"fifo": _fifo, "dev-zero": _zero, "garbage": _garbage, "huge": _huge}
FILES = (
    "sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages",
    "sys/devices/system/node/node0/hugepages/hugepages-1048576kB/nr_hugepages",
    "proc/meminfo",
    f"sys/devices/pci0000:00/{C01}/numa_node",
    "sys/kernel/iommu_groups/0/type",
    "sys/module/tenstorrent/version",
    f"sys/devices/pci0000:00/{C03}/tenstorrent/tenstorrent!1/tt_fw_bundle_ver",
)


@pytest.mark.parametrize("kind", sorted(HOSTILE))
@pytest.mark.parametrize("rel", FILES, ids=[f.rsplit("/", 2)[-1] for f in FILES])
def test_hostile_system_files_are_one_line_and_no_hang(build, kind: str, rel: str) -> None:
    root = build()
    if rel == "proc/meminfo":  # read when the sysfs counts are not there
        (root / "sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages").unlink()
    path = root / rel
    HOSTILE[kind](path)
    res = run_cli("check", "--root", str(root), timeout=30)
    assert res.code == 2, (res.code, res.out, res.err)
    lines = res.err.strip().splitlines()
    assert len([ln for ln in lines if ln.startswith("ttmesh:")]) == 1, res.err
    assert "Traceback" not in res.err
    assert rel.rsplit("/", 1)[-1] in lines[-1], lines[-1]
    assert "recreate it: ttmesh sim create --force" in lines[-1], lines[-1]
    res = run_cli("launch", "--root", str(root), "--", *OK, timeout=30)
    assert res.code == 2 and "Traceback" not in res.err, res.err


# --------------------------------------------------------------------------- two users


@pytest.mark.skipif(not can_switch(), reason=NEEDS_NOBODY)
def test_a_hostile_host_of_another_user_is_one_line_for_root(users, tmp_path: Path) -> None:
    """nobody's own simulated host, its hugepage count a link to a file only root may read
    and its firmware version a FIFO: root's check refuses it in one line, reading nothing
    outside it and never blocking; nobody reading it is refused the same way."""
    nobody = users["nobody"]
    sim = nobody.base / "hostile-syscheck"
    made = nobody.run("sim", "create", "--system", "quietbox2", "--root", str(sim))
    assert made.returncode == 0, made.stderr
    secret = tmp_path / "secret"
    secret.write_text("12\n")
    secret.chmod(0o600)
    pages = "sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages"
    plant = nobody.py(
        "import os, sys; p = sys.argv[1]; os.unlink(p); os.symlink(sys.argv[2], p)",
        str(sim / pages),
        str(secret),
    )
    assert plant.returncode == 0, plant.stderr
    res = users["root"].run("check", "--root", str(sim), hostile=True)
    assert res.returncode == 2, (res.returncode, res.stderr)
    line = res.stderr.strip().splitlines()[-1]
    assert line.startswith(f"ttmesh: the simulated host's {sim}/{pages} leads out of"), line
    assert "12" not in res.stdout
    fw = f"sys/devices/pci0000:00/{C01}/tenstorrent/tenstorrent!0/tt_fw_bundle_ver"
    fifo = nobody.py("import os, sys; p = sys.argv[1]; os.unlink(p); os.mkfifo(p)", str(sim / fw))
    assert fifo.returncode == 0, fifo.stderr
    for user in (users["root"], nobody):
        res = user.run("check", "--root", str(sim), hostile=True)
        assert res.returncode == 2, (user.name, res.returncode, res.stderr)
        assert "Traceback" not in res.stderr
        assert len([ln for ln in res.stderr.splitlines() if ln.startswith("ttmesh:")]) == 1


def test_recovery_after_a_crash_resets_nothing_for_the_system_software(build) -> None:
    """A host's recovery after a job (``ttmesh _recover --check``, run on every host of a mesh
    over several) calls for a reset when a reset can fix the chips: not for missing hugepages or an old
    driver, which pre-flight refuses before the next start instead."""
    root = build()
    fault(root, "no-hugepages")
    fault(root, "old-kmd")
    asic = "00008a26321e00c1"
    res = run_cli("_recover", "--root", str(root), "--check", "--chips", asic)
    assert res.code == 0, res.err
    line = next(ln for ln in res.out.splitlines() if ln.startswith("@@ttmesh-check"))
    assert json.loads(line.split(" ", 1)[1])["state"] == "healthy", line
    shown = json.loads(run_cli("sim", "show", "--root", str(root), "--json").out)
    assert shown["resets"] == 0
