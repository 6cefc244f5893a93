"""Output as torchrun gives it (issue 23): Python ranks unbuffered, torchrun's line prefix
template, --redirects / --tee / --log-dir in torchrun's layout, --local-ranks-filter, and the
gloo teardown abort explained.

Driven as pytorch's own launcher tests drive torchrun (test/distributed/launcher/ and
test/distributed/elastic/multiprocessing/): a script per rank, the launcher's flags, then the
console and the log directory read back. This machine sets PYTHONUNBUFFERED=1 in every shell,
and users' shells do not: every test here says which it runs with.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_cli, start_launch, users_shell

from ttmesh.launcher.attempt import failures


def launch(
    qb2: Path, *args: str, env: dict[str, str], timeout: float = 60
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ttmesh", "launch", "--root", str(qb2), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


def script(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# --------------------------------------------------------------------------- unbuffered


def test_a_ranks_print_arrives_while_it_runs(qb2: Path, tmp_path: Path) -> None:
    """The rank prints, then waits for a file the test makes only once it has seen the line:
    buffered, the line would come at the rank's exit, after its wait gave up (exit 9)."""
    release = tmp_path / "release"
    worker = script(
        tmp_path,
        "wait.py",
        "import os, sys, time\n"
        "print('hello from rank', os.environ['RANK'])\n"
        f"for _ in range(600):\n"
        f"    if os.path.exists({str(release)!r}):\n"
        "        sys.exit(0)\n"
        "    time.sleep(0.05)\n"
        "sys.exit(9)\n",
    )
    proc = start_launch(qb2, "--tp-size", "1", worker, unset=("PYTHONUNBUFFERED",))
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        release.touch()
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert first == "[r0] hello from rank 0\n", (first, err)
    assert proc.returncode == 0, err


@pytest.mark.parametrize("how", ["script", "python-after-dashes", "module"])
def test_a_sigkilled_rank_keeps_its_last_lines(qb2: Path, tmp_path: Path, how: str) -> None:
    """torchrun's python -u: what a rank printed before SIGKILL is on the console, for a
    script, a `python x.py` command after --, and -m."""
    (tmp_path / "killme.py").write_text(
        "import os, signal\n"
        "print('step 1')\n"
        "print('step 2: about to be killed')\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    command = {
        "script": [str(tmp_path / "killme.py")],
        "python-after-dashes": ["--", sys.executable, str(tmp_path / "killme.py")],
        "module": ["-m", "killme"],
    }[how]
    env = users_shell(PYTHONPATH=str(tmp_path))
    res = launch(qb2, "--tp-size", "1", *command, env=env)
    assert res.returncode == 137, res.stderr
    assert res.stdout.splitlines() == ["[r0] step 1", "[r0] step 2: about to be killed"], res


def test_the_users_own_pythonunbuffered_is_kept(qb2: Path, tmp_path: Path) -> None:
    """Set by the user (even empty, in the shell or with --env): left as it is."""
    probe = ["--", sys.executable, "-c",
             "import os; print(repr(os.environ.get('PYTHONUNBUFFERED')))"]  # fmt: skip
    res = launch(qb2, "--tp-size", "1", *probe, env=users_shell())
    assert res.stdout == "[r0] '1'\n", res.stderr
    res = launch(qb2, "--tp-size", "1", *probe, env=users_shell(PYTHONUNBUFFERED=""))
    assert res.stdout == "[r0] ''\n", res.stderr
    res = launch(qb2, "--tp-size", "1", "--env", "PYTHONUNBUFFERED=x", *probe, env=users_shell())
    assert res.stdout == "[r0] 'x'\n", res.stderr
    # The dry run says so: ttmesh adds it.
    res = launch(qb2, "--tp-size", "1", "--dry-run", "--json", *probe, env=users_shell())
    assert json.loads(res.stdout)["ranks"][0]["env"]["PYTHONUNBUFFERED"] == "1", res.stderr


# --------------------------------------------------------------------------- the prefix


