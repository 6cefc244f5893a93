"""tt-umd's per-chip lock files (issue 26, "Lock files"): ``check`` names a live holder of a
chip's ``CHIP_IN_USE`` lock and launch pre-flight refuses the chip before ranks would wait on
it (exit 3, one line); a lock a dead process left is a note, never deleted (tt-umd recovers
it and relies on clients not deleting the files); files that are not tt-umd's (a FIFO, a
link, a huge file) are one note each, read without blocking. The simulator's fault
``umd-lock`` writes them as tt-umd does, under the simulated root's ``dev/shm``.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import run_cli, scratch
from users import NEEDS_NOBODY, can_switch, users_fixture  # noqa: F401

from ttmesh import procs

C01, C03, C05 = "0000:01:00.0", "0000:03:00.0", "0000:05:00.0"
OK = [sys.executable, "-c", "pass"]
FLAG = 0x5454554D444D5458  # tt-umd's INITIALIZED_FLAG ("TTUMDMTX"), robust_mutex.cpp


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    """A QuietBox 2 (four p300 chips: /dev/tenstorrent/0 is 0000:01:00.0, 1 is 0000:03:00.0);
    its lock holders are killed at the end whatever the test did."""
    with scratch(tmp_path / "roots") as base:
        path = base / "qb2"
        res = run_cli("sim", "create", "--system", "quietbox2", "--root", str(path))
        assert res.code == 0, res.err
        try:
            yield path
        finally:
            run_cli("sim", "clear", "--root", str(path))


def fault(root: Path, *args: str) -> int:
    res = run_cli("sim", "fault", "--root", str(root), "umd-lock", *args)
    assert res.code == 0, res.err
    return int(res.out.split("pid ")[-1])


def check(root: Path, *args: str) -> tuple[int, dict, str]:
    res = run_cli("check", "--root", str(root), "--json", *args)
    assert "Traceback" not in res.err, res.err
    return res.code, json.loads(res.out), res.err


def ttmesh_lines(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith("ttmesh:")]


def lock_path(root: Path, dev: int, kind: str = "CHIP_IN_USE") -> Path:
    return root / "dev/shm" / f"TT_UMD_LOCK.{kind}_{dev}_PCIe"


def test_a_live_holder_is_named_in_check_and_refuses_the_launch(root: Path) -> None:
    pid = fault(root, C01)
    path = lock_path(root, 0)
    data = path.read_bytes()  # tt-umd's pthread_mutex_wrapper on x86-64: 40 + 8 + 4 + 4 bytes
    assert len(data) == 56 and struct.unpack_from("<Qii", data, 40) == (FLAG, pid, pid)
    code, report, err = check(root)
    assert code == 1, err
    (error,) = [p for p in report["problems"] if p["severity"] == "error"]
    assert error["what"].startswith(f"{C01} is in use: tt-umd's lock CHIP_IN_USE_0_PCIe is held")
    assert f"pid {pid} (root: " in error["what"] and "ttmesh.sim.lockholder" in error["what"]
    assert error["fix"].startswith(f"kill {pid} (") and "never delete" in error["fix"]
    (lock,) = report["umd_locks"]
    assert lock["state"] == "held" and lock["owner_pid"] == pid and lock["owner_alive"]
    assert lock["user"] == "root" and lock["mapped_by"] == [pid]
    assert lock["asic_ids"] == ["00008a26321e00c1"] and lock["dev_index"] == 0
    chip = next(c for c in report["chips"] if c["bdf"] == C01)
    assert not chip["healthy"]
    text = run_cli("check", "--root", str(root), env={"PYTHONUNBUFFERED": ""})
    assert text.code == 1 and f"held by pid {pid}" in text.out
    env = {"PYTHONUNBUFFERED": ""}
    res = run_cli("launch", "--root", str(root), "--chips", C01, "--", *OK, env=env)
    assert res.code == 3, res.err
    (line,) = ttmesh_lines(res.err)
    assert line.startswith(f"ttmesh: pre-flight: {C01} is in use: tt-umd's lock"), line
    assert f"kill {pid} (" in line, line
    other = run_cli("launch", "--root", str(root), "--chips", C03, "--", *OK, env=env)
    assert other.code == 0, other.err  # the other chips are free
    assert procs.alive(pid) and path.exists()  # a launch never ends nor unlinks a holder
    res = run_cli("sim", "clear", "--root", str(root))
    assert res.code == 0 and not procs.alive(pid), res.out
    assert check(root)[0] == 0


def test_a_dead_owners_lock_is_a_note_and_is_never_deleted(root: Path) -> None:
    pid = fault(root, C03, "--dead")
    path = lock_path(root, 1)
    before = path.read_bytes()
    assert (struct.unpack_from("<I", before, 0)[0] & 0x40000000) and not procs.alive(pid)
    code, report, err = check(root)
    assert code == 0, err
    assert not [p for p in report["problems"] if p["severity"] == "error"]
    (note,) = [n for n in report["notes"] if "tt-umd lock" in n]
    assert f"CHIP_IN_USE_1_PCIe ({C03}) was left locked by pid {pid}, which is gone" in note
    assert "do not delete it" in note
    (lock,) = report["umd_locks"]
    assert lock["state"] == "dead-owner" and lock["owner_pid"] == pid
    assert not lock["owner_alive"]
    res = run_cli("launch", "--root", str(root), "--chips", C03, "--", *OK)
    assert res.code == 0, res.err
    text = run_cli("check", "--root", str(root), env={"PYTHONUNBUFFERED": ""})
    assert text.code == 0 and "was left locked by pid" in text.out
    assert path.read_bytes() == before  # read, never changed nor removed


def test_a_free_lock_and_another_kind_are_no_problem(root: Path) -> None:
    """A lock no one holds (its futex word 0) and an ARC_MSG lock are not refusals."""
    path = lock_path(root, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes(40) + struct.pack("<Qii", FLAG, 0, 0))
    pid = fault(root, C03, "--kind", "arc_msg")
    code, report, err = check(root)
    assert code == 0, err
    states = {lk["name"]: lk["state"] for lk in report["umd_locks"]}
    assert states == {"ARC_MSG_1_PCIe": "held", "CHIP_IN_USE_0_PCIe": "free"}
    assert run_cli("launch", "--root", str(root), "--", *OK).code == 0
    assert procs.alive(pid)


def test_the_layout_before_owner_fields_names_the_holder_from_the_lock_word(root: Path) -> None:
    """tt-umd before #1539 wrote 48-byte files (the mutex and the flag, tt-umd#736's listing):
    the holder is the thread in the robust futex word, as long as it maps the file (this
    test's own process, holding it as tt-umd would)."""
    path = lock_path(root, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack("<I", os.getpid()) + bytes(36) + struct.pack("<Q", FLAG))
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 48) as held:
        code, report, err = check(root)
        assert code == 1, err
        (lock,) = report["umd_locks"]
        assert (lock["state"], lock["owner_pid"], lock["owner_tid"]) == (
            "held",
            os.getpid(),
            os.getpid(),
        ), lock
        assert held[:4] == struct.pack("<I", os.getpid())
    code, report, err = check(root)  # mapped by no one now: its owner is no holder
    assert code == 0 and report["umd_locks"][0]["state"] == "dead-owner", report["umd_locks"]


