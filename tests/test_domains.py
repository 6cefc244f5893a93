"""Reset domains (issue 24): what one reset takes, where a reset may stop beside another live
job, the record of links left down, and the wait for training after ``tt-smi -r``.

Cheap: simulated hosts, another job's leases taken in this process (``leases.acquire``, a
real lease every other ttmesh verifies), resets through the real entry point, whose tt-smi
stand-in logs what it actually reset (``sim/state.json`` "resets").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from ttmesh.cli.hosts import open_host
from ttmesh.fabric import domains, health
from ttmesh.fabric.devices import discover
from ttmesh.recovery import reset
from ttmesh.runtime import leases, leftdown
from ttmesh.sim import core

# QuietBox 2: chips 0,1 on one p300 (C03, C01), chips 2,3 on the other (C05, C07); the ring
# C03-C01, C05-C07 (each board's own), C03-C07 and C01-C05 (across the boards).
C01, C03, C05, C07 = "0000:01:00.0", "0000:03:00.0", "0000:05:00.0", "0000:07:00.0"


@pytest.fixture(autouse=True)
def _state_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("TTMESH_TT_SMI", raising=False)


def asic(root: Path, bdf: str) -> str:
    return core.asic_hex(core.SimRoot(str(root)).chip_by_bdf(bdf)["unique_id"])


def resets(root: Path) -> list[dict]:
    return core.SimRoot(str(root)).read_state()["resets"]


def do_reset(cli: Callable, root: Path, *args: str) -> tuple[int, dict | None, str]:
    res = cli("reset", "--json", "--root", str(root), "--backoff", "0", *args)
    return res.code, (json.loads(res.out) if res.out else None), res.err


def other_job(root: Path, bdfs: list[str], uses: dict[str, list[str]] | None = None):
    """Another live job on ``bdfs``: its leases, whose records say which links its mesh uses
    (by default: the links between its own chips, as a launch records them)."""
    host = open_host(root)
    inv = discover(host)
    chips = [asic(root, b) for b in bdfs]
    return leases.acquire(
        host, chips, "other-job", cmd="serve", uses=uses or domains.mesh_peers(inv, chips)
    )


# --------------------------------------------------------------------------- domains in ls


@pytest.mark.parametrize(
    ("system", "sizes", "command"),
    [
        ("n300x2", [2, 2], "tt-smi -r 0000:01:00.0"),
        ("t3k", [2, 2, 2, 2], "tt-smi -r 0000:01:00.0"),
        ("quietbox2", [1, 1, 1, 1], "tt-smi -r 0000:01:00.0"),
        ("galaxy-wh", [32], "tt-smi -glx_reset"),
    ],
)
def test_ls_json_names_reset_domains(
    shared_sim: Callable, cli: Callable, system: str, sizes: list[int], command: str
) -> None:
    root = shared_sim(system)
    res = cli("ls", "--json", "--root", str(root))
    assert res.code == 0, res.err
    doc = json.loads(res.out)
    doms = doc["reset_domains"]
    assert [len(d["chips"]) for d in doms] == sizes
    assert doms[0]["command"] == command
    every = {c["asic_id"] for c in doc["chips"]}
    assert sorted(a for d in doms for a in d["chips"]) == sorted(every)  # a partition
    for d in doms:
        inside = set(d["chips"])
        for lk in d["links"]:  # every link with one end inside, and only those
            ends = {lk["a"]["asic_id"], lk["b"]["asic_id"]} & inside
            assert ends and lk["inside"] == (
                len(ends) == 2 or lk["a"]["asic_id"] == lk["b"]["asic_id"]
            )
        touching = [lk for lk in doc["links"] if {lk["a"]["asic_id"], lk["b"]["asic_id"]} & inside]
        assert len(d["links"]) == len(touching)
    if system == "quietbox2":  # each chip its own PCI device: a p300's chips are two domains
        assert all(len(d["pci"]) == 1 and not any(lk["inside"] for lk in d["links"]) for d in doms)
    if system == "n300x2":  # the remote chip rides on its partner's PCI device
        assert all(len(d["pci"]) == 1 for d in doms)
    assert doc["links_left_down"] == []
    text = cli("ls", "--root", str(root))
    assert f"Reset domains ({len(sizes)})" in text.out and command in text.out


# --------------------------------------------------------------------------- stopping beside a job


def test_reset_beside_another_job_leaves_the_unused_link_down(
    qb2: Path, cli: Callable, runtime: Path
) -> None:
    theirs = [asic(qb2, C05), asic(qb2, C07)]
    with other_job(qb2, [C05, C07]) as held:
        code, doc, err = do_reset(cli, qb2, "--chips", C01)
        assert code == 0, err
        assert [c["bdf"] for c in doc["chips"]] == [C01, C03]  # the free board only
        (done,) = resets(qb2)
        assert set(done["targets"]) == {asic(qb2, C01), asic(qb2, C03)}  # not the job's
        # tt-smi does not re-detect (open) every chip after the reset: the job's neither
        assert doc["attempts"][0]["argv"][1:] == ["-r", f"{C01},{C03}", "--no_reinit"]
        assert not set(theirs) & set(done["targets"])
        assert "leaving 4 links to job other-job of user" in err, err
        (warn,) = [p for p in doc["problems"] if "leaving" in p["what"]]
        assert C05 in warn["fix"] and C01 in warn["fix"]
        assert held.fds  # the other job's leases are untouched
        recorded = leftdown.read(open_host(qb2))
        assert {e.pair for e in recorded} == {
            frozenset((asic(qb2, C01), asic(qb2, C05))),
            frozenset((asic(qb2, C03), asic(qb2, C07))),
        }
        st = (qb2 / "run/lock/ttmesh" / leftdown.NAME).lstat()
        assert st.st_uid == os.geteuid() and st.st_mode & 0o777 == 0o644
        listed = json.loads(cli("ls", "--json", "--root", str(qb2)).out)
        assert len(listed["links_left_down"]) == 2
        assert "left down: 2 links between" in cli("ls", "--root", str(qb2)).out

    # The next job whose mesh needs C01-C05: pre-flight names the record and the reset.
    inv = discover(open_host(qb2))
    found = [
        p for p in health.preflight(inv, [asic(qb2, C01), asic(qb2, C05)]) if p.kind == "link-down"
    ]
    assert found and "left down by a reset of" in found[0].what
    assert found[0].fix.endswith(f"--chips {C01},{C05}")
    res = cli(
        "launch",
        "--root",
        str(qb2),
        "--chips",
        f"{C01},{C05}",
        "--dry-run",
        "--",
        "python3",
        "-c",
        "pass",
    )
    assert res.code == 3 and "left down by a reset" in res.err and f"{C01},{C05}" in res.err
    # ... and with --auto-reset resets both ends together, which clears the record.
    res = cli(
        "launch", "--root", str(qb2), "--chips", f"{C01},{C05}", "--auto-reset", "--train-timeout", "5", "--",
        "python3", "-c", "pass",
    )  # fmt: skip
    assert res.code == 0, res.err
    last = resets(qb2)[-1]["targets"]
    assert {asic(qb2, C01), asic(qb2, C05)} <= set(last)
    assert leftdown.read(open_host(qb2)) == []
    assert not (qb2 / "run/lock/ttmesh" / leftdown.NAME).exists()


def test_a_link_a_mesh_uses_is_never_left_down(qb2: Path, cli: Callable) -> None:
    """The other job's record says its mesh uses the link to C01 (its chip C05's record
    names C01): the reset expands into the job's chips and is refused, as before."""
    c01, c05, c07 = asic(qb2, C01), asic(qb2, C05), asic(qb2, C07)
    with other_job(qb2, [C05, C07], uses={c05: [c07, c01], c07: [c05]}):
        info = leases.probe(open_host(qb2), [c05])[c05]
        assert info.uses == tuple(sorted([c07, c01]))
        code, _, err = do_reset(cli, qb2, "--chips", C01)
        assert code == 3, err
        assert "leased by job other-job" in err
    assert resets(qb2) == []
    assert leftdown.read(open_host(qb2)) == []


