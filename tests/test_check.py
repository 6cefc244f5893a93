"""``ttmesh check``: health of simulated hosts through the real entry point, faults included.

Each fault must turn the exit code to 1 and name the chip or link with a fix line; a fabric left
down by a killed job is found, and ``ttmesh reset`` brings the host back to exit 0. The topology
record of real hosts (known_good) and ``preflight`` (what ``launch`` runs) are exercised
in-process on inventories made to look like a real host's.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import until as _until

from ttmesh.cli.hosts import open_host as Host
from ttmesh.fabric import health, known_good
from ttmesh.fabric.devices import discover
from ttmesh.sim import core
from ttmesh.sim.backend import SimHost

# QuietBox 2: two p300 boards (01+03, 05+07) cabled as a ring: 01-03, 05-07, 03-07, 01-05.
C01, C03, C05, C07 = "0000:01:00.0", "0000:03:00.0", "0000:05:00.0", "0000:07:00.0"
QB2 = [C01, C03, C05, C07]
WORKER_TAG = "ttmesh-test-worker"

CHECK_KEYS = [
    "schema",
    "healthy",
    "chips",
    "links",
    "problems",
    "notes",
    "system",
    "umd_locks",
    "shm",
    "cables",
]
CHIP_KEYS = [
    "asic_id",
    "bdf",
    "dev_index",
    "board_type",
    "present",
    "driver_node",
    "heartbeat",
    "holders",
    "lease",
    "healthy",
]

# A job that opens the fabric, then waits (as in test_sim_dynamics): SIGKILL leaves it down.
CHILD = """
import os, sys
from ttmesh.sim.core import SimRoot
_tag, root, *asics = sys.argv[1:]
sim = SimRoot(root)
sim.add_holder(asics, os.getpid())
sim.mark_fabric(asics, os.getpid())
print("ready", flush=True)
sys.stdin.readline()
"""


# --------------------------------------------------------------------------- helpers

until = functools.partial(_until, timeout=5.0)


@pytest.fixture(autouse=True)
def _state_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Known-good records go to a per-test state dir (never the user's)."""
    state = tmp_path / "state"
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    monkeypatch.delenv("TTMESH_TOPOLOGY_DIR", raising=False)
    return state


def asic(root: Path, bdf: str) -> str:
    return core.asic_hex(core.SimRoot(str(root)).chip_by_bdf(bdf)["unique_id"])


@pytest.fixture(autouse=True)
def _no_stale_segments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """check counts the machine's stale Open MPI segments (a note): other tests' ttnn runs leave
    them in /dev/shm, so these tests look at an empty backing directory of their own."""
    shm = tmp_path / "mpi-shm"
    shm.mkdir()
    monkeypatch.setenv("OMPI_MCA_btl_sm_backing_directory", str(shm))


def check(cli: Callable, root: Path, *args: str) -> tuple[int, dict, str]:
    res = cli("check", "--json", "--root", str(root), *args)
    assert res.code in (0, 1), res.err
    return res.code, json.loads(res.out), res.err


def errors(doc: dict) -> list[dict]:
    return [p for p in doc["problems"] if p["severity"] == "error"]


def fault(cli: Callable, root: Path, *args: str) -> str:
    res = cli("sim", "fault", "--root", str(root), *args)
    assert res.code == 0, res.err
    return res.out


def smi(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(root / "bin" / "tt-smi"), *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )


def reset_fix(root: Path) -> str:
    return f"ttmesh reset --root {root.resolve()} --chips {','.join(QB2)}"


# --------------------------------------------------------------------------- healthy


def test_a_healthy_qb2_checks_clean_in_json_and_text(
    qb2: Path, cli: Callable, _state_home: Path
) -> None:
    code, doc, err = check(cli, qb2)
    assert code == 0, err
    assert list(doc) == CHECK_KEYS
    assert doc["schema"] == "ttmesh.check/1" and doc["healthy"] is True
    assert doc["problems"] == []
    assert [c["bdf"] for c in doc["chips"]] == QB2
    for c in doc["chips"]:
        assert list(c) == CHIP_KEYS
        assert (c["present"], c["driver_node"], c["heartbeat"], c["healthy"]) == (
            True,
            True,
            "alive",
            True,
        )
        assert c["holders"] == [] and c["lease"] is None
        assert re.fullmatch(r"[0-9a-f]{16}", c["asic_id"]) and c["board_type"] == "p300a"
    assert len(doc["links"]) == 8
    for lk in doc["links"]:
        assert list(lk) == ["a", "b", "state"] and lk["state"] == "up"
        assert list(lk["a"]) == ["asic_id", "chan"]
    human = cli("check", "--root", str(qb2))
    assert human.code == 0
    assert "Ethernet links: 8 up" in human.out and human.out.rstrip().endswith("healthy")
    assert human.err.splitlines() == [f"simulated host: {qb2.resolve()}"]
    assert not _state_home.exists()  # a simulated host records no known-good topology