def test_torchruns_line_prefix_template(qb2: Path, tmp_path: Path) -> None:
    template = "[rank${rank}|${local_rank}|${role_name}|$unknown]: "
    res = launch(qb2, "--tp-size", "2", "--", sys.executable, "-c",
                 "import os, sys; print('out', os.environ['RANK']); "
                 "print('err', os.environ['RANK'], file=sys.stderr)",
                 env=users_shell(TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE=template))  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert sorted(res.stdout.splitlines()) == [
        "[rank0|0|default|$unknown]: out 0",
        "[rank1|1|default|$unknown]: out 1",
    ]
    assert "[rank1|1|default|$unknown]: err 1" in res.stderr.splitlines()


# --------------------------------------------------------------------------- redirects, tee


SAY = (
    "import os, sys\n"
    "r = os.environ['RANK']\n"
    "print('out of', r, 'attempt', os.environ['TORCHELASTIC_RESTART_COUNT'])\n"
    "print('err of', r, file=sys.stderr)\n"
    "sys.exit(int(sys.argv[1]) if r == '0' and os.environ['TORCHELASTIC_RESTART_COUNT'] == '0' else 0)\n"
)


def run_dir(logs: Path, job: str) -> Path:
    (found,) = logs.glob(f"{job}_*")
    return found


def test_redirects_both_streams_to_torchruns_layout(qb2: Path, tmp_path: Path) -> None:
    """torchrun -r 3 --log-dir DIR: nothing of the ranks on the console; every stream in
    DIR/<run id>_<random>/attempt_0/<local rank>/."""
    logs = tmp_path / "logs"
    worker = script(tmp_path, "say.py", SAY)
    res = launch(qb2, "--tp-size", "2", "--job-id", "myjob", "-r", "3", "--log-dir", str(logs),
                 worker, "0", env=users_shell())  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stdout == ""
    assert "out of" not in res.stderr and "err of" not in res.stderr
    base = run_dir(logs, "myjob")
    assert f"ttmesh: the ranks' logs: {base}/attempt_N/" in res.stderr
    for rank in (0, 1):
        where = base / "attempt_0" / str(rank)
        assert (where / "stdout.log").read_text() == f"out of {rank} attempt 0\n"
        assert (where / "stderr.log").read_text() == f"err of {rank}\n"
    assert os.stat(base).st_mode & 0o777 == 0o700  # tempfile.mkdtemp's, as torchrun's


def test_per_rank_redirects_and_tee(qb2: Path, tmp_path: Path) -> None:
    """--redirects 0:1,1:2: rank 0's stdout and rank 1's stderr leave the console; --tee
    1:3 keeps rank 1's on it (tee wins, as in torchrun)."""
    logs = tmp_path / "logs"
    worker = script(tmp_path, "say.py", SAY)
    res = launch(qb2, "--tp-size", "2", "--job-id", "j", "--redirects", "0:1,1:2",
                 "--log-dir", str(logs), worker, "0", env=users_shell())  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == ["[r1] out of 1 attempt 0"]
    assert "[r0] err of 0" in res.stderr and "err of 1" not in res.stderr
    base = run_dir(logs, "j") / "attempt_0"
    assert (base / "0" / "stdout.log").read_text() == "out of 0 attempt 0\n"
    assert (base / "1" / "stderr.log").read_text() == "err of 1\n"
    res = launch(qb2, "--tp-size", "2", "-r", "0:1,1:2", "-t", "1:3", "--log-dir",
                 str(tmp_path / "l2"), worker, "0", env=users_shell())  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == ["[r1] out of 1 attempt 0"]
    assert "[r1] err of 1" in res.stderr and "err of 0" in res.stderr


