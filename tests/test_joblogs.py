"""A job you can look back on (issue 37): every job keeps its output with its record, bounded
(per stream a head and a tail, per job, across jobs), private, never through a link;
``ttmesh logs JOB`` prints it (ranks merged, ``--rank``, ``--stream``, ``--tail``, ``--since``,
``--follow``), ``ttmesh ps JOB`` says what happened, and ``--summary-json`` says the same."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, run_cli, start_launch, wait_for

WORKER = str(REPO / "tests" / "workers" / "tw.py")
PY = sys.executable


def _env(runtime: Path, **more: str) -> dict[str, str]:
    return {"XDG_RUNTIME_DIR": str(runtime), **more}


# --------------------------------------------------------------------------- the store


def test_a_stream_keeps_its_head_and_its_tail_within_its_share(runtime: Path) -> None:
    from ttmesh.runtime import joblogs

    logs = joblogs.JobLogs.create("big", joblogs.Limits(job=6 * 1024 * 1024))
    attempt = logs.attempt(0, ["0"])
    assert attempt is not None
    log = attempt.stream("0", "stdout")
    assert log is not None
    share = attempt.share
    lines = [f"line {i:07d} ".encode() + b"x" * 80 + b"\n" for i in range(200_000)]
    for i in range(0, len(lines), 100):  # blocks of whole lines, as the console hands them
        log.write(b"".join(lines[i : i + 100]))
    attempt.close()
    logs.close()
    owner = runtime / "ttmesh" / "logs" / "big" / "attempt_0" / "0"
    files = sorted(p.name for p in owner.iterdir())
    kept = sum(p.stat().st_size for p in owner.iterdir() if p.name.startswith("stdout.log"))
    assert kept <= share, (kept, share)  # a share: the head and at most two tail segments
    assert len([f for f in files if f.startswith("stdout.log.")]) <= 2, files
    # Private: the job's directories 0700, its files 0600.
    assert stat.S_IMODE((runtime / "ttmesh" / "logs" / "big").stat().st_mode) == 0o700
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in owner.iterdir())
    from ttmesh.runtime import logread

    kept_back = logread.read("big")
    assert kept_back is not None
    stream = kept_back.attempts[0]["0"]["stdout"]
    pieces = list(stream.read(0, stream.end))
    kept_back.close()
    first = pieces[0][1]
    assert isinstance(first, bytes) and first.startswith(lines[0])  # the head: the first lines
    last = pieces[-1][1]
    assert isinstance(last, bytes) and last.endswith(lines[-1])  # the tail: the last lines
    cut = [n for _, n in pieces if isinstance(n, int)]
    total = sum(len(line) for line in lines)
    assert cut and sum(cut) + sum(len(d) for _, d in pieces if isinstance(d, bytes)) == total


def test_logs_say_what_was_cut_and_merge_ranks_by_time(runtime: Path) -> None:
    from ttmesh.cli import logs as cli_logs
    from ttmesh.runtime import joblogs, jobs

    jobs.write(
        {
            "job": "m",
            "pid": os.getpid(),
            "started": time.time(),
            "ended": time.time(),
            "ranks": [{}, {}],
        }
    )
    logs = joblogs.JobLogs.create("m")
    attempt = logs.attempt(0, ["0", "1"])
    assert attempt is not None
    r0, r1 = attempt.stream("0", "stdout"), attempt.stream("1", "stdout")
    assert r0 is not None and r1 is not None
    r0.write(b"a first\n")
    r0.flush(now=100.0, force=True)
    r1.write(b"b second\n")
    r1.flush(now=101.0, force=True)
    r0.write(b"a third\n")
    r0.flush(now=102.0, force=True)
    attempt.close()
    logs.close()
    sources = cli_logs._sources("m", None)
    every = cli_logs.collect(sources, cli_logs.Shown(None, None, "both", None))
    assert cli_logs.render(every, None) == [b"[r0] a first", b"[r1] b second", b"[r0] a third"]
    assert cli_logs.render(every, 1) == [b"[r0] a third"]
    every.close()
    later = cli_logs.collect(sources, cli_logs.Shown(None, None, "both", 100.5))
    assert cli_logs.render(later, None) == [b"[r1] b second", b"[r0] a third"]
    later.close()
    one = cli_logs.collect(sources, cli_logs.Shown(1, None, "both", None))
    assert cli_logs.render(one, None) == [b"b second"]  # one rank: no prefix
    one.close()


def test_what_was_cut_is_said_once_however_many_seconds_it_spans(runtime: Path) -> None:
    """A rank that prints fast for seconds has its middle dropped across many index entries
    (one a second): the reader said one "not kept" line per second of it, six in a row for a
    5-second flood; the cut is one stretch of bytes, said once, with its whole size."""
    from ttmesh.cli import logs as cli_logs
    from ttmesh.runtime import joblogs, jobs

    now = time.time()
    jobs.write({"job": "fast", "pid": os.getpid(), "started": now, "ended": now, "ranks": [{}]})
    logs = joblogs.JobLogs.create("fast", joblogs.Limits(job=6 * 1024 * 1024))
    attempt = logs.attempt(0, ["0"])
    assert attempt is not None
    log = attempt.stream("0", "stdout")
    assert log is not None
    line = b"y" * 99 + b"\n"
    total = 0
    for second in range(8):  # 8 MiB a "second": far past the share, an index entry each
        for _ in range(80):
            log.write(line * 1048)
            total += len(line) * 1048
        log.flush(now=100.0 + second, force=True)
    attempt.close()
    logs.close()
    every = cli_logs.collect(
        cli_logs._sources("fast", None), cli_logs.Shown(None, None, "both", None)
    )
    out = cli_logs.render(every, None)
    every.close()
    notes = [i for i, ln in enumerate(out) if ln.startswith(b"ttmesh: ")]
    assert len(notes) == 1, [out[i] for i in notes]
    assert sum(len(ln) + 1 for i, ln in enumerate(out) if i not in notes) < total
    assert all(ln == line[:-1] for i, ln in enumerate(out) if i not in notes)


def test_since_reads_durations_and_times() -> None:
    from ttmesh.cli.logs import parse_since
    from ttmesh.errors import TTMeshError

    now = time.time()
    assert abs(parse_since("10m") - (now - 600)) < 5
    assert abs(parse_since("90") - (now - 90)) < 5
    assert parse_since("2026-12-05T14:05:00") > 0
    for bad in ("nan", "-5m", "1e9999", "10x", "25:00", "", "五分"):
        with pytest.raises(TTMeshError) as err:
            parse_since(bad)
        assert err.value.code == 2


def test_retention_removes_logs_without_a_record_then_the_oldest_past_the_bytes(
    runtime: Path,
) -> None:
    from ttmesh.runtime import joblogs, jobs

    for i, job in enumerate(("old", "mid", "new", "orphan")):
        if job != "orphan":
            now = time.time()
            jobs.write({"job": job, "pid": os.getpid(), "started": now, "ended": now + i})
        logs = joblogs.JobLogs.create(job)
        attempt = logs.attempt(0, ["0"])
        assert attempt is not None
        log = attempt.stream("0", "stdout")
        assert log is not None
        log.write(b"y" * 299 + b"\n")
        attempt.close()
        logs.close()
        os.utime(logs.path, (1000.0 + i, 1000.0 + i))
    sizes = joblogs.sizes()
    one = sizes["new"][1]
    removed = joblogs.prune(joblogs.Limits(every=2 * one + one // 2))
    assert sorted(removed) == ["old", "orphan"]
    assert sorted(os.listdir(runtime / "ttmesh" / "logs")) == ["mid", "new"]


def test_a_link_planted_for_a_log_file_is_never_read(runtime: Path, tmp_path: Path) -> None:
    from ttmesh.cli import logs as cli_logs
    from ttmesh.runtime import joblogs, jobs

    secret = tmp_path / "secret"
    secret.write_text("do not show me\n")
    jobs.write(
        {
            "job": "l",
            "pid": os.getpid(),
            "started": time.time(),
            "ended": time.time(),
            "ranks": [{}],
        }
    )
    logs = joblogs.JobLogs.create("l")
    attempt = logs.attempt(0, ["0"])
    assert attempt is not None
    attempt.close()
    logs.close()
    owner = runtime / "ttmesh" / "logs" / "l" / "attempt_0" / "0"
    owner.mkdir(exist_ok=True)
    (owner / "stdout.log").symlink_to(secret)
    snap = cli_logs.collect(cli_logs._sources("l", None), cli_logs.Shown(None, None, "both", None))
    assert b"do not show me" not in b"\n".join(cli_logs.render(snap, None))
    snap.close()


def test_writing_stops_before_the_file_system_fills(
    runtime: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ttmesh.runtime import joblogs

    logs = joblogs.JobLogs.create("full")
    attempt = logs.attempt(0, ["0"])
    assert attempt is not None
    log = attempt.stream("0", "stderr")
    assert log is not None
    log.write(b"before\n")

    class Full:
        f_bavail, f_frsize, f_blocks = 10, 4096, 1 << 20

    monkeypatch.setattr(joblogs.os, "fstatvfs", lambda fd: Full())
    for _ in range(4):
        log.write(b"z" * (joblogs.SPACE_EVERY // 2 - 1) + b"\n")
    attempt.close()
    logs.close()
    text = (runtime / "ttmesh" / "logs" / "full" / "attempt_0" / "0" / "stderr.log").read_bytes()
    # Free space is looked at every SPACE_EVERY bytes: at most that much more is written.
    assert text.startswith(b"before\n") and len(text) < joblogs.SPACE_EVERY + 200
    assert b"[ttmesh: the file system has only 0 MiB free" in text


def test_bad_bounds_are_bad_input() -> None:
    from ttmesh.errors import TTMeshError
    from ttmesh.runtime import joblogs

    for key, value in (("TTMESH_JOB_LOG_MB", "nan"), ("TTMESH_LOGS_MB", "0"),
                       ("TTMESH_JOB_LOG_MB", "1e400")):  # fmt: skip
        with pytest.raises(TTMeshError) as err:
            joblogs.limits({key: value})
        assert err.value.code == 2 and key in err.value.message


# --------------------------------------------------------------------------- a job, end to end


def test_an_ended_job_keeps_its_output_its_record_and_its_summary(
    qb2: Path, runtime: Path, tmp_path: Path
) -> None:
    """One failing 2-rank job: ttmesh logs (merged, --rank, --stream, --tail), ps JOB, ps, the
    record and --summary-json all say what happened, where and when."""
    summary = tmp_path / "s.json"
    done = tmp_path / "done"  # rank 1 fails once rank 0 has said everything
    script = (
        "import os, sys, time; r = os.environ['RANK']; print('out of', r, flush=True); "
        "print('trouble on', r, file=sys.stderr, flush=True)\n"
        f"if r == '0': open({str(done)!r}, 'w').close(); sys.exit(0)\n"
        f"while not os.path.exists({str(done)!r}): time.sleep(0.01)\n"
        "sys.exit(3)"
    )
    env = _env(runtime)
    res = run_cli(
        "launch", "--root", str(qb2), "--tp-size", "2", "--job-id", "look",
        "--summary-json", str(summary), "--", PY, "-c", script, env=env,
    )  # fmt: skip
    assert res.code == 3, res.err
    logs = run_cli("logs", "look", env=env)
    assert logs.code == 0, logs.err
    assert sorted(logs.out.splitlines()) == sorted(
        ["[r0] out of 0", "[r0] trouble on 0", "[r1] out of 1", "[r1] trouble on 1"]
    )
    assert run_cli("logs", "look", "--rank", "1", "--stream", "stderr", env=env).out == (
        "trouble on 1\n"
    )
    assert len(run_cli("logs", "look", "--tail", "1", env=env).out.splitlines()) == 1
    bad = run_cli("logs", "look", "--rank", "7", env=env)
    assert bad.code == 2 and "job look has 2 ranks" in bad.err
    bad = run_cli("logs", "look", "--attempt", "9", env=env)
    assert bad.code == 2 and "job look keeps the output of attempts 1" in bad.err
    assert run_cli("logs", "look", "--attempt", "1", "--rank", "0", env=env).out == (
        "out of 0\ntrouble on 0\n"
    )
    detail = run_cli("ps", "look", env=env)
    assert detail.code == 0, detail.err
    for want in ("job look: ended: rank 1 exited with code 3 (exit 3)", "user ", "host ",
                 "chips: 0000:01:00.0, 0000:03:00.0", "1: ", "exit 3",
                 "(ttmesh logs look)", "last lines of rank 1's stderr", "trouble on 1"):  # fmt: skip
        assert want in detail.out, (want, detail.out)
    record = json.loads(run_cli("ps", "look", "--json", env=env).out)["jobs"][0]
    data = json.loads(summary.read_text())
    assert data["schema"] == "ttmesh.summary/1"
    for doc in (record, data):
        assert doc["job"] == "look" and doc["host"] and doc["user"] and doc["uid"] == os.getuid()
        assert doc["chips"] == ["0000:01:00.0", "0000:03:00.0"] and doc["profile"] is None
        assert doc["started"] <= doc["attempts"][0]["started"] <= doc["attempts"][0]["ended"]
        assert doc["attempts"][0]["ended"] <= doc["ended"]
        assert doc["restarts"] == [] and doc["resets"] == [] and "phases" not in doc
        assert doc["logs"] == str(runtime / "ttmesh" / "logs" / "look")
        assert doc["code"] == 3 and doc["diagnosis"] is None
        assert doc["command"][:2] == [PY, "-c"] and doc["root"] == str(qb2)
    listed = run_cli("ps", env=env)  # a plain ps shows the job that just ended, and how
    assert "look" in listed.out and " rank 1 exit 3 " in listed.out  # said short, never cut


def test_a_stream_that_says_nothing_leaves_no_files(qb2: Path, runtime: Path) -> None:
    """A stream's kept files are made by its first bytes: a launch opens none before its
    ranks start, and a silent stream has none; the job's logs read the same."""
    env = _env(runtime)
    script = "import os; r = os.environ['RANK']\nif r == '1': print('only', r)"
    res = run_cli("launch", "--root", str(qb2), "--tp-size", "2", "--job-id", "hush", "--",
                  PY, "-c", script, env=env)  # fmt: skip
    assert res.code == 0, res.err
    attempt = runtime / "ttmesh" / "logs" / "hush" / "attempt_0"
    made = sorted(str(p.relative_to(attempt)) for p in attempt.rglob("*") if p.is_file())
    assert made == ["1/stdout.idx", "1/stdout.log"], made
    logs = run_cli("logs", "hush", env=env)
    assert logs.code == 0 and logs.out == "[r1] only 1\n", (logs.out, logs.err)
    assert run_cli("logs", "hush", "--rank", "0", env=env).out == ""


