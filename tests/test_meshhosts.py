"""A tt-metal mesh over several hosts (issue 13): one global plan from every host's report, and
one MPMD mpirun whose ranks do their host's duties (ttmesh _rank) before the command runs.

The planner is tested on simulated hosts read in this process (their reports built as each
host's ttmesh builds them); the reports through mpirun and the runs across hosts on emulated
hosts (tests/hosts.py), with a network of the test's own where ranks talk through MPI.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from conftest import CAPTURES, TAG, TW, scratch
from hosts import Network, can_emulate, can_network, launch_agent, make_hosts, mpi_env

from ttmesh.errors import TTMeshError
from ttmesh.host import clusterdesc
from ttmesh.launcher.nodes import hostreport, meshhosts, mpi, rankshim
from ttmesh.launcher.planning.request import LaunchRequest
from ttmesh.mesh import cluster as meshcluster
from ttmesh.sim import system

WHY = can_emulate()
NET_WHY = can_network()
needs_hosts = pytest.mark.skipif(WHY is not None, reason=WHY or "")
needs_mpirun = pytest.mark.skipif(
    subprocess.run(["sh", "-c", "command -v mpirun"], capture_output=True).returncode != 0,
    reason="needs mpirun (apt-get install openmpi-bin)",
)


# --------------------------------------------------------------------------- reports, in-process


def _reports(base: Path, name: str, order: list[int] | None = None) -> list:
    """Every host of a multi-host system simulated under ``base`` and reported as its own ttmesh
    reports it (hostreport.make, then parsed back as the launcher reads it)."""
    from ttmesh.cli.hosts import open_host
    from ttmesh.sim.create import create

    model = system.load_any(name)
    assert isinstance(model, system.ClusterModel)
    out = []
    for i in order or range(len(model.hosts)):
        root = base / f"{name}-{i}"
        if not root.exists():
            create(model.host(i), root, config={"reset_seconds": 0.0})
        data = json.loads(json.dumps(hostreport.make(open_host(root))))
        out.append(hostreport.parse(data, f"h{i}"))
    return out


@pytest.fixture
def base(tmp_path: Path) -> Iterator[Path]:
    with scratch(tmp_path / "hosts") as path:
        yield path


def _mh(names: list[str], environ: dict[str, str] | None = None) -> meshhosts.MpiHosts:
    return meshhosts.MpiHosts(names, "/usr/bin/mpirun", (4, 1), environ=environ or {})


def _plan(reported: list, nproc: int | None = None, **kw: object):
    names = [view.name for view, _w, _h in reported]
    req = LaunchRequest(
        command=[], tp_size=kw.pop("tp_size", None), layout="mesh", nproc=nproc,  # type: ignore[arg-type]
        job="mh-test", run_dir="/run-dir", cwd="/", strict_links=True, **kw,  # type: ignore[arg-type]
    )  # fmt: skip
    return meshhosts.plan_over(req, reported, _mh(names), descriptor_only=True).plan


def test_two_t3ks_join_through_their_eight_cables(base: Path) -> None:
    reported = _reports(base, "dual-t3k")
    c = meshcluster.join([v for v, _w, _h in reported])
    assert len(c.inv.chips) == 16 and len(c.cables) == 8
    assert {(c.host_of[lk.a], c.host_of[lk.b]) for lk in c.cables} <= {(0, 1), (1, 0)}
    sel, grid = meshcluster.select(c, 16)
    # tt-metal's own dual-T3K: a 1x16 line over 2 hosts (here the cables close it to a ring).
    assert (sel.shape, sel.dim_types, sel.channels) == ((1, 16), ("LINE", "RING"), 2)
    assert (grid.dims, grid.block) == ((1, 2), (1, 8))
    assert [c.host_of[sel.grid[(0, col)]] for col in range(16)] == [0] * 8 + [1] * 8


def test_a_cable_down_at_one_end_holds_the_start_naming_both_ends(base: Path) -> None:
    """Host 0 reads one end of a cable down (it was reset alone): its report carries its cable
    ends, and the plan's hosts not ready name that cable by host, PCI address and channel on
    both sides, with the reset of both hosts as the fix."""
    from ttmesh.cli.hosts import open_host

    _reports(base, "dual-t3k")  # the two roots
    h0 = open_host(base / "dual-t3k-0")
    with h0.sim.change() as state:
        a, ca, b, cb = h0.sim.remote_links()[0]
        state["links_down"] = [h0.sim.link_key(a, ca, b, cb)]
    reported = _reports(base, "dual-t3k")
    assert [len(v.cable_ends) for v, _w, _h in reported] == [8, 8]
    names = [view.name for view, _w, _h in reported]
    req = LaunchRequest(command=[], tp_size=16, layout="mesh", nproc=1, job="mh-test",
                        run_dir="/run-dir", cwd="/", strict_links=True)  # fmt: skip
    prepared = meshhosts.plan_over(req, reported, _mh(names), descriptor_only=True)
    assert len(prepared.hosts_not_ready) == 1, prepared.hosts_not_ready
    host, what, fix = prepared.hosts_not_ready[0]
    bdf = reported[0][0].inv.chip(a).bdf or ""
    assert host == "h0" and what.startswith(f"cable h0 {bdf} ch{ca} <-> h1 "), what
    assert what.endswith(f" ch{cb} is down") and fix == (
        "reset both ends together: ttmesh reset --hosts h0,h1"
    ), (what, fix)


def test_four_galaxies_are_placed_by_their_wiring_not_their_order(base: Path) -> None:
    """Hosts named 0,2,1,3: the 8x16 torus still runs 0-1-2-3 along its ring (the cables say
    so); ranks are node-major in the given order, host ranks their place in the mesh."""
    reported = _reports(base, "quad-galaxy", order=[0, 2, 1, 3])
    c = meshcluster.join([v for v, _w, _h in reported])
    sel, grid = meshcluster.select(c, 128)
    assert (sel.shape, sel.dim_types, sel.channels) == ((8, 16), ("RING", "RING"), 4)
    assert grid.place == {0: (0, 0), 2: (0, 1), 1: (0, 2), 3: (0, 3)}
    plan = _plan(reported, nproc=1)
    assert [(r.rank, plan.hosts[r.node], r.host_rank) for r in plan.ranks] == [
        (0, "h0", 0), (1, "h2", 2), (2, "h1", 1), (3, "h3", 3),
    ]  # fmt: skip
    assert plan.host_dims == (1, 4)


def test_each_rank_gets_tt_metals_own_view_of_its_host(base: Path) -> None:
    """One rank per T3K: its mock cluster is what tt-umd wrote on that host of tt-metal's
    dual-T3K (same chips, links, and the cables as links to remote devices)."""
    plan = _plan(_reports(base, "dual-t3k"), nproc=1)
    for rank in plan.ranks:
        ours = clusterdesc.loads(
            plan.files[f"/run-dir/mock/rank{rank.rank}_cluster_descriptor.yaml"]
        )
        theirs = clusterdesc.load(CAPTURES / f"dual-t3k-host{rank.node}.yaml")
        uid = {c.id: c.unique_id for c in ours.chips.values()}
        tuid = {c.id: c.unique_id for c in theirs.chips.values()}
        assert sorted(uid.values()) == sorted(tuid.values())
        assert {(uid[r.chip], r.chan, r.remote_unique_id, r.remote_chan) for r in ours.remote_links} == {
            (tuid[r.chip], r.chan, r.remote_unique_id, r.remote_chan) for r in theirs.remote_links
        }  # fmt: skip
        assert len(ours.links) == len(theirs.links) == 20
    # One descriptor for every host: a 1x16 mesh, host_topology 1x2, 2 STRICT channels.
    text = plan.files["/run-dir/mesh/mesh.textproto"]
    assert "dims: 16" in text and "count: 2" in text and "policy: STRICT" in text
    assert {r.env["TT_MESH_GRAPH_DESC_PATH"] for r in plan.ranks} == {
        "/run-dir/mesh/mesh.textproto"
    }


def test_ranks_are_node_major_with_the_global_torchrun_contract(base: Path) -> None:
    plan = _plan(_reports(base, "dual-t3k"), nproc=2)
    rows = [
        (r.rank, r.node, r.env["LOCAL_RANK"], r.env["GROUP_RANK"], r.env["TT_MESH_HOST_RANK"])
        for r in plan.ranks
    ]
    assert rows == [
        (0, 0, "0", "0", "0"),
        (1, 0, "1", "0", "1"),
        (2, 1, "0", "1", "2"),
        (3, 1, "1", "1", "3"),
    ]
    for r in plan.ranks:
        assert (r.env["WORLD_SIZE"], r.env["LOCAL_WORLD_SIZE"], r.env["GROUP_WORLD_SIZE"]) == (
            "4",
            "2",
            "2",
        )
        assert (r.env["MASTER_ADDR"], r.env["TTMESH_NNODES"]) == ("h0", "2")
        assert r.env["TTMESH_SIM_ROOT"].endswith(f"dual-t3k-{r.node}")  # the rank's own host
    assert plan.mpi_args == [
        "--host", "h0:2,h1:2", "--rankfile", "mpi/rankfile",
        # two ranks a host: shared memory between them (Open MPI 4.1's vader), tt-metal#57284
        "--mca", "btl", "self,vader,tcp", "--mca", "btl_tcp_if_exclude", "docker0,lo",
        "--oversubscribe",
    ]  # fmt: skip
    assert plan.files["/run-dir/mpi/rankfile"] == (
        "rank 0=h0 slot=0\nrank 1=h0 slot=0\nrank 2=h1 slot=0\nrank 3=h1 slot=0\n"
    )


def test_a_galaxy_mesh_gets_its_physical_groupings(base: Path) -> None:
    plan = _plan(_reports(base, "quad-galaxy"), nproc=1)
    text = plan.files["/run-dir/mesh/groupings.textproto"]
    assert text.count('name: "ttmesh_block_') == 4 and "row_major_mesh { dims: [1, 4] }" in text
    assert text.count("tray_id: TRAY_") == 128
    assert {r.env["TT_METAL_PHYSICAL_GROUPING_DESCRIPTOR_PATH"] for r in plan.ranks} == {
        "/run-dir/mesh/groupings.textproto"
    }
    t3k = _plan(_reports(base, "dual-t3k"), nproc=1)
    assert "/run-dir/mesh/groupings.textproto" not in t3k.files


def test_swapped_host_ranks_are_named_against_the_wiring(base: Path) -> None:
    reported = _reports(base, "quad-galaxy")
    c = meshcluster.join([v for v, _w, _h in reported])
    ranks = [(i, i, c.chips_of(i)) for i in range(4)]
    assert meshcluster.check_host_ranks(c, (1, 4), ranks) is None
    swapped = [
        (0, 1, c.chips_of(0)),
        (1, 0, c.chips_of(1)),
        (2, 2, c.chips_of(2)),
        (3, 3, c.chips_of(3)),
    ]
    assert meshcluster.check_host_ranks(c, (1, 4), swapped) == (
        "mesh host ranks 1 (rank 0 on h0) and 2 (rank 2 on h2) are neighbours in host_topology "
        "1x4, but no link joins their chips: the host ranks are swapped against the wiring"
    )


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        ({"tp_size": 15}, "tp-size 15: 2 hosts share a mesh equally (give a multiple of 2"),
        ({"tp_size": 16, "mesh_shape": (4, 4)}, "tp-size 16: no mesh shape 4x4 over these 2 hosts"),
        ({"tp_size": 16, "nproc": 3}, "6 workers cannot share a 1x16 mesh equally"),
        ({"tp_size": 16, "mesh_shape": (2, 4)}, "--mesh-shape 2x4 has 8 chips but --tp-size is 16"),
        ({"mesh_shape": (2, 4)}, "--mesh-shape 2x4 has 8 chips but --tp-size is 16"),  # every chip
    ],
)
def test_plans_that_cannot_be_are_one_line(base: Path, kw: dict, needle: str) -> None:
    with pytest.raises(TTMeshError) as info:
        _plan(_reports(base, "dual-t3k"), **kw)
    assert info.value.code == 2 and needle in str(info.value) and "\n" not in str(info.value)


def test_a_host_named_twice_is_refused(base: Path) -> None:
    reported = _reports(base, "dual-t3k", order=[0, 0])
    with pytest.raises(TTMeshError) as info:
        meshcluster.join([v for v, _w, _h in reported])
    assert "hosts h0 and h0 both report chip" in str(info.value)


def test_open_mpi_4_and_5_spell_rankfiles_and_agents_differently() -> None:
    assert mpi.rankfile_args((4, 1), "rf") == ["--rankfile", "rf"]
    assert mpi.rankfile_args((5, 0), "rf") == ["--map-by", "rankfile:file=rf"]
    assert mpi.agent_args((4, 1), "/a") == ["--mca", "plm_rsh_agent", "/a"]
    assert mpi.agent_args((5, 0), "/a") == ["--prtemca", "plm_ssh_agent", "/a"]
    assert mpi.tcp_args("eth0", {}, (5, 0)) == [
        "--mca",
        "btl",
        "self,sm,tcp",  # tt-metal#57284: shared memory between ranks of one host
        "--mca",
        "btl_tcp_if_include",
        "eth0",
    ]
    assert (
        mpi.tcp_args(None, {"OMPI_MCA_btl": "self,tcp", "OMPI_MCA_btl_tcp_if_include": "lo"}) == []
    )
    for text, ver in (("mpirun (Open MPI) 4.1.4\n", (4, 1)), ("mpirun (Open MPI) 5.0.7\n", (5, 0))):
        assert mpi.VERSION.search(text).groups()[:2] == tuple(str(v) for v in ver)  # type: ignore[union-attr]


# --------------------------------------------------------------------------- the rank's duties


def _rank(
    root: Path, chips: list[str], *command: str, files: dict | None = None
) -> subprocess.CompletedProcess:
    env = {**os.environ, "TTMESH_ROOT": str(root), "TTMESH_RANK": "0", "TTMESH_RANK_HOST": "h0",
           "TTMESH_JOB_ID": "mh-shim", "TTMESH_RANK_CHIPS": json.dumps(chips),
           "TTMESH_RANK_FILES": json.dumps(files or {})}  # fmt: skip
    return subprocess.run([sys.executable, "-m", "ttmesh", "_rank", "--", *command],
                          env=env, capture_output=True, text=True, timeout=60)  # fmt: skip


def test_a_rank_on_the_wrong_host_stops_with_one_line(base: Path) -> None:
    _reports(base, "dual-t3k")
    host0 = [
        c.asic_id
        for c in system.load_any("dual-t3k").host(0).to_cluster_descriptor().chips.values()
    ]  # type: ignore[union-attr]
    res = _rank(base / "dual-t3k-1", host0, "true")
    assert res.returncode == 3, res.stderr
    line = res.stderr.strip().splitlines()[-1]
    assert line.startswith("ttmesh: not started on ")
    assert ": rank 0 was planned on host h0 but runs on " in line
    assert "which has none of its chips" in line and "the hosts are swapped" in line
    # The launching ttmesh reads this as a refusal before the command ran: no recovery, no
    # restart (a rank's own exit 3 is a crash like any other).
    tail = res.stderr.strip().splitlines()
    assert rankshim.refused_before_start(3, tail)
    assert not rankshim.refused_before_start(7, tail)
    assert not rankshim.refused_before_start(3, ["ttmesh: rank 0 exited", "exit 3 by itself"])
    assert not rankshim.refused_before_start(3, [*tail, "the program's own last line"])


def test_a_rank_writes_its_files_and_holds_its_leases_while_it_runs(base: Path) -> None:
    _reports(base, "dual-t3k")
    root = base / "dual-t3k-0"
    chips = sorted(system.load_any("dual-t3k").host(0).chips, key=lambda c: c.id)  # type: ignore[union-attr]
    asics = [c.asic_id for c in chips]
    target = base / "run" / "mesh" / "mesh.textproto"
    res = _rank(root, asics, sys.executable, "-m", "ttmesh", "ls", "--root", str(root), "--json",
                files={str(target): "mesh {}\n"})  # fmt: skip
    assert res.returncode == 0, res.stderr
    seen = json.loads(res.stdout)
    assert {c["asic_id"]: (c["lease"] or {}).get("job") for c in seen["chips"]} == dict.fromkeys(
        asics, "mh-shim"
    )
    assert target.read_text() == "mesh {}\n"
    after = subprocess.run([sys.executable, "-m", "ttmesh", "ls", "--root", str(root), "--json"],
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert all(c["lease"] is None for c in json.loads(after.stdout)["chips"])


# --------------------------------------------------------------------------- emulated hosts


@pytest.fixture
def world(tmp_path: Path) -> Iterator[Path]:
    with scratch(tmp_path / "world") as path:
        path.chmod(0o777)
        yield path


def _run(hosts: list, agent: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    names = ",".join(h.name for h in hosts)
    argv = [a.replace("HOSTS", names) for a in args]
    return subprocess.run([sys.executable, "-m", "ttmesh", *argv], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **mpi_env(agent)})  # fmt: skip


@needs_hosts
@needs_mpirun
def test_descriptor_over_two_emulated_t3ks(world: Path, tmp_path: Path) -> None:
    """Each host reports through mpirun (ttmesh _host-report on that host); one descriptor, the
    per-rank table naming each rank's host, tt-run's binding and the rankfile it runs with."""
    hosts = make_hosts(world, "dual-t3k")
    agent = launch_agent(world, hosts)
    out = tmp_path / "out"
    res = _run(hosts, agent, "descriptor", "--hosts", "HOSTS", "--mesh-layout", "mesh",
               "--nproc-per-node", "1", "--strict-links", "--per-rank", "-o", str(out),
               "--export-rank-binding", str(out / "b.yaml"))  # fmt: skip
    assert res.returncode == 0, res.stderr
    rows = [ln.split()[:5] for ln in res.stdout.splitlines() if ln.split()[:1] in (["0"], ["1"])]
    assert rows == [
        ["0", "ttmh-0", "0000:31:00.0,0000:4b:00.0,0000:b1:00.0,0000:ca:00.0", "0", "0"],
        ["1", "ttmh-1", "0000:ca:00.0,0000:b1:00.0,0000:4b:00.0,0000:31:00.0", "0", "1"],
    ]
    assert sorted(p.name for p in out.iterdir()) == [
        "b.rankfile", "b.yaml", "mesh.textproto", "rank0_cluster_descriptor.yaml",
        "rank1_cluster_descriptor.yaml",
    ]  # fmt: skip
    binding = yaml.safe_load((out / "b.yaml").read_text())
    assert [(b["rank"], b["mesh_id"], b["mesh_host_rank"]) for b in binding["rank_bindings"]] == [
        (0, 0, 0), (1, 0, 1),
    ]  # fmt: skip
    # tt-run's binding has no host field: the rankfile places the ranks.
    assert {k for b in binding["rank_bindings"] for k in b} == {
        "rank", "mesh_id", "mesh_host_rank", "env_overrides",
    }  # fmt: skip
    assert (out / "b.rankfile").read_text() == "rank 0=ttmh-0 slot=0\nrank 1=ttmh-1 slot=0\n"
    assert "--host ttmh-0:1,ttmh-1:1 --rankfile b.rankfile" in (out / "b.yaml").read_text()


@needs_hosts
@needs_mpirun
def test_a_mesh_over_two_emulated_t3ks_runs_each_rank_on_its_host(world: Path) -> None:
    """One MPMD mpirun (rankfile, --host, the agent instead of ssh): every rank starts on its
    own emulated host, with its chips, host rank and mock cluster there; the plan's exit code."""
    hosts = make_hosts(world, "dual-t3k")
    agent = launch_agent(world, hosts)
    envs = world / "envs"
    envs.mkdir()
    envs.chmod(0o777)
    res = _run(hosts, agent, "launch", "--hosts", "HOSTS", "--mesh-layout", "mesh",
               "--nproc-per-node", "2", "--tp-size", "16", "--", sys.executable, TW, TAG,
               f"env={envs}", "exit=0")  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    seen = {
        int(p.stem.removeprefix("rank")): json.loads(p.read_text()) for p in envs.glob("*.json")
    }
    assert sorted(seen) == [0, 1, 2, 3]
    for rank, env in seen.items():
        node = rank // 2
        assert env["TTMESH_RANK_HOST"] == f"ttmh-{node}" and env["GROUP_RANK"] == str(node)
        assert env["TTMESH_ROOT"] == str(hosts[node].root)  # started by that host's agent
        assert env["TTMESH_SIM_ROOT"] == str(hosts[node].root)
        assert env["TT_MESH_HOST_RANK"] == str(rank) and env["LOCAL_RANK"] == str(rank % 2)
        assert "TTMESH_RANK_FILES" not in env  # the rank's ttmesh wrote them, then dropped it
    failing = _run(hosts, agent, "launch", "--hosts", "HOSTS", "--mesh-layout", "mesh",
                   "--nproc-per-node", "1", "--tp-size", "16", "--", sys.executable, TW, TAG,
                   "exit=7")  # fmt: skip
    assert failing.returncode == 7, failing.stderr