def test_plan_is_pure_and_stops_only_at_unused_links(qb2: Path) -> None:
    """``reset.plan`` with a ``Usage`` (what a serving fleet recovers one replica with)."""
    inv = discover(open_host(qb2))
    c01, c03, c05, c07 = (asic(qb2, b) for b in (C01, C03, C05, C07))
    usage = domains.Usage(
        jobs={c05: "job a of user u", c07: "job a of user u"},
        uses={c05: frozenset({c07}), c07: frozenset({c05})},
        leased=frozenset({c05, c07}),
    )
    p = reset.plan(inv, [c01], usage=usage)
    assert set(p.chips) == {c01, c03}
    assert {frozenset((lk.a, lk.b)) for lk in p.left_down} == {
        frozenset((c01, c05)),
        frozenset((c03, c07)),
    }
    unknown = domains.Usage(jobs=usage.jobs, uses={}, leased=usage.leased)  # an older lease
    assert set(reset.plan(inv, [c01], usage=unknown).chips) == {c01, c03, c05, c07}
    assert reset.plan(inv, [c01], usage=unknown).left_down == ()


def test_a_galaxy_reset_never_stops_at_a_link(shared_sim: Callable) -> None:
    inv = discover(open_host(shared_sim("galaxy-wh")))
    rest = [c.asic_id for c in inv.chips[8:]]
    usage = domains.Usage(
        jobs={a: "job a of user u" for a in rest},
        uses={a: frozenset() for a in rest},
        leased=frozenset(rest),
    )
    p = reset.plan(inv, [inv.chips[0].asic_id], usage=usage)
    assert len(p.chips) == 32 and p.galaxy and p.left_down == ()


