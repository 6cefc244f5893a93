"""The cables between two simulated hosts are one state both hosts read (issue 24).

Two roots of a dual T3K, made side by side in one test directory, share one cable state (as on
hardware both ends of a cable change together). Each host sees its cables as its chips'
firmware reports them (``ETH_LIVE_STATUS``, through the sim's own reader and ``tt-smi -s``);
resets are ``tt-smi -r``'s (the sim core's reset). Training times are scaled down through the
sim's config; a wait for training polls the state under a deadline.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import scratch, wait_for
from hosts import can_emulate, launch_agent, make_hosts, mpi_env

from ttmesh.sim import core
from ttmesh.sim.create import create
from ttmesh.sim.system import load_any

SYSTEM = "dual-t3k"


def _hosts(tmp_path: Path, **config: float) -> list[core.SimRoot]:
    model = load_any(SYSTEM)
    roots = []
    for i in range(2):
        root = tmp_path / f"t3k-{i}"
        create(model.host(i), root, config={"reset_seconds": 0.0, **config})  # type: ignore[union-attr]
        roots.append(core.SimRoot(str(root)))
    return roots


def _pci(sim: core.SimRoot) -> list[str]:
    return [core.asic_hex(c["unique_id"]) for c in sim.chips() if c.get("bdf")]


def _cables_up(sim: core.SimRoot) -> list[bool]:
    """Each cable of the host, up or not, as its chips' ETH_LIVE_STATUS says (bit 16 + chan)."""
    state = sim.read_state()
    status = sim.eth_live_statuses(state, sorted(state["chips"]))
    return [bool(status[a] >> (16 + ca) & 1) for a, ca, _b, _cb in sim.remote_links()]


def test_the_hosts_share_one_cable_state_beside_their_roots(tmp_path: Path) -> None:
    h0, h1 = _hosts(tmp_path)
    for sim in (h0, h1):
        assert sim.cable_store().directory == str(tmp_path / f"{SYSTEM}.cables")
        assert len(sim.remote_links()) == 8 and _cables_up(sim) == [True] * 8
    data = json.loads((tmp_path / f"{SYSTEM}.cables" / "cables.json").read_text())
    # Wormhole's external links train in about 90 s (ttmesh.host.boards.link_training).
    assert data["config"]["cable_train_seconds"] == 90.0 and len(data["cables"]) == 8


def test_resetting_one_end_downs_the_cable_on_both_sides(tmp_path: Path) -> None:
    h0, h1 = _hosts(tmp_path, cable_train_seconds=0.0)
    h0.reset(_pci(h0))
    assert _cables_up(h0) == [False] * 8
    assert _cables_up(h1) == [False] * 8  # the other host did nothing, and sees them down


def test_both_ends_reset_within_the_window_train_after_the_training_time(tmp_path: Path) -> None:
    h0, h1 = _hosts(tmp_path, cable_train_seconds=0.3, cable_window=30.0)
    h0.reset(_pci(h0))
    h1.reset(_pci(h1))
    view = h1.cables_now()
    assert view is not None
    assert {c["why"] for c in view["cables"]} == {"training after both ends were reset"}
    assert {c["trained"] for c in view["cables"]} == {False}
    wait_for(lambda: _cables_up(h0) == [True] * 8 == _cables_up(h1), 10, "the cables to train")


def test_resets_outside_the_window_leave_the_cables_down(tmp_path: Path) -> None:
    h0, h1 = _hosts(tmp_path, cable_train_seconds=0.0, cable_window=0.0)
    h0.reset(_pci(h0))
    h1.reset(_pci(h1))  # after host 0's: outside a window of 0 s
    assert _cables_up(h0) == [False] * 8 == _cables_up(h1)
    view = h0.cables_now()
    assert view is not None and {c["train_at"] for c in view["cables"]} == {None}


def test_a_bad_cable_stays_down_after_both_ends_reset(tmp_path: Path, cli) -> None:
    h0, h1 = _hosts(tmp_path, cable_train_seconds=0.0, cable_window=30.0)
    bad = cli("sim", "fault", "--root", h0.root, "bad-cable", "0000:ca:00.0", "--channel", "6")
    assert bad.code == 0, bad.err
    h0.reset(_pci(h0))
    h1.reset(_pci(h1))  # trained at once (0 s), all but the bad one
    assert _cables_up(h0).count(False) == 1 and _cables_up(h1).count(False) == 1
    shown = cli("sim", "show", "--root", h1.root)
    assert "cables to other hosts: 7 of 8 up" in shown.out, shown.out
    assert "ch6 <-> host 0 0000000261903008 ch6: down (a bad cable" in shown.out, shown.out
    assert cli("sim", "clear", "--root", h1.root).code == 0  # either host mends it
    assert _cables_up(h0) == [True] * 8


