"""torch_tpu and libtt under ttmesh, with stand-ins for the packages (the real ones:
test_torchtpu_real.py): the torch-tpu and jax-tt program profiles, the contract each rank gets,
the libtt release read before the start, the simulated host at the real paths, and what the
ranks leave."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import run_cli, start_launch, wait_for
from users import users_fixture  # noqa: F401

from ttmesh.runtime import jobs

PY = sys.executable
QB2_CHIPS = 4


def fake_stack(base: Path, libtt: str | None = "0.1.3", torch_tpu: bool = True) -> Path:
    """A directory that, on a Python's path, makes importlib.metadata find the stack's
    distributions (their dist-info only: nothing imports them)."""
    site = base / f"site-{libtt}-{torch_tpu}"
    dists = ([("jax_tt_plugin", libtt)] if libtt else []) + (
        [("torch_tpu", "0.2.0")] if torch_tpu else []
    )
    for name, version in dists:
        info = site / f"{name}-{version}.dist-info"
        info.mkdir(parents=True, exist_ok=True)
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: {version}\n"
        )
    site.mkdir(parents=True, exist_ok=True)
    return site


def dry(root: Path, *args: str, env: dict[str, str] | None = None) -> tuple[dict, str]:
    res = run_cli("launch", "--root", str(root), "--dry-run", "--json", "--show-env", *args,
                  env=env)  # fmt: skip
    assert res.code == 0, res.err
    return json.loads(res.out), res.err


# --------------------------------------------------------------------------- which profile


def test_a_torch_tpu_job_is_known_by_its_environment_and_says_why(
    qb2: Path, tmp_path: Path
) -> None:
    """LIBTT_TPU_COMPAT=1 in the launcher's environment or in --env, or --profile torch-tpu,
    makes a plain program a torch-tpu job, and the dry run says which and why;
    JAX_PLATFORMS=tt a jax-tt one; --profile none and a server's own profile win."""
    site = str(fake_stack(tmp_path))
    cmd = ["--tp-size", "1", "--env", f"PYTHONPATH={site}", "--", PY, "-c", "pass"]
    plan, err = dry(qb2, *cmd, env={"LIBTT_TPU_COMPAT": "1"})
    assert plan["program"]["profile"] == "torch-tpu"
    assert plan["program"]["why"] == "LIBTT_TPU_COMPAT=1 is in your environment"
    assert "torch-tpu: PyTorch on torch_tpu" in err and "chosen because LIBTT_TPU_COMPAT=1" in err
    assert "libtt 0.1.3 (jax-tt-plugin in " in err
    plan, _ = dry(qb2, "--env", "LIBTT_TPU_COMPAT=1", *cmd)
    assert plan["program"]["why"] == "LIBTT_TPU_COMPAT=1 is in --env"
    plan, err = dry(qb2, "--profile", "torch-tpu", *cmd)
    assert plan["program"]["why"] == "--profile torch-tpu"
    assert plan["ranks"][0]["env"]["LIBTT_TPU_COMPAT"] == "1"  # the profile sets it
    plan, _ = dry(qb2, *cmd, env={"JAX_PLATFORMS": "tt"})
    assert plan["program"]["profile"] == "jax-tt"
    assert "TORCH_TPU_TOPOLOGY" not in plan["ranks"][0]["env"]  # JAX's processes join nothing
    plan, _ = dry(qb2, "--profile", "none", *cmd, env={"LIBTT_TPU_COMPAT": "1"})
    assert plan["program"] is None and "TMPDIR" not in plan["ranks"][0]["env"]
    plan, _ = dry(qb2, *cmd)
    assert plan["program"] is None
    listed = run_cli("profiles", "--json")
    kinds = {p["name"]: p["kind"] for p in json.loads(listed.out)["profiles"]}
    assert kinds["torch-tpu"] == kinds["jax-tt"] == "program" and kinds["sglang"] == "server"


