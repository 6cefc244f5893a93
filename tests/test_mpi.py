"""The MPI start mode and tt-run rank bindings: real mpirun, standard-library workers.

Needs Open MPI's mpirun (Debian: openmpi-bin; .ci/run installs it). tt-metal itself is exercised
in tests/test_conformance_mpi.py.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TAG, TW, alive, run_cli, start_launch, wait_for, worker

from ttmesh.launcher.nodes.mpi import Demux
from ttmesh.vocab import LAUNCHER

needs_mpirun = pytest.mark.skipif(
    shutil.which("mpirun") is None, reason="needs mpirun (apt-get install openmpi-bin)"
)


# --------------------------------------------------------------------------- pure parts


def test_demux_splits_tagged_chunks_into_ranks() -> None:
    got: list[tuple[int, str, bytes]] = []
    d = Demux(lambda r, n, b: got.append((r, n, b)))
    d.data("stderr", b"[1,2]<stderr>:err from[1,0]<stderr>:err from 0\n[1,2]<stderr>: 2\n")
    d.data("stderr", b"----\nProcess name: [[588,1],1]\n  Exit code:    3\n")
    d.data("stdout", b"[1,1]<stdout>:hel")
    d.data("stdout", b"lo\n[1,")
    d.data("stdout", b"0]<stdout>:x\n")
    d.flush()
    by_rank: dict[tuple[int, str], bytes] = {}
    for r, n, b in got:
        by_rank[(r, n)] = by_rank.get((r, n), b"") + b
    assert by_rank[(2, "stderr")] == b"err from 2\n"
    assert by_rank[(0, "stderr")] == b"err from 0\n"
    assert by_rank[(1, "stdout")] == b"hello\n"
    assert by_rank[(0, "stdout")] == b"x\n"
    assert b"Exit code:    3" in by_rank[(LAUNCHER, "stderr")]
    assert d.first_failure() == (1, 3)


NOT_STARTED_LINE = (
    b"ttmesh: not started on ttmh-1: cannot run /tmp/j.sh: No such file or directory\n"
)
# Open MPI 4.1's words when a rank exits non-zero, untagged on mpirun's stderr (as a fresh CI
# machine got them, in one read with the rank's last line).
PRIMARY_JOB = (
    b"-------\nPrimary job  terminated normally, but 1 process returned\n"
    b"a non-zero exit code. Per user-direction, the job has been aborted.\n-------\n"
)
FIRST_FAILED = (
    b"-------\nmpirun detected that one or more processes exited with non-zero status, thus "
    b"causing\nthe job to be terminated. The first process to do so was:\n\n"
    b"  Process name: [[20528,1],1]\n  Exit code:    127\n-------\n"
)


@pytest.mark.parametrize("ver", [(4, 1), (5, 0)])
@pytest.mark.parametrize("rank_first", [True, False])
def test_a_ranks_not_started_line_is_its_last_however_the_reads_cut_mpiruns_report(
    ver: tuple[int, int], rank_first: bool
) -> None:
    """The rank's one line (tagged) and mpirun's report of its exit 127 (untagged) reach the
    guardian in whichever order and however its reads cut them, one read holding both
    included: the rank's stderr ends with its line, the report is mpirun's, so the launcher
    refuses the job with that line rather than calling exit 127 a crash."""
    from ttmesh.launcher.attempt.logs import Console
    from ttmesh.launcher.nodes.rankshim import refused_before_start

    tag = b"[1,1]<stderr>:" + (b" " if ver >= (5, 0) else b"")
    said = tag + b"simulated host: /h1/root\n" + tag + NOT_STARTED_LINE
    stream = said + PRIMARY_JOB + FIRST_FAILED if rank_first else PRIMARY_JOB + said + FIRST_FAILED
    for cuts in [(), *((i,) for i in range(1, len(stream))), (5, len(said) + 3)]:
        console = Console(2, quiet=True, launcher=True, sink=lambda *_: None)
        demux = Demux(console.feed, ver)
        edges = [0, *cuts, len(stream)]
        for a, b in itertools.pairwise(edges):
            demux.data("stderr", stream[a:b])
        demux.flush()
        console.close(1, "stderr")
        console.close(LAUNCHER, "stderr")
        tail = console.tail(1)
        assert tail == ["simulated host: /h1/root", NOT_STARTED_LINE.decode().strip()], cuts
        assert refused_before_start(127, tail) == NOT_STARTED_LINE.decode()[8:].strip(), cuts
        mpirun_said = "\n".join(console.tail(LAUNCHER))
        assert "Primary job  terminated normally" in mpirun_said, cuts
        assert demux.first_failure(127) == (1, 127) and demux.ranks_ran(), cuts


def test_demux_reads_signal_reports() -> None:
    d = Demux(lambda *_: None)
    d.data(
        "stderr",
        b"mpirun noticed that process rank 1 with PID 0 on node vm exited on signal 11 "
        b"(Segmentation fault).\n",
    )
    assert d.first_failure() == (1, 139)


def test_demux_reads_open_mpi_5_output() -> None:
    """Open MPI 5 (PRRTE) puts a space after the tag, names ranks ``[prterun-vm-123@1,N]`` in its
    failure report and breaks its signal line; its tag may be cut just before that space."""
    got: list[tuple[int, str, bytes]] = []
    d = Demux(lambda r, n, b: got.append((r, n, b)), (5, 0))
    d.data("stdout", b"[1,1]<stdout>: TTMESH-HOST-REPORT {}\n[1,0]<stdout>:")
    d.data("stdout", b" x\n")
    d.data(
        "stderr",
        b"prterun detected that one or more processes exited with non-zero status,\n"
        b"thus causing the job to be terminated. The first process to do so was:\n\n"
        b"   Process name: [prterun-vm-11187@1,1]\n   Exit code:    3\n",
    )
    d.flush()
    by_rank: dict[tuple[int, str], bytes] = {}
    for r, n, b in got:
        by_rank[(r, n)] = by_rank.get((r, n), b"") + b
    assert by_rank[(1, "stdout")] == b"TTMESH-HOST-REPORT {}\n"
    assert by_rank[(0, "stdout")] == b"x\n"
    assert d.first_failure() == (1, 3) and d.ranks_ran()
    signalled = Demux(lambda *_: None, (5, 0))
    signalled.data(
        "stderr",
        b"prterun noticed that process rank 1 with PID 11284 on node ttmh-1 exited on\n"
        b"signal 11 (Segmentation fault).\n",
    )
    assert signalled.first_failure() == (1, 139)
    # Open MPI 4 keeps the space that is the rank's own.
    old: list[bytes] = []
    Demux(lambda r, n, b: old.append(b)).data("stdout", b"[1,0]<stdout>: indented\n")
    assert b"".join(old) == b" indented\n"


def test_demux_names_the_rank_that_called_mpi_abort() -> None:
    """A rank that calls MPI_Abort (or dies in MPI's fatal error handler) is the first failure:
    Open MPI 4 says which rank and the code it gave; 5 says which rank, and mpirun's exit code
    stands for the rank's."""
    four = Demux(lambda *_: None)
    four.data(
        "stderr",
        b"-----\nMPI_ABORT was invoked on rank 1 in communicator MPI_COMM_WORLD\n"
        b"with errorcode 5.\n\nNOTE: invoking MPI_ABORT causes Open MPI to kill all MPI processes.\n",
    )
    assert four.first_failure(5) == (1, 5) and four.aborted() == 1 and four.ranks_ran()
    five = Demux(lambda *_: None, (5, 0))
    five.data(
        "stderr",
        b"prterun has exited due to process rank 2 with PID 0 on node ttmh-2 calling\n"
        b'"abort". This may have caused other processes in the application to be\n',
    )
    assert five.first_failure(14) == (2, 14) and five.aborted() == 2
    plain = Demux(lambda *_: None)
    plain.data("stderr", b"mpirun: some other complaint\n")
    assert plain.first_failure(14) is None and plain.aborted() is None


def test_mpirun_argv_has_one_section_per_rank(qb2: Path) -> None:
    res = run_cli(
        "launch",
        "--root",
        str(qb2),
        "--tp-size",
        "4",
        "--mesh-layout",
        "mesh",
        "--dry-run",
        "--json",
        *worker("exit=0"),
    )
    assert res.code in (0, 2), res.err
    if res.code == 2:
        assert "mpirun" in res.err
        pytest.skip("no mpirun here")
    plan = json.loads(res.out)
    assert plan["launcher"] == "mpi" and plan["layout"] == "mesh"
    from ttmesh.cli.hosts import open_host as Host
    from ttmesh.fabric.devices import discover
    from ttmesh.launcher.nodes import mpi
    from ttmesh.launcher.planning.prepare import prepare
    from ttmesh.launcher.planning.request import LaunchRequest

    req = LaunchRequest(
        command=[sys.executable, TW, TAG], tp_size=4, layout="mesh", launcher="mpi", no_python=True
    )
    prepared = prepare(req, Host(qb2))
    argv, env = mpi.mpirun_argv("/usr/bin/mpirun", prepared.plan, {"RANK": "9", "PATH": "/bin"}, 1)
    assert argv[:4] == ["/usr/bin/mpirun", "--tag-output", "--bind-to", "none"]
    assert ("--allow-run-as-root" in argv) == (os.geteuid() == 0)
    assert ("--oversubscribe" in argv) == ((os.cpu_count() or 1) < 4)
    assert argv.count(":") == 3 and argv.count("-np") == 4
    assert "RANK" not in env and env["PATH"] == "/bin"  # rank variables never inherited
    sections = " ".join(argv).split(" : ")
    for r, section in enumerate(sections):
        assert f"-x RANK={r} " in section
        assert "-x TT_MESH_ID=0 " in section
        assert "-x TORCHELASTIC_RESTART_COUNT=1 " in section
        assert f"-x TT_MESH_HOST_RANK={prepared.plan.ranks[r].host_rank} " in section
        assert "--wdir " in section  # a working directory of the job's own
    assert discover(Host(qb2)).chips  # the host is untouched


# --------------------------------------------------------------------------- real mpirun


# Each rank appends its lines to a file of its own: two ranks printing to mpirun's stdout at
# once may interleave (a CI run read "BTLBTL 1 self,tcp" when PYTHONUNBUFFERED split a print).
RANK_PROBE = """
import ctypes, os, sys
rank = os.environ.get("OMPI_COMM_WORLD_RANK")
def say(*words):
    with open(os.path.join(sys.argv[2], f"said.{rank}"), "a") as out:
        out.write(" ".join(str(w) for w in words) + "\\n")
say("BTL", rank, os.environ.get("OMPI_MCA_btl"))
try:
    lib = ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)
except OSError:
    sys.exit(0)  # no libmpi to load here: the transports are still what mpirun gave
lib.MPI_Init(None, None)
world = ctypes.addressof(ctypes.c_char.in_dll(lib, "ompi_mpi_comm_world"))
dup = ctypes.c_void_p()
assert lib.MPI_Comm_dup(ctypes.c_void_p(world), ctypes.byref(dup)) == 0  # tt-metal#57284's call
assert lib.MPI_Barrier(dup) == 0
say("DUP", rank)
lib.MPI_Finalize()
"""


def _ranks_over_hosts(mpirun: str, environ: dict[str, str], tmp_path: Path) -> tuple[list, str]:
    """Two ranks started with the options a mesh over several hosts gets (one host here,
    TCP on loopback); what each rank says of its transports, and mpirun's stderr."""
    from ttmesh.launcher.nodes import mpi

    probe = tmp_path / "probe.py"
    probe.write_text(RANK_PROBE)
    out = tmp_path / "said"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    ver = mpi.version(mpirun)
    argv = [mpirun, *mpi.tcp_args("lo", environ, ver), "-np", "2", "--oversubscribe"]
    if os.geteuid() == 0:
        argv.append("--allow-run-as-root")
    lib = str(Path(mpirun).resolve().parent.parent / "lib" / "libmpi.so.40")
    lib = lib if os.path.exists(lib) else "libmpi.so.40"
    proc = subprocess.run([*argv, sys.executable, str(probe), lib, str(out)], capture_output=True,
                          text=True, env=environ, timeout=120)  # fmt: skip
    lines = [line for f in sorted(out.iterdir()) for line in f.read_text().splitlines()]
    said = sorted(line.split()[1:] for line in lines if line.startswith("BTL"))
    dup = sorted(line for line in lines if line.startswith("DUP"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    try:
        import ctypes

        ctypes.CDLL(lib)
    except OSError:
        return said, proc.stderr  # no libmpi here: what the ranks were given is still checked
    assert dup == ["DUP 0", "DUP 1"], "\n".join(lines)  # MPI_Comm_dup ran over those transports
    return said, proc.stderr


# Open MPI 5's mpirun, when the conformance cache has it (tests/test_conformance_meshhosts.py).
OMPI5 = (
    Path(os.environ.get("TTMESH_CONFORMANCE_CACHE") or Path.home() / ".cache/ttmesh-conformance")
    / "ompi5/bin/mpirun"
)


@needs_mpirun
@pytest.mark.parametrize("which", ["PATH", "ompi5"])
def test_ranks_over_hosts_get_shared_memory_beside_tcp_unless_the_user_chose(
    tmp_path: Path, which: str
) -> None:
    """Ranks of a mesh over several hosts that share a host talk through shared memory, not
    TCP loopback (tt-metal#57284: tt-run's self,tcp deadlocks MPI_Comm_dup at 80 ranks,
    self,sm,tcp does not), under the name this Open MPI gives it; the user's OMPI_MCA_btl, or
    a btl line in their Open MPI parameter file, wins."""
    from ttmesh.launcher.nodes import mpi

    mpirun = shutil.which("mpirun") if which == "PATH" else str(OMPI5)
    if which == "ompi5" and not OMPI5.exists():
        pytest.skip("no Open MPI 5 in the conformance cache")
    assert mpirun is not None
    ver = mpi.version(mpirun)
    base = {k: v for k, v in os.environ.items() if not k.startswith("OMPI_MCA_")}
    base["HOME"] = str(tmp_path)
    said, _ = _ranks_over_hosts(mpirun, base, tmp_path)
    want = "self,sm,tcp" if ver is not None and ver >= (5, 0) else "self,vader,tcp"
    assert said == [["0", want], ["1", want]]
    said, _ = _ranks_over_hosts(mpirun, {**base, "OMPI_MCA_btl": "self,tcp"}, tmp_path)
    assert said == [["0", "self,tcp"], ["1", "self,tcp"]]
    conf = tmp_path / ".openmpi" / "mca-params.conf"
    conf.parent.mkdir()
    conf.write_text("# mine: loopback is fine here\n  btl_tcp_if_include = lo\nbtl = self,tcp\n")
    assert mpi.tcp_args("lo", base, ver) == ["--mca", "btl_tcp_if_include", "lo"]
    said, _ = _ranks_over_hosts(mpirun, base, tmp_path)
    # the file's, as Open MPI reads it (5.x hands it on in the ranks' environment, 4.x does not)
    assert said in ([["0", "None"], ["1", "None"]], [["0", "self,tcp"], ["1", "self,tcp"]])
    listed = {**base, "OMPI_MCA_mca_base_param_files": str(tmp_path / "none.conf")}
    assert mpi.tcp_args("lo", listed, ver)[:3] == ["--mca", "btl", want]


def test_the_shared_memory_transport_is_named_as_each_open_mpi_names_it() -> None:
    from ttmesh.launcher.nodes import mpi

    assert mpi.btl((5, 0)) == "self,sm,tcp"  # tt-metal#57284
    assert mpi.btl((4, 1)) == "self,vader,tcp"  # 4.x's "sm" fails MPI_Init
    assert mpi.btl(None) == "self,vader,tcp"  # 5.x takes vader as sm's alias


@needs_mpirun
def test_mpi_job_output_env_and_failure(qb2: Path, tmp_path: Path) -> None:
    res = run_cli(
        "launch",
        "--root",
        str(qb2),
        "--tp-size",
        "4",
        "--launcher",
        "mpi",
        "--workdir",
        ".",
        "--summary-json",
        str(tmp_path / "s.json"),
        *worker(
            f"env={tmp_path}",
            f"pids={tmp_path}",
            f"child={tmp_path}",
            "lines=3",
            "fail-after=2:0.5:3",
        ),
        timeout=60,
    )
    assert res.code == 3, res.err
    summary = json.loads((tmp_path / "s.json").read_text())
    assert (summary["source"], summary["rank"], summary["code"]) == ("worker", 2, 3)
    assert "rank 2 failing on purpose" in res.err
    lines = [ln for ln in res.out.splitlines() if ln]
    assert len(lines) == 12
    for line in lines:
        prefix, _, rest = line.partition(" ")
        assert rest.startswith(f"rank{prefix[2]}-line"), line[:50]
    envs = {r: json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)}
    for r, e in envs.items():
        assert e["OMPI_COMM_WORLD_RANK"] == str(r) == e["RANK"]
        assert e["WORLD_SIZE"] == "4"
        assert e["TT_METAL_MOCK_CLUSTER_DESC_PATH"].endswith(f"rank{r}_cluster_descriptor.yaml")
    assert len({e["TT_VISIBLE_DEVICES"] for e in envs.values()}) == 4
    pids = [int(p.read_text()) for p in tmp_path.glob("*.pid")] + [
        int(p.read_text()) for p in tmp_path.glob("*.child")
    ]
    wait_for(lambda: not [p for p in pids if alive(p)], timeout=5, what="every rank gone")


@needs_mpirun
def test_sigkill_of_ttmesh_takes_mpirun_and_ranks(qb2: Path, tmp_path: Path) -> None:
    proc = start_launch(
        qb2,
        "--tp-size",
        "4",
        "--launcher",
        "mpi",
        "--workdir",
        ".",
        *worker(f"pids={tmp_path}", f"setsid={tmp_path}"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: len(list(tmp_path.glob("*.setsid"))) == 4, what="ranks")
        pids = [int(p.read_text()) for p in (*tmp_path.glob("*.pid"), *tmp_path.glob("*.setsid"))]
        mpiruns = subprocess.run(
            ["pgrep", "-f", "mpirun --tag-output"], capture_output=True, text=True
        ).stdout.split()
        proc.kill()
        proc.wait()
        wait_for(lambda: not [p for p in pids if alive(p)], timeout=2.0, what="ranks gone")
        wait_for(
            lambda: not [int(p) for p in mpiruns if alive(int(p))], timeout=2.0, what="mpirun gone"
        )
    finally:
        proc.kill()
        proc.wait()


@needs_mpirun
def test_interrupt_stops_an_mpi_job(qb2: Path, tmp_path: Path) -> None:
    proc = start_launch(
        qb2,
        "--tp-size",
        "2",
        "--launcher",
        "mpi",
        "--workdir",
        ".",
        *worker(f"pids={tmp_path}"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(lambda: len(list(tmp_path.glob("*.pid"))) == 2, what="ranks")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert not [p for p in (int(f.read_text()) for f in tmp_path.glob("*.pid")) if alive(p)]


@needs_mpirun
def test_mpi_job_leases_holders_and_fabric(qb2: Path, tmp_path: Path) -> None:
    """A mesh over 4 processes brings the fabric up between all its chips: a killed rank
    leaves the links down, as on hardware, and ttmesh recovers them before it exits; the
    leases and holders show while it runs."""
    proc = start_launch(
        qb2,
        "--tp-size",
        "4",
        "--mesh-layout",
        "mesh",
        "--job-id",
        "mpi-job",
        "--workdir",
        ".",
        *worker(f"pids={tmp_path}"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(lambda: len(list(tmp_path.glob("*.pid"))) == 4, what="ranks")

        def listed() -> dict:
            return json.loads(run_cli("ls", "--root", str(qb2), "--json").out)

        wait_for(lambda: all(c["holders"] for c in listed()["chips"]), what="holders registered")
        ls = listed()
        assert {c["lease"]["job"] for c in ls["chips"]} == {"mpi-job"}
        ps = json.loads(run_cli("ps", "--root", str(qb2), "--json").out)["jobs"]
        assert [j["job"] for j in ps] == ["mpi-job"]
        assert sorted(r["pid"] for r in ps[0]["ranks"]) == sorted(
            int(p.read_text()) for p in tmp_path.glob("*.pid")
        )
        os.kill(int((tmp_path / "rank1.pid").read_text()), signal.SIGKILL)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGKILL, err
    # The killed rank left the links between the job's chips down; ttmesh saw it and recovered
    # them before exiting, keeping the rank's exit code.
    assert "resetting its chips" in err and "recovered and verified" in err, err
    ls = json.loads(run_cli("ls", "--root", str(qb2), "--json").out)
    assert {link["state"] for link in ls["links"]} == {"up"}


# --------------------------------------------------------------------------- rank bindings


def _binding(tmp_path: Path, ranks: list[dict], **extra: object) -> Path:
    import yaml

    mgd = tmp_path / "m.textproto"
    mgd.write_text("# placeholder\n")
    path = tmp_path / "bind.yaml"
    path.write_text(
        yaml.safe_dump({"rank_bindings": ranks, "mesh_graph_desc_path": str(mgd), **extra})
    )
    return path


@needs_mpirun
def test_rank_binding_env(qb2: Path, tmp_path: Path) -> None:
    path = _binding(
        tmp_path,
        [
            {
                "rank": 0,
                "mesh_id": 0,
                "mesh_host_rank": 1,
                "env_overrides": {"TT_VISIBLE_DEVICES": "0000:03:00.0", "FOO": "${HOME}/x"},
            },
            {
                "rank": 1,
                "mesh_id": 0,
                "mesh_host_rank": 0,
                "env_overrides": {"TT_VISIBLE_DEVICES": "0000:01:00.0"},
            },
        ],
        global_env={"BAR": "b"},
    )
    out = tmp_path / "out"
    out.mkdir()
    res = run_cli(
        "launch",
        "--root",
        str(qb2),
        "--rank-binding",
        str(path),
        "--workdir",
        ".",
        *worker(f"env={out}", "exit=0"),
        env={"TT_METAL_RUNTIME_ROOT": "/rt"},
    )
    assert res.code == 0, res.err
    e0 = json.loads((out / "rank0.json").read_text())
    e1 = json.loads((out / "rank1.json").read_text())
    assert e0["TT_VISIBLE_DEVICES"] == "0000:03:00.0" and e1["TT_VISIBLE_DEVICES"] == "0000:01:00.0"
    assert (e0["TT_MESH_HOST_RANK"], e1["TT_MESH_HOST_RANK"]) == ("1", "0")
    assert e0["TT_MESH_ID"] == "0" and e0["TT_RUN_RANK"] == "0" and e1["TT_RUN_RANK"] == "1"
    assert e0["TT_MESH_GRAPH_DESC_PATH"] == str(tmp_path / "m.textproto")
    assert e0["FOO"] == os.environ["HOME"] + "/x" and e0["BAR"] == "b"
    assert e0["TT_RUN_ORIGINAL_CWD"] == os.getcwd() and e0["TT_METAL_RUNTIME_ROOT"] == "/rt"
    assert e0["RANK"] == "0" and e0["LIBTT_SYMMETRIC_DRAM_MB"] == "2048"


@pytest.mark.parametrize(
    "ranks, needle",
    [
        (
            [
                {"rank": 0, "mesh_id": 0, "env_overrides": {"TT_VISIBLE_DEVICES": "0000:01:00.0"}},
                {"rank": 2, "mesh_id": 0, "env_overrides": {"TT_VISIBLE_DEVICES": "0000:03:00.0"}},
            ],
            "without gaps",
        ),
        (
            [{"rank": 0, "mesh_id": 0, "env_overrides": {"TT_VISIBLE_DEVICES": "0000:0f:00.0"}}],
            "no chip here",
        ),
        (
            [
                {"rank": 0, "mesh_id": 0, "env_overrides": {"TT_VISIBLE_DEVICES": "0000:01:00.0"}},
                {"rank": 1, "mesh_id": 0, "env_overrides": {"TT_VISIBLE_DEVICES": "0000:01:00.0"}},
            ],
            "given to ranks",
        ),
        (
            [
                {
                    "rank": 0,
                    "mesh_id": 0,
                    "env_overrides": {
                        "X": "${TTMESH_SURELY_UNSET_VAR}",
                        "TT_VISIBLE_DEVICES": "0000:01:00.0",
                    },
                }
            ],
            "is not set",
        ),
        # One rank naming no chips drives every chip (tests/test_ttrun_files.py); two share them.
        ([{"rank": 0, "mesh_id": 0}, {"rank": 1, "mesh_id": 0}], "no TT_VISIBLE_DEVICES"),
    ],
)
def test_bad_rank_bindings(qb2: Path, tmp_path: Path, ranks: list, needle: str) -> None:
    path = _binding(tmp_path, ranks)
    res = run_cli("launch", "--root", str(qb2), "--rank-binding", str(path), *worker("exit=0"))
    assert res.code == 2, res.err
    lines = [ln for ln in res.err.splitlines() if ln.startswith("ttmesh:")]
    assert len(lines) == 1 and needle in lines[0], res.err


def test_bad_launcher_and_missing_mpirun(qb2: Path, tmp_path: Path) -> None:
    res = run_cli(
        "launch", "--root", str(qb2), "--tp-size", "2", "--launcher", "slurm", *worker("exit=0")
    )
    assert res.code == 2 and "slurm" in res.err
    res = run_cli(
        "launch",
        "--root",
        str(qb2),
        "--tp-size",
        "2",
        "--launcher",
        "mpi",
        *worker("exit=0"),
        env={"TTMESH_MPIRUN": "/nonexistent/mpirun", "PATH": "/nonexistent"},
    )
    assert res.code == 2 and "apt-get install openmpi-bin" in res.err, res.err
    bad = tmp_path / "mpirun"
    bad.write_text("#!/bin/sh\necho 'mpirun: cannot start the daemon' >&2\nexit 1\n")
    bad.chmod(0o755)
    res = run_cli(
        "launch",
        "--root",
        str(qb2),
        "--tp-size",
        "2",
        "--launcher",
        "mpi",
        *worker("exit=0"),
        env={"TTMESH_MPIRUN": str(bad)},
    )
    assert res.code == 2, res.err
    assert res.err.strip().splitlines()[-1] == (
        "ttmesh: exit 2: mpirun failed to start the ranks: mpirun: cannot start the daemon"
    )


@pytest.mark.parametrize(
    "report",
    [
        # Open MPI 4's first words when a rank fails; the rank is named later, or not at all
        # when mpirun is gone first.
        "Primary job  terminated normally, but 1 process returned\\na non-zero exit code. "
        "Per user-direction, the job has been aborted.",
        "Process name: [[19556,1],1]\\n  Exit code:    3",
    ],
)
def test_a_rank_that_ends_before_ttmesh_sees_it_is_a_rank_failure(
    qb2: Path, tmp_path: Path, report: str
) -> None:
    """A rank that exits at once ends before ttmesh finds its PID: mpirun's report that a
    rank ran and failed makes it the rank's failure (its code), not mpirun failing to start."""
    fake = tmp_path / "mpirun"
    fake.write_text(f"#!/bin/sh\nprintf '{report}\\n' >&2\nexit 3\n")
    fake.chmod(0o755)
    res = run_cli("launch", "--root", str(qb2), "--tp-size", "2", "--launcher", "mpi",
                  *worker("exit=0"), env={"TTMESH_MPIRUN": str(fake)})  # fmt: skip
    assert res.code == 3, res.err
    assert "failed to start" not in res.err


@needs_mpirun
def test_an_mpi_rank_whose_program_is_not_on_its_path_is_one_line(
    qb2: Path, tmp_path: Path
) -> None:
    """mpirun said it in a dozen lines, then ttmesh ended with 'exit 2: mpirun failed to start
    the ranks: ----...': the program is checked on each rank's PATH first, as the direct
    starter does, and named in one line (127)."""
    mine = tmp_path / "bin"
    mine.mkdir()
    (mine / "prog").write_text("#!/bin/sh\nexit 0\n")
    (mine / "prog").chmod(0o755)
    res = run_cli("launch", "--root", str(qb2), "--tp-size", "2", "--launcher", "mpi",
                  "--env", "PATH=/nonexistent", "--grace", "300", "--", "prog",
                  env={"PATH": f"{mine}:{os.environ['PATH']}"}, timeout=120)  # fmt: skip
    assert res.code == 127, res.err
    lines = [ln for ln in res.err.splitlines() if not ln.startswith("simulated host: ")]
    assert len(lines) == 1, res.err
    assert "prog: command not found on the rank's PATH (/nonexistent)" in lines[0], res.err


MPI4_NOT_FOUND = """\
--------------------------------------------------------------------------
mpirun was unable to find the specified executable file, and therefore
did not launch the job.  This error was first reported for process
rank 1; it may have occurred for other processes as well.

NOTE: A common cause for this error is misspelling a mpirun command
      line parameter option (remember that mpirun interprets the first
      unrecognized command line token as the executable).

Node:       host-b
Executable: prog
--------------------------------------------------------------------------
"""
# Open MPI 5 (PRRTE), as users reported it: no node.
MPI5_NOT_FOUND = """\
prterun was unable to find the specified executable file, and therefore did
not launch the job.  This error was first reported for process rank
1; it may have occurred for other processes as well.

NOTE: A common cause for this error is misspelling a prterun command
   line parameter option (remember that prterun interprets the first
   unrecognized command line token as the executable).

Executable: prog
"""
MPI4_NOT_RUNNABLE = """\
--------------------------------------------------------------------------
mpirun was unable to launch the specified application as it could not access
or execute an executable:

Executable: prog
Node: host-b

while attempting to start process rank 1.
--------------------------------------------------------------------------
"""


@pytest.mark.parametrize(
    ("report", "code", "what"),
    [
        (MPI4_NOT_FOUND, 127, "could not start prog on host-b: mpirun found no such program"),
        (MPI5_NOT_FOUND, 127, "could not start prog: mpirun found no such program"),
        (MPI4_NOT_RUNNABLE, 126, "could not start prog on host-b: mpirun could not execute it"),
    ],
)
def test_mpiruns_report_of_a_program_it_could_not_run_names_it(
    qb2: Path, tmp_path: Path, report: str, code: int, what: str
) -> None:
    """Where ttmesh cannot look first (another host), mpirun's own report names the rank and
    the program: the job ends with that rank's one line and a shell's code, not 'mpirun failed
    to start the ranks' with exit 2."""
    (tmp_path / "report.txt").write_text(report)
    fake = tmp_path / "mpirun"
    fake.write_text(f"#!/bin/sh\ncat {tmp_path / 'report.txt'} >&2\nexit 134\n")
    fake.chmod(0o755)
    res = run_cli("launch", "--root", str(qb2), "--tp-size", "2", "--launcher", "mpi",
                  "--grace", "300", *worker("exit=0"), env={"TTMESH_MPIRUN": str(fake)},
                  timeout=120)  # fmt: skip
    assert res.code == code, res.err
    ours = [ln for ln in res.err.splitlines() if ln.startswith("ttmesh: ")]
    assert len(ours) == 1, res.err
    assert ours[0].startswith("ttmesh: rank 1 (") and what in ours[0], res.err


@needs_mpirun
def test_interrupt_before_the_ranks_are_known(qb2: Path, tmp_path: Path) -> None:
    """A SIGINT that arrives while mpirun is still starting its ranks stops the job cleanly."""
    proc = start_launch(
        qb2,
        "--tp-size",
        "4",
        "--launcher",
        "mpi",
        "--workdir",
        ".",
        *worker(f"pids={tmp_path}"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stderr is not None
        proc.stderr.readline()  # "simulated host: ..." : the launch is under way
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "supervisor error" not in err
    assert not [p for p in (int(f.read_text()) for f in tmp_path.glob("*.pid")) if alive(p)]
