"""Hostile input and killed processes (issue 10): every mistake is one line and exit 2, nothing
outside ttmesh's own directories is touched, the launcher's contract can't be overridden, and
whichever ttmesh process survives a kill -9 finishes the job."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import REPO, alive, run_cli, start_launch, wait_for, worker

from ttmesh import procs
from ttmesh.cli.hosts import open_host as Host
from ttmesh.runtime import jobs, leases

ME = procs.user_name(os.getuid())  # how ttmesh names this user

C01, C03, C05, C07 = "0000:01:00.0", "0000:03:00.0", "0000:05:00.0", "0000:07:00.0"


def one_line(err: str) -> str:
    """The single ttmesh line of a refusal (the simulated-host notice aside)."""
    lines = [ln for ln in err.splitlines() if not ln.startswith("simulated host: ")]
    assert len(lines) == 1, err
    assert lines[0].startswith("ttmesh: "), err
    assert "Traceback" not in err
    return lines[0]


def link_states(root: Path) -> set[str]:
    doc = json.loads(run_cli("ls", "--root", str(root), "--json").out)
    return {lk["state"] for lk in doc["links"]}


def record(job: str) -> dict | None:
    return next((r for r in jobs.every() if r["job"] == job), None)


# --------------------------------------------------------------------------- ids and paths


@pytest.mark.parametrize(
    "job_id", ["../../victim", "../victim", "a/b", "/abs/x", ".hidden", "", "x" * 65, "a b"]
)
def test_unsafe_job_ids_are_refused(qb2: Path, runtime: Path, job_id: str) -> None:
    victim = runtime / "victim"
    victim.mkdir()
    (victim / "keep").write_text("mine\n")
    before = sorted(p.name for p in runtime.rglob("*"))
    res = run_cli("launch", "--root", str(qb2), "--tp-size", "1", "--job-id", job_id,
                  *worker("exit=0"))  # fmt: skip
    assert res.code == 2, res.err
    line = one_line(res.err)
    assert line.startswith(f"ttmesh: --job-id {job_id!r}: not a valid name"), line
    assert "letters, digits" in line
    assert (victim / "keep").read_text() == "mine\n"
    assert sorted(p.name for p in runtime.rglob("*")) == before  # nothing created


def test_planted_symlink_and_foreign_run_dir_are_refused_not_cleaned(
    qb2: Path, runtime: Path
) -> None:
    victim = runtime / "victim"
    victim.mkdir()
    (victim / "keep").write_text("mine\n")
    runs = runtime / "ttmesh" / "runs"
    runs.mkdir(parents=True, mode=0o700)
    (runs / "planted").symlink_to(victim)
    (runs / "precreated").mkdir()
    (runs / "precreated" / "theirs").write_text("x\n")
    for job in ("planted", "precreated"):
        res = run_cli("launch", "--root", str(qb2), "--tp-size", "1", "--job-id", job,
                      *worker("exit=0"))  # fmt: skip
        assert res.code == 2, res.err
        assert "already exists" in one_line(res.err)
    assert (runs / "planted").is_symlink() and (victim / "keep").read_text() == "mine\n"
    assert (runs / "precreated" / "theirs").exists()
    # A later command's sweep leaves them too: they are no stale run directory of a job.
    assert run_cli("ps").code == 0
    assert (runs / "planted").is_symlink() and (runs / "precreated" / "theirs").exists()


def test_a_run_dir_replaced_while_the_job_runs_is_not_removed(
    qb2: Path, runtime: Path, tmp_path: Path
) -> None:
    """Removal checks it is still the directory the job created: a symlink put in its place
    (to a victim) is left alone, and so is the victim."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("mine\n")
    proc = start_launch(qb2, "--tp-size", "1", "--job-id", "swap", *worker(f"pids={tmp_path}"))
    try:
        wait_for(lambda: (tmp_path / "rank0.pid").exists(), what="the worker")
        run_dir = runtime / "ttmesh" / "runs" / "swap"
        run_dir.rename(tmp_path / "moved")
        run_dir.symlink_to(victim)
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=20)
    finally:
        proc.kill()
        proc.communicate()
    assert (victim / "keep").read_text() == "mine\n"
    assert run_dir.is_symlink()


