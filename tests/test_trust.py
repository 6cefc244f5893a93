"""What one user of a shared host may do to another's job, tested as two users (root, nobody).

A host's lease directory is shared by every user (``/run/lock/ttmesh``: root's, sticky,
world-writable). Here each user has a simulated QuietBox 2 of their own, with the same chips,
and both use one shared lease directory made as ``/run/lock/ttmesh`` is (``TTMESH_RUNTIME_DIR``):
a chip's lease is then one file both users contend for, exactly as on one real host. Each test
here failed on the code before leases were recorded and verified (docs/conventions.md, "What one
user may do to another's job").
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, TAG, TW, alive, run_cli, start_launch, wait_for, worker
from users import (
    NEEDS_NOBODY,
    NOBODY_UID,
    User,
    users_fixture,  # noqa: F401  (the fixture "users")
    world_dir,
)

C01 = "0000:01:00.0"
A01 = "00008a26321e00c1"  # the unique id of a QuietBox 2's chip at 0000:01:00.0
HOLD = (
    "import fcntl, os, sys, time\n"
    "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o666)\n"
    "fcntl.flock(fd, fcntl.LOCK_EX)\n"
    "print('held', flush=True)\n"
    "time.sleep(120)\n"
)


@pytest.fixture
def two(users: dict[str, User]) -> dict[str, User]:
    if "nobody" not in users:
        pytest.skip(NEEDS_NOBODY)
    return users


@pytest.fixture
def shared(two: dict[str, User]) -> Iterator[Path]:
    """A lease directory as /run/lock/ttmesh is: root's, mode 1777 (and the test worker where
    both users can run it)."""
    top = world_dir("ttmesh-trust-", 0o755)
    leases = top / "ttmesh"
    leases.mkdir()
    leases.chmod(0o1777)
    shutil.copy(TW, top / "tw.py")
    (top / "tw.py").chmod(0o644)
    try:
        yield leases
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _env(shared: Path) -> dict[str, str]:
    return {"TTMESH_RUNTIME_DIR": str(shared), "PYTHONUNBUFFERED": "1"}


def _lease(user: User, sim: Path, shared: Path) -> dict | None:
    res = user.run("ls", "--json", "--root", str(sim), env=_env(shared))
    assert res.returncode == 0, res.stderr
    chips = {c["asic_id"]: c for c in json.loads(res.stdout)["chips"]}
    return chips[A01]["lease"]


@contextlib.contextmanager
def _job(user: User, shared: Path, job: str, *more: str) -> Iterator[tuple[subprocess.Popen, int]]:
    """``job`` on C01 of the user's simulated host, running (yields the launcher, the worker)."""
    pids = Path(tempfile.mkdtemp(prefix="pids-", dir=user.base))
    pids.chmod(0o777)
    argv = user.ttmesh(
        "launch", "--root", str(user.sim), "--chips", C01, "--job-id", job, *more, "--",
        user.python, str(shared.parent / "tw.py"), TAG, f"pids={pids}",
        env=_env(shared),
    )  # fmt: skip
    front = user.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    pid_file = pids / "rank0.pid"
    try:
        wait_for(lambda: pid_file.exists() or front.poll() is not None, what=f"job {job}")
        assert front.poll() is None, front.communicate()
        yield front, int(pid_file.read_text())
    finally:
        if front.poll() is None:
            front.send_signal(signal.SIGTERM)
        front.communicate(timeout=30)
        shutil.rmtree(pids, ignore_errors=True)


def _holder(user: User, path: Path) -> subprocess.Popen:
    """A process of ``user`` holding an flock on ``path`` (created if missing)."""
    argv = user.argv(user.python, "-c", HOLD, str(path), TAG)
    proc = user.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "held", proc.communicate()
    return proc