# --------------------------------------------------------------------------- faults


def test_world_openable_device_nodes_are_noted(qb2: Path, cli: Callable, runtime: Path) -> None:
    """tt-kmd's udev rule makes /dev/tenstorrent/* mode 0666 (the simulator models it): any
    user may open, and so hold, any chip. check says so, as a note (still healthy, also with
    --strict); nodes closed to others get no note."""
    # The runtime directory an earlier launch made: check remembers what it said there and
    # never makes it (the machine's own depended on which tests had run first in the worker).
    (runtime / "ttmesh").mkdir(mode=0o700)
    nodes = sorted((qb2 / "dev" / "tenstorrent").glob("[0-9]*"))
    assert nodes and all(n.stat().st_mode & 0o777 == 0o666 for n in nodes)
    code, doc, _err = check(cli, qb2)
    assert code == 0 and len(doc["notes"]) == 1, doc["notes"]
    assert "world-openable (mode 0666" in doc["notes"][0]
    assert "leases keep ttmesh jobs apart, not other programs" in doc["notes"][0]
    first = cli("check", "--root", str(qb2), "--strict")
    assert first.code == 0 and "note: the chips' device nodes" in first.out
    # A note about the host is said once while the host stays as it is (issue 37): not on
    # every check; --notes says every note; --json always has them.
    again = cli("check", "--root", str(qb2))
    assert again.code == 0 and "device nodes" not in again.out
    assert "note: the chips' device nodes" in cli("check", "--root", str(qb2), "--notes").out
    assert len(check(cli, qb2)[1]["notes"]) == 1
    for n in nodes:
        n.chmod(0o660)
    assert check(cli, qb2)[1]["notes"] == []
    for n in nodes:  # the host changed back: said again
        n.chmod(0o666)
    assert "note: the chips' device nodes" in cli("check", "--root", str(qb2)).out


def test_down_links_are_an_error_whose_fix_is_a_reset(qb2: Path, cli: Callable) -> None:
    fault(cli, qb2, "link-down", C01, C03)
    code, doc, err = check(cli, qb2)
    assert code == 1 and doc["healthy"] is False
    (problem,) = errors(doc)
    assert problem["what"].startswith(f"2 of 2 links between {C01} and {C03} are down")
    assert problem["fix"] == reset_fix(qb2)
    a, b = asic(qb2, C01), asic(qb2, C03)
    down = [lk for lk in doc["links"] if lk["state"] == "down"]
    assert len(down) == 2 and all({lk["a"]["asic_id"], lk["b"]["asic_id"]} == {a, b} for lk in down)
    assert all(c["healthy"] for c in doc["chips"])  # the chips themselves are fine
    last = err.splitlines()[-1]
    assert last.startswith("ttmesh: unhealthy: 1 error") and C03 in last
    human = cli("check", "--root", str(qb2))
    assert human.code == 1
    lines = human.out.splitlines()
    assert "Ethernet links: 2 down, 6 up" in lines and "UNHEALTHY: 1 error, 0 warnings" in lines
    assert lines[-2].startswith(f"error: 2 of 2 links between {C01} and {C03} are down")
    assert lines[-1] == f"  fix: {reset_fix(qb2)}"


def test_problems_with_one_fix_say_it_once(qb2: Path, cli: Callable) -> None:
    """Four problems the same reset fixes: each problem, then its fix once (issue 37)."""
    fault(cli, qb2, "link-down", C01, C03)
    fault(cli, qb2, "link-down", C05, C07)
    human = cli("check", "--root", str(qb2))
    assert human.code == 1
    lines = human.out.splitlines()
    assert lines.count(f"  fix: {reset_fix(qb2)}") == 1, human.out
    at = lines.index(f"  fix: {reset_fix(qb2)}")
    assert lines[at - 2].startswith(f"error: 2 of 2 links between {C01} and {C03} are down")
    assert lines[at - 1].startswith(f"error: 2 of 2 links between {C05} and {C07} are down")
    assert len(errors(check(cli, qb2)[1])) == 2  # --json keeps each problem's own fix