def test_any_value_libtt_reads_as_compat_mode_is_a_torch_tpu_job(
    qb2: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """libtt's own hook (libtt_tpu_compat.pth, jax-tt-plugin 0.1.3) turns TPU compatibility
    mode on for any LIBTT_TPU_COMPAT but "" and "0": such a job is torch_tpu's whatever the
    spelling, so it is never run without the contract its ranks need; a spelling other than
    the profile's is one line (exit 2), "" and "0" leave the job a plain one. (In-process:
    the choice is made before anything starts.)"""
    import ttmesh.cli

    cmd = ["launch", "--root", str(qb2), "--dry-run", "--json", "--tp-size", "1"]
    for value in ("yes", "2", " 1", "\u00b2", "1\nttmesh: fake", "", "0"):
        for how in ("environment", "--env"):
            monkeypatch.delenv("LIBTT_TPU_COMPAT", raising=False)
            extra = ["--env", f"LIBTT_TPU_COMPAT={value}"] if how == "--env" else []
            if how == "environment":
                monkeypatch.setenv("LIBTT_TPU_COMPAT", value)
            code = ttmesh.cli.run([*cmd, *extra, "--", PY, "-c", "pass"])
            out, err = capsys.readouterr()
            lines = [ln for ln in err.splitlines() if not ln.startswith("simulated host")]
            if value in ("", "0"):  # libtt's hook stays off: a plain job
                assert code == 0 and json.loads(out)["program"] is None, (value, how, err)
                continue
            assert code == 2 and len(lines) == 1, (value, how, err)
            assert "torch-tpu: LIBTT_TPU_COMPAT=" in lines[0], lines
            assert "needs LIBTT_TPU_COMPAT=1" in lines[0], lines
    monkeypatch.delenv("LIBTT_TPU_COMPAT", raising=False)
    # JAX_PLATFORMS is a list JAX opens every platform of: tt among others is libtt's too.
    for value, profile in (("tt,cpu", "jax-tt"), ("cpu,tt", "jax-tt"), ("cpu", None)):
        monkeypatch.setenv("JAX_PLATFORMS", value)
        monkeypatch.setenv("PYTHONPATH", str(fake_stack(tmp_path)))
        code = ttmesh.cli.run([*cmd, "--", PY, "-c", "pass"])
        out, err = capsys.readouterr()
        assert code == 0, err
        assert (json.loads(out)["program"] or {}).get("profile") == profile, (value, err)


def test_a_malformed_program_profile_is_one_line(qb2: Path, tmp_path: Path) -> None:
    mine = tmp_path / "profiles"
    mine.mkdir()
    (mine / "mine.yaml").write_text(
        "kind: program\nname: mine\nrecognise: {env: {MINE: '1'}}\ncontract: torch-tpu\n"
        "libtt: {distribution: jax-tt-plugin, releases: [{below: one, joins: true}]}\n"
    )
    res = run_cli("launch", "--root", str(qb2), "--dry-run", "--", PY, "-c", "pass",
                  env={"TTMESH_PROFILES": str(mine)})  # fmt: skip
    assert res.code == 2, res.err
    (line,) = [ln for ln in res.err.splitlines() if not ln.startswith("simulated host")]
    assert "mine.yaml: malformed (libtt.releases[0]: below must be a version" in line
    for leftovers in ("['/etc/passwd']", "['/dev/shm/../etc/x']"):
        (mine / "mine.yaml").write_text(f"kind: program\nname: mine\nleftovers: {leftovers}\n")
        res = run_cli("profiles", env={"TTMESH_PROFILES": str(mine)})
        assert res.code == 2 and "leftovers must be a list of names in /dev/shm" in res.err
    (mine / "mine.yaml").write_text("kind: program\nname: mine\nenv: {RANK: '3'}\n")
    res = run_cli("profiles", env={"TTMESH_PROFILES": str(mine)})
    assert res.code == 2 and "env sets RANK, which ttmesh sets" in res.err, res.err
    (mine / "mine.yaml").write_text("kind: daemon\nname: mine\n")
    res = run_cli("profiles", env={"TTMESH_PROFILES": str(mine)})
    assert res.code == 2 and "kind 'daemon'" in res.err, res.err


# --------------------------------------------------------------------------- the contract


def test_every_rank_gets_torch_tpus_contract(qb2: Path, tmp_path: Path) -> None:
    """On a libtt that joins processes, 4 ranks of one chip each: the same slice addresses
    (one free port per process), topology (C,R,1 of the mesh), handshake port and session on
    every rank; the processes per host; a TMPDIR and working directory of each rank's own in
    the run directory; the chips left to libtt; a launcher's own values not inherited."""
    site = str(fake_stack(tmp_path, "0.1.5"))
    above = {"LIBTT_TPU_COMPAT": "1", "TORCH_TPU_TOPOLOGY": "9,9,9", "TPU_VISIBLE_CHIPS": "7",
             "TMPDIR": "/tmp"}  # fmt: skip
    plan, err = dry(qb2, "--tp-size", "4", "--env", f"PYTHONPATH={site}", "--", PY, "-c", "pass",
                    env=above)  # fmt: skip
    assert "libtt 0.1.5" in err and "joins processes into one mesh" in err
    ranks = plan["ranks"]
    envs = [r["env"] for r in ranks]
    addresses = envs[0]["TORCH_TPU_SLICEBUILDER_ADDRESSES"].split(",")
    assert len(addresses) == 4 and len(set(addresses)) == 4
    assert all(a.startswith("127.0.0.1:") for a in addresses)
    for key in ("TORCH_TPU_SLICEBUILDER_ADDRESSES", "TORCH_TPU_TOPOLOGY", "LIBTT_SYMMETRIC_DRAM_MB",
                "TORCH_TPU_INTERNAL_HANDSHAKE_PORT", "TORCH_TPU_XPROF_SESSION_ID"):  # fmt: skip
        assert len({e[key] for e in envs}) == 1, key
    assert envs[0]["TORCH_TPU_TOPOLOGY"] == "2,2,1"  # a 2x2 mesh: 2 columns, 2 rows
    assert envs[0]["TORCH_TPU_INTERNAL_HANDSHAKE_PORT"] not in {a.split(":")[1] for a in addresses}
    assert envs[0]["TORCH_TPU_INTERNAL_HANDSHAKE_PORT"] != "36423"  # torch_tpu's shared default
    assert {e["TORCH_TPU_DEVICES_PER_HOST"] for e in envs} == {"4"}
    assert [e["WORLD_SIZE"] for e in envs] == ["4"] * 4
    run_dir = Path(envs[0]["TORCHELASTIC_ERROR_FILE"]).parent.parent
    for r, e in zip(ranks, envs, strict=True):
        assert e["TMPDIR"] == r["tmpdir"] == f"{run_dir}/ranks/rank{r['rank']}/tmp"
        assert r["workdir"] == f"{run_dir}/ranks/rank{r['rank']}/work"
        assert e["TTMESH_ORIGINAL_CWD"] == os.getcwd()
        assert "TT_VISIBLE_DEVICES" not in e and "TT_MESH_GRAPH_DESC_PATH" not in e  # libtt's
        assert {"TPU_VISIBLE_CHIPS", "TORCH_TPU_TOPOLOGY", "TMPDIR"} <= set(r["unset"]) | set(e)
        assert "TPU_VISIBLE_CHIPS" in r["unset"]
    assert plan["program"]["torch_tpu"]["topology"] == "2,2,1"
    plan, _ = dry(qb2, "--tp-size", "4", "--mesh-shape", "1x4", "--env", f"PYTHONPATH={site}",
                  "--", PY, "-c", "pass", env={"LIBTT_TPU_COMPAT": "1"})  # fmt: skip
    assert plan["ranks"][0]["env"]["TORCH_TPU_TOPOLOGY"] == "4,1,1"


def test_the_contract_is_the_plans_own(qb2: Path, tmp_path: Path) -> None:
    """--env may not set what the contract sets, a profile's variable may not be contradicted,
    and a tt-metal world under mpirun is not this stack's (each one line, exit 2)."""
    site = str(fake_stack(tmp_path))
    cmd = ["--env", f"PYTHONPATH={site}", "--", PY, "-c", "pass"]
    compat = {"LIBTT_TPU_COMPAT": "1"}
    for args, env, said in (
        (["--env", "TORCH_TPU_TOPOLOGY=1,1,1"], compat, "--env TORCH_TPU_TOPOLOGY: ttmesh sets"),
        (["--env", "TMPDIR=/tmp"], compat, "--env TMPDIR: ttmesh sets TMPDIR"),
        (["--env", "TPU_PROCESS_BOUNDS=1,1,1"], compat, "torch_tpu derives it"),
        (["--profile", "torch-tpu", "--env", "LIBTT_TPU_COMPAT=0"], {}, "LIBTT_TPU_COMPAT=0 in --env"),
        (["--mesh-layout", "mesh"], compat, "--mesh-layout mesh with torch-tpu"),
    ):  # fmt: skip
        res = run_cli("launch", "--root", str(qb2), "--dry-run", *args, *cmd, env=env)
        assert res.code == 2, (args, res.err)
        lines = [ln for ln in res.err.splitlines() if not ln.startswith("simulated host")]
        assert len(lines) == 1 and said in lines[0], (args, res.err)


# --------------------------------------------------------------------------- libtt's release


def test_a_libtt_that_cannot_join_is_refused_before_the_start(qb2: Path, tmp_path: Path) -> None:
    """libtt 0.1.3 cannot join processes into one mesh: 4 torch_tpu ranks are refused in one
    line naming the release, why, and the two ways out; one process over the 4 chips, and one
    rank of one chip, are planned; a Python without libtt's plugin is refused by name."""
    site = str(fake_stack(tmp_path))
    compat = {"LIBTT_TPU_COMPAT": "1"}
    res = run_cli("launch", "--root", str(qb2), "--tp-size", "4", "--job-id", "unjoined",
                  "--env", f"PYTHONPATH={site}", "--", PY, "-c", "pass", env=compat)  # fmt: skip
    assert res.code == 2, res.err
    (line,) = [ln for ln in res.err.splitlines() if ln.startswith("ttmesh: torch-tpu: libtt")]
    assert "libtt 0.1.3 (jax-tt-plugin in " in line
    assert "cannot run 4 processes as one torch_tpu world" in line and "join" in line
    assert "--mesh-layout single-process" in line and "libtt from main" in line
    assert not (jobs.runs_dir() / "unjoined").exists()
    plan, _ = dry(qb2, "--tp-size", "4", "--mesh-layout", "single-process", "--env",
                  f"PYTHONPATH={site}", "--", PY, "-c", "pass", env=compat)  # fmt: skip
    (rank,) = plan["ranks"]
    assert (
        rank["env"]["WORLD_SIZE"] == "1" and len(rank["env"]["TT_VISIBLE_DEVICES"].split(",")) == 4
    )
    assert rank["env"]["TORCH_TPU_TOPOLOGY"] == "2,2,1"
    assert len(rank["env"]["TORCH_TPU_SLICEBUILDER_ADDRESSES"].split(",")) == 1
    plan, _ = dry(qb2, "--tp-size", "1", "--env", f"PYTHONPATH={site}", "--", PY, "-c", "pass",
                  env=compat)  # fmt: skip
    assert plan["ranks"][0]["env"]["TT_VISIBLE_DEVICES"] == plan["ranks"][0]["bdfs"][0]
    assert plan["program"]["libtt"]["version"] == "0.1.3"
    bare = str(fake_stack(tmp_path / "bare", libtt=None))
    res = run_cli("launch", "--root", str(qb2), "--tp-size", "1", "--dry-run", "--env",
                  f"PYTHONPATH={bare}", "--", PY, "-c", "pass", env=compat)  # fmt: skip
    assert res.code == 2 and "has no jax-tt-plugin (libtt's PJRT plugin)" in res.err, res.err


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ("sleep 30", "did not say which packages it has within 1 s"),
        ("yes | head -c 10000000", "said more than 64 KiB"),
        ("exit 3", "exited 3 when asked"),
        ("echo '[1, 2]'", "exited 0 when asked"),
    ],
)
def test_a_ranks_python_that_does_not_answer_is_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str, said: str
) -> None:
    """Reading the ranks' Python's packages is bounded in time and in output, and what it left
    running is stopped; the launch then goes on, saying the version was not read."""
    from ttmesh.launcher.planning import programs

    monkeypatch.setattr(programs, "STACK_TIMEOUT", 1.0)
    python = tmp_path / "python3"
    python.write_text(f"#!/bin/sh\necho $$ > {tmp_path}/pid\n{body}\n")
    python.chmod(0o755)
    stack = programs.read_stack(str(python), ["jax-tt-plugin"], dict(os.environ))
    assert stack.versions == {} and said in stack.unread, stack.unread
    pid = int((tmp_path / "pid").read_text())
    wait_for(lambda: not Path(f"/proc/{pid}").exists(), what="the stand-in to be gone")