@needs_hosts
@needs_mpirun
def test_a_binding_with_swapped_host_ranks_is_refused_before_anything_starts(
    world: Path, tmp_path: Path
) -> None:
    """tt-run's binding for four Galaxies with galaxies 0 and 1 trading host ranks: ttmesh's
    pre-flight names the pair the wiring cannot join, in one line, and starts no rank (exit 3);
    the binding as exported runs the plan's own check clean (--dry-run)."""
    hosts = make_hosts(world, "quad-galaxy")
    agent = launch_agent(world, hosts)
    out = tmp_path / "out"
    res = _run(hosts, agent, "descriptor", "--hosts", "HOSTS", "--mesh-layout", "mesh",
               "--nproc-per-node", "1", "-o", str(out), "--export-rank-binding",
               str(out / "b.yaml"))  # fmt: skip
    assert res.returncode == 0, res.stderr
    good = _run(hosts, agent, "launch", "--hosts", "HOSTS", "--rank-binding", str(out / "b.yaml"),
                "--dry-run", "--json", "--", "true")  # fmt: skip
    assert good.returncode == 0, good.stderr
    assert [r["host"] for r in json.loads(good.stdout)["ranks"]] == [h.name for h in hosts]
    data = yaml.safe_load((out / "b.yaml").read_text())
    data["rank_bindings"][0]["mesh_host_rank"], data["rank_bindings"][1]["mesh_host_rank"] = 1, 0
    (out / "s.yaml").write_text(yaml.safe_dump(data))
    (out / "s.rankfile").write_text((out / "b.rankfile").read_text())
    marker = world / "started"
    bad = _run(hosts, agent, "launch", "--hosts", "HOSTS", "--rank-binding", str(out / "s.yaml"),
               "--", "touch", str(marker))  # fmt: skip
    assert bad.returncode == 3, bad.stderr
    lines = bad.stderr.strip().splitlines()
    assert lines[-1] == (
        f"ttmesh: pre-flight: {out / 's.yaml'}: mesh host ranks 1 (rank 0 on ttmh-0) and 2 "
        "(rank 2 on ttmh-2) are neighbours in host_topology 1x4, but no link joins their chips: "
        "the host ranks are swapped against the wiring (give each rank the host rank of its place "
        "in the wiring (ttmesh descriptor --hosts ... --export-rank-binding writes one))"
    )
    assert not marker.exists()


