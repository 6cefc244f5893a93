"""The heartbeat at the firmware's rate (issue 22): Blackhole's firmware updates its telemetry,
heartbeat included, every 100 ms and reports that interval (UPDATE_TELEM_SPEED); Wormhole's rate
is not published. The simulator runs each at its firmware's rate, and the heartbeat watch reads
the interval where firmware reports it instead of assuming one."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import run_cli

from ttmesh.cli.hosts import open_host
from ttmesh.fabric import heartbeat
from ttmesh.fabric.devices import discover
from ttmesh.host import telemetry
from ttmesh.host.real import RealHost
from ttmesh.sim import core, faults


def rate(root: Path) -> float:
    return core.SimRoot(str(root)).read_state()["config"]["heartbeat_hz"]


@pytest.mark.parametrize("system, hz", [("quietbox2", 10.0), ("p150x4", 10.0), ("t3k", 10.0)])
def test_default_rate_per_arch(tmp_path: Path, system: str, hz: float) -> None:
    """sim create gives each architecture its firmware's rate: 10 Hz for Blackhole (100 ms, as
    its firmware says), and Wormhole's unpublished rate as a documented 10 Hz default."""
    root = tmp_path / system
    res = run_cli("sim", "create", "--system", system, "--root", str(root))
    assert res.code == 0, res.err
    assert rate(root) == hz


def test_sim_create_sets_the_rate(tmp_path: Path) -> None:
    root = tmp_path / "t3k"
    res = run_cli("sim", "create", "--system", "t3k", "--heartbeat-hz", "2", "--root", str(root))
    assert res.code == 0, res.err
    assert rate(root) == 2.0
    res = run_cli("sim", "create", "--system", "t3k", "--heartbeat-hz", "0", "--root", str(root))
    assert res.code == 2 and res.err.count("\n") == 1 and "--heartbeat-hz 0" in res.err


def test_blackhole_reports_its_update_interval(tmp_path: Path) -> None:
    """The simulated firmware's telemetry carries the interval as Blackhole's does (tt-smi's
    UPDATE_TELEM_SPEED, in ms); Wormhole's has no such tag."""
    for system, want in (("quietbox2", "0x64"), ("t3k", None)):
        root = tmp_path / system
        assert run_cli("sim", "create", "--system", system, "--root", str(root)).code == 0
        out = subprocess.run(
            [str(root / "bin" / "tt-smi"), "-s"], capture_output=True, text=True, check=True
        ).stdout
        devices = json.loads(out)["device_info"]
        assert {d["smbus_telem"].get("UPDATE_TELEM_SPEED") for d in devices} == {want}


def test_the_watch_reads_the_reported_interval(make_sim: Callable[..., Path]) -> None:
    """At 0.5 Hz the next tick is 2 s after the rate is set: a watch that assumed its 1 s would
    call every live chip frozen; one that reads the firmware's 2000 ms waits for it."""
    root = make_sim("quietbox2")
    host = open_host(root)
    faults.set_config(host, 0.5, None)  # every counter restarts now: the next tick is in 2 s
    watch = heartbeat.Watch(discover(host))
    assert watch.timeout == pytest.approx(4.0)
    assert set(watch.wait().values()) == {heartbeat.ALIVE}


def test_the_watch_waits_two_ticks_at_10hz(make_sim: Callable[..., Path]) -> None:
    """At Blackhole's 10 Hz the watch gives a chip two updates (200 ms) to move; with no interval
    reported (Wormhole) it keeps the assumed second."""
    assert heartbeat.Watch(discover(open_host(make_sim("quietbox2")))).timeout == pytest.approx(0.2)
    assert heartbeat.Watch(discover(open_host(make_sim("t3k")))).timeout == pytest.approx(1.0)


def test_a_stopped_heartbeat_is_detected_at_10hz(make_sim: Callable[..., Path]) -> None:
    root = make_sim("quietbox2")
    assert rate(root) == 10.0
    res = run_cli("sim", "fault", "--root", str(root), "chip-dead", "0000:05:00.0")
    assert res.code == 0, res.err
    res = run_cli("check", "--root", str(root), "--json")
    beats = {c["bdf"]: c["heartbeat"] for c in json.loads(res.out)["chips"]}
    assert beats == {
        "0000:01:00.0": "alive",
        "0000:03:00.0": "alive",
        "0000:05:00.0": "frozen",
        "0000:07:00.0": "alive",
    }


def test_real_hosts_read_the_interval_through_tt_umd(monkeypatch: pytest.MonkeyPatch) -> None:
    """On this machine the interval comes from each PCI chip's ARC telemetry (tt-umd), the same
    question the simulator answers; a chip without the tag, or a remote one, says nothing."""
    tags = SimpleNamespace(UPDATE_TELEM_SPEED=5)

    class Reader:
        def __init__(self, dev: int) -> None:
            self.dev = dev

        def is_entry_available(self, tag: int) -> bool:
            return tag == 5 and self.dev == 0  # device 1: Wormhole firmware, no such tag

        def read_entry(self, tag: int) -> int:
            return 100

    class Device:
        @staticmethod
        def create(dev: int) -> Device:
            d = Device()
            d.dev = dev
            return d

        def init_tt_device(self) -> None:
            pass

        def get_arc_telemetry_reader(self) -> Reader:
            return Reader(self.dev)

    fake = SimpleNamespace(TelemetryTag=tags, TTDevice=Device)
    monkeypatch.setattr(telemetry, "_umd", lambda: fake)
    got = RealHost("/").heartbeat_intervals([("a", 0), ("b", 1), ("c", None)])
    assert got == {"a": 0.1, "b": None, "c": None}


def test_a_state_at_0hz_is_no_traceback(make_sim: Callable[..., Path]) -> None:
    """A hand-edited state whose rate is 0 (the state's check allows it: no heartbeat at all)
    reports no interval, so the watch assumes its second and calls every chip frozen."""
    root = make_sim("quietbox2")
    sim = core.SimRoot(str(root))
    with sim.change() as state:
        state["config"]["heartbeat_hz"] = 0
    res = run_cli("check", "--root", str(root), "--json")
    assert res.code == 1 and "Traceback" not in res.err, res.err
    assert {c["heartbeat"] for c in json.loads(res.out)["chips"]} == {"frozen"}
