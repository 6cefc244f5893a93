"""Recovery over hosts resets the two ends of a cable together (issue 24): the decision from
every host's check (pure), and each host's steps on simulated hosts read in this process."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import scratch

from ttmesh.recovery import afterjob, together
from ttmesh.recovery.afterjob import FAILED, HEALTHY, HostCheck


def _end(chip: str, name: str, chan: int, peer: str, peer_chan: int, state: str = "up") -> dict:
    return {"chip": chip, "name": name, "chan": chan, "peer": peer, "peer_chan": peer_chan,
            "state": state}  # fmt: skip


def _two_hosts(a_state: str = "up", b_state: str = "up", problem: str | None = None) -> dict:
    """Host A: chips a1, a2 on one board (a reset of either takes both); host B: b1, b2 apart.
    Cable 1: a1 chan 8 <-> b1 chan 0; cable 2: a2 chan 9 <-> b2 chan 1 (both ends up)."""
    a = HostCheck(
        FAILED if problem else HEALTHY, ["a1", "a2"], problem,
        [_end("a1", "0000:01:00.0", 8, "b1", 0, a_state), _end("a2", "0000:02:00.0", 9, "b2", 1)],
        {"a1": ["a1", "a2"], "a2": ["a1", "a2"]}, 180.0,
    )  # fmt: skip
    b = HostCheck(
        HEALTHY, ["b1", "b2"], None,
        [_end("b1", "0000:31:00.0", 0, "a1", 8, b_state), _end("b2", "0000:32:00.0", 1, "a2", 9)],
        {"b1": ["b1"], "b2": ["b2"]}, 180.0,
    )  # fmt: skip
    return {"hostA": a, "hostB": b}


def test_either_end_down_resets_both_and_what_the_reset_takes_brings_the_far_ends() -> None:
    """Only B reads cable 1 down: both its ends are reset; A's reset of a1 takes a2 (one
    board), whose cable 2 then goes down too: b2 is reset with it, though nothing was wrong."""
    d = together.decide(_two_hosts(b_state="down"))
    assert d.needed and d.resets == {"hostA": ["a1", "a2"], "hostB": ["b1", "b2"]}
    assert d.why == {"hostA": "its cables to hostB are reset at both ends",
                     "hostB": "1 cable end down"}  # fmt: skip
    assert [c.label() for c in d.together] == [
        "hostA 0000:01:00.0 ch8 <-> hostB 0000:31:00.0 ch0",
        "hostA 0000:02:00.0 ch9 <-> hostB 0000:32:00.0 ch1",
    ]
    assert together.pairs(d.together) == "2 between hostA and hostB"


def test_a_hosts_own_problem_takes_its_peers_ends_and_nothing_down_resets_nothing() -> None:
    assert not together.decide(_two_hosts()).needed
    d = together.decide(_two_hosts(problem="2 of 2 links between a1 and a2 are down"))
    assert d.resets == {"hostA": ["a1", "a2"], "hostB": ["b1", "b2"]}
    assert d.why["hostA"] == "2 of 2 links between a1 and a2 are down"
    assert together.decide(_two_hosts(), always=True).resets["hostB"] == ["b1", "b2"]


def test_a_cable_is_up_only_when_both_its_ends_say_so_and_one_down_is_named_by_both() -> None:
    after = {h: c.ends for h, c in _two_hosts().items()}
    assert together.verdict(after) == []
    after["hostA"] = [_end("a1", "0000:01:00.0", 8, "b1", 0, "down"), after["hostA"][1]]
    down = together.verdict(after)
    assert [c.label() for c in down] == ["hostA 0000:01:00.0 ch8 <-> hostB 0000:31:00.0 ch0"]
    line = together.bad_cable_line(down[0], 180.0)
    assert line == (
        "cable hostA 0000:01:00.0 ch8 <-> hostB 0000:31:00.0 ch0 is still down after both "
        "ends were reset together and 180 s of training: reseat or replace that cable, then "
        "ttmesh reset --hosts hostA,hostB"
    )
    # A host that did not report its ends: a cable down at the other end is named by the far
    # chip's unique id; one up there is left to that host's own line ("no answer").
    only_a = together.verdict({"hostA": after["hostA"]})
    assert [c.label() for c in only_a] == ["hostA 0000:01:00.0 ch8 <-> chip b1 ch0"]


# --------------------------------------------------------------------------- simulated hosts


@pytest.fixture
def t3ks(tmp_path: Path) -> Iterator[list]:
    """The two hosts of dual-t3k, simulated in this process, sharing their cables (both ends
    of a cable change together; trained 0.3 s after both ends were reset within 20 s)."""
    from ttmesh.cli.hosts import open_host
    from ttmesh.sim import system
    from ttmesh.sim.create import create

    model = system.load_any("dual-t3k")
    assert isinstance(model, system.ClusterModel)
    config = {"reset_seconds": 0.0, "cable_train_seconds": 0.3, "cable_window": 20.0}
    with scratch(tmp_path / "hosts") as base:
        hosts = []
        for i in range(2):
            create(model.host(i), base / f"h{i}", config=config, cables=base / "dual-t3k.cables")
            hosts.append(open_host(base / f"h{i}"))
        yield hosts


def _reset_at(hosts: list, every: list[str], chips: list[str], train_timeout: float) -> dict:
    """Each host's step 2 (``ttmesh _recover --reset``) at one agreed moment, run at once as
    mpirun runs them, each its own process; host -> its HostRecovery."""
    import subprocess
    import sys

    at = f"{time.time() + 0.6:.3f}"  # both started by then (late: a note, not a failure)
    procs = [subprocess.Popen(
        [sys.executable, "-m", "ttmesh", "_recover", "--root", str(h.root), "--chips",
         ",".join(every), "--reset", ",".join(chips) or ",", "--at", at, "--train-timeout",
         str(train_timeout)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    ) for h in hosts]  # fmt: skip
    out = {}
    for i, p in enumerate(procs):
        stdout, stderr = p.communicate(timeout=60)
        outcome = afterjob.parse(stdout)
        assert outcome is not None, stderr
        out[f"h{i}"] = outcome
    return out


def _together(t3ks: list, train_timeout: float = 5.0) -> tuple[dict, together.Decision, dict]:
    """Both hosts' checks, the decision, and each host's reset at one agreed moment."""
    every = _chips(t3ks[0]) + _chips(t3ks[1])
    checks = {f"h{i}": afterjob.check_host(h, every, peers=every) for i, h in enumerate(t3ks)}
    decision = together.decide(checks)
    chips = [a for h in ("h0", "h1") for a in decision.resets[h]]
    return checks, decision, _reset_at(t3ks, every, chips, train_timeout)


def test_one_host_reset_alone_leaves_the_cables_down_on_both_and_both_reset_together(
    t3ks,
) -> None:
    """Host 0 reset alone (its ends reset without host 1's): every cable reads down from both
    sides; the checks say which ends, both hosts reset together, and every cable trains."""
    from ttmesh.recovery import reset

    assert reset.recover(t3ks[0], None).recovered  # its own chips verify: the cables do not
    checks, decision, outcomes = _together(t3ks)
    for c in checks.values():
        assert [e["state"] for e in c.ends] == ["down"] * 8, c.ends
    assert decision.why == {"h0": "8 cable ends down", "h1": "8 cable ends down"}
    assert len(decision.together) == 8
    assert {o.state for o in outcomes.values()} == {afterjob.RECOVERED}
    assert together.verdict({h: o.cables for h, o in outcomes.items()}) == []


def test_a_bad_cable_stays_down_after_both_ends_are_reset_and_is_named_by_both(t3ks) -> None:
    from ttmesh.sim import faults

    a, ca, _b, _cb = t3ks[0].sim.remote_links()[0]
    faults.bad_cable(t3ks[0], a, ca)
    _checks, decision, outcomes = _together(t3ks, train_timeout=1.0)
    assert len(decision.together) == 8
    down = together.verdict({h: o.cables for h, o in outcomes.items()})
    assert len(down) == 1, down
    name0 = next(e["name"] for e in outcomes["h0"].cables if e["chip"] == a and e["chan"] == ca)
    assert down[0].a.label() == f"h0 {name0} ch{ca}" and down[0].b is not None
    assert down[0].b.host == "h1" and down[0].b.state == "down"
    assert together.bad_cable_line(down[0], 1.0).endswith(
        "reseat or replace that cable, then ttmesh reset --hosts h0,h1"
    )


def _chips(host) -> list[str]:
    from ttmesh.fabric.devices import discover

    return [c.asic_id for c in discover(host).chips]


def test_each_host_checks_resets_at_the_agreed_moment_and_reports_its_cable_ends(t3ks) -> None:
    """Host 0's end of a cable is down (a fault there): each host's check reports its eight
    cable ends; the decision resets both T3Ks; each resets at the agreed moment and reads its
    ends up after."""
    every = _chips(t3ks[0]) + _chips(t3ks[1])
    with t3ks[0].sim.change() as state:  # one end of the first cable reads down
        a, ca, b, cb = t3ks[0].sim.remote_links()[0]
        state["links_down"] = [t3ks[0].sim.link_key(a, ca, b, cb)]
    checks = {f"h{i}": afterjob.check_host(h, every, peers=every) for i, h in enumerate(t3ks)}
    assert [len(c.ends) for c in checks.values()] == [8, 8]
    assert [e["state"] for e in checks["h0"].ends].count("down") == 1
    assert checks["h0"].train_timeout == 180.0  # Wormhole's external links
    decision = together.decide(checks)
    # One chip's reset takes the whole T3K (its domain), so all eight cables: each host asks
    # for its four cabled chips (its reset takes the other four with them).
    assert [len(decision.resets[h]) for h in ("h0", "h1")] == [4, 4]
    assert checks["h0"].domains[decision.resets["h0"][0]] == checks["h0"].chips
    assert len(decision.together) == 8
    outcomes = _reset_at(t3ks, every, [a for h in ("h0", "h1") for a in decision.resets[h]], 5.0)
    assert {o.state for o in outcomes.values()} == {afterjob.RECOVERED}
    assert together.verdict({h: o.cables for h, o in outcomes.items()}) == []