def test_stale_run_dirs_are_swept_live_ones_kept(qb2: Path, runtime: Path, tmp_path: Path) -> None:
    runs = runtime / "ttmesh" / "runs"
    # A run directory whose job died with it (its lock is free), made the way a launch does.
    code = (
        "import sys; from pathlib import Path; from ttmesh import paths; "
        "paths.create_run_dir(Path(sys.argv[1]), 'dead-job', 'x'); "
        "(Path(sys.argv[1]) / 'dead-job' / 'mesh').mkdir()"
    )
    subprocess.run([sys.executable, "-c", code, str(runs)], check=True)
    assert (runs / "dead-job" / "mesh").is_dir()
    proc = start_launch(qb2, "--tp-size", "1", "--job-id", "live-job", *worker(f"pids={tmp_path}"))
    try:
        wait_for(lambda: (tmp_path / "rank0.pid").exists(), what="the worker")
        res = run_cli("ps")
        assert res.code == 0, res.err
        assert not (runs / "dead-job").exists()
        assert (runs / "live-job").is_dir()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=20)
    assert not (runs / "live-job").exists()


# --------------------------------------------------------------------------- the contract


@pytest.mark.parametrize(
    ("item", "needle"),
    [
        ("RANK=5", "each rank gets its own"),
        ("WORLD_SIZE=7", "--tp-size"),
        ("TT_VISIBLE_DEVICES=0000:01:00.0", "--chips"),
        ("MASTER_PORT=1234", "--master-port"),
        ("TT_MESH_ID=3", "--mesh-layout"),
        ("TT_MESH_GRAPH_DESC_PATH=/x", "--mesh-layout"),
        ("LIBTT_SYMMETRIC_DRAM_MB=1", "--symmetric-dram-mb"),
        ("TT_METAL_MOCK_CLUSTER_DESC_PATH=/x", "--sim or --root"),
        ("TORCHELASTIC_RUN_ID=x", "--job-id"),
        ("TTMESH_JOB_ID=x", "ttmesh's own"),
    ],
)
def test_env_cannot_override_what_ttmesh_sets(qb2: Path, item: str, needle: str) -> None:
    res = run_cli("launch", "--root", str(qb2), "--tp-size", "2", "--env", item, "--dry-run",
                  *worker("exit=0"))  # fmt: skip
    assert res.code == 2, res.err
    key = item.split("=")[0]
    line = one_line(res.err)
    assert line.startswith(f"ttmesh: --env {key}: ttmesh sets {key} for every rank"), line
    assert needle in line


def test_env_of_the_users_own_is_passed(qb2: Path) -> None:
    res = run_cli("launch", "--root", str(qb2), "--tp-size", "1", "--env", "MY_FLAG=1",
                  "--dry-run", "--json", "--show-env", *worker("exit=0"))  # fmt: skip
    assert res.code == 0, res.err
    assert json.loads(res.out)["ranks"][0]["env"]["MY_FLAG"] == "1"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--foo"], "no such option: --foo"),
        (["--tp-sise", "4"], "no such option: --tp-sise (did you mean --tp-size?"),
        (["--max-nodes", "2"], "--max-nodes is torchrun's option"),
    ],
)
def test_option_looking_words_before_the_command(qb2: Path, args: list[str], needle: str) -> None:
    res = run_cli("launch", "--root", str(qb2), "--tp-size", "1", *args, "true")
    assert res.code == 2, res.err
    assert needle in one_line(res.err)


def test_a_command_that_starts_with_a_dash_goes_after_double_dash(qb2: Path) -> None:
    res = run_cli("launch", "--root", str(qb2), "--tp-size", "1", "--dry-run", "--", "-x")
    assert res.code == 2
    assert "command '-x' not found on PATH" in one_line(res.err)
    # Options after the command are the command's.
    res = run_cli("launch", "--root", str(qb2), "--tp-size", "1", "--dry-run", "--json",
                  sys.executable, "-c", "pass", "--foo")  # fmt: skip
    assert res.code == 0, res.err
    assert json.loads(res.out)["ranks"][0]["argv"][-1] == "--foo"


@pytest.mark.parametrize("where", [["--version"], ["launch", "--version"], ["launch", "-V"]])
def test_version_is_printed_by_ttmesh_and_by_launch(where: list[str]) -> None:
    from ttmesh import __version__

    res = run_cli(*where)
    assert res.code == 0, res.err
    assert res.out.strip() == f"ttmesh, version {__version__}"


