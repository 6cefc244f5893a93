"""How a simulated host moves: heartbeats, holders and fabric marks.

Values are read the way ttmesh reads a real host (``Host.read_text`` / ``Host.attr`` on sysfs and
procfs paths, ``ttmesh ls --json``, ``tt-smi -s``); the changes come from real processes that
live, exit or get SIGKILLed. Nothing sleeps and hopes: every wait polls for its condition under a
deadline.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import until as _until

from ttmesh.cli.hosts import open_host as Host
from ttmesh.sim import core

A, B = "0000:01:00.0", "0000:03:00.0"  # QuietBox 2: linked by two links (one p300)
WORKER_TAG = "ttmesh-test-worker"  # conftest reports any such process left behind

# A job that opens the fabric: registers as holder, marks the fabric, then waits on stdin.
# mode "clean" clears its mark and holder before exiting; "exit" just exits.
CHILD = """
import os, sys
from ttmesh.sim.core import SimRoot
_tag, root, mode, *asics = sys.argv[1:]
sim = SimRoot(root)
me = os.getpid()
sim.add_holder(asics, me)
sim.mark_fabric(asics, me)
print("ready", flush=True)
sys.stdin.readline()
if mode == "clean":
    sim.clear_fabric(me)
    sim.remove_holder(me)
