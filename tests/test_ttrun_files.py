"""tt-run's files as tt-metal writes them (issue 23): the older TT_METAL_VISIBLE_DEVICES key, a
binding with no env_overrides (one rank per host, every chip of it), --rank-bindings-mapping
(sub-contexts), and ranks that run where tt-run runs them (the launch directory, PYTHONPATH).

Every file here is written by the test in the shape of tt-metal's own
tests/tt_metal/distributed/config/*rank_bindings*.yaml (none is copied from there).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import TAG, TW, env_without, run_cli, worker

from ttmesh.errors import TTMeshError
from ttmesh.launcher.adapters import ttrun
from ttmesh.launcher.nodes import hostreport, meshhosts
from ttmesh.launcher.planning.request import LaunchRequest
from ttmesh.vocab import StartMode

needs_mpirun = pytest.mark.skipif(
    shutil.which("mpirun") is None, reason="needs mpirun (apt-get install openmpi-bin)"
)

MGD = "tests/tt_metal/tt_fabric/custom_mesh_descriptors/t3k_2x2_mesh_graph_descriptor.textproto"


def _repo(tmp_path: Path) -> Path:
    """A checkout-like launch directory: the descriptor at the relative path the binding names."""
    repo = tmp_path / "repo"
    (repo / MGD).parent.mkdir(parents=True)
    (repo / MGD).write_text("# a mesh graph descriptor\n")
    return repo


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# tt-metal's 2x2_multiprocess shape: two meshes of two chips, chips by PCI index under the older
# key, an integer in global_env, a descriptor path relative to the checkout.
TWO_BY_TWO = f"""\
rank_bindings:
  - rank: 0
    mesh_id: 0
    env_overrides:
      TT_METAL_VISIBLE_DEVICES: "0,1"

  - rank: 1
    mesh_id: 1
    env_overrides:
      TT_METAL_VISIBLE_DEVICES: "2,3"

global_env:
  OMPI_ALLOW_RUN_AS_ROOT: 1

mesh_graph_desc_path: "{MGD}"
"""

# tt-metal's bh_qb_4x4 shape: four hosts of one mesh, no env_overrides (each rank drives every
# chip of its host), host ranks out of rank order.
FOUR_HOSTS = """\
rank_bindings:
  - rank: 0
    mesh_id: 0
    mesh_host_rank: 2

  - rank: 1
    mesh_id: 0
    mesh_host_rank: 1

  - rank: 2
    mesh_id: 0
    mesh_host_rank: 3

  - rank: 3
    mesh_id: 0
    mesh_host_rank: 0

