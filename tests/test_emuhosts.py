"""What an emulated host (scripts/emuhosts.py, tests/hosts.py) sees: its own /tmp, and the paths a
cluster shares wherever they lie, under the machine's /tmp too (where CI runners and people put
clones, their venvs and caches); never another host's /tmp, by any path."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO, scratch
from hosts import can_emulate, launch_agent, make_hosts

WHY = can_emulate()
pytestmark = pytest.mark.skipif(WHY is not None, reason=WHY or "")


@pytest.fixture
def in_tmp() -> Iterator[Path]:
    """A directory under the machine's /tmp itself (pytest's basetemp may be elsewhere)."""
    path = Path(tempfile.mkdtemp(prefix="ttmesh-emu-", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _on(host, script: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        host.wrap(["sh", "-c", script]), capture_output=True, text=True, timeout=60
    )


def test_hosts_whose_directory_lies_under_tmp_see_their_roots(in_tmp: Path) -> None:
    """The hosts' common directory under /tmp (the suite's fall-back when there is no
    /dev/shm): each host's ttmesh finds its simulated root there, as it does elsewhere."""
    hosts = make_hosts(in_tmp / "world", "quietbox2", 2)
    for host in hosts:
        proc = host.ttmesh("ls", "--json", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert len(json.loads(out)["chips"]) == 4, out


def test_a_venv_in_a_cache_under_tmp_runs_on_every_host(
    in_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cache the tests hand to hosts (here the conformance cache, where ttnn's venv and Open
    MPI 5 live) under /tmp: its Python runs on each host, at the same path ("python: not
    found" when the host's own /tmp hid it)."""
    cache = in_tmp / "conformance"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(cache / "venv")], check=True)
    monkeypatch.setenv("TTMESH_CONFORMANCE_CACHE", str(cache))
    hosts = make_hosts(in_tmp / "world", "quietbox2", 2)
    python = cache / "venv" / "bin" / "python"
    for host in hosts:
        res = _on(host, f"{python} -c 'import sys; print(sys.prefix)'")
        assert res.returncode == 0, res.stderr
        assert res.stdout.strip() == str(cache / "venv")


def test_every_host_sees_this_checkout_and_its_python(tmp_path: Path) -> None:
    """The checkout and the Python running the suite, wherever they are (a clone in /tmp
    included: run from one, this fails when hosts cannot see them)."""
    hosts = make_hosts(tmp_path / "world", "quietbox2", 2)
    probe = "import sys, ttmesh; print(sys.prefix); print(ttmesh.__file__)"
    for host in hosts:
        proc = host.popen(
            [sys.executable, "-c", probe], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert out.splitlines() == [sys.prefix, str(REPO / "ttmesh" / "__init__.py")], out


def test_no_host_sees_the_machines_tmp_or_another_hosts(in_tmp: Path, tmp_path: Path) -> None:
    """A host's /tmp is its own: what another host keeps there (its runtime files) is seen
    neither at /tmp nor at the directory that holds it; the machine's /tmp neither, beyond what
    the hosts share."""
    private = in_tmp / "not-shared"
    private.write_text("MACHINE-ONLY\n")
    with scratch(tmp_path / "world") as usual:  # /dev/shm, where the suite's hosts live
        for world in (usual, in_tmp / "world"):
            _apart(world, private)


def _apart(world: Path, private: Path) -> None:
    """Host 0 of two hosts under ``world`` sees none of host 1's /tmp, nor ``private``."""
    hosts = make_hosts(world, "quietbox2", 2)
    put = _on(hosts[1], "echo HOST1-RUNTIME > /tmp/run/mine && cat /tmp/run/mine")
    assert put.returncode == 0 and put.stdout == "HOST1-RUNTIME\n", put.stderr
    backing = hosts[1].dir / "tmp" / "run" / "mine"
    assert backing.read_text() == "HOST1-RUNTIME\n"  # where host 1's /tmp lies on this machine
    look = _on(hosts[0], f"cat /tmp/run/mine {backing} {private} 2>&1; ls {hosts[1].dir}")
    assert "HOST1-RUNTIME" not in look.stdout, look.stdout
    assert "MACHINE-ONLY" not in look.stdout, look.stdout
    assert "root" in look.stdout.split(), look.stdout  # host 1's root itself is shared


def test_the_launch_agent_enters_the_same_host(in_tmp: Path) -> None:
    """mpirun's launch agent puts COMMAND on the named host as Host.wrap does: its name, its
    root, the hosts' common directory under /tmp, from ``/``."""
    hosts = make_hosts(in_tmp / "world", "quietbox2", 2)
    agent = launch_agent(in_tmp / "world", hosts)
    (in_tmp / "world" / "note").write_text("shared\n")
    for host in hosts:
        res = subprocess.run(
            [str(agent), "-x", host.name, "hostname; pwd; echo $TTMESH_ROOT;",
             f"cat {in_tmp}/world/note; ls {host.root}/sim >/dev/null && echo root-ok"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert res.returncode == 0, res.stderr
        assert res.stdout.split() == [host.name, "/", str(host.root), "shared", "root-ok"]


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)")
def test_another_user_on_a_host_cannot_redirect_a_share(
    in_tmp: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A host's /tmp is writable by everyone. A share under the machine's /tmp that does not
    exist yet when the hosts are made (a cache made later): ``nobody`` on a host plants a link
    where its mount point goes, to a directory of the machine's. The mount points were made
    with the hosts, as root: the link cannot be planted, root follows none later, and the
    share is seen at its own path once it exists."""
    late = in_tmp / "late" / "cache"
    monkeypatch.setenv("TTMESH_SGLANG_DIR", str(late))
    elsewhere = Path(tempfile.mkdtemp(prefix="ttmesh-emu-elsewhere-", dir="/tmp"))
    try:
        with scratch(tmp_path / "world") as world:
            hosts = make_hosts(world, "quietbox2", 2)
            first = "/tmp/" + in_tmp.name
            plant = _on(
                hosts[0],
                "setpriv --reuid=nobody --regid=nogroup --clear-groups "
                f"sh -c 'rm -rf {first} 2>/dev/null; ln -s {elsewhere} {first}'",
            )
            late.mkdir(parents=True)
            (late / "f").write_text("late share\n")
            seen = _on(hosts[0], f"cat {late}/f")
            assert plant.returncode != 0, "nobody planted a link in the host's /tmp"
            assert seen.returncode == 0 and seen.stdout == "late share\n", seen.stderr
            assert list(elsewhere.iterdir()) == []  # root made nothing where the link pointed
    finally:
        shutil.rmtree(elsewhere, ignore_errors=True)