def test_the_release_lines_are_data() -> None:
    from ttmesh.launcher.planning import programs

    (profile,) = [p for p in programs.every() if p.name == "torch-tpu"]
    assert profile.libtt is not None
    assert not profile.libtt.release("0.1.3").joins
    assert profile.libtt.release("0.1.5.dev3+g5861d04").joins
    assert profile.libtt.release("1.0").chips == "libtt"
    assert programs.version_tuple("0.1.10") > programs.version_tuple("0.1.5")


# --------------------------------------------------------------------------- a real start

RANK = r"""
import json, os, socket, sys
out = sys.argv[1]
rank = int(os.environ["RANK"])
chip = json.loads(os.environ["TTMESH_JOB_CHIPS"])[rank]
seen = {"dev": sorted(os.listdir("/dev/tenstorrent")) if os.path.isdir("/dev/tenstorrent") else None,
        "proc": sorted(os.listdir("/proc/driver/tenstorrent"))
        if os.path.isdir("/proc/driver/tenstorrent") else None,
        "uid": os.getuid(), "cwd": os.getcwd(), "tmp": os.environ.get("TMPDIR"),
        "tmp_mode": oct(os.stat(os.environ["TMPDIR"]).st_mode & 0o777) if "TMPDIR" in os.environ else None,
        "blocked": [line.split()[1] for line in open("/proc/self/status")
                    if line.startswith("SigBlk:")]}
bound = []
ports = [a.rsplit(":", 1) for a in os.environ.get("TORCH_TPU_SLICEBUILDER_ADDRESSES", "").split(",") if a]
ports.append(("127.0.0.1", os.environ.get("TORCH_TPU_INTERNAL_HANDSHAKE_PORT", "0")))
for host, port in ports if rank == 0 else []:
    s = socket.socket()
    s.bind((host, int(port)))  # free when the ranks start: ttmesh let them go
    bound.append(port)
    s.close()
seen["bound"] = bound
os.makedirs("generated/fabric", exist_ok=True)  # as tt-metal does in its working directory
os.makedirs(os.path.join(os.environ["TMPDIR"], "libtt-tt-metal-runtime-assets-x"), exist_ok=True)
shm = f"/dev/shm/tt_device_{int(chip, 16)}_memory"  # as libtt's mock chips
fd = os.open(shm, os.O_RDWR | os.O_CREAT, 0o600)
os.write(fd, b"x")
os.close(fd)
seen["shm"] = shm
with open(os.path.join(out, f".rank{rank}.json"), "w") as f:
    json.dump(seen, f)
os.rename(os.path.join(out, f".rank{rank}.json"), os.path.join(out, f"rank{rank}.json"))
if rank == 1:  # the failing rank ends the job: not before rank 0 has said what it saw
    import time
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(out, "rank0.json")) and time.monotonic() < deadline:
        time.sleep(0.01)
if len(sys.argv) > 2:
    open(os.path.join(out, f"rank{rank}.ready"), "w").close()
    import time
    time.sleep(600)
sys.exit(7 if rank == 1 else 0)
"""