def test_a_restart_is_the_next_attempt_dir(qb2: Path, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    worker = script(tmp_path, "say.py", SAY)
    res = launch(qb2, "--tp-size", "2", "--job-id", "rj", "--max-restarts", "1", "--tee", "3",
                 "--log-dir", str(logs), worker, "5", env=users_shell())  # fmt: skip
    assert res.returncode == 0, res.stderr
    base = run_dir(logs, "rj")
    assert sorted(p.name for p in base.iterdir()) == ["attempt_0", "attempt_1"]
    assert (base / "attempt_1" / "0" / "stdout.log").read_text() == "out of 0 attempt 1\n"
    # (rank 1 of attempt 0 may be stopped before it prints: rank 0 fails at once)
    assert (base / "attempt_0" / "0" / "stdout.log").read_text() == "out of 0 attempt 0\n"
    assert (base / "attempt_1" / "1" / "stdout.log").read_text() == "out of 1 attempt 1\n"


def test_redirects_without_a_log_dir_go_to_a_temporary_one(qb2: Path, tmp_path: Path) -> None:
    """torchrun makes /tmp/torchelastic_*: so does ttmesh, and it says where."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    worker = script(tmp_path, "say.py", SAY)
    res = launch(qb2, "--tp-size", "1", "--job-id", "t", "--redirects", "1", worker, "0",
                 env=users_shell(TMPDIR=str(tmp)))  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stdout == ""
    (base,) = tmp.glob("torchelastic_*/t_*")
    assert f"the ranks' logs: {base}/" in res.stderr
    assert (base / "attempt_0" / "0" / "stdout.log").read_text() == "out of 0 attempt 0\n"


def test_local_ranks_filter_keeps_the_files_whole(qb2: Path, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    worker = script(tmp_path, "say.py", SAY)
    res = launch(qb2, "--tp-size", "2", "--job-id", "f", "--local_ranks_filter", "1", "--tee",
                 "3", "--log-dir", str(logs), worker, "0", env=users_shell())  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == ["[r1] out of 1 attempt 0"]
    base = run_dir(logs, "f") / "attempt_0"
    assert (base / "0" / "stdout.log").read_text() == "out of 0 attempt 0\n"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["-r", "4"], "--redirects '4': not 0-3 or a map of local ranks"),
        (["--redirects", "0:1,x"], "--redirects '0:1,x': not 0-3"),
        (["--tee", "0:5"], "--tee '0:5': not 0-3"),
        (["-t", ""], "--tee '': not 0-3"),
        (["-r", "1 2"], "--redirects '1 2'"),
        (["--local-ranks-filter", "a"], "--ranks-filter 'a': expected rank numbers"),
    ],
)
def test_bad_log_flags_are_one_line(
    qb2: Path, tmp_path: Path, args: list[str], needle: str
) -> None:
    logs = tmp_path / "logs"
    res = launch(qb2, "--tp-size", "1", *args, "--log-dir", str(logs), "true", env=users_shell())
    assert res.returncode == 2, res.stderr
    said = [ln for ln in res.stderr.splitlines() if not ln.startswith("simulated host:")]
    assert len(said) == 1 and needle in said[0], res.stderr
    assert not any(logs.glob("*"))  # nothing made


# --------------------------------------------------------------------------- gloo teardown


def test_the_gloo_teardown_abort_is_explained(qb2: Path, tmp_path: Path) -> None:
    """A rank that finished its work and aborted at exit (torch 2.13's gloo without
    destroy_process_group()): exit 134, and the summary says why and what to add."""
    out = tmp_path / "s.json"
    worker = script(
        tmp_path,
        "abort.py",
        "import os, sys\n"
        "print('epoch 3 done')\n"
        "sys.stderr.write('terminate called without an active exception\\n')\n"
        "sys.stderr.flush()\n"
        "os.abort()\n",
    )
    res = launch(qb2, "--tp-size", "2", "--summary-json", str(out), worker, env=users_shell())
    assert res.returncode == 134, res.stderr
    entry = next(e for e in failures.table() if e.id == "gloo-teardown")
    assert "destroy_process_group()" in entry.fix
    diagnosis = json.loads(out.read_text())["diagnosis"]
    assert diagnosis["id"] == "gloo-teardown"
    assert diagnosis["line"] == "terminate called without an active exception"
    assert f"ttmesh: known failure (gloo-teardown): {entry.cause}" in res.stderr
    assert f"ttmesh:   fix: {entry.fix}" in res.stderr


def test_help_lists_torchruns_log_flags() -> None:
    res = run_cli("launch", "--help")
    for flag in (
        "-r, --redirects",
        "-t, --tee",
        "--log-dir",
        "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE",
    ):
        assert flag in res.out, flag


def test_mpi_ranks_are_unbuffered_too(qb2: Path) -> None:
    """One MPMD mpirun: each rank's section exports PYTHONUNBUFFERED=1, unless the user's."""
    import shutil

    if shutil.which("mpirun") is None:
        pytest.skip("no mpirun here")
    from ttmesh.cli.hosts import open_host
    from ttmesh.launcher.nodes import mpi
    from ttmesh.launcher.planning.prepare import prepare
    from ttmesh.launcher.planning.request import LaunchRequest

    req = LaunchRequest(
        command=[sys.executable, "-c", "pass"], tp_size=2, layout="mesh", launcher="mpi",
        no_python=True,
    )  # fmt: skip
    plan = prepare(req, open_host(qb2)).plan
    argv, _ = mpi.mpirun_argv("/usr/bin/mpirun", plan, {"PATH": "/bin"}, 0)
    sections = " ".join(argv).split(" : ")
    assert len(sections) == 2
    assert all("-x PYTHONUNBUFFERED=1 " in s for s in sections), sections
    argv, env = mpi.mpirun_argv(
        "/usr/bin/mpirun", plan, {"PATH": "/bin", "PYTHONUNBUFFERED": ""}, 0
    )
    assert "PYTHONUNBUFFERED=1" not in " ".join(argv) and env["PYTHONUNBUFFERED"] == ""


@pytest.mark.skipif(os.geteuid() != 0, reason="root meeting another user's link")
def test_a_log_dir_link_another_user_planted_is_refused(qb2: Path, tmp_path: Path) -> None:
    """As root, --log-dir through a link nobody planted (to a directory root can write) is
    refused in one line, and nothing is made where it points."""
    import pwd

    nobody = pwd.getpwnam("nobody")
    shared = tmp_path / "shared"
    target = tmp_path / "target"
    shared.mkdir()
    target.mkdir()
    os.chown(shared, nobody.pw_uid, nobody.pw_gid)
    link = shared / "logs"
    link.symlink_to(target)
    os.lchown(link, nobody.pw_uid, nobody.pw_gid)
    res = launch(qb2, "--tp-size", "1", "--log-dir", str(link), "--", "true", env=users_shell())
    assert res.returncode == 2, res.stderr
    assert f"--log-dir {link} is a symbolic link owned by nobody" in res.stderr
    assert list(target.iterdir()) == []


def test_a_ranks_error_file_is_kept_in_torchruns_layout(qb2: Path, tmp_path: Path) -> None:
    """torch's @record writes TORCHELASTIC_ERROR_FILE; torchrun keeps it as
    attempt_N/<local rank>/error.json in the log directory: so does ttmesh."""
    logs = tmp_path / "logs"
    record = json.dumps({"message": {"message": "ValueError: bad batch 17", "extraInfo": {}}})
    worker = script(
        tmp_path,
        "record.py",
        "import os, sys\n"
        "if os.environ['RANK'] == '0':\n"
        f"    open(os.environ['TORCHELASTIC_ERROR_FILE'], 'w').write({record!r})\n"
        "    sys.exit(1)\n",
    )
    res = launch(qb2, "--tp-size", "2", "--job-id", "e", "--log-dir", str(logs), worker,
                 env=users_shell())  # fmt: skip
    assert res.returncode == 1, res.stderr
    assert "rank 0 raised ValueError: bad batch 17" in res.stderr
    base = run_dir(logs, "e") / "attempt_0"
    assert (base / "0" / "error.json").read_text() == record
    assert not (base / "1" / "error.json").exists()


@pytest.mark.parametrize("kind", ["link", "fifo"])
def test_an_error_file_that_is_no_file_is_not_copied(qb2: Path, tmp_path: Path, kind: str) -> None:
    """A rank that leaves a link (to a secret) or a FIFO as its error file: nothing copied,
    no hang."""
    secret = tmp_path / "secret"
    secret.write_text('{"message": "the secret"}')
    make = (
        f"os.symlink({str(secret)!r}, os.environ['TORCHELASTIC_ERROR_FILE'])"
        if kind == "link"
        else "os.mkfifo(os.environ['TORCHELASTIC_ERROR_FILE'])"
    )
    logs = tmp_path / "logs"
    res = launch(qb2, "--tp-size", "1", "--job-id", "x", "--log-dir", str(logs), "--",
                 sys.executable, "-c", f"import os, sys; {make}; sys.exit(1)",
                 env=users_shell())  # fmt: skip
    assert res.returncode == 1, res.stderr
    assert not (run_dir(logs, "x") / "attempt_0" / "0" / "error.json").exists()
