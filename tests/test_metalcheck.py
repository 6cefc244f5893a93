"""Pre-flight asks tt-metal's mock control plane about the ranks' own files (issue 22): a mesh
tt-metal refuses is stopped before any rank starts; without a ttnn Python the check is skipped
and said so, never silently."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from conftest import run_cli

NO_TTNN = {"TTMESH_TTNN_PYTHON": ""}


def _binding(tmp_path: Path, mgd_dims: tuple[int, int]) -> Path:
    """A tt-run rank binding: one rank on the QuietBox 2's four chips, with a mesh graph
    descriptor of the given shape (the user's own file, which ttmesh passes on as given)."""
    mgd = tmp_path / "mesh.textproto"
    mgd.write_text(
        'mesh_descriptors {\n  name: "M0"\n  arch: BLACKHOLE\n  device_topology {\n'
        f"    dims: {mgd_dims[0]}\n    dims: {mgd_dims[1]}\n  }}\n"
        "  channels {\n    count: 2\n    policy: RELAXED\n  }\n"
        "  host_topology {\n    dims: 1\n    dims: 1\n  }\n}\n"
        'top_level_instance {\n  mesh {\n    mesh_descriptor: "M0"\n  }\n}\n'
    )
    binding = tmp_path / "binding.yaml"
    binding.write_text(
        "rank_bindings:\n  - rank: 0\n    mesh_id: 0\n    env_overrides:\n"
        '      TT_VISIBLE_DEVICES: "0000:01:00.0,0000:03:00.0,0000:05:00.0,0000:07:00.0"\n'
        f"mesh_graph_desc_path: {mgd}\n"
    )
    return binding


def test_without_ttnn_the_dry_run_says_skipped(qb2: Path) -> None:
    res = run_cli(
        "launch", "--root", str(qb2), "--tp-size", "4", "--dry-run", "--json", "--", "true",
        env=NO_TTNN,
    )  # fmt: skip
    assert res.code == 0, res.err
    checks = {c["check"]: c for c in json.loads(res.out)["checks"]}
    metal = checks["tt-metal control plane"]
    assert metal["result"] == "skipped"
    assert "TTMESH_TTNN_PYTHON" in metal["detail"] and "pip install ttnn" in metal["detail"]
    res = run_cli("launch", "--root", str(qb2), "--tp-size", "4", "--dry-run", "--", "true",
                  env=NO_TTNN)  # fmt: skip
    assert "check tt-metal control plane: skipped (no ttnn Python configured" in res.out


def test_a_configured_python_without_ttnn_is_bad_input(qb2: Path, tmp_path: Path) -> None:
    marker = tmp_path / "started"
    for python, said in (("/nonexistent/python", "no such interpreter"),
                         (sys.executable, "cannot import ttnn")):  # fmt: skip
        res = run_cli(
            "launch", "--root", str(qb2), "--tp-size", "4", "--mesh-layout", "single-process",
            "--", "touch", str(marker), env={"TTMESH_TTNN_PYTHON": python},
        )  # fmt: skip
        lines = [ln for ln in res.err.splitlines() if ln.startswith("ttmesh:")]
        assert res.code == 2 and len(lines) == 1 and said in lines[0], res.err
        assert "Traceback" not in res.err and not marker.exists()


@pytest.mark.conformance
def test_a_mesh_tt_metal_refuses_starts_no_rank(
    qb2: Path, tmp_path: Path, ttnn_python: str
) -> None:
    """A 1x8 descriptor on four chips: ttmesh passes the user's file on as given; tt-metal's
    control plane refuses it, so the launch stops before the rank starts, with tt-metal's reason."""
    marker = tmp_path / "started"
    binding = _binding(tmp_path, (1, 8))
    env = {"TTMESH_TTNN_PYTHON": ttnn_python}
    for dry in ((), ("--dry-run",)):
        res = run_cli("launch", "--root", str(qb2), "--rank-binding", str(binding), *dry, "--",
                      "touch", str(marker), env=env, timeout=300)  # fmt: skip
        lines = [ln for ln in res.err.splitlines() if ln.startswith("ttmesh:")]
        assert res.code == 3, res.err
        assert len(lines) == 1 and "tt-metal refuses rank 0's mesh" in lines[0], res.err
        assert "no grouping" in lines[0] or "mapping" in lines[0], lines[0]
        assert not marker.exists()
    res = run_cli("ps", "--all", "--json")
    assert res.code == 0


@pytest.mark.conformance
def test_a_mesh_tt_metal_accepts_runs(qb2: Path, tmp_path: Path, ttnn_python: str) -> None:
    marker = tmp_path / "started"
    env = {"TTMESH_TTNN_PYTHON": ttnn_python}
    res = run_cli("launch", "--root", str(qb2), "--rank-binding", str(_binding(tmp_path, (2, 2))),
                  "--dry-run", "--json", "--", "true", env=env, timeout=300)  # fmt: skip
    assert res.code == 0, res.err
    checks = {c["check"]: c for c in json.loads(res.out)["checks"]}
    assert checks["tt-metal control plane"]["result"] == "passed"
    assert "2x2" in checks["tt-metal control plane"]["detail"]
    res = run_cli("launch", "--root", str(qb2), "--tp-size", "4", "--mesh-layout", "mesh",
                  "--dry-run", "--json", "--", "true", env=env, timeout=300)  # fmt: skip
    assert res.code == 0, res.err  # four processes, one tt-metal world over MPI
    checks = {c["check"]: c for c in json.loads(res.out)["checks"]}
    assert checks["tt-metal control plane"]["result"] == "passed"
    res = run_cli("launch", "--root", str(qb2), "--tp-size", "4", "--mesh-layout",
                  "single-process", "--", "touch", str(marker), env=env, timeout=300)  # fmt: skip
    assert res.code == 0, res.err
    assert marker.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="root runs another user's file only as root")