"""


# --------------------------------------------------------------------------- helpers

until = functools.partial(_until, timeout=3.0)


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen]]:
    """Processes a test starts; any still running at the end is killed (by PID) and reaped."""
    procs: list[subprocess.Popen] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=10)


def dev_of(root: Path, bdf: str) -> int:
    host = Host(root)
    return next(n for n in host.dev_indexes() if host.bdf_of(n) == bdf)


def asic_of(root: Path, bdf: str) -> str:
    return Host(root).attr(dev_of(root, bdf), "tt_asic_id")


def beat(host: Host, n: int) -> int:
    return int(host.attr(n, "tt_heartbeat"))


def pids(host: Host, n: int) -> str | None:
    return host.read_text(f"proc/driver/tenstorrent/{n}/pids")


def ls(cli: Callable, root: Path) -> dict:
    res = cli("ls", "--json", "--root", str(root))
    assert res.code == 0, res.err
    return json.loads(res.out)


def link_states(cli: Callable, root: Path) -> dict[frozenset, str]:
    """{frozenset of the two asic ids: sorted states of the links between them}."""
    out: dict[frozenset, list[str]] = {}
    for lk in ls(cli, root)["links"]:
        out.setdefault(frozenset({lk["a"]["asic_id"], lk["b"]["asic_id"]}), []).append(lk["state"])
    return {k: sorted(v) for k, v in out.items()}


def smi(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
    return subprocess.run(
        [str(root / "bin" / "tt-smi"), *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def eth_up(root: Path) -> dict[str, set[int]]:
    """Link-up channels (ETH_LIVE_STATUS bits 16+) per PCI address, from ``tt-smi -s``."""
    res = smi(root, "-s")
    assert res.returncode == 0, res.stdout + res.stderr
    out = {}
    for dev in json.loads(res.stdout)["device_info"]:
        value = int(dev["smbus_telem"]["ETH_LIVE_STATUS"], 16)
        out[dev["board_info"]["bus_id"]] = {c for c in range(16) if value >> (16 + c) & 1}
    return out


def channels(root: Path, a: str, b: str) -> tuple[set[int], set[int]]:
    """The channels of chip a and of chip b that link them to each other."""
    sim = core.SimRoot(str(root))
    ca, cb = set(), set()
    for x, cx, y, cy in sim.links():
        if {x, y} == {a, b}:
            ca.add(cx if x == a else cy)
            cb.add(cy if x == a else cx)
    return ca, cb


def start_job(root: Path, mode: str, bdfs: list[str], children: list) -> subprocess.Popen:
    asics = [asic_of(root, b) for b in bdfs]
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, WORKER_TAG, str(root), mode, *asics],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    children.append(proc)
    assert proc.stdout.readline() == "ready\n"
    return proc


# --------------------------------------------------------------------------- heartbeats


def test_heartbeats_advance_while_alive(qb2: Path) -> None:
    host = Host(qb2)
    devs = host.dev_indexes()
    assert len(devs) == 4
    first = {n: beat(host, n) for n in devs}
    for n in devs:
        assert until(lambda n=n: beat(host, n) > first[n]), f"tenstorrent!{n} did not advance"


def test_heartbeat_rate_follows_config(qb2: Path) -> None:
    host = Host(qb2)
    hz = core.SimRoot(str(qb2)).read_state()["config"]["heartbeat_hz"]
    t0 = time.time()
    v1 = beat(host, 0)
    t1 = time.time()
    assert until(lambda: beat(host, 0) >= v1 + 20)
    t2 = time.time()
    v2 = beat(host, 0)
    t3 = time.time()
    # the counter moves with the clock: hz x the time between the two reads
    assert hz * (t2 - t1) - 1 <= v2 - v1 <= hz * (t3 - t0) + 1


def test_heartbeat_freezes_when_chip_dies_and_resumes_after_reset(qb2: Path, cli: Callable) -> None:
    host = Host(qb2)
    dead, live = dev_of(qb2, "0000:05:00.0"), dev_of(qb2, A)
    res = cli("sim", "fault", "--root", str(qb2), "chip-dead", "0000:05:00.0")
    assert res.code == 0, res.err
    frozen = beat(host, dead)
    start = beat(host, live)
    seen = set()

    def live_moved_on() -> bool:
        seen.add(beat(host, dead))
        return beat(host, live) >= start + 20  # 20 heartbeats of a live chip

    assert until(live_moved_on)
    assert seen == {frozen}
    assert smi(qb2, "-r", "0000:05:00.0").returncode == 0
    assert until(lambda: beat(host, dead) > frozen)


def test_a_remote_chip_heartbeat_beats_freezes_and_resets_with_its_pci_chip(
    make_sim: Callable[..., Path], cli: Callable
) -> None:
    root = make_sim("n300")
    host = Host(root)
    right = next(
        core.asic_hex(c["unique_id"]) for c in core.SimRoot(str(root)).chips() if not c["bdf"]
    )
    first = host.remote_heartbeats([right])[right]
    assert until(lambda: host.remote_heartbeats([right])[right] > first)
    assert cli("sim", "fault", "--root", str(root), "chip-dead", right).code == 0
    frozen = host.remote_heartbeats([right])[right]
    left = host.dev_indexes()[0]
    start = beat(host, left)
    assert until(lambda: beat(host, left) >= start + 20)
    assert host.remote_heartbeats([right])[right] == frozen
    # the right chip is reset with the PCI device it sits behind
    assert smi(root, "-r", "0000:41:00.0").returncode == 0
    assert until(lambda: host.remote_heartbeats([right])[right] > frozen)


# --------------------------------------------------------------------------- holders


def test_holder_listed_only_while_its_process_lives(qb2: Path, children: list) -> None:
    host, sim = Host(qb2), core.SimRoot(str(qb2))
    n = dev_of(qb2, B)
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()", WORKER_TAG], stdin=subprocess.PIPE
    )
    children.append(child)
    sim.add_holder([asic_of(qb2, B)], child.pid)
    assert pids(host, n) == f"{child.pid}\n"
    assert host.holder_pids(n) == [child.pid]
    for other in host.dev_indexes():
        if other != n:
            assert pids(host, other) == ""
    child.send_signal(signal.SIGKILL)
    assert until(lambda: pids(host, n) == "")  # a zombie holds nothing
    child.wait(timeout=10)
    assert pids(host, n) == ""


def test_dead_pid_is_never_listed(qb2: Path) -> None:
    host, sim = Host(qb2), core.SimRoot(str(qb2))
    n = dev_of(qb2, B)
    gone = subprocess.Popen([sys.executable, "-c", "pass", WORKER_TAG])
    gone.wait(timeout=10)
    sim.add_holder([asic_of(qb2, B)], gone.pid)
    assert pids(host, n) == ""
    # Even if the PID is later reused: emulate it by pointing the record at a live process.
    with sim.change() as state:
        for h in state["holders"]:
            if h["pid"] == gone.pid:
                h["pid"] = os.getpid()
    assert pids(host, n) == ""


def test_holder_with_another_start_time_is_not_listed(qb2: Path, children: list) -> None:
    """A PID reused by a new process is not the holder that was registered."""
    host, sim = Host(qb2), core.SimRoot(str(qb2))
    n = dev_of(qb2, B)
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()", WORKER_TAG], stdin=subprocess.PIPE
    )
    children.append(child)
    sim.add_holder([asic_of(qb2, B)], child.pid)
    assert pids(host, n) == f"{child.pid}\n"
    with sim.change() as state:
        for h in state["holders"]:
            h["start"] -= 1
    assert pids(host, n) == ""


# --------------------------------------------------------------------------- fabric marks


@pytest.mark.parametrize(
    ("end", "state"), [("kill", "down"), ("exit", "down"), ("clean", "up")], ids=str
)
def test_fabric_mark_and_how_the_job_ends(
    qb2: Path, cli: Callable, children: list, end: str, state: str
) -> None:
    a, b = asic_of(qb2, A), asic_of(qb2, B)
    ca, cb = channels(qb2, a, b)
    assert len(ca) == len(cb) == 2
    job = start_job(qb2, "exit" if end == "kill" else end, [A, B], children)

    # while the job lives its fabric is up and it holds both chips
    links = link_states(cli, qb2)
    assert set(links) and all(v == ["up", "up"] for v in links.values())
    chips = {c["bdf"]: c for c in ls(cli, qb2)["chips"]}
    assert [h["pid"] for h in chips[A]["holders"]] == [job.pid]
    assert [h["pid"] for h in chips[B]["holders"]] == [job.pid]

    if end == "kill":
        job.send_signal(signal.SIGKILL)
        assert job.wait(timeout=10) == -signal.SIGKILL
    else:
        job.stdin.write("\n")
        job.stdin.flush()
        assert job.wait(timeout=10) == 0

    links = link_states(cli, qb2)
    assert links.pop(frozenset({a, b})) == [state, state]
    assert all(v == ["up", "up"] for v in links.values())  # the other links never were involved
    eth = eth_up(qb2)
    if state == "up":
        assert eth[A] >= ca and eth[B] >= cb
    else:
        assert not eth[A] & ca and not eth[B] & cb
    chips = {c["bdf"]: c for c in ls(cli, qb2)["chips"]}
    assert chips[A]["holders"] == chips[B]["holders"] == []  # the process is gone either way


def test_reset_of_both_chips_restores_their_links(qb2: Path, cli: Callable, children: list) -> None:
    a, b = asic_of(qb2, A), asic_of(qb2, B)
    ca, cb = channels(qb2, a, b)
    job = start_job(qb2, "exit", [A, B], children)
    job.send_signal(signal.SIGKILL)
    job.wait(timeout=10)
    assert link_states(cli, qb2)[frozenset({a, b})] == ["down", "down"]
    res = smi(qb2, "-r", A, B)
    assert res.returncode == 0, res.stdout
    links = link_states(cli, qb2)
    assert links.pop(frozenset({a, b})) == ["up", "up"]
    eth = eth_up(qb2)
    assert eth[A] >= ca and eth[B] >= cb
    # their links to the two chips that were not reset fail to train, as on hardware
    for pair, states in links.items():
        touched = bool(pair & {a, b})
        assert states == (["down", "down"] if touched else ["up", "up"]), pair


def test_reset_of_one_side_leaves_the_link_down(qb2: Path, cli: Callable, children: list) -> None:
    a, b = asic_of(qb2, A), asic_of(qb2, B)
    ca, cb = channels(qb2, a, b)
    job = start_job(qb2, "exit", [A, B], children)
    job.send_signal(signal.SIGKILL)
    job.wait(timeout=10)
    for one in (A, B):  # one side, then the other: never both together
        assert smi(qb2, "-r", one).returncode == 0
        assert link_states(cli, qb2)[frozenset({a, b})] == ["down", "down"]
        eth = eth_up(qb2)
        assert not eth[A] & ca and not eth[B] & cb
    assert smi(qb2, "-r").returncode == 0  # everything at once
    assert all(v == ["up", "up"] for v in link_states(cli, qb2).values())


def test_fabric_mark_of_a_dead_pid(qb2: Path, cli: Callable) -> None:
    """A mark by a process already gone is an abandoned fabric, even if its PID is reused."""
    sim = core.SimRoot(str(qb2))
    a, b = asic_of(qb2, A), asic_of(qb2, B)
    gone = subprocess.Popen([sys.executable, "-c", "pass", WORKER_TAG])
    gone.wait(timeout=10)
    sim.mark_fabric([a, b], gone.pid)
    with sim.change() as state:  # emulate the PID's reuse by a live process
        for m in state["fabric_marks"]:
            m["pid"] = os.getpid()
    assert link_states(cli, qb2)[frozenset({a, b})] == ["down", "down"]