# --------------------------------------------------------------------------- the record


def test_planted_records_are_not_believed(qb2: Path, tmp_path: Path) -> None:
    host = open_host(qb2)
    d = qb2 / "run/lock/ttmesh"
    d.mkdir(parents=True, exist_ok=True)
    path = d / leftdown.NAME
    a, b = asic(qb2, C01), asic(qb2, C05)
    good = {
        "schema": leftdown.SCHEMA,
        "links": [{"a": a, "b": b, "chans": [[3, 7]], "since": 1.0, "why": "x"}],
    }
    target = tmp_path / "elsewhere.json"
    target.write_text(json.dumps(good))
    path.symlink_to(target)
    assert leftdown.read(host) == []  # a link is never followed
    path.unlink()
    for bad in (
        {**good, "schema": "other"},
        {**good, "links": [{**good["links"][0], "a": "../x"}]},
    ):
        path.write_text(json.dumps(bad))
        assert leftdown.read(host) == []
    os.mkfifo(path.with_suffix(".fifo"))
    path.unlink()
    path.with_suffix(".fifo").rename(path)
    assert leftdown.read(host) == []  # a FIFO is never opened for reading
    path.unlink()
    path.write_text(json.dumps(good))
    assert [e.pair for e in leftdown.read(host)] == [frozenset((a, b))]
    assert leftdown.update(host, reset=[a, b]) is None and not path.exists()