def test_a_frozen_heartbeat_and_its_down_links_are_errors(qb2: Path, cli: Callable) -> None:
    fault(cli, qb2, "chip-dead", C05)
    code, doc, _ = check(cli, qb2)
    assert code == 1
    chips = {c["bdf"]: c for c in doc["chips"]}
    assert chips[C05]["heartbeat"] == "frozen" and chips[C05]["healthy"] is False
    assert all(chips[b]["healthy"] for b in (C01, C03, C07))
    whats = [p["what"] for p in errors(doc)]
    assert f"{C05}: heartbeat frozen (its firmware is not running)" in whats
    # its links to 01 and 07 are down too
    assert any(w.startswith(f"2 of 2 links between {C01} and {C05} are down") for w in whats)
    assert any(w.startswith(f"2 of 2 links between {C05} and {C07} are down") for w in whats)
    assert {p["fix"] for p in errors(doc)} == {reset_fix(qb2)}


def test_check_names_the_pid_holding_a_chip_and_how_to_kill_it(
    qb2: Path, cli: Callable, hold_pids: list[int]
) -> None:
    pid = int(re.search(r"pid (\d+)", fault(cli, qb2, "hold", C07)).group(1))
    hold_pids.append(pid)
    code, doc, _ = check(cli, qb2)
    assert code == 1
    (problem,) = errors(doc)
    assert problem["what"].startswith(f"{C07} is held by pid {pid} (")
    assert "ttmesh-sim-hold" in problem["what"] and "\n" not in problem["what"]
    assert re.fullmatch(rf"kill {pid} \(\S+: .*ttmesh-sim-hold {C07}\)", problem["fix"])
    chips = {c["bdf"]: c for c in doc["chips"]}
    assert [h["pid"] for h in chips[C07]["holders"]] == [pid]
    assert chips[C07]["holders"][0]["job"] is None
    assert [b for b, c in chips.items() if not c["healthy"]] == [C07]


def test_permanently_dead_chip_gone_after_reset(qb2: Path, cli: Callable) -> None:
    gone = asic(qb2, C05)
    fault(cli, qb2, "chip-dead", C05, "--permanent")
    assert smi(qb2, "-r", ",".join(QB2)).returncode == 0
    code, doc, _ = check(cli, qb2)
    assert code == 1
    chips = {c["asic_id"]: c for c in doc["chips"]}
    assert chips[gone]["present"] is False and chips[gone]["bdf"] == C05
    assert chips[gone]["healthy"] is False
    whats = {p["what"]: p["fix"] for p in errors(doc)}
    missing = f"chip {C05} ({gone}) is in the topology but the host lost it"
    assert missing in whats and whats[missing].startswith("power-cycle the host")
    assert any(f"between {C01} and {C05} ({gone}) are down" in w for w in whats)
    # a lost chip can still be named by its PCI address
    code, doc, _ = check(cli, qb2, "--chips", C05)
    assert code == 1 and [c["asic_id"] for c in doc["chips"]] == [gone]
    code, doc, _ = check(cli, qb2, "--chips", C03)  # 03 is not linked to 05: healthy
    assert code == 0 and [c["bdf"] for c in doc["chips"]] == [C03]