def test_a_job_that_died_mid_fabric_downs_its_cables_on_both_sides(tmp_path: Path) -> None:
    h0, h1 = _hosts(tmp_path, cable_train_seconds=0.0)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    h0.mark_fabric(_pci(h0), int(gone.stdout))  # its process is gone: a dead mark
    assert _cables_up(h0) == [False] * 8  # seen here, and said in the shared state:
    assert _cables_up(h1) == [False] * 8


def test_tt_smi_sees_the_cables_and_resets_its_end(tmp_path: Path) -> None:
    """The stand-in in the root's bin/ (standard library only) reads and resets the cables."""
    h0, h1 = _hosts(tmp_path, cable_train_seconds=0.0)
    smi = os.path.join(h0.root, "bin", "tt-smi")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    reset = subprocess.run([sys.executable, smi, "-r"], capture_output=True, text=True, env=env)
    assert reset.returncode == 0, reset.stderr
    assert _cables_up(h1) == [False] * 8
    snap = subprocess.run([sys.executable, os.path.join(h1.root, "bin", "tt-smi"), "-s"],
                          capture_output=True, text=True, env=env, check=True)  # fmt: skip
    eth = {
        d["board_info"]["bus_id"]: int(d["smbus_telem"]["ETH_LIVE_STATUS"], 16)
        for d in json.loads(snap.stdout)["device_info"]
    }
    assert eth["0000:ca:00.0"] >> 6 & 1 and not eth["0000:ca:00.0"] >> (16 + 6) & 1  # ch6: down


@pytest.mark.parametrize("plant", ["link", "others-writable", "others-file"])
def test_a_cable_state_another_user_could_change_is_refused(tmp_path: Path, plant: str) -> None:
    h0, _h1 = _hosts(tmp_path)
    shared = tmp_path / f"{SYSTEM}.cables"
    if plant == "link":
        shared.rename(tmp_path / "elsewhere")
        shared.symlink_to(tmp_path / "elsewhere")
    elif plant == "others-writable":
        shared.chmod(0o777)
    else:
        os.chown(shared / "cables.json", 65534, 65534)
    fresh = core.SimRoot(h0.root)
    with pytest.raises(core.SimError) as err:
        fresh.reset(_pci(fresh))
    assert "refusing" in str(err.value) or "another user's" in str(err.value), err.value


# --------------------------------------------------------------------------- over emulated hosts

WHY = can_emulate()


@pytest.mark.skipif(WHY is not None or shutil.which("mpirun") is None,
                    reason=WHY or "needs mpirun (apt-get install openmpi-bin)")  # fmt: skip
def test_check_over_hosts_names_a_cable_down_by_both_ends_and_the_reset_of_both(
    tmp_path: Path,
) -> None:
    """Host 1 alone resets its chips: every cable is down, from both hosts. ls/check --hosts
    name each cable by both ends; check says to reset both hosts together, and that command
    brings them back (after the training time)."""
    with scratch(tmp_path / "world") as world:
        world.chmod(0o777)
        hosts = make_hosts(world, SYSTEM)
        agent = launch_agent(world, hosts)
        env = {**os.environ, **mpi_env(agent)}

        def run(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run([sys.executable, "-m", "ttmesh", *args], capture_output=True,
                                  text=True, timeout=180, env=env)  # fmt: skip

        one = core.SimRoot(str(hosts[1].root))
        one.reset(_pci(one))
        names = "ttmh-0,ttmh-1"
        ls = run("ls", "--hosts", names, "--json")
        assert ls.returncode == 0, ls.stderr
        cables = json.loads(ls.stdout)["cables"]
        assert len(cables) == 8 and {c["state"] for c in cables} == {"down"}, cables
        assert {(c["a"]["host"], c["b"]["host"]) for c in cables} == {("ttmh-0", "ttmh-1")}
        text = run("ls", "--hosts", names)
        assert "== cables between the hosts: 0 of 8 up ==" in text.stdout, text.stdout
        assert "ttmh-0 0000:ca:00.0 ch6 <-> ttmh-1 0000:ca:00.0 ch6: down" in text.stdout
        check = run("check", "--hosts", names)
        assert check.returncode == 1, check.stdout + check.stderr
        line = check.stderr.strip().splitlines()[-1]
        fix = f"ttmesh reset --hosts {names}"  # (mpirun reaches them by its environment here)
        assert line.startswith("ttmesh: unhealthy: cable ttmh-0 0000:31:00.0 ch6 <-> ttmh-1 "
                               "0000:31:00.0 ch6 is down (and 7 more) (reset both hosts' chips "
                               f"at those ends together: {fix};"), line  # fmt: skip
        reset = run(*fix.split()[1:])
        assert reset.returncode == 0, reset.stdout + reset.stderr
        wait_for(lambda: run("check", "--hosts", names).returncode == 0, 60, "the cables")