def test_root_never_runs_a_ttnn_python_another_user_could_change(qb2: Path, tmp_path: Path) -> None:
    """ttmesh runs as root on shared hosts: a TTMESH_TTNN_PYTHON that another user owns, or that
    others may write, is refused before it runs, in one line naming it."""
    ran = tmp_path / "ran"
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\ntouch {ran}\n")
    fake.chmod(0o755)
    os.chown(tmp_path, 0, 0)
    os.chown(fake, 65534, 65534)  # nobody's
    link = tmp_path / "link"
    link.symlink_to(fake)
    for python, said in ((fake, "is owned by nobody"), (link, "is owned by nobody")):
        res = run_cli("launch", "--root", str(qb2), "--tp-size", "4", "--", "true",
                      env={"TTMESH_TTNN_PYTHON": str(python)})  # fmt: skip
        lines = [ln for ln in res.err.splitlines() if ln.startswith("ttmesh:")]
        assert res.code == 2 and len(lines) == 1 and said in lines[0], res.err
    # check --active runs the same interpreter: it refuses it the same way, however named.
    for args, env in ((["--ttnn-python", str(fake)], {}), ([], {"TTMESH_TTNN_PYTHON": str(fake)})):
        res = run_cli("check", "--root", str(qb2), "--active", *args, env=env)
        lines = [ln for ln in res.err.splitlines() if ln.startswith("ttmesh:")]
        assert res.code == 2 and len(lines) == 1 and "is owned by nobody" in lines[0], res.err
    os.chown(fake, 0, 0)
    fake.chmod(0o757)  # others may write it
    res = run_cli("launch", "--root", str(qb2), "--tp-size", "4", "--", "true",
                  env={"TTMESH_TTNN_PYTHON": str(fake)})  # fmt: skip
    assert res.code == 2 and "is writable by others" in res.err, res.err
    assert not ran.exists()


def test_a_broken_checker_is_not_blamed_on_tt_metal(qb2: Path, tmp_path: Path) -> None:
    """TTMESH_TTNN_PYTHON=/bin/false said "tt-metal refuses rank 0's mesh" (exit 3): a checker
    that never ran the probe, or whose ttnn crashed on import, is the checker's fault: one line
    naming it and the fix, exit 2. A probe that crashed inside tt-metal (ttnn imported) is
    still tt-metal's verdict (exit 3), said without a negative code."""
    marker = tmp_path / "started"
    crash_on_import = tmp_path / "crash-on-import"
    crash_on_import.write_text("#!/bin/sh\necho PROBE-STAGE python\nkill -SEGV $$\n")
    crash_in_metal = tmp_path / "crash-in-metal"
    crash_in_metal.write_text(
        "#!/bin/sh\necho PROBE-STAGE python\necho PROBE-STAGE ttnn\nkill -SEGV $$\n"
    )
    for fake in (crash_on_import, crash_in_metal):
        fake.chmod(0o755)
    for python, code, said in (
        ("/bin/false", 2, "TTMESH_TTNN_PYTHON=/bin/false did not run tt-metal's check: it "
                          "exited with code 1 before starting it: the checker is broken"),
        (str(crash_on_import), 2, f"TTMESH_TTNN_PYTHON={crash_on_import} was killed by SIGSEGV "
                                  "importing ttnn: the checker is broken, not the mesh"),
        (str(crash_in_metal), 3, "tt-metal refuses rank 0's mesh: its control plane was killed "
                                 "by SIGSEGV without an answer"),
    ):  # fmt: skip
        res = run_cli("launch", "--root", str(qb2), "--chips", "0000:01:00.0", "--", "touch",
                      str(marker), env={"TTMESH_TTNN_PYTHON": python})  # fmt: skip
        lines = [ln for ln in res.err.splitlines() if ln.startswith("ttmesh:")]
        assert res.code == code and len(lines) == 1 and said in lines[0], res.err
        if code == 2:
            assert "unset TTMESH_TTNN_PYTHON" in lines[0], lines[0]
        assert not marker.exists()
