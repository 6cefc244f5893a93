"""What a field capture carries beyond the driver's own tree, and how ``sim create
--from-capture`` rebuilds it (issue 26, "The host as the driver and tt-umd see it"): each
chip's hwmon node, tt-umd's lock files in ``/dev/shm``, the ``/dev/tenstorrent/by-id`` names
and the container signs. Each test captures a simulated host showing the thing, recreates it
and compares what ttmesh reports on both roots; the hostile ones feed the reader lock entries
and by-id links no capture of ttmesh has.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli, scratch
from users import NEEDS_NOBODY, can_switch, users_fixture  # noqa: F401

from ttmesh.cli.hosts import open_host
from ttmesh.fabric import umdlocks
from ttmesh.recovery import capture
from ttmesh.recovery.top import Sampler
from ttmesh.sim import faults
from ttmesh.sim.from_capture import recreate

C01, C03, C05, C07 = "0000:01:00.0", "0000:03:00.0", "0000:05:00.0", "0000:07:00.0"


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    """A QuietBox 2 whose fault processes (lock holders) end with the test."""
    with scratch(tmp_path / "roots") as base:
        path = base / "qb2"
        res = run_cli("sim", "create", "--system", "quietbox2", "--root", str(path))
        assert res.code == 0, res.err
        try:
            yield path
        finally:
            with contextlib.suppress(Exception):
                for lock in umdlocks.read(open_host(path)):
                    if lock.state == umdlocks.HELD and lock.owner_pid:
                        cmd = Path(f"/proc/{lock.owner_pid}/cmdline").read_bytes()
                        if faults.UMD_LOCK_TAG.encode() in cmd:
                            os.kill(lock.owner_pid, signal.SIGKILL)


def take(root: Path, dest: Path) -> Path:
    res = run_cli("doctor", "--root", str(root), "--capture", str(dest))
    assert res.code == 0, res.err
    return dest


def twin_of(archive: Path, tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """The recreated root and its sim/capture.json."""
    twin = tmp_path / "twin"
    res = run_cli("sim", "create", "--from-capture", str(archive), "--root", str(twin))
    assert res.code == 0, res.err
    return twin, json.loads((twin / "sim/capture.json").read_text())


def check(root: Path) -> dict[str, Any]:
    res = run_cli("check", "--json", "--root", str(root))
    assert "Traceback" not in res.err and res.out, res.err
    return json.loads(res.out.replace(str(root.resolve()), "ROOT"))


def telemetry(root: Path) -> dict[str, tuple[Any, ...]]:
    """What ttmesh metrics reports of each chip (the driver's files only: hwmon, tt_aiclk)."""
    sample = Sampler(open_host(root), first_wait=0.2, driver_only=True).sample()
    return {
        c["bdf"]: (c["temperature_c"], c["power_w"], c["voltage_v"], c["aiclk_mhz"])
        for c in sample["chips"]
    }


def hwmon_dir(root: Path, bdf: str) -> Path:
    (node,) = (root / f"sys/devices/pci0000:00/{bdf}/hwmon").iterdir()
    return node


# --------------------------------------------------------------------------- round trips


def test_hwmon_values_recreated(root: Path, tmp_path: Path) -> None:
    """A hot chip, a chip drawing more power with a current sensor, a driver without hwmon on
    another: ttmesh metrics' values are the same on the recreated host."""
    hot = hwmon_dir(root, C03)
    (hot / "temp1_input").write_text("81250\n")
    (hot / "power1_input").write_text("118000000\n")
    (hot / "curr1_input").write_text("140000\n")
    (hot / "temp1_label").write_text("asic\n")
    for f in hwmon_dir(root, C05).iterdir():
        f.unlink()
    hwmon_dir(root, C05).rmdir()
    before = telemetry(root)
    assert before[C03][:2] == (81.25, 118.0) and before[C05][:3] == (None, None, None)
    archive = take(root, tmp_path / "c.tar.gz")
    twin, info = twin_of(archive, tmp_path)
    assert telemetry(twin) == before
    assert (hwmon_dir(twin, C03) / "curr1_input").read_text() == "140000\n"
    assert any("hwmon values" in r and C03 in r and C05 in r for r in info["reproduced"])
    manifest = capture.read_archive(archive).manifest
    assert manifest["sections"]["driver files"]["hwmon"] == 3
    assert f"host/sys/devices/pci0000:00/{C03}/hwmon/hwmon1/temp1_input" in manifest["captured"]


def test_umd_locks_recreated(root: Path, tmp_path: Path) -> None:
    """A held CHIP_IN_USE, a dead owner's ARC_MSG, a file that is not tt-umd's: the same files
    (names, sizes, bytes) on the recreated host; the held one, which no process can hold
    there, is a dead owner's and said so."""
    host = open_host(root)
    held = faults.umd_lock(host, C01)
    dead = faults.umd_lock(host, C03, kind="ARC_MSG", dead=True)
    (root / "dev/shm/TT_UMD_LOCK.junk").write_bytes(b"x" * 10)
    shm = root / "dev/shm"
    files = {p.name: p.read_bytes() for p in shm.iterdir()}
    original = check(root)
    assert next(p["what"] for p in original["problems"]).startswith(f"{C01} is in use")
    archive = take(root, tmp_path / "c.tar.gz")
    doc = capture.read_archive(archive).json(capture.UMD_LOCKS)
    assert {e["file"]: e["state"] for e in doc["locks"]} == {
        "TT_UMD_LOCK.CHIP_IN_USE_0_PCIe": "held",
        "TT_UMD_LOCK.ARC_MSG_1_PCIe": "dead-owner",
        "TT_UMD_LOCK.junk": "unreadable",
    }
    entry = next(e for e in doc["locks"] if e["state"] == "held")
    assert entry["field_pid"] == held and entry["lock_word"] == held and entry["size"] == 56
    assert "bytes" not in next(e for e in doc["locks"] if e["state"] == "unreadable")
    twin, info = twin_of(archive, tmp_path)
    again = {p.name: p.read_bytes() for p in (twin / "dev/shm").iterdir()}
    assert again.keys() == files.keys()
    assert again["TT_UMD_LOCK.ARC_MSG_1_PCIe"] == files["TT_UMD_LOCK.ARC_MSG_1_PCIe"]
    assert again["TT_UMD_LOCK.junk"] == bytes(10)  # its size, not its contents
    was, now = files["TT_UMD_LOCK.CHIP_IN_USE_0_PCIe"], again["TT_UMD_LOCK.CHIP_IN_USE_0_PCIe"]
    assert now[4:] == was[4:] and int.from_bytes(now[:4], "little") == held | 0x40000000
    recreated = check(twin)
    states = {lk["name"]: lk["state"] for lk in recreated["umd_locks"]}
    assert states == {"CHIP_IN_USE_0_PCIe": "dead-owner", "ARC_MSG_1_PCIe": "dead-owner",
                      "junk": "unreadable"}  # fmt: skip
    assert not recreated["problems"]
    notes = [n for n in recreated["notes"] if "tt-umd lock" in n]
    assert any(f"by pid {dead}" in n for n in notes) and any(f"by pid {held}" in n for n in notes)
    assert any("10 bytes, not tt-umd's" in n for n in notes)
    assert any(f"held by pid {held}" in n and "dead owner" in n for n in info["not_reproduced"])


def test_by_id_names_recreated(root: Path, tmp_path: Path) -> None:
    """by-id names other than the simulator's (one renamed, one gone, one chip with two):
    ttmesh ls --json shows the same on the recreated host."""
    by_id = root / "dev/tenstorrent/by-id"
    links = sorted(by_id.iterdir())
    os.rename(links[0], by_id / "rack3-slot1")
    links[1].unlink()
    os.symlink(os.readlink(links[2]), by_id / "spare")

    def names(where: Path) -> dict[str, Any]:
        res = run_cli("ls", "--json", "--root", str(where))
        assert res.code == 0, res.err
        return {c["bdf"]: c["by_id"] for c in json.loads(res.out)["chips"]}

    before = names(root)
    assert "rack3-slot1" in before.values() and None in before.values()
    twin, info = twin_of(take(root, tmp_path / "c.tar.gz"), tmp_path)
    assert names(twin) == before
    assert sorted(os.listdir(twin / "dev/tenstorrent/by-id")) == sorted(os.listdir(by_id))
    assert any("by-id" in r and "rack3-slot1" in r for r in info["reproduced"])
    # A reset renders the tree again: the captured names stay.
    res = run_cli("reset", "--root", str(twin))
    assert res.code == 0, res.err
    assert sorted(os.listdir(twin / "dev/tenstorrent/by-id")) == sorted(os.listdir(by_id))


def test_container_recreated(root: Path, tmp_path: Path) -> None:
    """A Docker container with its private 64 MiB /dev/shm and a node a reset re-created:
    check's container findings are the same on the recreated host."""
    host = open_host(root)
    faults.container(host, C05)
    (root / "proc/1/cgroup").write_text("0::/system.slice/docker-4f2a.scope\n")

    def container_view(where: Path) -> tuple[list[Any], list[str]]:
        doc = check(where)
        return doc["problems"], [n for n in doc["notes"] if "container" in n or "mounted" in n]

    before = container_view(root)
    kinds = " ".join(p["what"] for p in before[0])
    assert "no driver node in this container" in kinds and "/dev/shm holds 64 MiB" in kinds
    archive = take(root, tmp_path / "c.tar.gz")
    doc = capture.read_archive(archive).json(capture.CONTAINER)
    assert doc["container"] and doc["markers"] == {".dockerenv": {"mode": "0644", "kind": "file"}}
    assert doc["dev_shm"] == {"fstype": "tmpfs", "source": "shm", "size": 64 << 20}
    assert "/proc/1/cgroup names docker" in doc["signs"]
    twin, info = twin_of(archive, tmp_path)
    assert container_view(twin) == before
    assert any(r.startswith("a container (") for r in info["reproduced"])
    res = run_cli("sim", "show", "--json", "--root", str(twin))
    assert json.loads(res.out)["container"] is True


def test_nothing_extra_on_a_plain_host(root: Path, tmp_path: Path) -> None:
    """No container, no locks, the simulator's own names and values: nothing said, nothing
    written beyond what a fresh simulated host has."""
    archive = take(root, tmp_path / "c.tar.gz")
    manifest = capture.read_archive(archive).manifest
    assert [m["what"] for m in manifest["not_captured"]] == ["kernel messages"]
    assert manifest["sections"]["container"] == {"ok": True, "container": False, "signs": []}
    assert manifest["sections"]["tt-umd locks"] == {"ok": True, "locks": 0, "states": {}}
    rec, twin = recreate(archive, tmp_path / "twin")
    assert rec.reproduced == [] and not rec.locks and not rec.container
    assert not (twin / "dev/shm").exists() and not (twin / ".dockerenv").exists()


# --------------------------------------------------------------------------- hostile input


def rewrite(archive: Path, dest: Path, edit: Callable[[str, bytes], bytes]) -> Path:
    """``archive`` with each member's bytes passed through ``edit(name, data)``."""
    with tarfile.open(archive) as src, tarfile.open(dest, "w:gz") as out:
        for member in src.getmembers():
            if member.isreg():
                f = src.extractfile(member)
                assert f is not None
                data = edit(member.name.split("/", 1)[1], f.read())
                member.size = len(data)
                out.addfile(member, io.BytesIO(data))
            else:
                out.addfile(member)
    return dest


def with_lock(entry: dict[str, Any]) -> Callable[[str, bytes], bytes]:
    def edit(name: str, data: bytes) -> bytes:
        if name != capture.UMD_LOCKS:
            return data
        doc = json.loads(data)
        doc["locks"] = [entry]
        return json.dumps(doc).encode()

    return edit


LOCK = {"file": "TT_UMD_LOCK.CHIP_IN_USE_0_PCIe", "type": "file", "size": 56, "state": "free",
        "bytes": "00" * 56}  # fmt: skip
HOSTILE_LOCKS = {
    "dotdot": ({**LOCK, "file": "../escaped"}, "names '../escaped', no lock file"),
    "a path": ({**LOCK, "file": "TT_UMD_LOCK.a/../../../../tmp/ttmesh-escaped"}, "no lock"),
    "prefix dotdot": ({**LOCK, "file": "TT_UMD_LOCK../escaped"}, "no lock file"),
    "huge bytes": ({**LOCK, "size": 1 << 20, "bytes": "00" * (1 << 20)}, "bytes no lock file"),
    "size lies": ({**LOCK, "size": 10**15}, "bytes no lock file has"),
}


@pytest.mark.parametrize("kind", list(HOSTILE_LOCKS))
def test_hostile_lock_entries_are_refused(kind: str, root: Path, tmp_path: Path) -> None:
    entry, said = HOSTILE_LOCKS[kind]
    faults.umd_lock(open_host(root), C03, dead=True)
    bad = rewrite(take(root, tmp_path / "c.tar.gz"), tmp_path / "bad.tar.gz", with_lock(entry))
    work = tmp_path / "work"
    work.mkdir()
    res = run_cli("sim", "create", "--from-capture", str(bad), "--root", "DIR", cwd=work)
    assert res.code == 2, (res.out, res.err)
    assert len(res.err.splitlines()) == 1 and res.err.startswith("ttmesh: "), res.err
    assert "refusing the archive" in res.err and said in res.err, res.err
    assert os.listdir(work) == [] and not Path("/tmp/ttmesh-escaped").exists()
    assert not any(p.name == "escaped" for p in tmp_path.rglob("escaped"))


def test_a_huge_junk_lock_is_named_not_made(root: Path, tmp_path: Path) -> None:
    """A file of another size than tt-umd's, without bytes (as a capture records one), too big
    to make: named in the notes, not written."""
    faults.umd_lock(open_host(root), C03, dead=True)
    entry = {"file": "TT_UMD_LOCK.big", "type": "file", "size": 10**15, "state": "unreadable"}
    bad = rewrite(take(root, tmp_path / "c.tar.gz"), tmp_path / "big.tar.gz", with_lock(entry))
    twin, info = twin_of(bad, tmp_path)
    assert not (twin / "dev/shm").exists()
    assert any("TT_UMD_LOCK.big" in n and "not made" in n for n in info["not_reproduced"])


def test_a_by_id_link_out_of_the_root_is_data_only(root: Path, tmp_path: Path) -> None:
    """A by-id link planted to lead out of the root: the capture names its target (never
    follows it, never archives it as a link); the recreated host has no such link."""
    by_id = root / "dev/tenstorrent/by-id"
    (by_id / "evil").symlink_to("/etc/passwd")
    (by_id / "up").symlink_to("../../../../../../../tmp")
    archive = take(root, tmp_path / "c.tar.gz")
    ar = capture.read_archive(archive)
    listing = {e["path"]: e for e in ar.json(capture.DEV_LISTING)["entries"]}
    assert listing["dev/tenstorrent/by-id/evil"]["target"] == "/etc/passwd"
    assert not any("by-id" in name for name in ar.links)
    twin, info = twin_of(archive, tmp_path)
    made = os.listdir(twin / "dev/tenstorrent/by-id")
    assert "evil" not in made and "up" not in made and len(made) == 4
    assert sum("not a chip's /dev/tenstorrent/N" in n for n in info["not_reproduced"]) == 2
    res = run_cli("ls", "--json", "--root", str(twin))
    assert res.code == 0, res.err


@pytest.mark.skipif(not can_switch(), reason=NEEDS_NOBODY)
def test_nobody_captures_roots_host_and_replays_it(users) -> None:  # type: ignore[no-untyped-def]
    """root holds a chip's lock on root's host, a by-id link there leads to /etc/shadow: nobody
    captures it (the lock held, as nobody believes the owner PID tt-umd wrote; the link named,
    not followed) and rebuilds it in nobody's own directory, where root's holder is no holder:
    a dead owner's lock, the link not made."""
    nobody, me = users["nobody"], users["root"]
    try:
        made = me.run("sim", "fault", "--root", str(me.sim), "umd-lock", C05)
        assert made.returncode == 0, made.stderr
        pid = int(made.stdout.split("pid ")[-1])
        (me.sim / "dev/tenstorrent/by-id/evil").symlink_to("/etc/shadow")
        archive = nobody.base / "root.tar.gz"
        res = nobody.run("doctor", "--root", str(me.sim), "--capture", str(archive), hostile=True)
        assert res.returncode == 0, res.stderr
        doc = capture.read_archive(archive).json(capture.UMD_LOCKS)
        ((entry),) = doc["locks"]
        assert entry["state"] == "held" and entry["field_pid"] == pid and entry["user"] == "root"
        twin = nobody.base / "twin"
        res = nobody.run("sim", "create", "--from-capture", str(archive), "--root", str(twin))
        assert res.returncode == 0, res.stderr
        assert "/etc/shadow" in res.stdout and "not made" in res.stdout
        res = nobody.run("check", "--root", str(twin), "--json", hostile=True)
        data = json.loads(res.stdout)
        assert [(lk["name"], lk["state"]) for lk in data["umd_locks"]] == [
            ("CHIP_IN_USE_3_PCIe", "dead-owner")
        ]
        assert "evil" not in os.listdir(twin / "dev/tenstorrent/by-id")
        assert (twin / "dev/shm").stat().st_uid == nobody.uid
    finally:
        with contextlib.suppress(FileNotFoundError):
            (me.sim / "dev/tenstorrent/by-id/evil").unlink()
        me.run("sim", "clear", "--root", str(me.sim))
