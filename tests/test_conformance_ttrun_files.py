"""tt-run itself (the conformance ttnn wheel's) against ttmesh, on files in tt-metal's shapes:
the environment each rank gets, from tt-run's own ``--dry-run`` mpirun command (issue 23).

Needs the conformance Python with ttnn and mpirun (tests/test_conformance_mpi.py's).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from test_conformance_mpi import PROBE, _ttrun_pythonpath, dry_plan, ttnn_py  # noqa: F401

pytestmark = pytest.mark.conformance


def _tt_run(ttnn_py: str, flag: str, path: Path, cwd: Path) -> dict[int, dict]:  # noqa: F811
    """Each rank's environment in tt-run's ``--dry-run`` command, by TT_RUN_RANK."""
    import shutil
    import subprocess

    tt_run = Path(ttnn_py).parent / "tt-run"
    assert tt_run.is_file(), tt_run
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TT_METAL_", "TT_RUN_"))}
    env["TT_LOGGER_LEVEL"] = "error"
    extra = _ttrun_pythonpath(ttnn_py)
    if extra:
        env["PYTHONPATH"] = extra
    env["PATH"] = os.path.dirname(shutil.which("mpirun") or "/usr/bin/mpirun") + ":" + env["PATH"]
    proc = subprocess.run([str(tt_run), "--dry-run", flag, str(path), ttnn_py, PROBE],
                          capture_output=True, text=True, timeout=300, env=env, cwd=cwd)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (line,) = [ln for ln in (proc.stderr + proc.stdout).splitlines() if "[tt-run] Command: " in ln]
    ranks: dict[int, dict] = {}
    for section in line.split("[tt-run] Command: ", 1)[1].split(" : "):
        tokens = section.split()
        env_of = dict(tokens[i + 1].split("=", 1) for i, t in enumerate(tokens) if t == "-x")
        ranks[int(env_of["TT_RUN_RANK"])] = env_of
    return ranks


def _same(theirs: dict[int, dict], plan: dict, keys: list[str]) -> None:
    assert sorted(theirs) == [r["rank"] for r in plan["ranks"]]
    for r in plan["ranks"]:
        mine, them = r["env"], theirs[r["rank"]]
        assert {k: mine.get(k) for k in keys} == {k: them.get(k) for k in keys}, r["rank"]


def test_tt_run_and_ttmesh_agree_on_the_older_chip_key(
    ttnn_py: str,  # noqa: F811
    qb2: Path,
    tmp_path: Path,
) -> None:
    """tt-metal's 2x2_multiprocess shape: TT_METAL_VISIBLE_DEVICES as written, a descriptor
    relative to the launch directory, each rank's mesh id."""
    mgd = tmp_path / "tests" / "t3k_2x2_mesh_graph_descriptor.textproto"
    mgd.parent.mkdir()
    mgd.write_text("# a descriptor\n")
    bind = tmp_path / "2x2_multiprocess_rank_bindings.yaml"
    bind.write_text(
        yaml.safe_dump(
            {
                "rank_bindings": [
                    {"rank": 0, "mesh_id": 0, "env_overrides": {"TT_METAL_VISIBLE_DEVICES": "0,1"}},
                    {"rank": 1, "mesh_id": 1, "env_overrides": {"TT_METAL_VISIBLE_DEVICES": "2,3"}},
                ],
                "global_env": {"OMPI_ALLOW_RUN_AS_ROOT": "1"},
                "mesh_graph_desc_path": "tests/t3k_2x2_mesh_graph_descriptor.textproto",
            }
        )
    )
    theirs = _tt_run(ttnn_py, "--rank-binding", bind, tmp_path)
    plan = dry_plan(ttnn_py, qb2, tmp_path, "--rank-binding", str(bind))
    keys = ["TT_METAL_VISIBLE_DEVICES", "TT_MESH_ID", "TT_MESH_GRAPH_DESC_PATH",
            "TT_RUN_ORIGINAL_CWD", "TT_METAL_HOME", "OMPI_ALLOW_RUN_AS_ROOT", "TT_RUN_RANK"]  # fmt: skip
    _same(theirs, plan, keys)
    assert theirs[1]["TT_METAL_VISIBLE_DEVICES"] == "2,3"
    assert {r["workdir"] for r in plan["ranks"]} == {str(tmp_path)}  # where tt-run runs mpirun


def test_tt_run_and_ttmesh_agree_on_sub_contexts(
    ttnn_py: str,  # noqa: F811
    qb2: Path,
    tmp_path: Path,
) -> None:
    """--rank-bindings-mapping: the merged world's ranks, each with its sub-context and its
    overlay's descriptor, exactly as tt-run gives them (ttmesh adds _SIZE and _COUNT)."""
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    overlays = {
        "prefill": [
            {"rank": 1, "mesh_id": 0, "mesh_host_rank": 1,
             "env_overrides": {"TT_VISIBLE_DEVICES": "0000:03:00.0"}},
            {"rank": 0, "mesh_id": 0, "mesh_host_rank": 0,
             "env_overrides": {"TT_VISIBLE_DEVICES": "0000:01:00.0"}},
        ],
        "decode": [
            {"rank": 0, "mesh_id": 0, "env_overrides": {"TT_VISIBLE_DEVICES": "0000:05:00.0"}},
        ],
    }  # fmt: skip
    for name, ranks in overlays.items():
        (cfg / f"{name}.textproto").write_text(f"# {name}\n")
        (cfg / f"{name}_rank_bindings.yaml").write_text(
            yaml.safe_dump(
                {
                    "rank_bindings": ranks,
                    "global_env": {"SHARED": "yes"},
                    "mesh_graph_desc_path": str(cfg / f"{name}.textproto"),
                }
            )
        )
    mapping = cfg / "mapping.yaml"
    mapping.write_text(
        "subcontext_id_to_rank_bindings:\n"
        "  0: prefill_rank_bindings.yaml\n"
        "  1: decode_rank_bindings.yaml\n"
    )
    theirs = _tt_run(ttnn_py, "--rank-bindings-mapping", mapping, tmp_path)
    plan = dry_plan(ttnn_py, qb2, tmp_path, "--rank-bindings-mapping", str(mapping))
    keys = ["TT_RUN_SUBCONTEXT_ID", "TT_RUN_SUBCONTEXT_SIZES", "TT_MESH_GRAPH_DESC_PATH",
            "TT_MESH_ID", "TT_MESH_HOST_RANK", "TT_VISIBLE_DEVICES", "TT_RUN_RANK", "SHARED"]  # fmt: skip
    _same(theirs, plan, keys)
    assert [theirs[r]["TT_RUN_SUBCONTEXT_ID"] for r in range(3)] == ["0", "0", "1"]
    assert theirs[2]["TT_RUN_SUBCONTEXT_SIZES"] == "2,1"