mesh_graph_desc_path: "{mgd}"
"""


def _index_bdfs(root: Path) -> dict[str, str]:
    chips = json.loads(run_cli("ls", "--root", str(root), "--json").out)["chips"]
    return {str(c["pci_index"]): c["bdf"] for c in chips}


def _plan(root: Path, *args: str, cwd: Path, env: dict[str, str] | None = None) -> dict:
    res = run_cli("launch", "--root", str(root), *args, "--dry-run", "--json", "--", "true",
                  cwd=cwd, env=env)  # fmt: skip
    assert res.code == 0, res.err
    return json.loads(res.out)


def _one_line(res) -> str:  # type: ignore[no-untyped-def]
    lines = [ln for ln in res.err.splitlines() if ln.strip() and not ln.startswith("simulated")]
    assert res.code == 2 and len(lines) == 1 and lines[0].startswith("ttmesh: "), res.err
    return lines[0]


# --------------------------------------------------------------------------- the older key


def test_tt_metal_visible_devices_names_each_ranks_chips(qb2: Path, tmp_path: Path) -> None:
    """tt-run runs tt-metal's 2x2_multiprocess file as it is: ttmesh takes the chips the older
    key names as the rank's (its chips, leased and checked), passes the key through as written,
    and gives TT_VISIBLE_DEVICES the same chips by PCI address."""
    repo = _repo(tmp_path)
    bind = _write(repo / "2x2_multiprocess_rank_bindings.yaml", TWO_BY_TWO)
    index = _index_bdfs(qb2)
    plan = _plan(qb2, "--rank-binding", bind.name, cwd=repo)
    r0, r1 = plan["ranks"]
    assert r0["bdfs"] == [index["0"], index["1"]] and r1["bdfs"] == [index["2"], index["3"]]
    assert r0["env"]["TT_METAL_VISIBLE_DEVICES"] == "0,1"
    assert r1["env"]["TT_METAL_VISIBLE_DEVICES"] == "2,3"
    assert r0["env"]["TT_VISIBLE_DEVICES"] == f"{index['0']},{index['1']}"
    assert (r0["mesh_id"], r1["mesh_id"]) == (0, 1)
    assert r0["env"]["OMPI_ALLOW_RUN_AS_ROOT"] == "1"
    assert r0["env"]["TT_MESH_GRAPH_DESC_PATH"] == str(repo / MGD)


def test_the_two_keys_must_name_the_same_chips(qb2: Path, tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    text = TWO_BY_TWO.replace(
        'TT_METAL_VISIBLE_DEVICES: "2,3"',
        'TT_METAL_VISIBLE_DEVICES: "2,3"\n      TT_VISIBLE_DEVICES: "0,1"',
    )
    bind = _write(repo / "b.yaml", text)
    line = _one_line(run_cli("launch", "--root", str(qb2), "--rank-binding", "b.yaml",
                             "--dry-run", "--", "true", cwd=repo))  # fmt: skip
    assert "rank 1" in line and "TT_VISIBLE_DEVICES" in line and "TT_METAL_VISIBLE_DEVICES" in line
    assert str(bind.name) in line
    # The same chips, one key by PCI index and the other by address: one rank's chips.
    index = _index_bdfs(qb2)
    _write(
        bind,
        text.replace(
            'TT_VISIBLE_DEVICES: "0,1"', f'TT_VISIBLE_DEVICES: "{index["2"]},{index["3"]}"'
        ),
    )
    plan = _plan(qb2, "--rank-binding", "b.yaml", cwd=repo)
    assert plan["ranks"][1]["bdfs"] == [index["2"], index["3"]]


@pytest.mark.parametrize("where", ["--env", "global_env"])
def test_the_older_key_is_a_ranks_own_like_the_newer(qb2: Path, tmp_path: Path, where: str) -> None:
    """Every rank given the same chips (global_env, --env) would share them: refused as
    TT_VISIBLE_DEVICES is."""
    repo = _repo(tmp_path)
    text = TWO_BY_TWO
    args = ["--rank-binding", "b.yaml"]
    if where == "global_env":
        text = text.replace("OMPI_ALLOW_RUN_AS_ROOT: 1", 'TT_METAL_VISIBLE_DEVICES: "0"')
    else:
        args += ["--env", "TT_METAL_VISIBLE_DEVICES=0"]
    _write(repo / "b.yaml", text)
    line = _one_line(run_cli("launch", "--root", str(qb2), *args, "--dry-run", "--", "true",
                             cwd=repo))  # fmt: skip
    assert "TT_METAL_VISIBLE_DEVICES" in line


@needs_mpirun
def test_the_older_key_reaches_the_ranks(qb2: Path, tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    _write(repo / "b.yaml", TWO_BY_TWO)
    out = tmp_path / "env"
    out.mkdir()
    # Under a tt-run (or a ttmesh) of sub-contexts: a job without them does not inherit them.
    res = run_cli("launch", "--root", str(qb2), "--rank-binding", "b.yaml",
                  *worker(f"env={out}", "exit=0"), cwd=repo,
                  env={"TT_RUN_SUBCONTEXT_ID": "1", "TT_METAL_VISIBLE_DEVICES": "3"})  # fmt: skip
    assert res.code == 0, res.err
    e0, e1 = (json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1))
    assert (e0["TT_METAL_VISIBLE_DEVICES"], e1["TT_METAL_VISIBLE_DEVICES"]) == ("0,1", "2,3")
    assert "TT_RUN_SUBCONTEXT_ID" not in e0 and "TT_RUN_SUBCONTEXT_ID" not in e1
    index = _index_bdfs(qb2)
    assert e1["TT_VISIBLE_DEVICES"] == f"{index['2']},{index['3']}"


# --------------------------------------------------------------------------- no env_overrides


def test_four_hosts_of_one_mesh_on_one_host_are_refused_naming_hosts(
    qb2: Path, tmp_path: Path
) -> None:
    repo = _repo(tmp_path)
    _write(repo / "bh_qb_4x4_rank_bindings.yaml", FOUR_HOSTS.format(mgd=MGD))
    marker = tmp_path / "started"
    res = run_cli("launch", "--root", str(qb2), "--rank-binding", "bh_qb_4x4_rank_bindings.yaml",
                  "--", "touch", str(marker), cwd=repo)  # fmt: skip
    line = _one_line(res)
    assert "4 ranks name no chips" in line and "--hosts" in line, line
    assert "mesh_host_rank 0-3" in line, line
    assert not marker.exists()


def test_one_rank_with_no_chips_named_drives_every_chip(qb2: Path, tmp_path: Path) -> None:
    """As tt-metal opens every chip it sees: one rank, no TT_VISIBLE_DEVICES, the whole host."""
    repo = _repo(tmp_path)
    _write(
        repo / "b.yaml",
        f"rank_bindings:\n  - rank: 0\n    mesh_id: 0\nmesh_graph_desc_path: {MGD}\n",
    )
    plan = _plan(qb2, "--rank-binding", "b.yaml", cwd=repo)
    (r0,) = plan["ranks"]
    assert sorted(r0["bdfs"]) == sorted(_index_bdfs(qb2).values())


def _reports(base: Path, name: str) -> list:
    from ttmesh.cli.hosts import open_host
    from ttmesh.sim import system
    from ttmesh.sim.create import create

    model = system.load_any(name)
    out = []
    for i in range(len(model.hosts)):  # type: ignore[union-attr]
        root = base / f"{name}-{i}"
        create(model.host(i), root, config={"reset_seconds": 0.0})  # type: ignore[union-attr]
        data = json.loads(json.dumps(hostreport.make(open_host(root))))
        out.append(hostreport.parse(data, f"h{i}"))
    return out


def _over_hosts(reported: list, bind: Path, cwd: Path) -> object:
    names = [view.name for view, _w, _h in reported]
    req = LaunchRequest(
        command=[], tp_size=None, job="tr-test", run_dir="/run-dir", cwd=str(cwd),  # type: ignore[arg-type]
        launcher=StartMode.MPI, binding=ttrun.load(str(bind), {}, str(cwd)),
    )  # fmt: skip
    mh = meshhosts.MpiHosts(names, "/usr/bin/mpirun", (4, 1))
    return meshhosts.plan_over(req, reported, mh, descriptor_only=True).plan


def test_four_hosts_of_one_mesh_run_over_four_hosts(tmp_path: Path) -> None:
    """bh_qb_4x4's shape over four hosts (four Galaxies here, a 1x4 host topology): each rank
    drives every chip of the host its rankfile puts it on, with its mesh host rank as written."""
    reported = _reports(tmp_path / "hosts", "quad-galaxy")
    names = [view.name for view, _w, _h in reported]
    probe = LaunchRequest(command=[], tp_size=None, layout="mesh", nproc=1, job="p",  # type: ignore[arg-type]
                          run_dir="/run-dir", cwd="/")  # fmt: skip
    probe_plan = meshhosts.plan_over(
        probe, reported, meshhosts.MpiHosts(names, "/usr/bin/mpirun", (4, 1)), True
    ).plan
    mgd = _write(tmp_path / "bh_qb_4x4.textproto", probe_plan.files["/run-dir/mesh/mesh.textproto"])
    bind = _write(tmp_path / "bh_qb_4x4_rank_bindings.yaml", FOUR_HOSTS.format(mgd=mgd))
    # Host rank N is host N in the wiring: the rankfile puts each rank on the host of its place.
    _write(bind.with_suffix(".rankfile"),
           "rank 0=h2 slot=0\nrank 1=h1 slot=0\nrank 2=h3 slot=0\nrank 3=h0 slot=0\n")  # fmt: skip
    plan = _over_hosts(reported, bind, tmp_path)
    hosts = {view.name: view for view, _w, _h in reported}
    got = [(r.rank, plan.hosts[r.node], r.env["TT_MESH_HOST_RANK"]) for r in plan.ranks]  # type: ignore[attr-defined]
    assert got == [(0, "h2", "2"), (1, "h1", "1"), (2, "h3", "3"), (3, "h0", "0")]
    for r in plan.ranks:  # type: ignore[attr-defined]
        mine = {c.bdf for c in hosts[plan.hosts[r.node]].inv.chips}  # type: ignore[attr-defined]
        assert len(r.bdfs) == 32 and set(r.bdfs) == mine
        assert set(r.env["TT_VISIBLE_DEVICES"].split(",")) == mine


@pytest.fixture
def world(tmp_path: Path):  # type: ignore[no-untyped-def]
    from conftest import scratch

    with scratch(tmp_path / "world") as path:
        path.chmod(0o777)
        yield path


def _emulated() -> str | None:
    from hosts import can_emulate

    return can_emulate()


@pytest.mark.skipif(_emulated() is not None, reason=str(_emulated()))
@needs_mpirun
def test_four_hosts_of_one_mesh_over_emulated_hosts(world: Path, tmp_path: Path) -> None:
    """The CLI as a tt-run user types it, with --hosts: four emulated Galaxies, tt-metal's
    bh_qb_4x4 shape (no env_overrides, host ranks out of rank order) and its rankfile; every
    rank on its host with every chip of it, then the ranks run there."""
    from hosts import launch_agent, make_hosts, mpi_env

    hosts = make_hosts(world, "quad-galaxy")
    agent = launch_agent(world, hosts)
    names = ",".join(h.name for h in hosts)
    env = {**os.environ, **mpi_env(agent)}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "ttmesh", *args], capture_output=True,
                              text=True, timeout=300, env=env, cwd=tmp_path)  # fmt: skip

    out = tmp_path / "out"
    made = run("descriptor", "--hosts", names, "--mesh-layout", "mesh", "--nproc-per-node", "1",
               "-o", str(out))  # fmt: skip
    assert made.returncode == 0, made.stderr
    bind = _write(tmp_path / "bh_qb_4x4_rank_bindings.yaml",
                  FOUR_HOSTS.format(mgd=out / "mesh.textproto"))  # fmt: skip
    order = [hosts[2], hosts[1], hosts[3], hosts[0]]  # rank r on the host of its mesh_host_rank
    _write(bind.with_suffix(".rankfile"),
           "".join(f"rank {r}={h.name} slot=0\n" for r, h in enumerate(order)))  # fmt: skip
    plan = run("launch", "--hosts", names, "--rank-binding", bind.name, "--dry-run", "--json",
               "--", "true")  # fmt: skip
    assert plan.returncode == 0, plan.stderr
    ranks = json.loads(plan.stdout)["ranks"]
    assert [r["host"] for r in ranks] == [h.name for h in order]
    assert [len(r["bdfs"]) for r in ranks] == [32] * 4
    assert [r["env"]["TT_MESH_HOST_RANK"] for r in ranks] == ["2", "1", "3", "0"]
    envs = world / "envs"
    envs.mkdir()
    envs.chmod(0o777)
    ran = run("launch", "--hosts", names, "--rank-binding", bind.name, "--", sys.executable, TW,
              TAG, f"env={envs}", "exit=0")  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    for r, h in enumerate(order):
        seen = json.loads((envs / f"rank{r}.json").read_text())
        assert seen["TTMESH_RANK_HOST"] == h.name and seen["TTMESH_ROOT"] == str(h.root)
        assert len(seen["TT_VISIBLE_DEVICES"].split(",")) == 32


def test_two_ranks_with_no_chips_on_one_of_the_hosts_are_refused(tmp_path: Path) -> None:
    reported = _reports(tmp_path / "hosts", "quad-galaxy")
    _write(tmp_path / "m.textproto", "# placeholder\n")
    bind = _write(tmp_path / "b.yaml", FOUR_HOSTS.format(mgd=tmp_path / "m.textproto"))
    _write(bind.with_suffix(".rankfile"),
           "rank 0=h2 slot=0\nrank 1=h2 slot=0\nrank 2=h3 slot=0\nrank 3=h0 slot=0\n")  # fmt: skip
    with pytest.raises(TTMeshError) as exc:
        _over_hosts(reported, bind, tmp_path)
    assert exc.value.code == 2
    assert "h2" in str(exc.value) and "ranks 0 and 1" in str(exc.value), str(exc.value)


# --------------------------------------------------------------------------- sub-contexts


def _subcontexts(tmp_path: Path, mapping: dict | None = None, decode_env: str = "") -> Path:
    """Two overlays (prefill: two ranks of one mesh; decode: two meshes), each with its own
    descriptor, and the mapping naming them relative to itself."""
    cfg = tmp_path / "cfg"
    _write(cfg / "prefill.textproto", "# prefill\n")
    _write(cfg / "decode.textproto", "# decode\n")
    _write(cfg / "prefill_rank_bindings.yaml", f"""\