def _shm_names(qb2: Path) -> dict[str, str]:
    from ttmesh.fabric.devices import discover
    from ttmesh.host.base import Host

    inv = discover(Host(qb2))
    return {
        c.bdf or c.asic_id: f"/dev/shm/tt_device_{int(c.asic_id, 16)}_memory" for c in inv.chips
    }


@pytest.mark.usefixtures("mock_chip_files")
def test_the_ranks_see_their_chips_and_leave_nothing(qb2: Path, tmp_path: Path) -> None:
    """A torch-tpu job on a simulated host, rank 1 failing (exit 7): each rank sees the job's
    chips at /dev/tenstorrent and /proc/driver/tenstorrent, starts in its own working directory
    with its own TMPDIR, finds the slice's ports free; the TMPDIRs, generated/ and the mock
    chips' /dev/shm files the job made are gone when it ends, a file that was there before
    is kept."""
    site = str(fake_stack(tmp_path, "0.1.5"))
    out = tmp_path / "out"
    out.mkdir()
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    names = _shm_names(qb2)
    before = names["0000:03:00.0"]  # rank 1's chip (the second of --chips): there already
    Path(before).write_bytes(b"")
    os.chmod(before, 0o600)
    try:
        res = run_cli(
            "launch", "--root", str(qb2), "--chips", "0000:01:00.0,0000:03:00.0", "--job-id",
            "tpu-start", "--env", f"PYTHONPATH={site}", "--", PY, str(script), str(out),
            env={"LIBTT_TPU_COMPAT": "1"}, timeout=120,
        )  # fmt: skip
        assert res.code == 7, res.err
        seen = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
        assert [s["dev"] for s in seen] == [["0", "1", "by-id"]] * 2  # the job's chips only
        assert [s["proc"] for s in seen] == [["0", "1"]] * 2
        # Started from the view's thread, with no signal blocked (a thread made before the
        # guardian unblocked them would pass its mask on, across exec).
        assert [s["blocked"] for s in seen] == [["0" * 16]] * 2
        assert len(seen[0]["bound"]) == 3  # 2 slice addresses and the handshake port
        for r, s in enumerate(seen):
            assert s["cwd"].endswith(f"/ranks/rank{r}/work") and s["tmp"].endswith(f"rank{r}/tmp")
            assert s["tmp_mode"] == "0o700"
            assert not Path(s["tmp"]).exists() and not Path(s["cwd"]).exists()
        assert not Path(names["0000:01:00.0"]).exists()
        assert f"removed {names['0000:01:00.0']}, left behind by the ranks" in res.err
        assert Path(before).exists()  # not made by the job
        assert not (jobs.runs_dir() / "tpu-start").exists()
    finally:
        for path in names.values():
            with contextlib.suppress(OSError):
                os.unlink(path)