@needs_hosts
@needs_mpirun
@pytest.mark.skipif(NET_WHY is not None, reason=NET_WHY or "")
def test_a_mesh_over_hosts_on_a_network_of_their_own(world: Path) -> None:
    """The emulated hosts on a test network (one namespace each, bridged): mpirun, started in
    the launcher's namespace, reaches them over it, and the ranks' MPI transport is tt-run's
    --tcp-interface (their eth0)."""
    net = Network(f"ttmt{os.getpid() % 100000}", 2)
    net.up()
    try:
        hosts = make_hosts(world, "dual-t3k", net=net)
        agent = launch_agent(world, hosts)
        envs = world / "envs"
        envs.mkdir()
        envs.chmod(0o777)
        res = subprocess.run(
            [*net.enter(net.launcher), sys.executable, "-m", "ttmesh", "launch", "--hosts",
             ",".join(h.name for h in hosts), "--tcp-interface", "eth0", "--mesh-layout", "mesh",
             "--nproc-per-node", "1", "--tp-size", "16", "--", sys.executable, TW, TAG,
             f"env={envs}", "exit=0"],
            capture_output=True, text=True, timeout=180, env={**os.environ, **mpi_env(agent, net)},
        )  # fmt: skip
    finally:
        net.down()
    assert res.returncode == 0, res.stdout + res.stderr
    seen = {
        int(p.stem.removeprefix("rank")): json.loads(p.read_text()) for p in envs.glob("*.json")
    }
    assert {r: env["TTMESH_ROOT"] for r, env in seen.items()} == {
        0: str(hosts[0].root),
        1: str(hosts[1].root),
    }


