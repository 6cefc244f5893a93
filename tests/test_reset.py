"""``ttmesh reset``: expansion, refusals, ``--force``, tt-smi faults, verification, bad input.

Everything runs the real entry point against simulated roots whose ``bin/tt-smi`` stand-in
records each reset it performs (``sim/state.json`` "resets": the chips it actually reset), so
the tests see what tt-smi was asked to do, not only what ttmesh says.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from conftest import start_launch, worker
from conftest import until as _until

from ttmesh import procs
from ttmesh.cli.hosts import open_host as Host
from ttmesh.fabric import health
from ttmesh.fabric.devices import discover
from ttmesh.recovery import reset
from ttmesh.sim import core

ME = procs.user_name(os.getuid())  # how ttmesh names this user

C01, C03, C05, C07 = "0000:01:00.0", "0000:03:00.0", "0000:05:00.0", "0000:07:00.0"
QB2 = [C01, C03, C05, C07]
RESET_KEYS = ["schema", "recovered", "chips", "attempts", "problems"]
CHIP_KEYS = ["bdf", "asic_id", "before", "after", "dev_before", "dev_after"]


# --------------------------------------------------------------------------- helpers

until = functools.partial(_until, timeout=5.0)


@pytest.fixture(autouse=True)
def _state_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("TTMESH_TT_SMI", raising=False)


def sim_of(root: Path) -> core.SimRoot:
    return core.SimRoot(str(root))


def asic(root: Path, bdf: str) -> str:
    return core.asic_hex(sim_of(root).chip_by_bdf(bdf)["unique_id"])


def resets(root: Path) -> list[dict]:
    """What the tt-smi stand-in actually did, one record per tt-smi reset."""
    return sim_of(root).read_state()["resets"]


def fault(cli: Callable, root: Path, *args: str) -> str:
    res = cli("sim", "fault", "--root", str(root), *args)
    assert res.code == 0, res.err
    return res.out


def do_reset(cli: Callable, root: Path, *args: str) -> tuple[int, dict | None, str]:
    res = cli("reset", "--json", "--root", str(root), "--backoff", "0", *args)
    doc = json.loads(res.out) if res.out else None
    return res.code, doc, res.err


def ttmesh_lines(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if not ln.startswith("simulated host: ")]


def link_states(root: Path) -> set[str]:
    from ttmesh.fabric import links

    return {s.state for s in links.observe(discover(Host(root)))}


def hold(cli: Callable, root: Path, bdf: str, pids: list[int]) -> int:
    pid = int(re.search(r"pid (\d+)", fault(cli, root, "hold", bdf)).group(1))
    pids.append(pid)
    return pid


# --------------------------------------------------------------------------- expansion


def test_one_qb2_chip_expands_to_the_ring(qb2: Path, cli: Callable) -> None:
    fault(cli, qb2, "link-down", C05, C07)
    code, doc, err = do_reset(cli, qb2, "--chips", C01)
    assert code == 0, err
    assert list(doc) == RESET_KEYS and doc["schema"] == "ttmesh.reset/1"
    assert doc["recovered"] is True and doc["problems"] == []
    assert [c["bdf"] for c in doc["chips"]] == QB2
    assert all(list(c) == CHIP_KEYS for c in doc["chips"])
    before = {c["bdf"]: c["before"] for c in doc["chips"]}
    assert before == {C01: "ok", C03: "ok", C05: "links down", C07: "links down"}
    assert {c["after"] for c in doc["chips"]} == {"ok"}
    (attempt,) = doc["attempts"]
    assert attempt["argv"][1:] == ["-r", ",".join(QB2)]
    assert (attempt["attempt"], attempt["verified"], attempt["timed_out"]) == (1, True, False)
    (done,) = resets(qb2)
    assert set(done["targets"]) == {asic(qb2, b) for b in QB2} and done["effective"]
    line = next(ln for ln in ttmesh_lines(err) if "resetting" in ln)
    assert line.startswith(f"ttmesh: resetting 4 chips: {C01} (asked), {C03} (Ethernet-linked")
    assert link_states(qb2) == {"up"}


def test_p300_pair_expands_to_its_card_only(make_sim: Callable, cli: Callable) -> None:
    root = make_sim("p300x2-disconnected")
    code, doc, err = do_reset(cli, root, "--chips", C05)
    assert code == 0, err
    assert [c["bdf"] for c in doc["chips"]] == [C05, C07]
    assert doc["attempts"][0]["argv"][1:] == ["-r", f"{C05},{C07}"]
    assert set(resets(root)[-1]["targets"]) == {asic(root, C05), asic(root, C07)}


def test_t3k_expansion_and_no_expand(make_sim: Callable, cli: Callable) -> None:
    root = make_sim("t3k")
    inv = discover(Host(root))
    lead = inv.by_bdf()["0000:01:00.0"]
    partner = next(c.asic_id for c in inv.chips if c.via == lead.asic_id)
    linked = {
        lk.b if lk.a == lead.asic_id else lk.a for lk in inv.links if lead.asic_id in (lk.a, lk.b)
    }
    assert partner in linked and len(linked) == 3  # its remote partner and two PCI neighbours
    code, doc, err = do_reset(cli, root, "--chips", "0000:01:00.0")
    assert code == 0, err
    chosen = {c["asic_id"] for c in doc["chips"]}
    assert {lead.asic_id, partner} | linked <= chosen
    assert chosen == {c.asic_id for c in inv.chips}  # T3K is one connected mesh
    assert doc["attempts"][0]["argv"][2] == "0000:01:00.0,0000:02:00.0,0000:03:00.0,0000:04:00.0"

    code, doc, err = do_reset(cli, root, "--chips", "0000:01:00.0", "--no-expand")
    assert code == 0, err
    assert [c["asic_id"] for c in doc["chips"]] == [lead.asic_id, partner]  # board stays whole
    assert doc["attempts"][0]["argv"][2] == "0000:01:00.0"
    assert set(resets(root)[-1]["targets"]) == {lead.asic_id, partner}
    warns = [ln for ln in ttmesh_lines(err) if ln.startswith("ttmesh: warning: --no-expand")]
    assert len(warns) == 1 and "will stay down" in warns[0]
    kinds = [p["what"] for p in doc["problems"] if p["severity"] == "warning"]
    assert any("to chips outside the set are down" in w for w in kinds)
    assert "down" in link_states(root)


def test_n300_remote_chip_resets_through_its_partner(make_sim: Callable, cli: Callable) -> None:
    root = make_sim("n300")
    inv = discover(Host(root))
    remote = next(c for c in inv.chips if c.bdf is None)
    fault(cli, root, "chip-dead", remote.asic_id)
    code, doc, err = do_reset(cli, root, "--chips", remote.asic_id)
    assert code == 0, err
    assert doc["attempts"][0]["argv"][1:] == ["-r", "0000:41:00.0"]
    after = {c["asic_id"]: (c["bdf"], c["before"], c["after"]) for c in doc["chips"]}
    assert after[remote.asic_id] == (None, "frozen", "ok")


def test_galaxy_uses_glx_reset(make_sim: Callable, cli: Callable) -> None:
    root = make_sim("galaxy-wh")
    code, doc, err = do_reset(cli, root, "--chips", "0000:01:00.0")
    assert code == 0, err
    assert doc["attempts"][0]["argv"][1:] == ["-glx_reset"]
    assert len(doc["chips"]) == 32  # the Galaxy reset takes every chip: all are checked
    assert len(resets(root)[-1]["targets"]) == 32


# --------------------------------------------------------------------------- tt-smi faults


def test_reset_fails_until_cleared(qb2: Path, cli: Callable) -> None:
    fault(cli, qb2, "link-down", C01, C03)
    fault(cli, qb2, "reset-fails")
    code, doc, err = do_reset(cli, qb2)  # default --retries 2
    assert code == 1
    assert doc["recovered"] is False
    assert [(a["attempt"], a["verified"], a["exit_code"]) for a in doc["attempts"]] == [
        (1, False, 0),
        (2, False, 0),
        (3, False, 0),
    ]
    wrong = f"2 of 2 links between {C01} and {C03} down"
    assert doc["attempts"][-1]["still_wrong"] == [wrong]
    assert [p["what"] for p in doc["problems"] if p["severity"] == "error"] == [wrong]
    assert all(p["fix"] for p in doc["problems"])
    assert len(resets(qb2)) == 3 and not any(r["effective"] for r in resets(qb2))
    assert ttmesh_lines(err)[-1] == f"ttmesh: not recovered after 3 attempts: {wrong}"
    human = cli("reset", "--root", str(qb2), "--retries", "0", "--backoff", "0")
    assert human.code == 1 and "NOT RECOVERED after 1 attempt" in human.out


def test_reset_fails_once_recovers_on_the_second_attempt(qb2: Path, cli: Callable) -> None:
    fault(cli, qb2, "link-down", C05, C07)
    fault(cli, qb2, "reset-fails", "--times", "1")
    code, doc, err = do_reset(cli, qb2)
    assert code == 0, err
    assert [(a["attempt"], a["verified"]) for a in doc["attempts"]] == [(1, False), (2, True)]
    assert [r["effective"] for r in resets(qb2)] == [False, True]
    assert link_states(qb2) == {"up"}


def test_reset_renumbers(qb2: Path, cli: Callable) -> None:
    fault(cli, qb2, "reset-renumbers")
    code, doc, err = do_reset(cli, qb2, "--chips", C03)
    assert code == 0, err
    assert [c["bdf"] for c in doc["chips"]] == QB2
    for c in doc["chips"]:
        assert c["dev_before"] != c["dev_after"], c
        assert (c["before"], c["after"]) == ("ok", "ok")
    host = Host(qb2)
    now = {host.bdf_of(n): n for n in host.dev_indexes()}
    assert {c["bdf"]: c["dev_after"] for c in doc["chips"]} == now


def _tt_smi_procs(root: Path) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if str(root / "bin" / "tt-smi") in " ".join(p.info["cmdline"] or []):
                found.append(p)
    return found


def test_reset_hangs_past_timeout(qb2: Path, cli: Callable) -> None:
    fault(cli, qb2, "reset-hangs", "30")
    t0 = time.monotonic()
    code, doc, err = do_reset(cli, qb2, "--timeout", "0.3", "--retries", "1")
    took = time.monotonic() - t0
    assert code == 1, err
    assert took < 10
    assert [(a["timed_out"], a["exit_code"], a["verified"]) for a in doc["attempts"]] == [
        (True, None, False),
        (True, None, False),
    ]
    assert doc["attempts"][0]["still_wrong"][0] == "tt-smi timed out after 0.3 s (killed)"
    assert "--timeout" in doc["problems"][0]["fix"]
    assert resets(qb2) == []  # killed before it reset anything
    assert _tt_smi_procs(qb2) == []  # no tt-smi left behind


def test_run_tt_smi_kills_the_whole_group(tmp_path: Path) -> None:
    tool = tmp_path / "slow-smi"
    tool.write_text(
        f"#!/bin/sh\necho $$ > {tmp_path}/self\nsleep 30 & echo $! > {tmp_path}/child\nwait\n"
    )
    tool.chmod(0o755)
    run = reset.run_tt_smi([str(tool)], timeout=0.5)
    assert (run.timed_out, run.code) == (True, None) and run.seconds < 5
    me, child = (int((tmp_path / n).read_text()) for n in ("self", "child"))
    assert not Path(f"/proc/{me}").exists()  # reaped: not even a zombie
    assert until(lambda: core.proc_start_time(child) is None)  # its child is gone too
    done = reset.run_tt_smi(["/bin/sh", "-c", "echo $TT_LOGGER_LEVEL; read x; echo $?"], 10)
    assert (done.code, done.timed_out, done.output) == (0, False, "error\n1\n")  # stdin closed


def test_tt_smi_finishes_its_reset_when_ttmesh_is_killed_mid_way(tmp_path: Path) -> None:
    """ttmesh killed with SIGKILL while tt-smi resets: tt-smi prints on, to no reader, and must
    not die of SIGPIPE before its reset's last step (its output is a file, not a pipe)."""
    import sys

    tool = tmp_path / "smi"
    tool.write_text(
        f"#!/bin/sh\necho $$ > {tmp_path}/started\n"
        "while kill -0 $PPID 2>/dev/null; do sleep 0.05; done\n"  # until ttmesh is gone
        "i=0; while [ $i -lt 200 ]; do echo resetting $i; i=$((i+1)); done\n"
        f"echo done > {tmp_path}/finished\n"
    )
    tool.chmod(0o755)
    code = f"from ttmesh.recovery.reset import run_tt_smi; run_tt_smi([{str(tool)!r}], 60)"
    runner = subprocess.Popen([sys.executable, "-c", code])
    try:
        assert until(lambda: (tmp_path / "started").exists() or runner.poll() is not None)
        assert runner.poll() is None
        runner.kill()
        runner.wait()
        smi = int((tmp_path / "started").read_text())
        assert until(lambda: not Path(f"/proc/{smi}").exists() or _zombie(smi))
    finally:
        runner.kill()
        runner.wait()
    assert (tmp_path / "finished").read_text() == "done\n"  # it ran to its end


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