@pytest.mark.usefixtures("mock_chip_files")
def test_sigkill_of_ttmesh_leaves_nothing(qb2: Path, tmp_path: Path) -> None:
    """ttmesh SIGKILLed while a torch-tpu job runs: its guardian stops the ranks and removes
    what they made (the mock chips' files, the run directory with the TMPDIRs)."""
    site = str(fake_stack(tmp_path))
    out = tmp_path / "out"
    out.mkdir()
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    names = _shm_names(qb2)
    there = [n for n in names.values() if os.path.exists(n)]
    assert not there, f"made before the job (a job keeps what was there before it): {there}"
    job = f"tpu-kill-{os.getpid()}"
    said = tmp_path / "stderr"  # what the guardian says after the launcher is gone
    with said.open("w") as err:
        proc = start_launch(
            qb2, "--tp-size", "1", "--job-id", job, "--env", f"PYTHONPATH={site}", "--", PY,
            str(script), str(out), "wait", env={"LIBTT_TPU_COMPAT": "1"},
            stdout=subprocess.DEVNULL, stderr=err,
        )  # fmt: skip
    try:
        wait_for(lambda: (out / "rank0.ready").exists() or proc.poll() is not None, timeout=60,
                 what="the rank")  # fmt: skip
        assert proc.poll() is None
        seen = json.loads((out / "rank0.json").read_text())
        assert Path(seen["shm"]).exists() and Path(seen["tmp"]).is_dir()
        proc.kill()
        proc.wait()

        def finished() -> bool:
            record = next((r for r in jobs.every() if r["job"] == job), None)
            return bool(record and record.get("ended"))

        wait_for(finished, timeout=60, what="the guardian to finish the job")
        record = next(r for r in jobs.every() if r["job"] == job)
        why = f"{record.get('status')!r}; the guardian said:\n{said.read_text()}"
        assert not Path(seen["shm"]).exists(), why
        assert not Path(seen["tmp"]).exists() and not (jobs.runs_dir() / job).exists(), why
    finally:
        proc.kill()
        proc.wait()
        for path in names.values():
            with contextlib.suppress(OSError):
                os.unlink(path)