def test_no_logs_keeps_none_and_says_so(qb2: Path, runtime: Path) -> None:
    env = _env(runtime)
    res = run_cli("launch", "--root", str(qb2), "--tp-size", "1", "--job-id", "quiet",
                  "--no-logs", "--", PY, "-c", "print('x')", env=env)  # fmt: skip
    assert res.code == 0, res.err
    assert not (runtime / "ttmesh" / "logs" / "quiet").exists()
    logs = run_cli("logs", "quiet", env=env)
    assert logs.code == 2 and "kept no output" in logs.err and "--no-logs" in logs.err
    assert "logs: none kept (--no-logs)" in run_cli("ps", "quiet", env=env).out
    nothing = run_cli("logs", "nosuch", env=env)
    assert nothing.code == 2 and "no job 'nosuch' of yours" in nothing.err


def test_follow_prints_new_output_and_ends_with_the_job(
    qb2: Path, runtime: Path, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    env = _env(runtime)
    job = start_launch(
        qb2, "--tp-size", "1", "--job-id", "tailme", "--", PY, WORKER, "ttmesh-test-worker",
        "say=before", f"await={go}", "say=after", "exit=0", env=env,
    )  # fmt: skip
    follow = None
    try:
        wait_for(lambda: b"before" in _kept(runtime, "tailme"), 30, "the first line kept")
        follow = subprocess.Popen(
            [PY, "-m", "ttmesh", "logs", "tailme", "--follow"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, **env},
        )  # fmt: skip
        assert follow.stdout is not None
        assert follow.stdout.readline() == "before from rank 0\n"
        go.touch()
        assert follow.stdout.readline() == "after from rank 0\n"
        out, err = follow.communicate(timeout=30)  # it ends by itself, with the job
        assert follow.returncode == 0, err
        assert out == ""
    finally:
        go.touch()
        job.communicate(timeout=30)
        if follow is not None and follow.poll() is None:
            follow.kill()
            follow.wait()


def _kept(runtime: Path, job: str) -> bytes:
    path = runtime / "ttmesh" / "logs" / job / "attempt_0" / "0" / "stdout.log"
    try:
        return path.read_bytes()
    except OSError:
        return b""


# --------------------------------------------------------------------------- ps, fleets


def test_ps_cells_keep_identities_short_and_the_last_ended_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ttmesh.cli import ps
    from ttmesh.sim.roots import cache_root

    assert ps.chips_cell([]) == "-"
    assert ps.chips_cell(["0000:01:00.0"]) == "0000:01:00.0"
    assert ps.chips_cell(["0000:01:00.0", "0000:03:00.0", "0000:05:00.0"]) == "0000:01:00.0 +2"
    assert ps.root_cell(str(cache_root() / "quietbox2")) == "--sim quietbox2"
    assert ps.root_cell("/tmp/qb2") == "/tmp/qb2"
    assert "\x1b" not in ps.root_cell("/tmp/\x1b[31mx")  # never raw escapes
    records = [{"job": f"e{i}", "ended": float(i + 1)} for i in range(6)] + [{"job": "run"}]
    assert [r["job"] for r in ps.recent(records)] == ["e3", "e4", "e5", "run"]
    assert [r["job"] for r in ps.recent(records[4:])] == ["e4", "e5", "run"]  # fewer than 3
    assert [r["job"] for r in ps.recent(records, 0)] == ["run"]
    long = {"code": 3, "ended": 1.0}
    assert ps.short_state("rank 12 exited with code 134", long) == "rank 12 exit 134"
    assert ps.short_state("hung in bring-up: ranks 0, 1 not ready after 2 s", long) == (
        "hung in bring-up"
    )
    assert ps.short_state("ttmesh killed (its processes are gone)", long) == "ttmesh killed"
    assert ps.short_state("x" * 40, long) == "exit 3" and ps.short_state("running", {}) == "running"


def test_a_fleets_logs_are_its_replicas_by_replica(runtime: Path) -> None:
    from ttmesh.cli import logs as cli_logs
    from ttmesh.errors import TTMeshError
    from ttmesh.runtime import joblogs, jobs

    now = time.time()
    replicas = [{"replica": k, "job": f"fl-r{k}"} for k in (0, 1)]
    jobs.write({"job": "fl", "pid": os.getpid(), "started": now, "ended": now,
                "layout": "fleet", "fleet": {"replicas": replicas}})  # fmt: skip
    for k in (0, 1):
        jobs.write({"job": f"fl-r{k}", "pid": os.getpid(), "started": now, "ended": now,
                    "ranks": [{}]})  # fmt: skip
        logs = joblogs.JobLogs.create(f"fl-r{k}")
        attempt = logs.attempt(0, ["0"])
        assert attempt is not None
        log = attempt.stream("0", "stdout")
        assert log is not None
        log.write(f"served by {k}\n".encode())
        log.flush(now=100.0 + k, force=True)
        attempt.close()
        logs.close()
    both = cli_logs.collect(cli_logs._sources("fl", None), cli_logs.Shown(None, None, "both", None))
    assert cli_logs.render(both, None) == [b"[replica0] served by 0", b"[replica1] served by 1"]
    both.close()
    one = cli_logs.collect(cli_logs._sources("fl", 1), cli_logs.Shown(None, None, "both", None))
    assert cli_logs.render(one, None) == [b"served by 1"]
    one.close()
    with pytest.raises(TTMeshError) as err:
        cli_logs._sources("fl", 5)
    assert err.value.code == 2 and "fleet fl has 2 replicas" in err.value.message