# --------------------------------------------------------------------------- refusals


def test_held_chip_refused_then_forced(qb2: Path, cli: Callable, hold_pids: list[int]) -> None:
    pid = hold(cli, qb2, C05, hold_pids)
    before = (qb2 / core.STATE_FILE).read_bytes()
    code, doc, err = do_reset(cli, qb2, "--chips", C01)  # 05 joins through the ring
    assert code == 3 and doc is not None and doc["schema"] == "ttmesh.error/1"
    assert doc["code"] == 3 and doc["message"].startswith(f"{C05} is held by pid {pid} (")
    last = ttmesh_lines(err)[-1]
    assert last.startswith(f"ttmesh: {C05} is held by pid {pid} (") and "ttmesh-sim-hold" in last
    assert "--force" in last
    assert core.proc_start_time(pid) is not None
    assert (qb2 / core.STATE_FILE).read_bytes() == before  # nothing was reset

    code, doc, err = do_reset(cli, qb2, "--chips", C01, "--force")
    assert code == 0, err
    assert until(lambda: core.proc_start_time(pid) is None)  # the holder is gone
    assert len(resets(qb2)) == 1 and doc["recovered"]
    human = cli("ls", "--json", "--root", str(qb2))
    assert all(c["holders"] == [] for c in json.loads(human.out)["chips"])