# --------------------------------------------------------------------------- the view

VIEW = (
    "import os, json\n"
    "print(json.dumps([os.getuid(), sorted(os.listdir('/dev/tenstorrent')),"
    " sorted(os.listdir('/dev/tenstorrent/by-id')), os.readlink('/dev/tenstorrent/by-id/'"
    " + sorted(os.listdir('/dev/tenstorrent/by-id'))[0]), os.getcwd()]))\n"
)


@pytest.mark.parametrize("who", ["root", "nobody"])
def test_each_user_sees_the_simulated_chips_at_the_real_paths(users: dict, who: str) -> None:
    """Any program of a rank (not only ttmesh's) finds the job's chips of a simulated host at
    /dev/tenstorrent, as root (a mount namespace) and as a user without privileges (a user
    namespace too), in its own working directory, as itself."""
    if who not in users:
        pytest.skip("cannot switch to nobody here")
    user = users[who]
    res = user.run("launch", "--root", str(user.sim), "--chips", "0000:05:00.0", "--",
                   "/usr/bin/python3", "-c", VIEW, cwd=user.base)  # fmt: skip
    assert res.returncode == 0, res.stderr
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("[r0] ["))
    uid, dev, by_id, link, cwd = json.loads(line[5:])
    assert uid == (0 if who == "root" else 65534)
    assert len(dev) == 2 and dev[1] == "by-id" and len(by_id) == 1  # one chip, and its link
    assert link == f"../{dev[0]}"
    assert cwd == str(user.base)