@needs_hosts
@needs_mpirun
def test_a_crash_over_hosts_is_recovered_on_every_host_before_all_restart(world: Path) -> None:
    """Each rank brings up its host's links (a crash leaves them down, as on hardware); after
    the failed attempt every host checks its chips and cable ends, both hosts reset together
    (a T3K's reset takes its eight chips, so every cable's both ends), the cables train, every
    cable is verified from both ends, then all ranks restart."""
    hosts = make_hosts(world, "dual-t3k")
    agent = launch_agent(world, hosts)
    crash_once = "exit $(( TORCHELASTIC_RESTART_COUNT == 0 ? 7 : 0 ))"
    res = _run(hosts, agent, "launch", "--hosts", "HOSTS", "--mesh-layout", "mesh",
               "--nproc-per-node", "1", "--tp-size", "16", "--max-restarts", "1",
               "--", "sh", "-c", crash_once, TAG)  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    notes = [ln for ln in res.stderr.splitlines() if ln.startswith("ttmesh: ")]
    for host in ("ttmh-0", "ttmh-1"):
        recovered = [n for n in notes if n.startswith(f"ttmesh: host {host}: ")]
        assert len(recovered) == 1, notes
        assert " are down " in recovered[0] and "chips reset and verified" in recovered[0]
        assert notes.index(recovered[0]) < next(
            i for i, n in enumerate(notes) if "restarting every rank" in n
        ), notes
    together = [n for n in notes if "cables reset together at both ends and trained" in n]
    assert len(together) == 1 and ": 8 between ttmh-0 and ttmh-1 (" in together[0], notes
    assert notes.index(together[0]) < next(
        i for i, n in enumerate(notes) if "restarting every rank" in n
    ), notes
    assert "ttmesh: attempt 2: every rank succeeded (exit 0" in res.stderr
    after = _run(hosts, agent, "check", "--hosts", "HOSTS")
    assert after.returncode == 0, after.stdout + after.stderr