def test_chip_leased_by_another_job(qb2: Path, cli: Callable) -> None:
    from ttmesh.runtime import leases

    before = (qb2 / core.STATE_FILE).read_bytes()
    with leases.acquire(Host(qb2), [asic(qb2, C07)], "other-job", cmd="x") as held:
        for extra in ([], ["--force"]):
            code, _, err = do_reset(cli, qb2, "--chips", C01, *extra)
            assert code == 3, err
            assert ttmesh_lines(err)[-1].startswith(
                f"ttmesh: {C07} is leased by job other-job of user {ME} (pid {os.getpid()}: x)"
            )
        assert held.fds  # still ours
        assert set(leases.probe(Host(qb2), [asic(qb2, C07)])) == {asic(qb2, C07)}
    assert (qb2 / core.STATE_FILE).read_bytes() == before
    assert resets(qb2) == []


def test_running_job_is_never_stopped(qb2: Path, cli: Callable, tmp_path: Path) -> None:
    pids_dir = tmp_path / "pids"
    pids_dir.mkdir()
    job = start_launch(
        qb2, "--tp-size", "2", "--job-id", "busy-job", *worker(f"pids={pids_dir}"),
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        assert until(lambda: len(list(pids_dir.glob("*.pid"))) == 2, timeout=20), job.stderr
        workers = [int(p.read_text()) for p in pids_dir.glob("*.pid")]
        res = cli("check", "--json", "--root", str(qb2))
        assert res.code == 0, res.out  # its workers hold the chips it leases: healthy
        leased = [c for c in json.loads(res.out)["chips"] if c["lease"]]
        assert len(leased) == 2 and {c["lease"]["job"] for c in leased} == {"busy-job"}
        assert sorted(h["pid"] for c in leased for h in c["holders"]) == sorted(workers)
        assert {h["job"] for c in leased for h in c["holders"]} == {"busy-job"}
        for extra in ([], ["--force"]):
            code, _, err = do_reset(cli, qb2, "--chips", leased[0]["bdf"], *extra)
            assert code == 3, err
            last = ttmesh_lines(err)[-1]
            assert f"job busy-job of user {ME}" in last and str(job.pid) in last
        assert all(core.proc_start_time(w) is not None for w in workers)
        assert resets(qb2) == []
    finally:
        job.send_signal(signal.SIGTERM)
        job.communicate(timeout=30)


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--chips", "0000:99:00.0"], r"--chips 0000:99:00\.0: no such chip on this host"),
        (["--chips", "0000:01:00"], r"--chips '0000:01:00': not a PCI address"),
        (["--no-expand"], r"--no-expand needs --chips"),
        (["--tt-smi", "/nonexistent"], r"tt-smi not found: .*pip install tt-smi"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
def test_bad_input_changes_nothing(qb2: Path, cli: Callable, args: list[str], message: str) -> None:
    fault(cli, qb2, "chip-dead", C03)
    before = (qb2 / core.STATE_FILE).read_bytes()
    res = cli("reset", "--root", str(qb2), *args)
    assert (res.code, res.out) == (2, "")
    assert res.err.splitlines()[0] == f"simulated host: {qb2.resolve()}"
    lines = ttmesh_lines(res.err)
    assert len(lines) == 1 and re.match(r"ttmesh: " + message, lines[0]), res.err
    assert (qb2 / core.STATE_FILE).read_bytes() == before


def test_reset_without_tt_smi_is_refused_saying_how_to_install_it(qb2: Path, cli: Callable) -> None:
    (qb2 / "bin" / "tt-smi").unlink()
    before = (qb2 / core.STATE_FILE).read_bytes()
    env = {"PATH": "/usr/bin:/bin"}
    res = cli("reset", "--root", str(qb2), env=env)
    assert res.code == 2
    (line,) = ttmesh_lines(res.err)
    assert "tt-smi not found" in line and "pip install tt-smi" in line
    assert (qb2 / core.STATE_FILE).read_bytes() == before


def test_reset_help_teaches(cli: Callable) -> None:
    res = cli("reset", "--help")
    assert res.code == 0
    assert "ttmesh reset --chips 0000:01:00.0" in res.out and "--no-expand" in res.out
    assert "--backoff" not in res.out


# --------------------------------------------------------------------------- never "match nothing"


def test_smi_argv_only_names_existing_pci_addresses() -> None:
    present = {C01, C03}
    assert reset.smi_argv("tt-smi", [C01, C03, C01], present) == ["tt-smi", "-r", f"{C01},{C03}"]
    for bad in ([], [C05], ["0000:0A:00.0"], ["0000:01:00"], ["all"], ["0"]):
        with pytest.raises(ValueError):
            reset.smi_argv("tt-smi", bad, present | {"0000:0A:00.0"})
    assert reset.smi_argv("tt-smi", [], set(), galaxy=True) == ["tt-smi", "-glx_reset"]


@pytest.mark.parametrize("system", ["quietbox2", "t3k", "n300x2", "p150x4"])
def test_every_plan_targets_existing_devices(make_sim: Callable, system: str) -> None:
    root = make_sim(system)
    inv = discover(Host(root))
    present = {Host(root).bdf_of(n) for n in Host(root).dev_indexes()}
    for chip in inv.chips:
        for no_expand in (False, True):
            p = reset.plan(inv, [chip.asic_id], no_expand=no_expand)
            argv = reset.smi_argv("tt-smi", reset.pci_targets(inv, p.chips), present)
            assert argv[1] == "-r" and set(argv[2].split(",")) <= present
            assert chip.asic_id in p.chips


def test_lost_chip_is_never_a_target(qb2: Path, cli: Callable) -> None:
    fault(cli, qb2, "chip-dead", C05, "--permanent")
    code, doc, err = do_reset(cli, qb2, "--retries", "1")
    assert code == 1
    first, second = (a["argv"][2].split(",") for a in doc["attempts"])
    assert first == QB2  # 05 existed (dead) at the first attempt ...
    assert second == [C01, C03, C07]  # ... and was gone at the second
    assert (
        f"{C05} did not come back (the driver does not list it)"
        in doc["attempts"][1]["still_wrong"]
    )
    gone = next(c for c in doc["chips"] if c["bdf"] == C05)
    assert (gone["before"], gone["after"], gone["dev_after"]) == ("frozen", "gone", None)
    problem = next(p for p in doc["problems"] if "did not come back" in p["what"])
    assert problem["fix"].startswith("power-cycle the host")
    # The host now lacks 05: a reset of what is there resets and verifies those chips, but the
    # host is not whole: exit 1, not 0, saying so (issue 37; docs/conventions.md Exit codes).
    code, doc, err = do_reset(cli, qb2)
    assert code == 1, err
    assert doc["attempts"][0]["argv"][2] == f"{C01},{C03},{C07}"
    assert doc["recovered"] is False and doc["attempts"][0]["verified"] is True
    (missing,) = [p for p in doc["problems"] if "missing from the host" in p["what"]]
    assert missing["severity"] == "error" and missing["fix"].startswith("power-cycle the host")
    (line,) = ttmesh_lines(err)[-1:]
    assert line.startswith("ttmesh: not recovered: ") and "missing from the host" in line
    text = cli("reset", "--root", str(qb2), "--backoff", "0")
    assert text.code == 1 and "NOT RECOVERED" in text.out and "error: chip" in text.out


# --------------------------------------------------------------------------- recover()


def test_recover_for_the_launcher(qb2: Path, cli: Callable) -> None:
    fault(cli, qb2, "link-down", C01, C03)
    host = Host(qb2)
    seen: list[str] = []
    t0 = time.monotonic()
    out = reset.recover(host, [asic(qb2, C01)], timeout=30, retries=1, log=seen.append, backoff=0)
    took = time.monotonic() - t0
    assert out.recovered and out.code == 0 and len(out.attempts) == 1
    assert [c["bdf"] for c in out.chips] == QB2
    assert seen[0].startswith("resetting 4 chips")
    assert any(s.startswith("attempt 1 of 2: ") for s in seen)
    assert took < 5
    assert health.check(discover(host)).healthy