def _end(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.communicate(timeout=10)


def _last(res: subprocess.CompletedProcess[str]) -> str:
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert "Traceback" not in res.stderr, res.stderr
    return lines[-1] if lines else ""


# --------------------------------------------------------------------------- leases


def test_no_one_deletes_anothers_lease(two: dict[str, User], shared: Path) -> None:
    """nobody pre-creates a chip's lease file, root launches on the chip, nobody deletes the
    file: root's lease must stay (ls shows it; reset --force refuses and stops nothing)."""
    root, nobody = two["root"], two["nobody"]
    planted = nobody.py("import os, sys; os.close(os.open(sys.argv[1], os.O_CREAT, 0o666))",
                        str(shared / f"{A01}.lock"))  # fmt: skip
    assert planted.returncode == 0, planted.stderr
    with _job(root, shared, "root-job") as (_front, worker):
        removed = nobody.py("import os, sys; os.unlink(sys.argv[1])", str(shared / f"{A01}.lock"))
        assert removed.returncode != 0, "nobody deleted the lease file of root's job"
        assert "PermissionError" in removed.stderr
        lease = _lease(root, root.sim, shared)
        assert lease is not None, "root's running job shows no lease"
        assert lease["job"] == "root-job" and lease["user"] == "root" and lease["verified"]
        seen = _lease(nobody, nobody.sim, shared)
        assert seen is not None and seen["job"] == "root-job" and seen["user"] == "root"
        reset = root.run(
            "reset", "--root", str(root.sim), "--chips", C01, "--force", env=_env(shared)
        )
        assert reset.returncode == 3, reset.stderr
        assert "root-job" in _last(reset)
        assert alive(worker), "reset --force stopped the worker of a running job"


@pytest.mark.parametrize("planted", ["empty", "nested JSON"])
def test_a_lock_that_is_no_lease_is_named(two: dict[str, User], shared: Path, planted: str) -> None:
    """nobody holds an flock on a chip's lease file: launches refuse naming pid and user, ls
    shows them (not None); the lock is not taken for a ttmesh job's lease. A file of 4 KiB of
    nested JSON (under the record size read) made every user's ls and launch an internal
    error (RecursionError, exit 1)."""
    root, nobody = two["root"], two["nobody"]
    if planted == "nested JSON":
        write = "import sys; open(sys.argv[1], 'w').write('[' * 2000 + ']' * 2000)"
        assert nobody.py(write, str(shared / f"{A01}.lock")).returncode == 0
    holder = _holder(nobody, shared / f"{A01}.lock")
    try:
        res = root.run(
            "launch", "--root", str(root.sim), "--chips", C01, "--", "true", env=_env(shared)
        )
        assert res.returncode == 3, res.stderr
        line = _last(res)
        assert f"pid {holder.pid}" in line and "nobody" in line, line
        assert "not a ttmesh lease" in line, line
        lease = _lease(root, root.sim, shared)
        assert lease == {
            "job": None, "pid": holder.pid, "user": "nobody", "uid": 65534, "verified": False
        }  # fmt: skip
        text = root.run("ls", "--root", str(root.sim), env=_env(shared))
        row = next(ln for ln in text.stdout.splitlines() if C01 in ln)
        assert "None" not in row and "nobody" in row and str(holder.pid) in row, row
    finally:
        _end(holder)


def test_a_forged_record_is_not_believed(two: dict[str, User], shared: Path) -> None:
    """A lease file of nobody's claiming a job of root's and a process of root's: never named
    as root's job, and reset --force signals no process of root's for it."""
    root, nobody = two["root"], two["nobody"]
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", TAG])
    try:
        with open(f"/proc/{victim.pid}/stat") as f:
            start = int(f.read().rsplit(")", 1)[1].split()[19])
        for uid in (0, 65534):
            record = json.dumps({
                "schema": "ttmesh.lease/1", "job": "root-job", "uid": uid, "user": "root",
                "pid": victim.pid, "start": start, "cmd": "python train.py",
            })  # fmt: skip
            path = shared / f"{A01}.lock"
            wrote = nobody.py("import sys; open(sys.argv[1], 'w').write(sys.argv[2])",
                              str(path), record)  # fmt: skip
            assert wrote.returncode == 0, wrote.stderr
            holder = _holder(nobody, path)
            try:
                lease = _lease(root, root.sim, shared)
                assert lease is not None
                assert lease["job"] is None and not lease["verified"], lease
                assert lease["pid"] == holder.pid and lease["user"] == "nobody", lease
                refused = root.run("reset", "--root", str(root.sim), "--chips", C01,
                                   env=_env(shared))  # fmt: skip
                assert refused.returncode == 3, refused.stderr
                assert "root-job" not in refused.stderr and f"pid {holder.pid}" in refused.stderr
                forced = root.run("reset", "--root", str(root.sim), "--chips", C01, "--force",
                                  env=_env(shared))  # fmt: skip
                assert forced.returncode == 0, forced.stderr
                assert alive(victim.pid) and holder.poll() is None
            finally:
                _end(holder)
                os.unlink(shared / f"{A01}.lock")
    finally:
        victim.kill()
        victim.wait()


def test_a_stale_lease_file_of_anothers(two: dict[str, User], shared: Path) -> None:
    """A lease file no job holds (its job was killed) blocks only the users who may not remove
    it: nobody is refused naming root as the owner who can; root removes nobody's and leases."""
    root, nobody = two["root"], two["nobody"]
    path = shared / f"{A01}.lock"
    path.write_text("{}")
    path.chmod(0o644)
    res = nobody.run("launch", "--root", str(nobody.sim), "--chips", C01, "--", "true",
                     env=_env(shared))  # fmt: skip
    assert res.returncode == 3, res.stderr
    line = _last(res)
    assert f"its lease file {path} is a stale lease file (no job holds it), owned by root" in line
    assert f"root can remove it: rm {path}" in line, line
    path.unlink()
    assert nobody.py("import os, sys; os.close(os.open(sys.argv[1], os.O_CREAT, 0o644))",
                     str(path)).returncode == 0  # fmt: skip
    res = root.run("launch", "--root", str(root.sim), "--chips", C01, "--", "true",
                   env=_env(shared))  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert not path.exists(), "the job left its lease file"


def test_a_running_jobs_record_cannot_be_rewritten(two: dict[str, User], shared: Path) -> None:
    """nobody's pre-created file under root's running job: nobody cannot rewrite the record to
    claim the job for another name."""
    root, nobody = two["root"], two["nobody"]
    path = shared / f"{A01}.lock"
    assert nobody.py("import os, sys; os.close(os.open(sys.argv[1], os.O_CREAT, 0o666))",
                     str(path)).returncode == 0  # fmt: skip
    with _job(root, shared, "real-job") as (front, _worker):
        forged = json.dumps({"job": "forged", "pid": front.pid, "cmd": "x"})
        nobody.py("import sys; open(sys.argv[1], 'w').write(sys.argv[2])", str(path), forged)
        lease = _lease(root, root.sim, shared)
        assert lease is not None and lease["job"] == "real-job" and lease["verified"], lease


# --------------------------------------------------------------------------- one user's job, another user


def test_what_nobody_may_do_to_roots_job(two: dict[str, User], shared: Path) -> None:
    """nobody sees root's job in ls (named, with its user), not in ps; cannot stop it, reset
    its chips, launch on them or delete its lease."""
    root, nobody = two["root"], two["nobody"]
    env = _env(shared)
    with _job(root, shared, "root-job") as (front, worker):
        lease = _lease(nobody, nobody.sim, shared)
        assert lease == {"job": "root-job", "pid": front.pid, "user": "root", "uid": 0,
                         "verified": True}  # fmt: skip
        ps = nobody.run("ps", "--all", "--json", env=env)
        assert ps.returncode == 0 and "root-job" not in ps.stdout, ps.stdout
        stop = nobody.run("stop", "root-job", env=env)
        assert stop.returncode == 2 and "root-job" in _last(stop), stop.stderr
        reset = nobody.run("reset", "--root", str(nobody.sim), "--chips", C01, "--force", env=env)
        assert reset.returncode == 3, reset.stderr
        assert "job root-job of user root" in _last(reset)
        launch = nobody.run("launch", "--root", str(nobody.sim), "--chips", C01, "--", "true",
                            env=env)  # fmt: skip
        assert launch.returncode == 3 and "job root-job of user root" in _last(launch)
        gone = nobody.py("import os, sys; os.unlink(sys.argv[1])", str(shared / f"{A01}.lock"))
        assert gone.returncode != 0 and (shared / f"{A01}.lock").exists()
        assert alive(worker)


def test_what_root_may_do_to_nobodys_job(two: dict[str, User], shared: Path) -> None:
    """root sees nobody's job in ls with its user, not in its ps; ttmesh as root does not stop
    it, reset its chips (even with --force) or launch on them."""
    root, nobody = two["root"], two["nobody"]
    env = _env(shared)
    with _job(nobody, shared, "nobody-job") as (front, worker):
        lease = _lease(root, root.sim, shared)
        assert lease == {"job": "nobody-job", "pid": front.pid, "user": "nobody",
                         "uid": 65534, "verified": True}  # fmt: skip
        ps = root.run("ps", "--all", "--json", env=env)
        assert ps.returncode == 0 and "nobody-job" not in ps.stdout
        stop = root.run("stop", "nobody-job", env=env)
        assert stop.returncode == 2, stop.stderr
        reset = root.run("reset", "--root", str(root.sim), "--chips", C01, "--force", env=env)
        assert reset.returncode == 3 and "job nobody-job of user nobody" in _last(reset)
        launch = root.run("launch", "--root", str(root.sim), "--chips", C01, "--", "true",
                          env=env)  # fmt: skip
        assert launch.returncode == 3 and "job nobody-job of user nobody" in _last(launch)
        assert alive(worker)


def test_the_guardian_still_holds_the_lease_when_the_launcher_is_killed(
    make_sim: Callable[..., Path], tmp_path: Path
) -> None:
    """The launcher killed, its guardian finishing the job (here: a reset after the failure
    that hangs) still holds the job's lease: shown as the job's (verified), not as a foreign
    lock, and the reset it runs does not refuse for it."""
    root = make_sim("quietbox2")
    assert run_cli("sim", "fault", "--root", str(root), "reset-hangs", "60").code == 0
    front = start_launch(
        root, "--chips", C01, "--job-id", "orphan-job", "--reset-on-failure",
        *worker(f"pids={tmp_path}"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    smi = str(root / "bin" / "tt-smi")

    def resetting() -> list[int]:
        return [int(p) for p in os.listdir("/proc") if p.isdigit() and smi in _cmdline(p)]

    def released() -> bool:
        ls = json.loads(run_cli("ls", "--json", "--root", str(root)).out)
        return all(c["lease"] is None for c in ls["chips"])

    try:
        wait_for(lambda: (tmp_path / "rank0.pid").exists(), what="the job")
        front.kill()
        front.wait(timeout=10)
        wait_for(resetting, what="the guardian's reset")
        lease = json.loads(run_cli("ls", "--json", "--root", str(root)).out)["chips"][0]["lease"]
        assert lease is not None and lease["job"] == "orphan-job" and lease["verified"], lease
        assert lease["user"] == "root"
    finally:
        if front.poll() is None:
            front.kill()
            front.wait()
        assert run_cli("sim", "clear", "--root", str(root)).code == 0
        for pid in resetting():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        wait_for(released, timeout=60, what="the guardian's finish")


def _cmdline(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_a_jobs_leftovers_are_its_users_only(two: dict[str, User]) -> None:
    """A process of nobody's naming root's job in its environment is not one of that job's
    leftovers, which root's ttmesh ends after a failure over several hosts."""
    from ttmesh.recovery import afterjob

    nobody = two["nobody"]
    argv = nobody.argv(nobody.python, "-c", "print('up', flush=True); import time; time.sleep(60)",
                       TAG, env={"TTMESH_JOB_ID": "root-job"})  # fmt: skip
    theirs = nobody.popen(argv, stdout=subprocess.PIPE)
    ours = subprocess.Popen([sys.executable, "-c", "print('up', flush=True); import time; "
                             "time.sleep(60)", TAG], stdout=subprocess.PIPE,
                            env={**os.environ, "TTMESH_JOB_ID": "root-job"}, text=True)  # fmt: skip
    try:
        for p in (theirs, ours):
            assert p.stdout is not None and p.stdout.readline().strip() == "up"
        found = {pid for pid, _start in afterjob.leftovers("root-job")}
        assert ours.pid in found and theirs.pid not in found, found
    finally:
        for p in (theirs, ours):
            _end(p)


# --------------------------------------------------------------------------- shared directories


def _target() -> Path:
    """A directory of root's that no one else may change (mode 0755, one file)."""
    path = Path(tempfile.mkdtemp(prefix="ttmesh-target-", dir="/dev/shm"))
    path.chmod(0o755)
    (path / "keep").write_text("root's\n")
    return path


def _unchanged(target: Path) -> None:
    assert stat.S_IMODE(target.stat().st_mode) == 0o755, oct(target.stat().st_mode)
    assert sorted(os.listdir(target)) == ["keep"], os.listdir(target)


@pytest.mark.parametrize("where", ["run/lock/ttmesh", "run/lock"])
def test_a_link_in_a_simulated_roots_lease_directory(two: dict[str, User], where: str) -> None:
    """nobody's simulated host with its lease directory (or a parent) a link to a directory of
    root's: root's launch refuses, naming the link and its owner; the target is unchanged."""
    root, nobody = two["root"], two["nobody"]
    target = _target()
    sim = nobody.base / f"linked-{where.replace('/', '-')}"
    made = nobody.run("sim", "create", "--system", "quietbox2", "--root", str(sim))
    assert made.returncode == 0, made.stderr
    try:
        planted = nobody.py(
            "import os, shutil, sys; shutil.rmtree(sys.argv[1]); os.symlink(sys.argv[2], sys.argv[1])",
            str(sim / where), str(target),
        )  # fmt: skip
        assert planted.returncode == 0, planted.stderr
        for args in (["launch", "--chips", C01, "--", "true"], ["ls"]):
            res = root.run(args[0], "--root", str(sim), *args[1:])
            assert res.returncode == 2, (args, res.stderr)
            line = _last(res)
            assert f"{sim / where} is a symbolic link owned by nobody" in line, line
        _unchanged(target)
    finally:
        shutil.rmtree(target)
        shutil.rmtree(sim, ignore_errors=True)


def test_a_link_as_the_runtime_directory(two: dict[str, User]) -> None:
    """TTMESH_RUNTIME_DIR names a path in a sticky directory where nobody planted a link."""
    root, nobody = two["root"], two["nobody"]
    target, sticky = _target(), world_dir("ttmesh-sticky-", 0o1777)
    try:
        assert nobody.py("import os, sys; os.symlink(sys.argv[2], sys.argv[1])",
                         str(sticky / "ttmesh"), str(target)).returncode == 0  # fmt: skip
        res = root.run("launch", "--root", str(root.sim), "--chips", C01, "--", "true",
                       env={"TTMESH_RUNTIME_DIR": str(sticky / "ttmesh")})  # fmt: skip
        assert res.returncode == 2, res.stderr
        assert f"{sticky / 'ttmesh'} is a symbolic link owned by nobody" in _last(res)
        _unchanged(target)
    finally:
        shutil.rmtree(target)
        shutil.rmtree(sticky)


def _can_unshare() -> bool:
    if shutil.which("unshare") is None or os.geteuid() != 0:
        return False
    probe = subprocess.run(["unshare", "--mount", "true"], capture_output=True)
    return probe.returncode == 0


ACQUIRE = (
    "import sys\n"
    "from ttmesh.errors import TTMeshError\n"
    "from ttmesh.host.base import Host\n"
    "from ttmesh.runtime import leases\n"
    "try:\n"
    "    held = leases.acquire(Host('/'), ['00000000000000aa'], sys.argv[1], cmd='test')\n"
    "except TTMeshError as exc:\n"
    "    print(f'ttmesh: {exc}', flush=True); sys.exit(exc.code)\n"
    "print('leased', flush=True)\n"
    "sys.stdin.read()\n"
    "held.release()\n"
)
# Runs as root in a mount namespace of its own: mounts (argv[1], sh), then each command of
# argv[2] (JSON) in turn, each left holding what it took until all have said their first line.
STAGE = (
    "import json, subprocess, sys\n"
    "subprocess.run(['sh', '-ec', sys.argv[1]], check=True)\n"
    "running = []\n"
    "for argv in json.loads(sys.argv[2]):\n"
    "    p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)\n"
    "    running.append(p)\n"
    "    print(p.stdout.readline().strip() or f'exit {p.wait()}', flush=True)\n"
    "for p in running:\n"
    "    p.communicate('')\n"
)


def _fresh_tmp(keep: list[Path], before: str) -> str:
    """Mounts (sh) giving the namespace an empty /tmp, with the directories ``keep`` that were
    under it (a checkout and its venv may live there) bound back at their places."""
    steps = [before, "mkdir -p /run/.oldtmp", "mount --bind /tmp /run/.oldtmp",
             "mount -t tmpfs -o mode=1777 none /tmp"]  # fmt: skip
    for path in keep:
        real = path.resolve()
        if real.is_relative_to("/tmp"):
            inner = shlex.quote(str(real))
            old = shlex.quote(f"/run/.oldtmp/{real.relative_to('/tmp')}")
            steps.append(f"mkdir -p {inner} && mount --bind {old} {inner}")
    return " && ".join(steps)


def _in_namespace(mounts: str, *commands: list[str]) -> list[str]:
    """Each command's first line (or its exit), run in turn as root sets them up in a mount
    namespace of their own after ``mounts``."""
    res = subprocess.run(
        ["unshare", "--mount", "--propagation", "private",
         sys.executable, "-c", STAGE, mounts, json.dumps(commands)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    return res.stdout.splitlines()


@pytest.mark.parametrize("hidden", [False, True], ids=["run-lock", "temp-fallback"])
def test_a_link_as_this_machines_lease_directory(two: dict[str, User], hidden: bool) -> None:
    """/run/lock/ttmesh (or, without /run/lock, the temp-dir fallback) a link nobody planted:
    root's lease refuses, naming it and its owner; the target is unchanged."""
    if not _can_unshare():
        pytest.skip("needs unshare --mount as root")
    nobody = two["nobody"]
    target = _target()
    try:
        if hidden:  # no /run/lock at all, and a /tmp of the test's own
            keep = [Path(sys.prefix), REPO, Path(nobody.python).parents[1],
                    Path(nobody.env["PYTHONPATH"])]  # fmt: skip
            mounts = _fresh_tmp(keep, "mount -t tmpfs -o mode=755 none /run")
            where = "/tmp/ttmesh-leases"
        else:
            mounts = "mount -t tmpfs -o mode=1777 none /run/lock"
            where = "/run/lock/ttmesh"
        plant = nobody.argv("sh", "-c", f"ln -s {target} {where} && echo planted")
        said = _in_namespace(mounts, plant, [sys.executable, "-c", ACQUIRE, "root-job"])
        assert said[0] == "planted", said
        assert said[1].startswith("ttmesh: "), said
        assert f"{where} is a symbolic link owned by nobody" in said[1], said
        _unchanged(target)
    finally:
        shutil.rmtree(target)


def test_one_lease_namespace_for_every_user(two: dict[str, User]) -> None:
    """/run/lock/ttmesh is root's and closed to nobody (mode 0755): nobody's lease must not fall
    back to a directory of its own, where root's lease of the same chip is not seen."""
    if not _can_unshare():
        pytest.skip("needs unshare --mount as root")
    nobody = two["nobody"]
    mounts = "mount -t tmpfs -o mode=1777 none /run/lock && mkdir -m 755 /run/lock/ttmesh"
    mine = nobody.argv(nobody.python, "-c", ACQUIRE, "nobody-job")
    fallback = Path("/tmp/ttmesh-leases")  # where ttmesh before this fix fell back
    there = fallback.exists()
    try:
        said = _in_namespace(mounts, mine, [sys.executable, "-c", ACQUIRE, "root-job"])
    finally:
        if not there:
            shutil.rmtree(fallback, ignore_errors=True)
    assert said.count("leased") < 2, f"both users leased one chip: {said}"
    assert said[0].startswith("ttmesh: ") and "/run/lock/ttmesh" in said[0], said


def test_a_link_above_a_private_directory(two: dict[str, User]) -> None:
    """XDG_RUNTIME_DIR through a link nobody planted in a sticky directory (as in /tmp): root's
    job records are neither read from nor written into the link's target; nor through a
    directory nobody owns."""
    root, nobody = two["root"], two["nobody"]
    target, sticky = _target(), world_dir("ttmesh-sticky-", 0o1777)
    try:
        link = sticky / "runtime"
        assert nobody.py("import os, sys; os.symlink(sys.argv[2], sys.argv[1])", str(link),
                         str(target)).returncode == 0  # fmt: skip
        for args in (["ps"], ["launch", "--root", str(root.sim), "--chips", C01, "--", "true"]):
            res = root.run(*args, env={"XDG_RUNTIME_DIR": str(link)})
            assert res.returncode == 2, res.stderr
            assert f"{link} is a symbolic link owned by nobody" in _last(res)
        _unchanged(target)
        theirs = sticky / "theirs"
        assert nobody.py("import os, sys; os.mkdir(sys.argv[1])", str(theirs)).returncode == 0
        res = root.run("ps", env={"XDG_RUNTIME_DIR": str(theirs)})
        assert res.returncode == 2 and f"{theirs} belongs to nobody" in _last(res), res.stderr
    finally:
        shutil.rmtree(target)
        shutil.rmtree(sticky)


@pytest.mark.parametrize(
    ("who", "jobs"),
    [("root", "planted"), ("nobody", "planted"), ("nobody", "read-only"), ("root", "a file")],
)
def test_a_job_that_cannot_be_recorded_does_not_start(
    two: dict[str, User], who: str, jobs: str
) -> None:
    """The jobs folder of the user's runtime directory made by the other user, not writable,
    or a file: ps and stop could not see the job, so it is refused (exit 2) before anything
    starts, in one line naming the folder and the fix; no lease or run directory is left."""
    me = two[who]
    other = two["nobody" if who == "root" else "root"]
    runtime = world_dir("ttmesh-unrecorded-", 0o700)
    try:
        os.chown(runtime, me.uid, -1)
        base = runtime / "ttmesh"
        base.mkdir(mode=0o700)
        os.chown(base, me.uid, -1)
        folder = base / "jobs"
        if jobs == "a file":
            folder.touch()
        else:
            folder.mkdir(mode=0o500 if jobs == "read-only" else 0o700)
        os.chown(folder, (other if jobs == "planted" else me).uid, -1, follow_symlinks=False)
        mark = runtime / "ran"
        res = me.run("launch", "--root", str(me.sim), "--chips", C01, "--",
                     "/bin/sh", "-c", f"touch {mark}", env={"XDG_RUNTIME_DIR": str(runtime)})  # fmt: skip
        assert res.returncode == 2, res.stderr
        line = _last(res)
        assert line.startswith("ttmesh: cannot write the job's record"), line
        assert str(folder) in line and "nothing started" in line, line
        assert "XDG_RUNTIME_DIR" in line or "chmod 700" in line, line
        assert not mark.exists()
        assert not any((base / "runs").iterdir())
        assert not list((me.sim / "run" / "lock" / "ttmesh").glob("*.lock"))
    finally:
        shutil.rmtree(runtime)


def test_another_user_cannot_freeze_a_simulated_hosts_state(two: dict[str, User]) -> None:
    """nobody cannot hold root's simulated host's state lock (a launch would wait forever)."""
    root, nobody = two["root"], two["nobody"]
    lock = root.sim / "sim" / "state.lock"
    assert root.run("sim", "clear", "--root", str(root.sim)).returncode == 0  # the lock exists
    took = nobody.py(
        "import fcntl, os, sys\n"
        "try:\n    fd = os.open(sys.argv[1], os.O_RDONLY)\n"
        "except PermissionError:\n    sys.exit(0)\n"
        "fcntl.flock(fd, fcntl.LOCK_SH)\nsys.exit(1)\n",
        str(lock),
    )
    assert took.returncode == 0, "nobody could open (and so hold) root's simulated state lock"


def test_a_link_as_a_simulated_hosts_state_directory(two: dict[str, User]) -> None:
    """nobody's simulated host whose sim/ is a link to root's host's: root changing nobody's
    host refuses (one line) and root's host is unchanged."""
    root, nobody = two["root"], two["nobody"]
    sim = nobody.base / "linked-state"
    assert nobody.run("sim", "create", "--system", "quietbox2", "--root", str(sim)).returncode == 0
    try:
        before = (root.sim / "sim" / "state.json").read_bytes()
        planted = nobody.py(
            "import os, shutil, sys; shutil.rmtree(sys.argv[1]); os.symlink(sys.argv[2], sys.argv[1])",
            str(sim / "sim"), str(root.sim / "sim"),
        )  # fmt: skip
        assert planted.returncode == 0, planted.stderr
        res = root.run("sim", "fault", "--root", str(sim), "chip-dead", C01)
        assert res.returncode == 2, res.stderr
        # Refused as it reads the host (its files lead out of it) or as it would change it.
        last = _last(res)
        assert f"{sim / 'sim'} is a symbolic link" in last or (
            f"{sim / 'sim' / 'system.json'} leads out of {sim}" in last
        ), last
        assert (root.sim / "sim" / "state.json").read_bytes() == before
    finally:
        shutil.rmtree(sim, ignore_errors=True)


def _own_sim(user: User, name: str) -> Path:
    """A fresh simulated QuietBox 2 of ``user``'s (the session's one stays untouched)."""
    sim = user.base / name
    made = user.run("sim", "create", "--system", "quietbox2", "--root", str(sim))
    assert made.returncode == 0, made.stderr
    return sim


def test_a_link_out_of_anothers_simulated_host_is_never_read(two: dict[str, User]) -> None:
    """nobody's simulated host whose driver file is a link to a file only root may read: root's
    ttmesh reading that host refuses the file in one line, never showing what it holds."""
    root, nobody = two["root"], two["nobody"]
    secret_dir = Path(tempfile.mkdtemp(prefix="ttmesh-secret-"))
    secret = secret_dir / "secret"
    secret.write_text("SECRET-of-root\n")
    secret.chmod(0o600)
    try:
        sim = _own_sim(nobody, "sim-link-out")
        attr = sim / "sys" / "class" / "tenstorrent" / "tenstorrent!0" / "tt_asic_id"
        assert attr.is_file()
        planted = nobody.py(
            "import os, sys; os.unlink(sys.argv[1]); os.symlink(sys.argv[2], sys.argv[1])",
            str(attr.resolve()), str(secret),
        )  # fmt: skip
        assert planted.returncode == 0, planted.stderr
        res = root.run("ls", "--root", str(sim))
        assert res.returncode == 2, res.stdout + res.stderr
        assert "SECRET" not in res.stdout + res.stderr
        (line,) = [x for x in res.stderr.splitlines() if x.startswith("ttmesh:")]
        assert "tt_asic_id leads out of" in line, line
    finally:
        shutil.rmtree(secret_dir, ignore_errors=True)


def test_root_reading_anothers_simulated_host_writes_nothing_into_it(
    two: dict[str, User],
) -> None:
    """Reading a host is reading: root's ttmesh on nobody's simulated host leaves no file of
    root's in it (a cache written there would follow a link nobody planted at its name)."""
    root, nobody = two["root"], two["nobody"]
    sim = _own_sim(nobody, "sim-no-writes")
    for res in (root.run("ls", "--root", str(sim)), root.run("check", "--root", str(sim))):
        assert res.returncode in (0, 1), res.stderr
    roots = [p for p in sim.rglob("*") if p.lstat().st_uid == 0]
    assert roots == [], roots


@pytest.mark.parametrize("option", ["--summary-json", "--export-rank-binding"])
def test_a_link_planted_at_an_output_in_a_shared_directory_is_not_written_through(
    two: dict[str, User], option: str
) -> None:
    """A file root names in /tmp-like directory (sticky, world-writable) where nobody planted
    a link to a file of root's: root's ttmesh refuses in one line and the file is untouched, as
    the kernel's fs.protected_symlinks would (this machine has it off)."""
    root, nobody = two["root"], two["nobody"]
    top = world_dir("ttmesh-outputs-", 0o1777)
    victim_dir = Path(tempfile.mkdtemp(prefix="ttmesh-victim-"))
    victim = victim_dir / "victim"
    victim.write_text("root's own\n")
    try:
        out = top / "out.json"
        planted = nobody.py("import os, sys; os.symlink(sys.argv[1], sys.argv[2])",
                            str(victim), str(out))  # fmt: skip
        assert planted.returncode == 0, planted.stderr
        if option == "--summary-json":
            res = root.run("launch", "--root", str(root.sim), "--tp-size", "1",
                           "--summary-json", str(out), "--", "true")  # fmt: skip
        else:
            res = root.run("descriptor", "--root", str(root.sim), "--tp-size", "2",
                           "-o", str(victim_dir / "desc"), "--export-rank-binding", str(out))  # fmt: skip
        assert victim.read_text() == "root's own\n"
        lines = [x for x in res.stderr.splitlines() if x.startswith("ttmesh:")]
        assert any(f"{option} {out} is a symbolic link of nobody's" in x for x in lines), res.stderr
        assert res.returncode == 2, res.stderr
    finally:
        shutil.rmtree(top, ignore_errors=True)
        shutil.rmtree(victim_dir, ignore_errors=True)


HOLD_LEASES = (
    "import sys\n"
    "from ttmesh.cli.hosts import open_host\n"
    "from ttmesh.fabric import domains\n"
    "from ttmesh.fabric.devices import discover\n"
    "from ttmesh.runtime import leases\n"
    "host = open_host(sys.argv[1]); inv = discover(host)\n"
    "chips = [inv.by_bdf()[b].asic_id for b in sys.argv[2:]]\n"
    "held = leases.acquire(host, chips, 'serve', cmd='serve', uses=domains.mesh_peers(inv, chips))\n"
    "print('ready', flush=True)\n"
    "sys.stdin.read()\n"
)


def test_a_reset_beside_another_users_job_and_the_record_it_leaves(
    two: dict[str, User], shared: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Root resets a free board of a QuietBox 2 while nobody's job runs on the other: the
    reset stops at the links between them (neither job's mesh uses them) and never touches
    nobody's chips. The record of those links lives in the shared lease directory: a link
    nobody planted at its name is replaced, never written through; a record nobody wrote is
    not believed by root (it could make root's jobs refuse)."""
    from conftest import stock_model

    from ttmesh.cli.hosts import open_host
    from ttmesh.runtime import leases, leftdown
    from ttmesh.sim import core
    from ttmesh.sim.create import create

    nobody = two["nobody"]
    env = _env(shared)
    top = world_dir("ttmesh-beside-", 0o755)
    qb2 = create(stock_model("quietbox2"), top / "qb2", config={"reset_seconds": 0.0})
    subprocess.run(["chmod", "-R", "a+rX", str(top)], check=True)
    victim_dir = Path(tempfile.mkdtemp(prefix="ttmesh-victim-"))
    victim = victim_dir / "victim"
    victim.write_text("root's own\n")
    record = shared / leftdown.NAME
    job = None
    try:
        planted = nobody.py("import os, sys; os.symlink(sys.argv[1], sys.argv[2])",
                            str(victim), str(record))  # fmt: skip
        assert planted.returncode == 0, planted.stderr
        job = nobody.popen(
            nobody.argv(nobody.python, "-c", HOLD_LEASES, str(qb2), "0000:05:00.0",
                        "0000:07:00.0", env=env),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        assert job.stdout is not None and job.stdout.readline() == "ready\n"
        monkeypatch.setenv("TTMESH_RUNTIME_DIR", str(shared))
        host = open_host(qb2)
        theirs = {core.asic_hex(core.SimRoot(str(qb2)).chip_by_bdf(b)["unique_id"])
                  for b in ("0000:05:00.0", "0000:07:00.0")}  # fmt: skip
        found = leases.probe(host, sorted(theirs))
        assert {i.user for i in found.values()} == {"nobody"} and all(
            i.uses for i in found.values()
        )
        res = run_cli("reset", "--root", str(qb2), "--chips", "0000:01:00.0",
                      "--backoff", "0", env=env)  # fmt: skip
        assert res.code == 0, res.err
        assert "job serve of user nobody" in res.err
        (done,) = core.SimRoot(str(qb2)).read_state()["resets"]
        assert not theirs & set(done["targets"]) and len(done["targets"]) == 2
        assert job.poll() is None and set(leases.probe(host, sorted(theirs))) == theirs
        assert victim.read_text() == "root's own\n"
        st = record.lstat()
        assert stat.S_ISREG(st.st_mode) and st.st_uid == 0
        assert len(leftdown.read(host)) == 2
        seen = nobody.run("ls", "--json", "--root", str(qb2), env=env)
        assert len(json.loads(seen.stdout)["links_left_down"]) == 2  # root's: believed by all
        text = record.read_text()
        record.unlink()
        wrote = nobody.py("import sys; open(sys.argv[1], 'w').write(sys.argv[2])",
                          str(record), text)  # fmt: skip
        assert wrote.returncode == 0, wrote.stderr
        assert record.stat().st_uid == NOBODY_UID
        assert leftdown.read(host) == []
        listed = run_cli("ls", "--json", "--root", str(qb2), env=env)
        assert json.loads(listed.out)["links_left_down"] == []
    finally:
        if job is not None:
            job.communicate(input="", timeout=30)
        shutil.rmtree(victim_dir, ignore_errors=True)
        shutil.rmtree(top, ignore_errors=True)


# --------------------------------------------------------------------------- jobs over hosts


def _rendezvous_jobs(job: str, count: int) -> list[list[Any]]:
    """``count`` jobs named ``job``, each of two agents (node 0 holding a real store on a free
    port of 127.0.0.1), joined in this process, all at once, through the real join: torch's
    store and rendezvous."""
    from ttmesh.launcher.nodes.rendezvous import Coordinator, Endpoint, Node

    jobs = []
    for _ in range(count):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        jobs.append([Coordinator(Endpoint("127.0.0.1", port), job, 2, n, "one-token",
                                 timeout=60) for n in range(2)])  # fmt: skip
    every = [c for agents in jobs for c in agents]
    done = _together(every, lambda c: c.join(Node(c.node, f"h{c.node}", "127.0.0.1", 1)))
    assert done == [None] * len(every), done
    return jobs


def _together(agents: list[Any], do: Callable[[Any], Any]) -> list[Any]:
    """``do(agent)`` for each agent at once (each waits for the others): results or errors."""
    out: list[Any] = [None] * len(agents)

    def one(i: int) -> None:
        try:
            out[i] = do(agents[i])
        except Exception as exc:
            out[i] = exc

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(agents))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    return out


@pytest.mark.torch
def test_a_failure_another_user_copies_from_an_earlier_job_is_ignored(
    two: dict[str, User], capsys: pytest.CaptureFixture[str]
) -> None:
    """Two jobs over hosts with the same token and job id (the default id is the endpoint's),
    one after the other. In each attempt the earlier job's rank 1 exits 7; root, then nobody,
    each with no token and no torch (the store's own protocol, tests/rawstore.py), copies that
    attempt's ``first/N`` record into the later job's store. The later job's agents neither
    stop nor take 7: each says once that it ignored the copy (it made node 0 exit 7 with every
    rank healthy)."""
    pytest.importorskip("torch")
    copier = (Path(__file__).parent / "rawstore.py").read_text()
    earlier, later = _rendezvous_jobs("train", 2)
    failed = {"interrupted": False, "rank": 1, "host": "h1", "reason": "rank 1 exited with code 7"}
    try:
        for attempt, user in enumerate(("root", "nobody")):
            ends = [c.report_end(attempt, {**failed, "code": 7 if c.node == 1 else 0})
                    for c in earlier[::-1]]  # node 1 ended first  # fmt: skip
            assert [e["code"] for e in ends] == [7, 7], ends
            copied = two[user].py(copier, str(earlier[0].endpoint.port),
                                  str(later[0].endpoint.port), f"ttmesh/first/{attempt}")  # fmt: skip
            assert copied.returncode == 0, copied.stderr
            for c in later:
                c.watch(attempt, lambda: pytest.fail("stopped for a copied record"))
                c._check_ends()  # what the heartbeat does while the ranks run
            ends = _together(later, lambda c, a=attempt: c.report_end(
                a, {**failed, "code": 0, "rank": None}))  # fmt: skip
            assert [e["code"] for e in ends] == [0, 0], ends
    finally:
        for c in [*later, *earlier]:
            c.close()
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("ttmesh: ")]
    for attempt in (0, 1):
        said = [ln for ln in lines if f"ignored first/{attempt} " in ln]
        assert len(said) == 2 and all("a record of another run of this job" in ln for ln in said)


# --------------------------------------------------------------------------- a job's output


def test_another_user_cannot_read_a_jobs_output(two: dict[str, User], shared: Path) -> None:
    """root's job keeps its output (issue 37) where only root can read it: files 0600 in
    directories 0700 of root's; nobody can neither open them nor have ttmesh logs show them,
    through root's runtime directory or its own."""
    root, nobody = two["root"], two["nobody"]
    top = world_dir("ttmesh-logs-", 0o755)
    runtime = top / "root-rt"
    runtime.mkdir(mode=0o700)
    try:
        env = {**_env(shared), "XDG_RUNTIME_DIR": str(runtime)}
        res = root.run("launch", "--root", str(root.sim), "--chips", C01, "--job-id", "mine",
                       "--", sys.executable, "-c", "print('root only: s3cr3t')", env=env)  # fmt: skip
        assert res.returncode == 0, res.stderr
        assert root.run("logs", "mine", env=env).stdout == "root only: s3cr3t\n"
        logs = runtime / "ttmesh" / "logs" / "mine"
        files = [p for p in logs.rglob("*") if p.is_file()]
        assert files and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in files)
        assert all(stat.S_IMODE(p.stat().st_mode) == 0o700 for p in [logs, *logs.rglob("*")]
                   if p.is_dir())  # fmt: skip
        kept = str(logs / "attempt_0" / "0" / "stdout.log")
        opened = nobody.py("open(__import__('sys').argv[1]).read()", kept)
        assert opened.returncode != 0 and "PermissionError" in opened.stderr
        through = nobody.run("logs", "mine", env={"XDG_RUNTIME_DIR": str(runtime)})
        assert through.returncode == 2 and "s3cr3t" not in through.stdout + through.stderr
        own = nobody.run("logs", "mine")
        assert own.returncode == 2 and "no job 'mine' of yours" in _last(own)
    finally:
        shutil.rmtree(top)