def test_a_view_that_cannot_be_made_is_one_line_and_the_job_runs(qb2: Path) -> None:
    """An entry of the simulated root that is a link (planted, or broken) is never bound: the
    ranks start without the view, as before, and one line says why."""
    entry = qb2 / "proc" / "driver" / "tenstorrent" / "0"
    target = qb2 / "elsewhere"
    entry.rename(target)
    entry.symlink_to(target)
    res = run_cli("launch", "--root", str(qb2), "--tp-size", "2", "--", PY, "-c",
                  "import os; print('seen', os.path.exists('/dev/tenstorrent'))")  # fmt: skip
    assert res.code == 0, res.err
    said = [ln for ln in res.err.splitlines() if "not the simulated host's" in ln]
    assert len(said) == 1 and "is a link" in said[0], res.err
    assert "[r0] seen False" in res.out and "[r1] seen False" in res.out


def test_as_root_the_view_is_a_thread_whose_ranks_live_until_the_attempt_ends(qb2: Path) -> None:
    """As root the view is built by a thread of the launcher in a mount namespace of its own,
    and the ranks start from it: no helper process, no nsenter before a rank's program, and
    the ranks (whose parent-death signal names that thread) keep running until the view is
    let go, with the launcher's own namespace untouched."""
    if os.getuid() != 0:
        pytest.skip("root builds the view in a thread; others use a helper and nsenter")
    from ttmesh import procs
    from ttmesh.launcher.planning.simview import HostView
    from ttmesh.runtime.rankview import Views

    existed = sorted(os.listdir("/dev"))
    view = HostView(str(qb2), ("0", "1"))
    views = Views(view.helper(), view.root, list(view.devices))
    views.open()
    started: list[subprocess.Popen] = []
    try:
        assert views.notice is None and views.prefix("/") == []
        here = os.readlink("/proc/self/ns/mnt")

        def start() -> str:
            argv = [*(procs.pdeathsig_wrapper() or []), sys.executable, "-c",
                    "import os, sys; print(sorted(os.listdir('/dev/tenstorrent')), flush=True);"
                    " sys.stdin.read()"]  # fmt: skip
            started.append(subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                            text=True))  # fmt: skip
            return os.readlink("/proc/thread-self/ns/mnt")

        theirs = views.within(start)
        assert theirs != here and os.readlink("/proc/self/ns/mnt") == here
        assert sorted(os.listdir("/dev")) == existed
        rank = started[0]
        assert rank.stdout is not None and rank.stdout.readline() == "['0', '1', 'by-id']\n"
        assert rank.poll() is None  # alive after its start returned, the view still held
        assert os.readlink(f"/proc/{rank.pid}/ns/mnt") == theirs
    finally:
        for rank in started:
            assert rank.stdin is not None
            rank.stdin.close()
            rank.wait(30)
        views.close()
    assert started[0].returncode == 0  # it ended by itself, not by a parent-death SIGKILL
    assert sorted(os.listdir("/dev")) == existed  # the launcher's own /dev never changed


# --------------------------------------------------------------------------- the parts


def test_held_ports_are_free_only_when_let_go() -> None:
    from ttmesh.launcher.planning import ports

    held = ports.hold_free(3)
    try:
        assert len(set(held)) == 3
        for port in held:
            with socket.socket() as s, pytest.raises(OSError) as exc:
                s.bind(("127.0.0.1", port))
            assert exc.value.errno == errno.EADDRINUSE
    finally:
        ports.release_held()
    for port in held:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_libtts_refusals_are_known_failures() -> None:
    from ttmesh.launcher.attempt import failures

    for line, known in (
        ("failed to extract embedded tt-metal runtime archive", "libtt-extract"),
        ("TT_THROW @ metal_env.cpp:88: Invalid BDF in TT_VISIBLE_DEVICES: 0000:99:00.0. Valid "
         "BDFs are part of the cluster descriptor.", "libtt-bad-bdf"),
        ("Invalid TT_MESH_ID: Local mesh binding mesh_id 1 not found in mesh graph descriptor",
         "libtt-mesh-id"),
    ):  # fmt: skip
        found = failures.match([("rank 0's stderr", [line])])
        assert found is not None and found["id"] == known, line