rank_bindings:
  - rank: 0
    mesh_id: 0
    mesh_host_rank: 0
    env_overrides:
      TT_VISIBLE_DEVICES: "0"
  - rank: 1
    mesh_id: 0
    mesh_host_rank: 1
    env_overrides:
      TT_VISIBLE_DEVICES: "1"
global_env:
  SHARED: "same"
mesh_graph_desc_path: "{cfg / 'prefill.textproto'}"
""")  # fmt: skip
    _write(cfg / "decode_rank_bindings.yaml", f"""\
rank_bindings:
  - rank: 1
    mesh_id: 1
    env_overrides:
      TT_VISIBLE_DEVICES: "3"
  - rank: 0
    mesh_id: 0
    env_overrides:
      TT_VISIBLE_DEVICES: "2"
global_env:
  SHARED: "same"{decode_env}
mesh_graph_desc_path: "{cfg / 'decode.textproto'}"
""")  # fmt: skip
    data = mapping or {
        "subcontext_id_to_rank_bindings": {
            0: "prefill_rank_bindings.yaml",
            1: "decode_rank_bindings.yaml",
        }
    }
    return _write(cfg / "rank_bindings_mapping.yaml", yaml.safe_dump(data))


def test_rank_bindings_mapping_runs_each_sub_context_with_its_descriptor(
    qb2: Path, tmp_path: Path
) -> None:
    """tt-run merges the overlays in sub-context order into one world (sub-context 0 ranks 0-1,
    1 ranks 2-3), each rank with its overlay's descriptor and tt-metal's sub-context variables."""
    mapping = _subcontexts(tmp_path)
    index = _index_bdfs(qb2)
    plan = _plan(qb2, "--rank-bindings-mapping", str(mapping), cwd=tmp_path)
    ranks = plan["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    assert [r["bdfs"] for r in ranks] == [[index["0"]], [index["1"]], [index["2"]], [index["3"]]]
    assert [r["mesh_id"] for r in ranks] == [0, 0, 0, 1]
    env = [r["env"] for r in ranks]
    assert [e["TT_RUN_SUBCONTEXT_ID"] for e in env] == ["0", "0", "1", "1"]
    assert {e["TT_RUN_SUBCONTEXT_SIZES"] for e in env} == {"2,2"}
    assert {e["TT_RUN_SUBCONTEXT_COUNT"] for e in env} == {"2"}
    assert [e["TT_RUN_SUBCONTEXT_SIZE"] for e in env] == ["2", "2", "2", "2"]
    cfg = tmp_path / "cfg"
    assert [e["TT_MESH_GRAPH_DESC_PATH"] for e in env] == [
        str(cfg / "prefill.textproto"), str(cfg / "prefill.textproto"),
        str(cfg / "decode.textproto"), str(cfg / "decode.textproto"),
    ]  # fmt: skip
    assert [e["RANK"] for e in env] == ["0", "1", "2", "3"] and env[0]["WORLD_SIZE"] == "4"
    assert env[0]["TT_MESH_HOST_RANK"] == "0" and "TT_MESH_HOST_RANK" not in env[2]
    assert env[3]["SHARED"] == "same"


@pytest.mark.parametrize(
    "mapping, decode_env, needle",
    [
        ({"subcontext_id_to_rank_bindings": {0: "prefill_rank_bindings.yaml",
                                             2: "decode_rank_bindings.yaml"}}, "",
         "must be 0..1"),
        ({"subcontext_id_to_rank_bindings": {}}, "", "no sub-contexts"),
        ({"rank_bindings": []}, "", "no subcontext_id_to_rank_bindings"),
        ({"subcontext_id_to_rank_bindings": {0: "nowhere.yaml"}}, "", "nowhere.yaml"),
        (None, '\n  OTHER: "x"\n  SHARED: "other"', "SHARED"),
    ],
)  # fmt: skip
def test_a_bad_mapping_is_one_line(
    qb2: Path, tmp_path: Path, mapping: dict | None, decode_env: str, needle: str
) -> None:
    path = _subcontexts(tmp_path, mapping, decode_env)
    line = _one_line(run_cli("launch", "--root", str(qb2), "--rank-bindings-mapping", str(path),
                             "--dry-run", "--", "true", cwd=tmp_path))  # fmt: skip
    assert needle in line, line


@pytest.mark.parametrize("where", ["--env", "global_env"])
def test_the_sub_context_variables_are_the_mappings(qb2: Path, tmp_path: Path, where: str) -> None:
    """A rank told another sub-context than the mapping's splits tt-metal's world wrongly."""
    path = _subcontexts(
        tmp_path, decode_env='\n  TT_RUN_SUBCONTEXT_ID: "0"' * (where == "global_env")
    )
    extra = ["--env", "TT_RUN_SUBCONTEXT_SIZES=4"] if where == "--env" else []
    line = _one_line(run_cli("launch", "--root", str(qb2), "--rank-bindings-mapping", str(path),
                             *extra, "--dry-run", "--", "true", cwd=tmp_path))  # fmt: skip
    assert "TT_RUN_SUBCONTEXT_" in line and "--rank-bindings-mapping" in line, line


def test_a_mapping_and_a_binding_together_are_refused(qb2: Path, tmp_path: Path) -> None:
    path = _subcontexts(tmp_path)
    line = _one_line(run_cli("launch", "--root", str(qb2), "--rank-bindings-mapping", str(path),
                             "--rank-binding", str(tmp_path / "cfg" / "decode_rank_bindings.yaml"),
                             "--dry-run", "--", "true", cwd=tmp_path))  # fmt: skip
    assert "--rank-binding and --rank-bindings-mapping together" in line, line


# --------------------------------------------------------------------------- where ranks run


def _checkout(tmp_path: Path) -> Path:
    """A repository root: its package, and tests/x.py importing it and reading a file relative
    to the root, as tt-metal's own tests do."""
    repo = _repo(tmp_path)
    _write(repo / "mypkg" / "__init__.py", "VALUE = 42\n")
    _write(repo / "tests" / "data.txt", "from the checkout\n")
    _write(repo / "tests" / "x.py", """\
import os, sys
import mypkg
with open("tests/data.txt") as f:
    said = f.read().strip()
out = sys.argv[1]
with open(os.path.join(out, "rank" + os.environ["RANK"]), "w") as f:
    f.write(f"{mypkg.VALUE} {os.getcwd()} {said}")
""")  # fmt: skip
    _write(repo / "b.yaml", TWO_BY_TWO)
    return repo