# --------------------------------------------------------------------------- killed processes


def _fabric_job(qb2: Path, tmp_path: Path, job: str, **kw: int) -> subprocess.Popen:
    """A single-process job on all 4 chips (its worker brings the fabric up)."""
    proc = start_launch(
        qb2, "--tp-size", "4", "--mesh-layout", "single-process", "--job-id", job,
        "--summary-json", str(tmp_path / "summary.json"), *worker(f"pids={tmp_path}"), **kw,
    )  # fmt: skip
    wait_for(lambda: (tmp_path / "rank0.pid").exists(), what="the worker")
    host = Host(qb2)
    wait_for(lambda: host.sim.read_state()["fabric_marks"], what="the fabric to come up")
    return proc


def _finished(qb2: Path, tmp_path: Path, job: str, status: str) -> None:
    """Everything a finished job leaves: no process, healthy chips, no lease, no run dir."""
    wait_for(lambda: (record(job) or {}).get("ended"), timeout=20, what="the job's end")
    worker_pid = int((tmp_path / "rank0.pid").read_text())
    assert not alive(worker_pid)
    assert record(job)["status"] == status
    assert link_states(qb2) == {"up"}
    assert run_cli("check", "--root", str(qb2)).code == 0
    chips = [
        c["asic_id"] for c in json.loads(run_cli("ls", "--root", str(qb2), "--json").out)["chips"]
    ]
    assert leases.probe(Host(qb2), chips) == {}
    assert not (jobs.runs_dir() / job).exists()
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["source"] == "ttmesh" and status in summary["reason"]


def test_sigkill_of_ttmesh_its_guardian_finishes_the_job(qb2: Path, tmp_path: Path) -> None:
    job = f"killed-{os.getpid()}"
    err_file = tmp_path / "stderr"
    with err_file.open("w") as err:
        proc = _fabric_job(qb2, tmp_path, job, stderr=err, stdout=subprocess.DEVNULL)
        (guardian,) = psutil.Process(proc.pid).children()
        proc.kill()
        proc.wait()
        wait_for(lambda: not guardian.is_running() or guardian.status() == "zombie", timeout=20,
                 what="the guardian to finish")  # fmt: skip
    _finished(qb2, tmp_path, job, "launcher killed")
    text = err_file.read_text()
    assert "Traceback" not in text and "supervisor error" not in text
    assert "the launcher was killed: its guardian stopped the workers" in text
    assert "chips recovered and verified" in text


def test_sigkill_of_ttmesh_whose_readers_are_gone(qb2: Path, tmp_path: Path) -> None:
    """Its output pipes have no reader any more (a closed terminal, a killed pipeline): the
    guardian still finishes, silently, without a BrokenPipeError."""
    job = f"nopipe-{os.getpid()}"
    proc = _fabric_job(qb2, tmp_path, job)
    (guardian,) = psutil.Process(proc.pid).children()
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    proc.stderr.close()
    proc.kill()
    proc.wait()
    wait_for(lambda: not guardian.is_running() or guardian.status() == "zombie", timeout=20,
             what="the guardian to finish")  # fmt: skip
    _finished(qb2, tmp_path, job, "launcher killed")