def test_hostile_lock_files_are_one_note_each_without_hanging(root: Path, tmp_path: Path) -> None:
    shm = root / "dev/shm"
    shm.mkdir(parents=True, exist_ok=True)
    os.mkfifo(lock_path(root, 0))
    os.symlink("/dev/zero", lock_path(root, 1))
    with open(lock_path(root, 3), "wb") as f:
        f.truncate(64 << 30)  # 64 GiB, sparse
    lock_path(root, 2).write_bytes(b"\xff" * 56)  # the right size, not tt-umd's
    code, report, err = check(root)
    assert code == 0, err
    notes = [n for n in report["notes"] if "tt-umd lock" in n]
    assert len(notes) == 4, notes
    joined = "\n".join(notes)
    assert "CHIP_IN_USE_0_PCIe is not a plain file" in joined
    assert "CHIP_IN_USE_1_PCIe is a symbolic link, not tt-umd's file (not followed)" in joined
    assert f"CHIP_IN_USE_3_PCIe is {64 << 30} bytes, not tt-umd's 48, 56 or 64" in joined
    assert "CHIP_IN_USE_2_PCIe is not initialised by tt-umd" in joined
    assert {lk["state"] for lk in report["umd_locks"]} == {"unreadable"}
    res = run_cli("launch", "--root", str(root), "--", *OK)
    assert res.code == 0, res.err
    # the fault never writes through what is there: a FIFO, a link, a hard link, a huge file
    other = root / "other"  # the same file system: a hard link can be made
    other.write_bytes(b"keep")
    os.link(other, shm / "TT_UMD_LOCK.MEM_BARRIER_0_PCIe")
    for kind, said in (
        ("CHIP_IN_USE", "is not a plain file of yours alone"),  # the FIFO
        ("MEM_BARRIER", "is not a plain file of yours alone"),  # a second name of another file
        ("NON_MMIO", "cannot be opened"),  # replaced by a link below
    ):
        if kind == "NON_MMIO":
            os.symlink(other, lock_path(root, 0, kind))
        res = run_cli("sim", "fault", "--root", str(root), "umd-lock", C01, "--kind", kind)
        assert res.code == 2 and "Traceback" not in res.err, res.err
        (line,) = ttmesh_lines(res.err)
        assert line.startswith(f"ttmesh: {lock_path(root, 0, kind)} "), line
        assert said in line, line
    assert other.read_bytes() == b"keep"
    res = run_cli("sim", "fault", "--root", str(root), "umd-lock", C05)  # device 3
    assert res.code == 2 and f"is {64 << 30} bytes, not tt-umd's 56" in res.err, res.err
    # the fault refuses to write through a dev/shm that leads out of the root
    for p in list(shm.iterdir()):
        p.unlink()
    shm.rmdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shm.symlink_to(elsewhere)
    res = run_cli("sim", "fault", "--root", str(root), "umd-lock", C01)
    assert res.code == 2, res.err
    (line,) = ttmesh_lines(res.err)
    assert line.startswith(f"ttmesh: {shm} leads out of the simulated root"), line
    assert not list(elsewhere.iterdir())
    for args, said in (
        (["--kind", "NOPE", C01], "ttmesh: no tt-umd lock kind 'NOPE' (one of ARC_MSG,"),
        (["0000:99:00.0"], "ttmesh: no chip 0000:99:00.0 on this simulated host"),
    ):
        res = run_cli("sim", "fault", "--root", str(root), "umd-lock", *args)
        assert res.code == 2 and "Traceback" not in res.err, res.err
        (line,) = ttmesh_lines(res.err)
        assert line.startswith(said), line