def _no_pythonpath() -> dict[str, str]:
    return env_without("PYTHONPATH", "PYTHONUNBUFFERED")


@needs_mpirun
def test_python_tests_x_py_from_the_repository_root_runs_as_under_tt_run(
    qb2: Path, tmp_path: Path
) -> None:
    repo = _checkout(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "ttmesh", "launch", "--root", str(qb2), "--rank-binding", "b.yaml",
         "--", sys.executable, "tests/x.py", str(out)],
        cwd=repo, env=_no_pythonpath(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for rank in (0, 1):
        assert (out / f"rank{rank}").read_text() == f"42 {repo} from the checkout"


def test_the_dry_run_says_where_ranks_run(qb2: Path, tmp_path: Path) -> None:
    repo = _checkout(tmp_path)
    argv = [sys.executable, "-m", "ttmesh", "launch", "--root", str(qb2), "--rank-binding",
            "b.yaml", "--dry-run"]  # fmt: skip
    text = subprocess.run([*argv, "--", "true"], cwd=repo, env=_no_pythonpath(),
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert text.returncode == 0, text.stderr
    notes = [ln for ln in text.stdout.splitlines() if ln.startswith("note: ranks run in")]
    assert len(notes) == 1 and str(repo) in notes[0] and f"PYTHONPATH={repo}" in notes[0], notes
    as_json = subprocess.run([*argv, "--json", "--", "true"], cwd=repo, env=_no_pythonpath(),
                             capture_output=True, text=True, timeout=60)  # fmt: skip
    plan = json.loads(as_json.stdout)
    assert {r["workdir"] for r in plan["ranks"]} == {str(repo)}
    assert {r["env"]["PYTHONPATH"] for r in plan["ranks"]} == {str(repo)}
    # A PYTHONPATH of yours is kept as it is (tt-run adds the launch directory only when unset).
    kept = subprocess.run([*argv, "--json", "--", "true"], cwd=repo,
                          env={**_no_pythonpath(), "PYTHONPATH": "/elsewhere"},
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert all("PYTHONPATH" not in r["env"] for r in json.loads(kept.stdout)["ranks"])


@pytest.mark.parametrize("whose", ["everyone's", "another user's"])
def test_a_launch_directory_others_can_write_is_not_put_on_pythonpath(
    qb2: Path, tmp_path: Path, whose: str
) -> None:
    """Root's ranks would import what another user planted there: the dry run says so."""
    repo = _checkout(tmp_path)
    if whose == "everyone's":
        repo.chmod(0o1777)
    elif os.geteuid() == 0:
        os.chown(repo, 65534, 65534)  # nobody's
    else:
        pytest.skip("chown to another user needs root")
    res = subprocess.run(
        [sys.executable, "-m", "ttmesh", "launch", "--root", str(qb2), "--rank-binding", "b.yaml",
         "--dry-run", "--json", "--", "true"],
        cwd=repo, env=_no_pythonpath(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    assert all("PYTHONPATH" not in r["env"] for r in plan["ranks"])
    why = "writable by other users" if whose == "everyone's" else "is another user's"
    assert any(why in n for n in plan["notes"]), plan["notes"]
