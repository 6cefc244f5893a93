"""Fault injection on a simulated host: ``ttmesh sim fault / clear / show``.

Each fault must change what ``ttmesh ls --json`` and ``tt-smi -s`` report, and ``tt-smi -r``
must clear it unless ``reset-fails`` is armed. Bad input changes nothing: exit 2, one error line,
the state file byte for byte as it was.
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import until as _until

from ttmesh.sim import core

# QuietBox 2: two p300 boards (01+03, 05+07) cabled as a ring: 01-03, 05-07, 03-07, 01-05.
C01, C03, C05, C07 = "0000:01:00.0", "0000:03:00.0", "0000:05:00.0", "0000:07:00.0"
BDFS = {C01, C03, C05, C07}


# --------------------------------------------------------------------------- helpers

until = functools.partial(_until, timeout=5.0)


class Sim:
    """One simulated root driven through the real command lines."""

    def __init__(self, root: Path, cli: Callable) -> None:
        self.root = root
        self.cli = cli

    def fault(self, *args: str):
        res = self.cli("sim", "fault", "--root", str(self.root), *args)
        assert res.code == 0, res.err
        return res

    def clear(self) -> str:
        res = self.cli("sim", "clear", "--root", str(self.root))
        assert res.code == 0, res.err
        return res.out

    def show(self) -> dict:
        res = self.cli("sim", "show", "--json", "--root", str(self.root))
        assert res.code == 0, res.err
        return json.loads(res.out)

    def ls(self) -> dict:
        res = self.cli("ls", "--json", "--root", str(self.root))
        assert res.code == 0, res.err
        return json.loads(res.out)

    def smi(self, *args: str) -> subprocess.CompletedProcess:
        env = {
            **os.environ,
            "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
        }
        return subprocess.run(
            [str(self.root / "bin" / "tt-smi"), *args],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )

    def reset(self, *targets: str) -> subprocess.CompletedProcess:
        res = self.smi("-r", *targets)
        assert res.returncode == 0, res.stdout + res.stderr
        return res

    def snapshot(self) -> dict:
        res = self.smi("-s")
        assert res.returncode == 0, res.stdout + res.stderr
        return json.loads(res.stdout)

    # derived views

    def asic(self, bdf: str) -> str:
        sim = core.SimRoot(str(self.root))
        return core.asic_hex(sim.chip_by_bdf(bdf)["unique_id"])

    def link_states(self, data: dict | None = None) -> dict[tuple, str]:
        """{(asic, chan, asic, chan) sorted by end: state} from ``ttmesh ls --json``."""
        data = self.ls() if data is None else data
        out = {}
        for lk in data["links"]:
            ends = sorted(
                [(lk["a"]["asic_id"], lk["a"]["chan"]), (lk["b"]["asic_id"], lk["b"]["chan"])]
            )
            out[(*ends[0], *ends[1])] = lk["state"]
        return out

    def between(self, bdf_a: str, bdf_b: str) -> set[tuple]:
        a, b = self.asic(bdf_a), self.asic(bdf_b)
        return {
            tuple(x for end in sorted([(la, ca), (lb, cb)]) for x in end)
            for la, ca, lb, cb in core.SimRoot(str(self.root)).links()
            if {la, lb} == {a, b}
        }

    def eth_up(self, doc: dict | None = None) -> dict[str, set[int]]:
        """Link-up channels per PCI address from ETH_LIVE_STATUS (bits 16+chan)."""
        doc = self.snapshot() if doc is None else doc
        out = {}
        for dev in doc["device_info"]:
            value = int(dev["smbus_telem"]["ETH_LIVE_STATUS"], 16)
            out[dev["board_info"]["bus_id"]] = {c for c in range(16) if value >> (16 + c) & 1}
        return out

    def chan_of(self, link: tuple, bdf: str) -> int:
        a = self.asic(bdf)
        return link[1] if link[0] == a else link[3]


@pytest.fixture
def sim(qb2: Path, cli: Callable) -> Sim:
    return Sim(qb2, cli)


def all_up(sim: Sim, data: dict | None = None) -> bool:
    return set(sim.link_states(data).values()) == {"up"}


def state_bytes(root: Path) -> bytes:
    return (root / core.STATE_FILE).read_bytes()


# --------------------------------------------------------------------------- link-down


def test_link_down_all_channels(sim: Sim) -> None:
    pair = sim.between(C01, C03)
    assert len(pair) == 2
    sim.fault("link-down", C01, C03)
    links = sim.link_states()
    assert {k for k, v in links.items() if v == "down"} == pair
    eth = sim.eth_up()
    assert not eth[C01] & {sim.chan_of(lk, C01) for lk in pair}
    assert not eth[C03] & {sim.chan_of(lk, C03) for lk in pair}
    assert eth[C05] and eth[C07]
    view = sim.show()
    assert {
        (d["a"]["asic_id"], d["a"]["chan"], d["b"]["asic_id"], d["b"]["chan"])
        for d in view["links_down"]
    } == pair
    assert {d["why"] for d in view["links_down"]} == {"fault"}
    sim.reset()
    assert all_up(sim)
    assert sim.show()["links_down"] == []


def test_link_down_one_channel(sim: Sim) -> None:
    pair = sim.between(C01, C03)
    target = next(lk for lk in pair if sim.chan_of(lk, C01) == 8)
    other = (pair - {target}).pop()
    sim.fault("link-down", C01, C03, "--channel", "8")
    links = sim.link_states()
    assert links[target] == "down"
    assert {k for k, v in links.items() if v == "down"} == {target}
    eth = sim.eth_up()
    assert 8 not in eth[C01] and sim.chan_of(other, C01) in eth[C01]
    assert sim.chan_of(target, C03) not in eth[C03] and sim.chan_of(other, C03) in eth[C03]
    assert len(sim.show()["links_down"]) == 1
    sim.reset()
    assert all_up(sim)


# --------------------------------------------------------------------------- chip-dead


def test_chip_dead_then_revived_by_reset(sim: Sim) -> None:
    sim.fault("chip-dead", C05)
    data = sim.ls()
    beats = {c["bdf"]: c["heartbeat"] for c in data["chips"]}
    assert beats == {C01: "alive", C03: "alive", C05: "frozen", C07: "alive"}
    dead = sim.asic(C05)
    for link, st in sim.link_states(data).items():
        assert st == ("down" if dead in (link[0], link[2]) else "up"), link
    view = sim.show()
    chip = next(c for c in view["chips"] if c["bdf"] == C05)
    assert (chip["alive"], chip["present"]) == (False, True)
    assert view["faults"]["permanent"] == []
    doc = sim.snapshot()
    dev = next(d for d in doc["device_info"] if d["board_info"]["bus_id"] == C05)
    assert dev["smbus_telem"]["ETH_LIVE_STATUS"] == "0x0"
    assert dev["telemetry"]["aiclk"] == "   0"
    assert dev["telemetry"]["heartbeat"] == str(chip["heartbeat"] // 6)  # frozen counter
    sim.reset()
    data = sim.ls()
    assert {c["heartbeat"] for c in data["chips"]} == {"alive"}
    assert all_up(sim, data)


def test_chip_dead_permanent_is_gone_after_reset(sim: Sim) -> None:
    gone = sim.asic(C05)
    dev = next(c["dev_index"] for c in sim.ls()["chips"] if c["bdf"] == C05)
    sim.fault("chip-dead", C05, "--permanent")
    assert sim.show()["faults"]["permanent"] == [gone]
    assert (sim.root / f"dev/tenstorrent/{dev}").exists()  # still there until the reset
    sim.reset()
    assert not (sim.root / f"dev/tenstorrent/{dev}").exists()
    assert not any(gone in p.name for p in (sim.root / "dev/tenstorrent/by-id").iterdir())
    data = sim.ls()
    assert {c["bdf"] for c in data["chips"]} == BDFS - {C05}
    assert gone not in {c["asic_id"] for c in data["chips"]}
    assert data["missing"] == [gone]
    assert C05 not in {d["board_info"]["bus_id"] for d in sim.snapshot()["device_info"]}
    sim.reset()  # and it stays gone
    assert {c["bdf"] for c in sim.ls()["chips"]} == BDFS - {C05}
    sim.clear()
    data = sim.ls()
    assert {c["bdf"] for c in data["chips"]} == BDFS and all_up(sim, data)


# --------------------------------------------------------------------------- reset-fails


def test_reset_fails_until_cleared(sim: Sim) -> None:
    sim.fault("link-down", C05, C07)
    sim.fault("reset-fails")
    assert sim.show()["faults"]["reset_fails"] == {"times": None}
    before = sim.link_states()
    for _ in range(2):
        res = sim.reset()  # exits 0, says what the real one says
        assert res.stdout.startswith("Resetting all PCI devices: [0, 1, 2, 3]\n")
        assert sim.link_states() == before
    assert sim.show()["resets"] == 2
    sim.clear()
    assert all_up(sim)


def test_reset_fails_once(sim: Sim) -> None:
    sim.fault("chip-dead", C03)
    sim.fault("reset-fails", "--times", "1")
    assert sim.show()["faults"]["reset_fails"] == {"times": 1}
    sim.reset()
    view = sim.show()
    assert next(c for c in view["chips"] if c["bdf"] == C03)["alive"] is False
    assert view["faults"]["reset_fails"] is None  # spent
    sim.reset()
    assert all(c["alive"] for c in sim.show()["chips"])
    assert {c["heartbeat"] for c in sim.ls()["chips"]} == {"alive"}


# --------------------------------------------------------------------------- reset-renumbers


def test_reset_renumbers(sim: Sim) -> None:
    before = {c["bdf"]: (c["dev_index"], c["asic_id"]) for c in sim.ls()["chips"]}
    sim.fault("reset-renumbers")
    assert sim.show()["faults"]["reset_renumbers"] is True
    sim.reset()
    after = {c["bdf"]: (c["dev_index"], c["asic_id"]) for c in sim.ls()["chips"]}
    assert set(after) == set(before) == BDFS  # every PCI address is still there ...
    for bdf in BDFS:
        assert after[bdf][1] == before[bdf][1]  # ... with the same chip ...
        assert after[bdf][0] != before[bdf][0]  # ... under another /dev/tenstorrent number
    assert sorted(
        int(p.name) for p in (sim.root / "dev/tenstorrent").iterdir() if p.name.isdigit()
    ) == sorted(d for d, _ in after.values())
    by_bdf = {d["board_info"]["bus_id"] for d in sim.snapshot()["device_info"]}
    assert by_bdf == BDFS
    assert sim.show()["faults"]["reset_renumbers"] is False  # one reset only
    sim.reset()
    assert {c["bdf"]: c["dev_index"] for c in sim.ls()["chips"]} == {
        b: d for b, (d, _) in after.items()
    }


def test_reset_renumbers_one_chip(sim: Sim) -> None:
    before = {c["bdf"]: c["dev_index"] for c in sim.ls()["chips"]}
    sim.fault("reset-renumbers")
    sim.reset(C03)
    after = {c["bdf"]: c["dev_index"] for c in sim.ls()["chips"]}
    assert after[C03] != before[C03]
    assert after[C03] not in {before[b] for b in BDFS - {C03}}
    assert {b: after[b] for b in BDFS - {C03}} == {b: before[b] for b in BDFS - {C03}}


# --------------------------------------------------------------------------- reset-hangs


def test_reset_hangs(sim: Sim) -> None:
    seconds = 0.6
    sim.fault("reset-hangs", str(seconds))
    assert sim.show()["faults"]["reset_hangs"] == seconds
    sim.fault("chip-dead", C01)
    t0 = time.monotonic()
    sim.reset()
    took = time.monotonic() - t0
    assert took >= seconds
    assert all(c["alive"] for c in sim.show()["chips"])  # it hangs, then works


# --------------------------------------------------------------------------- hold


def test_hold_and_clear(sim: Sim, hold_pids: list[int]) -> None:
    res = sim.fault("hold", C07)
    pid = int(re.fullmatch(rf"hold: pid (\d+) holds {re.escape(C07)}\n", res.out).group(1))
    hold_pids.append(pid)
    chips = {c["bdf"]: c for c in sim.ls()["chips"]}
    assert [h["pid"] for h in chips[C07]["holders"]] == [pid]
    assert "ttmesh-sim-hold" in chips[C07]["holders"][0]["cmd"]
    assert all(chips[b]["holders"] == [] for b in BDFS - {C07})
    view = sim.show()
    assert next(c for c in view["chips"] if c["bdf"] == C07)["holders"] == [pid]
    dev = chips[C07]["dev_index"]
    assert [(p["pid"], p["device"]) for p in sim.snapshot()["processes"]] == [(pid, dev)]
    sim.reset()  # a reset does not stop a holder
    assert [h["pid"] for h in {c["bdf"]: c for c in sim.ls()["chips"]}[C07]["holders"]] == [pid]
    assert sim.clear() == "cleared (1 holder process stopped)\n"
    assert until(lambda: core.proc_start_time(pid) is None)  # killed (a zombie at most)
    assert all(c["holders"] == [] for c in sim.ls()["chips"])
    assert sim.snapshot()["processes"] == []


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["melt", C01], r"No such command 'melt'"),
        (["link-down", C01, C07], rf"chips {C01} and {C07} have no Ethernet link between them"),
        (
            ["link-down", C01, C03, "--channel", "5"],
            rf"chip {C01} has no link to {C03} on channel 5",
        ),
        (["chip-dead", "0000:99:00.0"], r"no chip 0000:99:00\.0 on this simulated host"),
        (["hold", "0000:99:00.0"], r"no chip 0000:99:00\.0 on this simulated host"),
        (["link-down", C01, "0000:99:00.0"], r"no chip 0000:99:00\.0 on this simulated host"),
        (["chip-dead", "0000:1:00.0"], r"malformed PCI address '0000:1:00\.0'"),
        (["reset-hangs", "--", "-1"], r"reset-hangs -1: cannot be negative"),
        (["reset-hangs", "-1"], r"-1"),
        (["reset-hangs", "inf"], r"inf"),
        (["reset-hangs", "nan"], r"nan"),
        (["reset-fails", "--times", "0"], r"--times 0: too small"),
        (["reset-fails", "--times", "-3"], r"--times -3: too small"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
def test_bad_input_changes_nothing(sim: Sim, args: list[str], message: str) -> None:
    before = state_bytes(sim.root)
    res = sim.cli("sim", "fault", "--root", str(sim.root), *args)
    assert res.code == 2
    assert res.out == ""
    lines = [ln for ln in res.err.splitlines() if ln != f"simulated host: {sim.root}"]
    assert len(lines) == 1, res.err
    assert lines[0].startswith("ttmesh: ")
    assert re.search(message, lines[0]), lines[0]
    assert state_bytes(sim.root) == before


@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
@pytest.mark.parametrize("option", ["--heartbeat-hz", "--reset-seconds"])
def test_bad_config_changes_nothing(sim: Sim, option: str, value: str) -> None:
    before = state_bytes(sim.root)
    res = sim.cli("sim", "config", "--root", str(sim.root), f"{option}={value}")
    assert res.code == 2
    lines = [ln for ln in res.err.splitlines() if ln != f"simulated host: {sim.root}"]
    assert len(lines) == 1 and lines[0].startswith(f"ttmesh: {option} "), res.err
    assert state_bytes(sim.root) == before


def test_a_root_without_the_sim_marker_is_refused_unchanged(sim: Sim) -> None:
    (sim.root / core.MARKER).unlink()
    before = state_bytes(sim.root)
    res = sim.cli("sim", "fault", "--root", str(sim.root), "chip-dead", C01)
    assert (res.code, res.out) == (2, "")
    assert res.err.splitlines() == [
        f"ttmesh: {sim.root} is not a simulated host (no .ttmesh-sim marker) "
        "(create one with: ttmesh sim create --system quietbox2 --root DIR)"
    ]
    assert state_bytes(sim.root) == before


# --------------------------------------------------------------------------- clear and show


def test_clear_removes_every_fault(sim: Sim, hold_pids: list[int]) -> None:
    sim.fault("link-down", C05, C07)
    sim.fault("chip-dead", C03, "--permanent")
    sim.fault("reset-fails", "--times", "2")
    sim.fault("reset-renumbers")
    sim.fault("reset-hangs", "5")
    sim.fault("no-hugepages")
    sim.fault("fw-mismatch", C05, "--version", "18.6.0.0")
    sim.fault("old-kmd")
    pid = int(re.search(r"pid (\d+)", sim.fault("hold", C01).out).group(1))
    hold_pids.append(pid)
    view = sim.show()
    assert view["faults"] == {
        "reset_fails": {"times": 2},
        "reset_renumbers": True,
        "reset_hangs": 5.0,
        "permanent": [sim.asic(C03)],
        "no_hugepages": True,
        "fw_mismatch": {sim.asic(C05): "18.6.0.0"},
        "old_kmd": "1.34.0",
    }
    assert {c["bdf"]: c["holders"] for c in view["chips"]}[C01] == [pid]
    assert sim.clear() == "cleared (1 holder process stopped)\n"
    view = sim.show()
    assert view["faults"] == {
        "reset_fails": None,
        "reset_renumbers": False,
        "reset_hangs": 0.0,
        "permanent": [],
        "no_hugepages": False,
        "fw_mismatch": {},
        "old_kmd": None,
    }
    assert (sim.root / "sys/module/tenstorrent/version").read_text() == "2.10.0\n"
    pages = "sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages"
    assert (sim.root / pages).read_text() == "16\n"
    assert view["links_down"] == []
    assert all(c["alive"] and c["present"] and c["holders"] == [] for c in view["chips"])
    t0 = time.monotonic()
    sim.reset()
    assert time.monotonic() - t0 < 5  # the hang is gone too


def test_a_reset_never_hides_the_other_chips_from_a_reader(
    make_sim: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The simulator rewrites its driver files by writing each directory beside its place and
    swapping it in: at every step of a reset's rewrite, a reader (another job's pre-flight or
    reset) lists every chip with its address, as on a real host, where the driver
    re-enumerates only the reset devices. (Two replicas resetting their own chips at once
    once saw no chip at all.)"""
    from ttmesh.cli.hosts import open_host
    from ttmesh.fabric.devices import discover
    from ttmesh.sim import core

    root = make_sim("quietbox2")
    host = open_host(root)
    every = {c.bdf for c in discover(host).chips}
    seen: list[set[str | None]] = []
    real = core._put_in_place

    def step(new: str, place: str) -> None:
        seen.append({c.bdf for c in discover(host).chips})
        real(new, place)
        seen.append({c.bdf for c in discover(host).chips})

    monkeypatch.setattr(core, "_put_in_place", step)
    first = next(c.asic_id for c in discover(host).chips if c.bdf == "0000:01:00.0")
    core.SimRoot(str(root)).reset([first])  # (the root's tt-smi runs the same code)
    assert len(seen) > 8 and all(s == every for s in seen), seen
    assert not list(root.rglob("*.new"))


def test_a_link_left_where_the_rewrite_is_staged_is_removed_not_followed(
    make_sim: Callable[..., Path], tmp_path: Path
) -> None:
    from ttmesh.sim import core

    root = make_sim("quietbox2")
    outside = tmp_path / "outside"
    outside.mkdir()
    for staged in ("sys/class/tenstorrent.new", "sys/devices/pci0000:00/0000:01:00.0/hwmon.new"):
        (root / staged).symlink_to(outside)
    sim = core.SimRoot(str(root))
    sim.reset(list(sim.read_state()["chips"])[:1])
    assert list(outside.iterdir()) == [] and not list(root.rglob("*.new"))
    assert len(list((root / "sys/class/tenstorrent").iterdir())) == 4