@pytest.mark.skipif(not can_switch(), reason=NEEDS_NOBODY)
def test_a_holder_of_another_user_is_named_to_root_and_to_that_user(users) -> None:
    """nobody holds a chip's lock on its own simulated host: root (who sees every process's
    mappings) names it; root holds one on root's host: nobody (who cannot read root's maps)
    names it too, from the owner PID tt-umd wrote."""
    nobody, me = users["nobody"], users["root"]
    try:
        made = nobody.run("sim", "fault", "--root", str(nobody.sim), "umd-lock", C05)
        assert made.returncode == 0, made.stderr
        pid = int(made.stdout.split("pid ")[-1])
        mine = me.run("sim", "fault", "--root", str(me.sim), "umd-lock", C05)
        assert mine.returncode == 0, mine.stderr
        root_pid = int(mine.stdout.split("pid ")[-1])
        for user, sim, holder, who in (
            (me, nobody.sim, pid, "nobody"),
            (nobody, nobody.sim, pid, "nobody"),
            (nobody, me.sim, root_pid, "root"),
        ):
            res = user.run("check", "--root", str(sim), "--json", hostile=True)
            assert res.returncode == 1, (user.name, res.stderr)
            data = json.loads(res.stdout)
            (lock,) = data["umd_locks"]
            assert lock["state"] == "held" and lock["owner_pid"] == holder, (user.name, lock)
            assert lock["user"] == who, (user.name, lock)
            res = user.run("launch", "--root", str(sim), "--dry-run", "--chips", C05, "--", "true")
            assert res.returncode == 3, (user.name, res.stderr)
            (line,) = ttmesh_lines(res.stderr)
            assert f"is held by pid {holder} ({who}: " in line, line
    finally:
        nobody.run("sim", "clear", "--root", str(nobody.sim))
        me.run("sim", "clear", "--root", str(me.sim))