def test_the_view_helper_needs_its_arguments() -> None:
    from ttmesh.launcher.planning import simview

    for args in ([], ["--hold", "/"], ["/", "0"], ["/", "0", "x", "true"]):
        proc = subprocess.run([PY, "-I", "-S", simview.HELPER, *args], capture_output=True,
                              text=True, timeout=30)  # fmt: skip
        assert proc.returncode == 2 and proc.stderr.startswith("usage:"), args
    with tempfile.TemporaryDirectory() as empty:
        proc = subprocess.run([PY, "-I", "-S", simview.HELPER, "--hold", empty, "0"],
                              capture_output=True, text=True, timeout=30)  # fmt: skip
    assert proc.returncode == 3 and proc.stdout.startswith("failed: cannot read"), proc.stdout


def test_over_several_hosts_every_rank_gets_the_whole_slice(qb2: Path, tmp_path: Path) -> None:
    """A torch-tpu job over two hosts: every rank gets every host's addresses (each host's own
    ports, node-major), node 0's handshake port, the hosts (TPU_WORKER_HOSTNAMES, NNODES,
    NODE_RANK) and the topology of both hosts' chips."""
    from ttmesh.cli.hosts import open_host
    from ttmesh.launcher.nodes.multihost import global_plan
    from ttmesh.launcher.nodes.rendezvous import Node
    from ttmesh.launcher.planning import programs, rankenv
    from ttmesh.launcher.planning.prepare import prepare
    from ttmesh.launcher.planning.request import LaunchRequest

    site = str(fake_stack(tmp_path, "0.1.5"))
    req = LaunchRequest(
        command=[PY, "-c", "pass"], tp_size=2, no_python=True, nnodes=2,
        environ={**os.environ, "PYTHONPATH": site}, cwd=str(tmp_path),
        program=programs.choose("torch-tpu", {}, []),
    )  # fmt: skip
    try:
        local = prepare(req, open_host(qb2), ask_metal=False).plan
    finally:
        from ttmesh.launcher.planning import ports

        ports.release_held()
    assert local.program.tpu.topology == "2,1,1"
    mine = [int(a.rsplit(":", 1)[1]) for a in local.program.tpu.addresses]
    parts = [("10.0.0.1", [9001, 9002], 9003), ("10.0.0.2", mine, local.program.tpu.handshake_port)]
    tpu = rankenv.slice_over_hosts(local.program.tpu, parts)
    nodes = {
        n: Node(node=n, hostname=f"h{n}", addr=a, nproc=2) for n, (a, _, _) in enumerate(parts)
    }
    plan = global_plan(local, nodes, 1, "10.0.0.1", 29500, tpu)
    envs = [r.env for r in plan.ranks]
    want = ",".join(["10.0.0.1:9001", "10.0.0.1:9002"] + [f"10.0.0.2:{p}" for p in mine])
    assert {e["TORCH_TPU_SLICEBUILDER_ADDRESSES"] for e in envs} == {want}
    assert {e["TORCH_TPU_INTERNAL_HANDSHAKE_PORT"] for e in envs} == {"9003"}
    assert {e["TPU_WORKER_HOSTNAMES"] for e in envs} == {"10.0.0.1,10.0.0.2"}
    assert {(e["NNODES"], e["NODE_RANK"], e["TORCH_TPU_DEVICES_PER_HOST"]) for e in envs} == {
        ("2", "1", "2")
    }
    assert {e["TORCH_TPU_TOPOLOGY"] for e in envs} == {"2,2,1"}
    assert [e["RANK"] for e in envs] == ["2", "3"] and {e["WORLD_SIZE"] for e in envs} == {"4"}
    assert plan.program.tpu == tpu


def test_over_several_hosts_a_libtt_that_cannot_join_is_refused(qb2: Path, tmp_path: Path) -> None:
    """One rank on each of two hosts is a world of two: libtt 0.1.3 refuses it as well."""
    from ttmesh.cli.hosts import open_host
    from ttmesh.errors import TTMeshError
    from ttmesh.launcher.planning import programs
    from ttmesh.launcher.planning.prepare import prepare
    from ttmesh.launcher.planning.request import LaunchRequest

    site = str(fake_stack(tmp_path))
    req = LaunchRequest(
        command=[PY, "-c", "pass"], tp_size=1, no_python=True, nnodes=2,
        environ={**os.environ, "PYTHONPATH": site}, cwd=str(tmp_path),
        program=programs.choose("torch-tpu", {}, []),
    )  # fmt: skip
    with pytest.raises(TTMeshError) as exc:
        prepare(req, open_host(qb2), ask_metal=False)
    assert "cannot run 2 processes as one torch_tpu world" in exc.value.message