def test_fabric_left_down_by_a_killed_job_then_reset(qb2: Path, cli: Callable) -> None:
    a, b = asic(qb2, C01), asic(qb2, C03)
    job = subprocess.Popen(
        [sys.executable, "-c", CHILD, WORKER_TAG, str(qb2), a, b],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert job.stdout.readline() == "ready\n"
        code, doc, _ = check(cli, qb2)  # while it runs: a holder outside any ttmesh job
        assert code == 1 and {p["what"].split(" is held")[0] for p in errors(doc)} == {C01, C03}
        job.send_signal(signal.SIGKILL)
        assert job.wait(timeout=10) == -signal.SIGKILL
    finally:
        if job.poll() is None:
            job.kill()
            job.wait(timeout=10)
    code, doc, _ = check(cli, qb2)
    assert code == 1
    (problem,) = errors(doc)
    assert problem["what"].startswith(f"2 of 2 links between {C01} and {C03} are down")
    assert problem["fix"] == reset_fix(qb2)
    res = cli("reset", "--root", str(qb2), "--chips", C01)
    assert res.code == 0, res.err
    code, doc, err = check(cli, qb2)
    assert code == 0, err
    assert {lk["state"] for lk in doc["links"]} == {"up"}


# --------------------------------------------------------------------------- selection, input


def test_chips_limits_the_check_to_those_chips_and_their_links(qb2: Path, cli: Callable) -> None:
    fault(cli, qb2, "link-down", C05, C07)
    code, doc, _ = check(cli, qb2, "--chips", f"{C01},{C03.upper()}")
    assert code == 0  # their links are up; 05-07 is not theirs
    assert [c["bdf"] for c in doc["chips"]] == [C01, C03]
    assert len(doc["links"]) == 6  # 01-03 x2, 01-05 x2, 03-07 x2
    code, doc, _ = check(cli, qb2, "--chips", C07)
    assert code == 1 and errors(doc)[0]["what"].startswith(f"2 of 2 links between {C05} and {C07}")


@pytest.mark.parametrize(
    ("chips", "message"),
    [
        ("0000:99:00.0", r"--chips 0000:99:00\.0: no such chip on this host \(chips here: 0000:01"),
        ("0000:1:00.0", r"--chips '0000:1:00\.0': not a PCI address"),
        (",", r"--chips ',': no chip named"),
    ],
)
def test_bad_chips_are_refused_in_one_line_changing_nothing(
    qb2: Path, cli: Callable, chips: str, message: str
) -> None:
    before = (qb2 / core.STATE_FILE).read_bytes()
    res = cli("check", "--root", str(qb2), "--chips", chips)
    assert (res.code, res.out) == (2, "")
    lines = [ln for ln in res.err.splitlines() if not ln.startswith("simulated host: ")]
    assert len(lines) == 1 and re.match(r"ttmesh: " + message, lines[0]), res.err
    assert (qb2 / core.STATE_FILE).read_bytes() == before


def test_check_help_teaches(cli: Callable) -> None:
    res = cli("check", "--help")
    assert res.code == 0
    assert "ttmesh check --sim quietbox2" in res.out and "--strict" in res.out


# --------------------------------------------------------------------------- in-process


class BlindHost(SimHost):
    """A host whose firmware cannot report link state (as Blackhole before 19.9 does)."""

    def eth_live_status(self, asics: list[str]) -> dict[str, int | None]:
        return dict.fromkeys(asics)


class SilentHost(SimHost):
    """A host whose chips report no link up at all (0), with the firmware bundle ``fw``; each
    firmware read is counted."""

    fw = "19.10.0.0"
    reads = 0

    def eth_live_status(self, asics: list[str]) -> dict[str, int | None]:
        return dict.fromkeys(asics, 0)

    def attr(self, dev: int, name: str) -> str | None:
        if name == "tt_fw_bundle_ver":
            SilentHost.reads += 1
            return self.fw
        return super().attr(dev, name)


def test_no_link_reported_is_down_unless_the_firmware_cannot_report_links(qb2: Path) -> None:
    """A chip reporting no link up is down on firmware that reports links (19.9 and later) and
    unknown on older firmware; the firmware is read only then, once a chip."""
    from ttmesh.fabric import links

    inv = discover(SilentHost(qb2))
    chips = {s.a for s in inv.links} | {s.b for s in inv.links}
    SilentHost.reads = 0
    assert {o.state for o in links.observe(inv)} == {"down"}
    assert SilentHost.reads == len(chips)
    SilentHost.fw = "19.8.0.0"
    assert {o.state for o in links.observe(inv)} == {"unknown"}

    class Reporting(SilentHost):  # links reported as they are: no firmware read
        def eth_live_status(self, asics: list[str]) -> dict[str, int | None]:
            return SimHost.eth_live_status(self, asics)

    inv = discover(Reporting(qb2))
    SilentHost.reads = 0
    assert {o.state for o in links.observe(inv)} == {"up"} and SilentHost.reads == 0


def test_unknown_links_are_warnings_unless_strict(qb2: Path) -> None:
    inv = discover(BlindHost(qb2))
    report = health.check(inv)
    assert report.healthy
    assert {ls.state for ls in report.links} == {"unknown"}
    kinds = {p.kind for p in report.problems}
    assert kinds == {"link-unknown"} and {p.severity for p in report.problems} == {"warning"}
    strict = health.check(inv, strict=True)
    assert not strict.healthy and {p.severity for p in strict.problems} == {"error"}


def _as_real(inv, links=None, chips=None):
    """The inventory as tt-umd's discovery on a real host would give it."""
    return dataclasses.replace(
        inv,
        topology="tt_umd",
        links=inv.links if links is None else links,
        chips=inv.chips if chips is None else chips,
        missing=[],
    )


def test_the_known_good_topology_finds_links_and_chips_discovery_lost(
    qb2: Path, cli: Callable, tmp_path: Path
) -> None:
    store = tmp_path / "topology"
    inv = discover(Host(qb2))
    assert health.check(_as_real(inv), known_good_dir=False).recorded is None
    first = health.check(_as_real(inv), known_good_dir=store)  # a new host: recorded
    assert first.healthy and first.recorded is not None
    assert first.recorded == store / f"{known_good.host_key(c.asic_id for c in inv.chips)}.json"
    recorded = json.loads(first.recorded.read_text())
    assert recorded["schema"] == "ttmesh.topology/1" and len(recorded["links"]) == 8

    # A crash leaves 01-03 down, and discovery no longer sees those links at all.
    fault(cli, qb2, "link-down", C01, C03)
    a, b = asic(qb2, C01), asic(qb2, C03)
    seen = [lk for lk in inv.links if {lk.a, lk.b} != {a, b}]
    blind = health.check(_as_real(inv, links=seen), known_good_dir=False)
    assert blind.healthy  # without the record the lost links are silently absent ...
    report = health.check(_as_real(inv, links=seen), known_good_dir=store)
    assert not report.healthy and report.recorded is None  # ... with it they are down
    (problem,) = report.errors
    assert problem.kind == "link-down" and problem.what.startswith(
        f"2 of 2 links between {C01} and {C03} are down"
    )
    assert problem.fix == reset_fix(qb2)

    # A chip the host lost: found through the record (its set of chips hashes differently).
    lost = asic(qb2, C05)
    fewer = [c for c in inv.chips if c.asic_id != lost]
    report = health.check(_as_real(inv, chips=fewer), known_good_dir=store)
    whats = [p.what for p in report.errors]
    assert f"chip {C05} ({lost}) is in the topology but the host lost it" in whats


def test_pair_with_fewer_links(qb2: Path, tmp_path: Path) -> None:
    inv = discover(Host(qb2))
    a, b = asic(qb2, C01), asic(qb2, C03)
    one = next(lk for lk in inv.links if {lk.a, lk.b} == {a, b})
    short = _as_real(inv, links=[lk for lk in inv.links if lk != one])
    report = health.check(short, known_good_dir=tmp_path / "kg")
    assert report.healthy and report.recorded is None  # not recorded while a pair is short
    (problem,) = report.problems
    assert (problem.severity, problem.kind) == ("warning", "link-count")
    assert problem.what == f"{C01} and {C03} have 1 link between them; most chip pairs here have 2"
    assert problem.fix.startswith("check the cable between them, then ttmesh reset")
    strict = health.check(short, strict=True, known_good_dir=tmp_path / "kg")
    assert not strict.healthy and strict.errors[0].kind == "link-count"
    # the simulated host's own descriptor is complete: no such warning there
    assert health.check(inv).problems == []


def test_preflight_reports_only_the_job_chips_and_spares_its_own_holders(
    qb2: Path, cli: Callable, hold_pids: list[int]
) -> None:
    host = Host(qb2)
    inv = discover(host)
    every = [c.asic_id for c in inv.chips]
    # (How long pre-flight takes is scripts/bench.py's, beside torchrun: not a timed test.)
    assert health.preflight(inv, every) == []

    fault(cli, qb2, "chip-dead", C05)
    a01, a03, a05 = asic(qb2, C01), asic(qb2, C03), asic(qb2, C05)
    assert health.preflight(inv, [a01, a03]) == []  # 05 is not polled, 01-03 links are up
    problems = health.preflight(inv, [a01, a05])
    assert {p.kind for p in problems} == {"heartbeat", "link-down"}
    assert all(p.severity == "error" and p.fix for p in problems)

    pid = int(re.search(r"pid (\d+)", fault(cli, qb2, "hold", C03)).group(1))
    hold_pids.append(pid)
    (held,) = health.preflight(inv, [a01, a03])
    assert (held.kind, held.chips) == ("holder", (a03,)) and f"kill {pid} (" in held.fix
    assert health.preflight(inv, [a01, a03], allow_holders_pids=[pid]) == []

    from ttmesh.runtime import leases

    with leases.acquire(host, [a01], "mine", cmd="x"):  # this process's own lease: allowed
        assert health.preflight(inv, [a01]) == []