@needs_hosts
@needs_mpirun
def test_a_bad_cable_is_named_by_both_ends_and_the_job_not_restarted(world: Path) -> None:
    """Rank 0's first attempt makes one cable bad (it never trains again), then crashes: both
    hosts reset together, the cable stays down after the training wait, and ttmesh names it by
    host, PCI address and channel on both sides, with what to do; no restart, the rank's code."""
    from ttmesh.sim.core import SimRoot

    hosts = make_hosts(world, "dual-t3k")
    agent = launch_agent(world, hosts)
    asic, chan, _peer, peer_chan = SimRoot(str(hosts[0].root)).remote_links()[0]
    spoil = ('[ "$RANK" = 0 ] && "$0" -m ttmesh sim fault --root "$TTMESH_SIM_ROOT" bad-cable '
             f'{asic} --channel {chan} >/dev/null; exit 7')  # fmt: skip
    res = _run(hosts, agent, "launch", "--hosts", "HOSTS", "--mesh-layout", "mesh",
               "--nproc-per-node", "1", "--tp-size", "16", "--max-restarts", "1",
               "--train-timeout", "1", "--", "sh", "-c", spoil, sys.executable, TAG)  # fmt: skip
    assert res.returncode == 7, res.stdout + res.stderr
    notes = [ln for ln in res.stderr.splitlines() if ln.startswith("ttmesh: ")]
    bad = [n for n in notes if n.startswith("ttmesh: cable ttmh-0 ")]
    assert len(bad) == 1, notes
    assert f" ch{chan} <-> ttmh-1 0000:" in bad[0] and bad[0].endswith(
        f" ch{peer_chan} is still down after both ends were reset together and 1 s of "
        "training: reseat or replace that cable, then ttmesh reset --hosts ttmh-0,ttmh-1"
    ), bad
    assert any(n.startswith("ttmesh: not restarting: cable ttmh-0 ") for n in notes), notes
    assert "restarting every rank" not in res.stderr, notes
    assert "cables reset together at both ends and trained: 7 between ttmh-0 and ttmh-1" in (
        res.stderr
    ), notes