def test_sigkill_of_ttmesh_as_its_ranks_have_ended(qb2: Path, tmp_path: Path) -> None:
    """ttmesh SIGKILLed after its ranks have all ended, before it took its guardian's verdict
    over (found by scripts/chaos.py): the guardian, which waits until the verdict is taken,
    finishes the job in its place, as it does while ranks run.

    ttmesh is stopped (SIGSTOP) while its ranks still run, so it cannot take the verdict over;
    it is killed once the guardian waits for it to (blocked reading the pipe the front answers
    on: the one blocking read a guardian makes). A guardian that ended anyway (it did before it
    waited to be taken over) would leave the job to nobody."""
    job = f"verdict-{os.getpid()}"
    go = tmp_path / "go"
    proc = start_launch(
        qb2, "--tp-size", "4", "--grace", "1", "--job-id", job,
        *worker(f"pids={tmp_path}", "fabric", f"await={go}", "fail-after=1:0.3:3"),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for(lambda: len(list(tmp_path.glob("rank*.pid"))) == 4, what="the workers")
        ranks = [int(p.read_text()) for p in tmp_path.glob("rank*.pid")]
        guardian = _guardian_of(proc.pid)
        assert guardian is not None
        os.kill(proc.pid, signal.SIGSTOP)
        go.touch()
        wait_for(lambda: not any(alive(p) for p in ranks), what="the ranks' end")
        wait_for(lambda: _waits_on_a_pipe(guardian), timeout=30,
                 what="the guardian waiting for its verdict to be taken")  # fmt: skip
        assert not _ended(guardian)
    finally:
        proc.kill()
        proc.wait()
    wait_for(lambda: (record(job) or {}).get("ended"), timeout=20, what="the end")
    assert str(record(job)["status"]).startswith("launcher killed")
    assert link_states(qb2) == {"up"}
    assert not (jobs.runs_dir() / job).exists()


def _waits_on_a_pipe(pid: int) -> bool:
    """The process is blocked reading a pipe (the kernel's wait channel says so)."""
    try:
        return "pipe_read" in Path(f"/proc/{pid}/wchan").read_text()
    except OSError:
        return False


def _ended(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_sigkill_of_the_guardian_ttmesh_recovers(qb2: Path, tmp_path: Path) -> None:
    job = f"guardian-{os.getpid()}"
    proc = _fabric_job(qb2, tmp_path, job)
    (guardian,) = psutil.Process(proc.pid).children()
    guardian.kill()
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGKILL, err
    assert "Traceback" not in err
    assert "chips recovered and verified" in err
    _finished(qb2, tmp_path, job, "supervisor killed")


ORPHAN_SWEEP = r"""
import os, sys, time
from ttmesh import procs
from ttmesh.launcher.attempt import front as supervisor

procs.set_subreaper()  # as the front is
child = os.fork()
if child == 0:  # the guardian's mpirun: it starts a rank, then dies (the guardian is gone)
    rank = os.fork()
    if rank == 0:
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(60)", sys.argv[1]])
    print(rank, flush=True)
    os._exit(0)
rank = int(sys.stdin.readline())
while not procs.is_zombie(child):  # its exit is complete: the rank is ours now
    time.sleep(0.01)
real, walks = procs.live_descendants, []

def missed_once(root):
    # The first walk read our children (the dying mpirun) just before the rank was handed
    # over, and mpirun's just after: nothing alive seen. Later walks are real.
    walks.append(root)
    return [] if len(walks) == 1 else real(root)

supervisor.procs.live_descendants = missed_once
supervisor._kill_tree(os.getpid())
print("alive" if not procs.is_zombie(rank) else "gone", len(walks), flush=True)
"""


def test_the_sweep_after_the_guardian_waits_for_orphans_still_being_handed_over(
    tmp_path: Path,
) -> None:
    """The front's sweep once the guardian is killed (``supervisor._kill_tree``): a walk of
    its tree can read the dying mpirun as a zombie just as mpirun's ranks are being
    re-parented to the front, and see nothing alive. The sweep still ends only when nothing is
    left to reap either, so those ranks are killed too (found by scripts/chaos.py under load:
    mpi-guardian-kill left four ranks running, "process left", links down)."""
    from conftest import TAG

    proc = subprocess.Popen(
        [sys.executable, "-c", ORPHAN_SWEEP, TAG], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
    )  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    rank = int(proc.stdout.readline())
    try:
        proc.stdin.write(f"{rank}\n")
        proc.stdin.flush()
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert out.split()[0] == "gone", out + err
        assert not alive(rank)
    finally:
        with contextlib.suppress(OSError):
            os.kill(rank, signal.SIGKILL)
        proc.kill()
        proc.wait()


def test_sighup_to_ttmesh_is_ttmeshs(qb2: Path, tmp_path: Path) -> None:
    proc = start_launch(qb2, "--tp-size", "2", *worker(f"pids={tmp_path}"))
    try:
        wait_for(lambda: len(list(tmp_path.glob("rank*.pid"))) == 2, what="the workers")
        proc.send_signal(signal.SIGHUP)
        _out, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
        proc.communicate()
    assert proc.returncode == 128 + signal.SIGHUP, err
    assert "ttmesh: hangup (SIGHUP): stopping every worker" in err
    assert "killed by SIGHUP" not in err and "rank 0" not in err.split("hangup")[-1]
    assert err.splitlines()[-1] == "ttmesh: exit 129: hangup (SIGHUP)"


@pytest.mark.parametrize(
    ("sig", "moment"),
    [(signal.SIGTERM, "preflight"), (signal.SIGINT, "recovery"), (signal.SIGHUP, "recovery")],
)
def test_a_stop_signal_between_attempts_stops_the_job(
    make_sim, runtime: Path, tmp_path: Path, sig: int, moment: str
) -> None:
    """SIGTERM, SIGHUP or Ctrl-C while ttmesh itself resets chips, before the start or after a
    crash (found by scripts/chaos.py): no guardian is there to handle it, yet the job ends as
    a stop does: exit 128 + signal, its record closed with why, its run directory removed. The
    stop waits for tt-smi's reset to end (one cut short loses the chips), saying so at once."""
    root = make_sim("quietbox2", reset_seconds=2.0)
    job = f"between-{moment}-{os.getpid()}"
    summary = tmp_path / "summary.json"
    args = ["--tp-size", "4", "--job-id", job, "--summary-json", str(summary)]
    if moment == "preflight":
        run_cli("sim", "fault", "--root", str(root), "link-down", "0000:01:00.0", "0000:03:00.0")
        args += ["--auto-reset", *worker("exit=0")]
        event = "resetting the chips first"
    else:
        args += worker("fabric", "fail-after=0:0.2:3")
        event = "resetting its chips"
    proc = start_launch(root, *args, stdout=subprocess.DEVNULL)
    try:
        assert proc.stderr is not None
        seen = ""
        while event not in seen:
            line = proc.stderr.readline()
            assert line, f"ttmesh ended before {event!r}"
            seen += line
        wait_for(lambda: _tt_smi_running(proc.pid), timeout=10, what="tt-smi resetting")
        proc.send_signal(sig)
        _out, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
        proc.communicate()
    how = {signal.SIGTERM: "terminated", signal.SIGINT: "interrupted", signal.SIGHUP: "hangup"}
    status = f"{how[sig]} ({signal.Signals(sig).name})"
    assert proc.returncode == 128 + sig, err
    assert err.splitlines()[-1] == f"ttmesh: exit {128 + sig}: {status}", err
    assert "Traceback" not in err
    rec = record(job) or {}
    assert (rec.get("status"), rec.get("code")) == (status, 128 + sig)
    assert not (jobs.runs_dir() / job).exists()  # removed by the job, not left to a sweep
    data = json.loads(summary.read_text())
    assert (data["code"], data["reason"]) == (128 + sig, status)
    # The attempts are those that ran (a stop between them is not one).
    assert [a["code"] for a in data["attempts"]] == ([] if moment == "preflight" else [3])
    asics = [
        c["asic_id"] for c in json.loads(run_cli("ls", "--root", str(root), "--json").out)["chips"]
    ]
    assert leases.probe(Host(root), asics) == {}
    name = signal.Signals(sig).name
    assert f"ttmesh: {name}: stopping once the reset (-r) and its check has ended" in err, err
    # tt-smi was left to finish its reset: the chips are back, none lost to the host.
    check = run_cli("check", "--root", str(root))
    assert check.code == 0, check.out + check.err


def _tt_smi_running(launcher: int) -> bool:
    """A tt-smi under ttmesh (its own session, a descendant) is running its reset."""
    try:
        children = psutil.Process(launcher).children(recursive=True)
    except psutil.Error:
        return False
    for p in children:
        with contextlib.suppress(psutil.Error):
            argv = p.cmdline()
            if "-r" in argv and any(a.endswith("tt-smi") for a in argv):
                return True
    return False


def _guardian_of(pid: int) -> int | None:
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(pid).children():
            return child.pid
    return None


def test_sigterm_as_the_guardian_is_forked_is_a_graceful_stop(qb2: Path, runtime: Path) -> None:
    """A SIGTERM the moment the guardian exists (found by scripts/chaos.py: one in five ended
    the front before its forwarders were installed, recorded as "launcher killed"): held until
    the front forwards it and the guardian handles it, every time."""
    for i in range(6):
        job = f"fork-{os.getpid()}-{i}"
        proc = start_launch(qb2, "--tp-size", "4", "--job-id", job, *worker("fabric"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
        try:
            while _guardian_of(proc.pid) is None and proc.poll() is None:
                pass
            proc.send_signal(signal.SIGTERM)
            _out, err = proc.communicate(timeout=30)
        finally:
            proc.kill()
            proc.communicate()
        assert proc.returncode == 128 + signal.SIGTERM, err
        assert (record(job) or {}).get("status") == "terminated (SIGTERM)", err
        assert "supervisor" not in err


# --------------------------------------------------------------------------- ps and JSON


def test_ps_shows_every_root_by_default(qb2: Path, make_sim, tmp_path: Path) -> None:
    other = make_sim("p150", name="other")
    job = f"ps-{os.getpid()}"
    proc = start_launch(qb2, "--tp-size", "1", "--job-id", job, *worker(f"pids={tmp_path}"))
    try:
        wait_for(lambda: (tmp_path / "rank0.pid").exists(), what="the worker")
        listed = json.loads(run_cli("ps", "--json").out)["jobs"]
        (mine,) = [j for j in listed if j["job"] == job]
        assert mine["root"] == str(qb2.resolve()) and mine["state"] == "running"
        # Wide enough that no cell is cut, whatever other jobs run on this machine meanwhile.
        text = run_cli("ps", env={"COLUMNS": "1000"}).out
        assert job in text and str(qb2.resolve()) in text
        assert job in run_cli("ps", "--root", str(qb2)).out
        assert job not in run_cli("ps", "--root", str(other)).out
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=20)
    # It ended: a plain ps still shows it (the last jobs to end are the ones looked for), ended.
    listed = json.loads(run_cli("ps", "--json").out)["jobs"]
    assert [j["state"] for j in listed if j["job"] == job] == ["ended"]
    ended = [j for j in json.loads(run_cli("ps", "--all", "--json").out)["jobs"] if j["job"] == job]
    assert ended and ended[0]["state"] == "ended" and ended[0]["code"] == 130
    assert "interrupted" in ended[0]["status"]


def test_a_record_that_is_a_fifo_or_nested_past_the_bound_is_skipped(runtime: Path) -> None:
    """A job record that is a FIFO hung ps forever (its open waits for a writer); one nested
    deeper than Python's parser recurses ended it with an internal error. Both are no
    record: ps lists the others."""
    folder = runtime / "ttmesh" / "jobs"
    folder.mkdir(parents=True, mode=0o700)
    (runtime / "ttmesh").chmod(0o700)
    os.mkfifo(folder / "fifo.json")
    (folder / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (folder / "fine.json").write_text(json.dumps({"job": "fine", "pid": 1, "started": 1.0,
                                                  "ended": time.time(), "code": 0}))  # fmt: skip
    res = run_cli("ps", "--all", "--json", timeout=30)
    assert res.code == 0, res.err
    assert [j["job"] for j in json.loads(res.out)["jobs"]] == ["fine"]


def test_json_with_a_byte_that_is_not_utf8_is_valid_utf8(qb2: Path) -> None:
    """A command line or --env value with byte 0xff (Python: the lone surrogate U+DCFF) was
    written into --dry-run --json as \\udcff, which UTF-8 and strict JSON readers refuse."""
    bad = os.fsdecode(b"\xff")
    argv = [sys.executable, "-m", "ttmesh", "launch", "--root", str(qb2), "--chips",
            "0000:01:00.0", "--dry-run", "--json", "--show-env", "--env", f"X=a{bad}",
            "--", "true", bad]  # fmt: skip
    res = subprocess.run(argv, capture_output=True, timeout=60)
    assert res.returncode == 0 and b"\\ud" not in res.stdout, res.stderr
    plan = json.loads(res.stdout.decode("utf-8"))
    assert plan["ranks"][0]["argv"][-1] == "\ufffd" and plan["ranks"][0]["env"]["X"] == "a\ufffd"


SLEEPER = (
    "import os, sys, time\n"
    "open(os.path.join(sys.argv[2], 'rank0.pid'), 'w').write(str(os.getpid()))\n"
    "time.sleep(120)\n"
)


def test_ps_says_a_stopped_job_and_writes_json_any_reader_decodes(
    qb2: Path, runtime: Path, tmp_path: Path
) -> None:
    """A job whose command line holds byte 0xff (not UTF-8: Python decodes it as the lone
    surrogate U+DCFF) was listed by ``ps --json`` as ``\\udcff``, which UTF-8 and strict JSON
    readers refuse: it is U+FFFD; the text shows the byte as ``\\xff``. A SIGSTOPped guardian
    left ps saying "running": the job is "stopped", naming the process and how to continue it."""
    job = f"stopped-{os.getpid()}"
    proc = start_launch(qb2, "--tp-size", "1", "--job-id", job, "--", sys.executable, "-c",
                        SLEEPER, "ttmesh-test-worker", str(tmp_path), os.fsdecode(b"\xff"))  # fmt: skip
    guardian = None
    try:
        wait_for(lambda: (tmp_path / "rank0.pid").exists() or proc.poll() is not None)
        res = subprocess.run([sys.executable, "-m", "ttmesh", "ps", "--json"], capture_output=True)
        assert res.returncode == 0 and b"\\ud" not in res.stdout, res.stdout
        (mine,) = [j for j in json.loads(res.stdout.decode("utf-8"))["jobs"] if j["job"] == job]
        assert mine["command"][-1] == "\ufffd" and mine["state"] == "running", mine
        assert mine["stopped"] == []
        assert "\\xff" in run_cli("ps", env={"COLUMNS": "1000"}).out
        guardian = mine["guardian"]
        os.kill(guardian, signal.SIGSTOP)
        wait_for(lambda: procs.state(guardian) == "T", what="the guardian stopped")
        (mine,) = [j for j in json.loads(run_cli("ps", "--json").out)["jobs"] if j["job"] == job]
        assert mine["state"] == "stopped", mine
        assert mine["stopped"] == [{"pid": guardian, "what": "guardian"}]
        text = run_cli("ps", env={"COLUMNS": "1000"})
        row = next(r for r in text.out.splitlines() if r.startswith(job))
        assert row.split()[1] == "stopped", text.out  # said short in the cell (ps JOB: whole)
        assert f"is stopped (guardian {guardian}:" in text.err, text.err
        assert f"kill -CONT {guardian}" in text.err and len(text.err.splitlines()) == 1, text.err
        one = run_cli("ps", job)  # the job in detail says the same, not "running"
        assert one.out.splitlines()[0].startswith(f"job {job}: stopped (guardian {guardian}"), (
            one.out
        )
        assert f"kill -CONT {guardian}" in one.out.splitlines()[0], one.out
    finally:
        if guardian is not None:
            os.kill(guardian, signal.SIGCONT)
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=20)


@pytest.mark.parametrize(
    "args",
    [
        ["ls", "--json", "--root", "/nonexistent"],
        ["check", "--json", "--root", "/nonexistent"],
        ["reset", "--json", "--root", "/nonexistent"],
        ["ps", "--json", "--root", "/nonexistent"],
        ["sim", "show", "--json", "--root", "/nonexistent"],
        ["launch", "--json", "--dry-run", "--root", "/nonexistent", "--tp-size", "1", "true"],
        ["launch", "--json", "--dry-run", "--sim", "nosuch", "--tp-size", "1", "true"],
    ],
)
def test_json_failures_are_documents(args: list[str]) -> None:
    res = run_cli(*args)
    assert res.code == 2, res.err
    doc = json.loads(res.out)
    assert doc["schema"] == "ttmesh.error/1" and doc["code"] == 2
    line = one_line(res.err)
    assert line == f"ttmesh: {doc['message']}" + (f" ({doc['hint']})" if doc["hint"] else "")


def test_a_launched_commands_json_flag_is_not_ttmeshs(qb2: Path) -> None:
    res = run_cli("launch", "--root", str(qb2), "--tp-size", "99", "true", "--json")
    assert res.code == 2 and res.out == ""


# --------------------------------------------------------------------------- silent acceptances


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (
            ["--tp-size", "2", "--ranks-filter", "0,7"],
            "--ranks-filter 0,7: no rank 7 in a job of 2",
        ),
        (["--tp-size", "2", "--chips", ""], "--chips '': no chip named"),
        (["--tp-size", "2", "--chips", f"{C01},{C01}"], "duplicate chip 0000:01:00.0"),
        (
            ["--tp-size", "1", "--workdir", "/nonexistent/dir"],
            "--workdir /nonexistent/dir: no such directory",
        ),
        (["--tp-size", "1", "--tt-smi", str(REPO / "README.md")], "is not an executable file"),
        (["--mesh-layout", "mesh", "--rank-binding", "b.yaml"], "--rank-binding and --mesh-layout"),
    ],
)
def test_silent_acceptances_are_refused(qb2: Path, args: list[str], needle: str) -> None:
    res = run_cli("launch", "--root", str(qb2), *args, *worker("exit=0"))
    assert res.code == 2, res.err
    assert needle in one_line(res.err)
    assert not Path("/nonexistent").exists()


def test_empty_sim_is_refused_not_the_real_host() -> None:
    res = run_cli("ls", "--sim", "")
    assert res.code == 2
    assert "--sim '': no system named" in one_line(res.err)


def test_check_mesh_layout_needs_active(qb2: Path) -> None:
    res = run_cli("check", "--root", str(qb2), "--mesh-layout", "mesh")
    assert res.code == 2
    assert "--mesh-layout goes with --active" in one_line(res.err)


def test_script_that_is_a_directory(qb2: Path, tmp_path: Path) -> None:
    (tmp_path / "train.py").mkdir()
    res = run_cli("launch", "--root", str(qb2), "--tp-size", "1", str(tmp_path / "train.py"))
    assert res.code == 2
    assert "is a directory" in one_line(res.err)


# --------------------------------------------------------------------------- messages


def test_fix_lines_name_the_host_as_the_user_did_and_run_as_printed(tmp_path: Path) -> None:
    assert run_cli("sim", "fault", "--sim", "quietbox2", "chip-dead", C03).code == 0
    res = run_cli("check", "--sim", "quietbox2")
    assert res.code == 1
    fixes = [ln.split("fix: ", 1)[1] for ln in res.out.splitlines() if "fix: " in ln]
    assert fixes and all("--sim quietbox2" in f and "..." not in f for f in fixes), fixes
    assert str(tmp_path) not in res.out  # no cache path
    refused = run_cli("launch", "--sim", "quietbox2", "--tp-size", "4", "true")
    assert refused.code == 3
    line = one_line(refused.err)
    assert "..." not in line and "--auto-reset" in line and "--sim quietbox2" in line
    # The fix runs as printed.
    fix = fixes[0].split()
    assert fix[0] == "ttmesh"
    assert run_cli(*fix[1:]).code == 0
    assert run_cli("check", "--sim", "quietbox2").code == 0


def test_preflight_refusal_mentions_auto_reset(qb2: Path) -> None:
    assert run_cli("sim", "fault", "--root", str(qb2), "link-down", C01, C05).code == 0
    res = run_cli("launch", "--root", str(qb2), "--tp-size", "4", "true")
    assert res.code == 3
    line = one_line(res.err)
    assert line.startswith("ttmesh: pre-flight: ") and "or add --auto-reset" in line


def test_check_prints_each_problem_once(qb2: Path) -> None:
    assert run_cli("sim", "fault", "--root", str(qb2), "link-down", C01, C05).code == 0
    res = run_cli("check", "--root", str(qb2))
    assert res.code == 1
    what = "2 of 2 links between 0000:01:00.0 and 0000:05:00.0 are down"
    assert (res.out + res.err).count(what) == 1, res.out + res.err
    assert res.err.splitlines()[-1] == "ttmesh: unhealthy: 1 error (each with its fix above)"


def test_refused_reset_counts_the_leased_chips(qb2: Path) -> None:
    host = Host(qb2)
    chips = json.loads(run_cli("ls", "--root", str(qb2), "--json").out)["chips"]
    two = [c["asic_id"] for c in chips if c["bdf"] in (C05, C07)]
    with leases.acquire(host, two, "other-job", cmd="x"):
        res = run_cli("reset", "--root", str(qb2))
    assert res.code == 3
    line = res.err.splitlines()[-1]
    assert f"2 of the 4 chips to reset are leased (2 by job other-job of user {ME})" in line, line


def test_hanging_reset_does_not_say_ok(qb2: Path) -> None:
    assert run_cli("sim", "fault", "--root", str(qb2), "reset-hangs", "30").code == 0
    t0 = time.monotonic()
    res = run_cli("reset", "--root", str(qb2), "--timeout", "0.3", "--retries", "0")
    assert time.monotonic() - t0 < 15
    assert res.code == 1
    rows = [ln.split() for ln in res.out.splitlines() if ln.startswith("0000:")]
    assert len(rows) == 4 and all(r[2:5] == ["ok", "not", "reset"] for r in rows), res.out
    assert "NOT RECOVERED after 1 attempt" in res.out