def test_updates_merge_and_a_reset_of_both_ends_clears(
    qb2: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fcntl

    host = open_host(qb2)
    a, b, c, d = (asic(qb2, x) for x in (C01, C05, C03, C07))
    one = leftdown.LeftDown(a, b, ((3, 7),), 1.0, "a reset of x beside job j of user u")
    two = leftdown.LeftDown(c, d, ((7, 3),), 2.0, "a reset of y beside job j of user u")
    assert leftdown.update(host, [one]) is None
    lease_dir = qb2 / "run/lock/ttmesh"
    held = os.open(lease_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:  # another update holds the record: this one waits (here: not at all), then goes on
        fcntl.flock(held, fcntl.LOCK_EX)
        monkeypatch.setattr(leftdown, "LOCK_WAIT", 0.0)
        assert leftdown.update(host, [two]) is None
    finally:
        os.close(held)
    assert [e.pair for e in leftdown.read(host)] == [one.pair, two.pair]
    assert leftdown.update(host, reset=[a, c]) is None  # one end of each: both kept
    assert len(leftdown.read(host)) == 2
    assert leftdown.update(host, reset=[a, b]) is None
    assert [e.pair for e in leftdown.read(host)] == [two.pair]


# --------------------------------------------------------------------------- the wait for training


def test_the_wait_after_a_reset_is_the_boards_training_bound(
    qb2: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ttmesh.host.base import Host
    from ttmesh.host.boards import link_training

    assert (
        Host("/").train_timeout(["blackhole"]) == link_training("blackhole", external=False).timeout
    )
    assert Host("/").train_timeout(["wormhole_b0", "blackhole"]) == 60.0
    host = open_host(qb2)
    assert host.train_timeout(["blackhole"]) == 0.0  # the sim's links train as tt-smi returns
    seen: list[float] = []
    observed: list[int] = []
    real_settle, real_observe = reset._settle, reset.observe

    def settle(host_, p, bdfs, hb, deadline, *rest):  # type: ignore[no-untyped-def]
        import time

        seen.append(deadline - time.monotonic())
        return real_settle(host_, p, bdfs, hb, deadline, *rest)

    def observe(*args, **kwargs):  # type: ignore[no-untyped-def]
        observed.append(1)
        return real_observe(*args, **kwargs)

    monkeypatch.setattr(reset, "_settle", settle)
    monkeypatch.setattr(reset, "observe", observe)
    monkeypatch.setattr(type(host), "train_timeout", Host.train_timeout)  # as on hardware
    out = reset.recover(host, None, backoff=0)
    assert out.recovered
    assert 59.0 < seen[0] <= 60.0  # Blackhole's bound, not a constant
    assert len(observed) == 2  # before, and once after: a healthy reset returned at once
    out = reset.recover(host, None, backoff=0, settle=0.5)
    assert seen[-1] <= 0.5


@pytest.mark.parametrize("value", ["nan", "-1", "inf", "1e400"])
def test_train_timeout_is_checked(qb2: Path, cli: Callable, value: str) -> None:
    res = cli("reset", "--root", str(qb2), "--train-timeout", value)
    lines = [ln for ln in res.err.splitlines() if ln.startswith("ttmesh: ")]
    assert res.code == 2 and len(lines) == 1, res.err
    assert lines[0].startswith(f"ttmesh: --train-timeout {value}: ")
    assert lines[0].endswith("(give seconds from 0 to 2592000, e.g. --train-timeout 60)")
    assert resets(qb2) == []


def test_launch_train_timeout_is_checked(qb2: Path, cli: Callable) -> None:
    res = cli("launch", "--root", str(qb2), "--train-timeout", "nan", "--", "python3", "-c", "pass")
    assert res.code == 2
    assert res.err.splitlines()[-1] == (
        "ttmesh: --train-timeout nan: not a number (give seconds from 0 to 2592000, "
        "e.g. --train-timeout 60)"
    )


def test_train_timeout_is_used(qb2: Path, cli: Callable) -> None:
    code, doc, err = do_reset(cli, qb2, "--train-timeout", "0.2")
    assert code == 0 and doc["recovered"], err


def test_a_probe_knows_its_own_leases_and_free_chips_without_the_kernels_lock_table(
    qb2: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Free chips have no lease file, and the leases this process holds are known by their
    inodes: neither needs /proc/locks (whose first read in a while waits for an RCU grace
    period, about 10 ms). Another process's lease still asks the kernel."""
    host = open_host(qb2)
    c05, c07 = asic(qb2, C05), asic(qb2, C07)
    asked: list[int] = []
    real = leases._kernel_locks
    monkeypatch.setattr(leases, "_kernel_locks", lambda: asked.append(1) or real())
    assert leases.probe(host, [c05, c07]) == {}
    with leases.acquire(host, [c05], "mine", cmd="serve"):
        info = leases.probe(host, [c05, c07])[c05]
        assert (info.pid, info.job, info.verified) == (os.getpid(), "mine", True)
        assert asked == []
    assert leases.probe(host, [c05, c07]) == {} and asked == []
    assert leases._HELD == {}  # released: no longer known as held
    other = subprocess.Popen(
        [sys.executable, "-c", "import sys; from ttmesh.cli.hosts import open_host; "
         "from ttmesh.runtime import leases; "
         f"h = leases.acquire(open_host({str(qb2)!r}), [{c07!r}], 'theirs', cmd='x'); "
         "print('held', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert other.stdout is not None and other.stdout.readline() == "held\n"
        info = leases.probe(host, [c05, c07])[c07]
        assert (info.pid, info.job) == (other.pid, "theirs") and asked == [1]
    finally:
        assert other.stdin is not None
        other.stdin.close()
        other.wait(30)