@needs_hosts
@needs_mpirun
def test_one_host_reset_alone_holds_the_start_until_auto_reset_resets_both(world: Path) -> None:
    """Host 0 reset by itself downs every cable on both sides: a launch names one (by both
    ends) and how many more, starting nothing (exit 3); --auto-reset resets both hosts
    together, the cables train, and the job runs."""
    hosts = make_hosts(world, "dual-t3k")
    agent = launch_agent(world, hosts)
    alone = subprocess.run([sys.executable, "-m", "ttmesh", "reset", "--root", str(hosts[0].root)],
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert alone.returncode == 0, alone.stderr
    args = ["launch", "--hosts", "HOSTS", "--mesh-layout", "mesh", "--nproc-per-node", "1",
            "--tp-size", "16"]  # fmt: skip
    held = _run(hosts, agent, *args, "--", "true")
    assert held.returncode == 3, held.stdout + held.stderr
    last = held.stderr.strip().splitlines()[-1]
    assert last.startswith("ttmesh: host ttmh-0 is not ready: pre-flight: cable ttmh-0 0000:"), last
    assert (
        " <-> ttmh-1 0000:" in last
        and " is down (and 7 more) (on ttmh-0: reset both ends "
        "together: ttmesh reset --hosts ttmh-0,ttmh-1, or add --auto-reset"
        in last
    ), last
    ran = _run(hosts, agent, *args, "--auto-reset", "--", "true")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    notes = [ln for ln in ran.stderr.splitlines() if ln.startswith("ttmesh: ")]
    for host in ("ttmh-0", "ttmh-1"):
        assert f"ttmesh: host {host}: 8 cable ends down: chips reset and verified" in (
            "\n".join(notes)
        ), notes
    assert any(": 8 between ttmh-0 and ttmh-1 (" in n for n in notes), notes


def test_a_hosts_recovery_first_ends_what_the_job_left_there() -> None:
    """A rank's child that outlived its ttmesh (SIGKILLed by mpirun) still holds the chips:
    the host's recovery finds the job's processes by their TTMESH_JOB_ID, gives them the grace
    to end, then SIGKILLs them; other jobs' processes are left alone."""
    from ttmesh.recovery import afterjob

    ignore = [sys.executable, "-c", "import signal,time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
              "print(flush=True)\ntime.sleep(60)", TAG]  # fmt: skip
    mine = subprocess.Popen(ignore, env={**os.environ, "TTMESH_JOB_ID": "jleft-1"},
                            stdout=subprocess.PIPE)  # fmt: skip
    other = subprocess.Popen(ignore, env={**os.environ, "TTMESH_JOB_ID": "jleft-2"},
                             stdout=subprocess.PIPE)  # fmt: skip
    try:
        for p in (mine, other):
            assert p.stdout is not None and p.stdout.readline() == b"\n"  # started, env set
        assert [pid for pid, _t in afterjob.leftovers("jleft-1")] == [mine.pid]
        assert afterjob.end_leftovers("jleft-1", 0.2) == 0
        assert mine.wait(timeout=10) == -9
        assert other.poll() is None and afterjob.leftovers("jleft-1") == []
    finally:
        for p in (mine, other):
            p.kill()
            p.wait()


@needs_hosts
@needs_mpirun
def test_a_rank_not_started_on_its_host_refuses_the_job_after_the_others_recover(
    world: Path,
) -> None:
    """The command exists on host 0 only: host 1's rank ends in its ttmesh before it runs
    ("not started on ttmh-1", 127). The job is refused with that line and code, with no restart
    though --max-restarts allows one; the rank that had started on host 0 was stopped, and that
    host's chips were checked and recovered first, host 1's ends of their cables with them."""
    hosts = make_hosts(world, "dual-t3k")
    agent = launch_agent(world, hosts)
    name = f"ttmesh-job-{os.getpid()}.sh"
    script = f"#!/bin/sh\ntouch {world}/started-$RANK\nexec {sys.executable} {TW} {TAG} sleep=60\n"
    placed = [Path("/tmp") / name, hosts[0].dir / "tmp" / name]  # here (the launcher), host 0
    for path in placed:
        path.write_text(script)
        path.chmod(0o755)
    try:
        res = _run(hosts, agent, "launch", "--hosts", "HOSTS", "--mesh-layout", "mesh",
                   "--nproc-per-node", "1", "--tp-size", "16", "--max-restarts", "1",
                   "--", f"/tmp/{name}")  # fmt: skip
    finally:
        placed[0].unlink()
    assert res.returncode == 127, res.stdout + res.stderr
    notes = [ln for ln in res.stderr.splitlines() if ln.startswith("ttmesh: ")]
    assert notes[-1] == (
        f"ttmesh: not started on ttmh-1: cannot run /tmp/{name}: No such file or directory"
    ), notes
    assert notes[0].startswith("ttmesh: host ttmh-0: ") and notes[0].endswith(
        "chips reset and verified", 0, notes[0].rindex(" (")
    ), notes
    # Host 0's rank died with the fabric open: its cables are down from both ends (the shared
    # cable state), so host 1 resets its ends for them.
    assert notes[1].startswith("ttmesh: host ttmh-1: 8 cable ends down: chips reset"), notes
    assert notes[2].startswith("ttmesh: cables reset together at both ends and trained: 8 "), notes
    assert len(notes) == 4 and "restarting" not in res.stderr, notes
    assert (world / "started-0").exists() and not (world / "started-1").exists()


@needs_hosts
@needs_mpirun
def test_auto_reset_over_hosts_recovers_before_the_start(world: Path) -> None:
    """Links down between the job's chips on one host (its report says so): the start is
    refused in one line naming that host, and nothing starts anywhere or is reset; with
    --auto-reset that host's chips are reset before anything starts, and the other host's
    ends of the cables that reset takes with them (a cable trains only when both ends are reset
    together)."""
    hosts = make_hosts(world, "dual-t3k")
    agent = launch_agent(world, hosts)
    fault = subprocess.run([sys.executable, "-m", "ttmesh", "sim", "fault", "--root",
                            str(hosts[1].root), "link-down", "0000:31:00.0", "0000:4b:00.0"],
                           capture_output=True)  # fmt: skip
    assert fault.returncode == 0, fault.stderr
    job = ["launch", "--hosts", "HOSTS", "--mesh-layout", "mesh", "--nproc-per-node", "1",
           "--tp-size", "16", "--max-restarts", "2"]  # fmt: skip
    marker = world / "started"
    refused = _run(hosts, agent, *job, "--", "touch", str(marker))
    assert refused.returncode == 3, refused.stdout + refused.stderr
    line = refused.stderr.strip()
    assert len(line.splitlines()) == 1, refused.stderr
    assert line.startswith(
        "ttmesh: host ttmh-1 is not ready: pre-flight: 2 of 2 links between 0000:31:00.0 and "
        "0000:4b:00.0 are down (ch14<->ch14, ch15<->ch15) (on ttmh-1: ttmesh reset "
    ), line
    assert line.endswith(
        ", or add --auto-reset to recover the chips first; nothing started anywhere)"
    )
    assert not marker.exists()
    assert _run(hosts, agent, "check", "--hosts", "HOSTS").returncode == 1  # still down
    fixed = _run(hosts, agent, *job, "--auto-reset", "--", "touch", str(marker))
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert marker.exists()
    notes = sorted(ln for ln in fixed.stderr.splitlines() if ln.startswith("ttmesh: host "))
    assert len(notes) == 2, fixed.stderr
    assert notes[0].startswith("ttmesh: host ttmh-0: its cables to ttmh-1 are reset at both ends")
    assert notes[1].startswith(
        "ttmesh: host ttmh-1: 2 of 2 links between 0000:31:00.0 and 0000:4b:00.0 are down"
    ), fixed.stderr
    assert all(n.split(": ")[-1].startswith("chips reset and verified") for n in notes)


# --------------------------------------------------------------------------- ls/check/reset --hosts


@needs_hosts
@needs_mpirun
def test_ls_check_and_reset_over_hosts_show_each_host(world: Path) -> None:
    """ls, check and reset --hosts run on every host (through mpirun), each reading its own
    root, shown host by host; the exit is the worst host's; reset recovers only what is down."""
    hosts = make_hosts(world, "quietbox2", 2)
    agent = launch_agent(world, hosts)
    down = ["0000:01:00.0", "0000:03:00.0"]
    fault = subprocess.run([sys.executable, "-m", "ttmesh", "sim", "fault", "--root",
                            str(hosts[1].root), "link-down", *down], capture_output=True)  # fmt: skip
    assert fault.returncode == 0, fault.stderr
    res = _run(hosts, agent, "ls", "--hosts", "HOSTS", "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["schema"] == "ttmesh.hosts/1" and doc["command"] == "ls"
    assert [(h["host"], h["code"]) for h in doc["hosts"]] == [("ttmh-0", 0), ("ttmh-1", 0)]
    for h in doc["hosts"]:
        assert h["result"]["schema"] == "ttmesh.ls/1" and len(h["result"]["chips"]) == 4
    text = _run(hosts, agent, "ls", "--hosts", "HOSTS")
    assert text.returncode == 0 and text.stdout.startswith("== ttmh-0 ==\n"), text.stderr
    assert "\n== ttmh-1 ==\n" in text.stdout
    assert "\x1b" not in text.stdout  # plain text, though mpirun gives ranks a terminal
    check = _run(hosts, agent, "check", "--hosts", "HOSTS", "--json")
    assert check.returncode == 1, check.stderr
    codes = [(h["host"], h["code"]) for h in json.loads(check.stdout)["hosts"]]
    assert codes == [("ttmh-0", 0), ("ttmh-1", 1)]
    assert "ttmesh: host ttmh-1: exit 1" in check.stderr
    assert "ttmh-0" not in check.stderr.replace("[ttmh-0]", "")  # only the failing host named
    reset = _run(hosts, agent, "reset", "--hosts", "HOSTS", "--chips", ",".join(down), "--json")
    assert reset.returncode == 0, reset.stdout + reset.stderr
    after = _run(hosts, agent, "check", "--hosts", "HOSTS")
    assert after.returncode == 0, after.stdout + after.stderr
    bad = _run(hosts, agent, "check", "--hosts", "HOSTS", "--root", str(hosts[0].root))
    assert bad.returncode == 2 and "--root names a host on this machine" in bad.stderr
    gone = _run(hosts, agent, "ls", "--hosts", "HOSTS", "--launch-agent", "/bin/false")
    assert gone.returncode == 2, gone.stdout + gone.stderr
    assert gone.stderr.startswith("ttmesh: mpirun reached none of the hosts (ttmh-0, ttmh-1): ")
    assert len(gone.stderr.strip().splitlines()) == 1, gone.stderr
