"""scripts/chaos.py: ttmesh's fault matrix, every case twice (seed 1), and the harness's own
detectors (a harness that never reports a violation proves nothing)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from conftest import REPO

CHAOS = REPO / "scripts" / "chaos.py"


def _chaos() -> ModuleType:
    spec = importlib.util.spec_from_file_location("chaos", CHAOS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["chaos"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_harness_sees_what_a_run_leaves(tmp_path: Path) -> None:
    """A run that leaves a process of its job, a lease, a host with links down, and ends with
    another code and record than expected: each is a violation."""
    chaos = _chaos()
    chaos.SETTLE = 0.5
    from ttmesh.runtime import leases

    held: list[leases.LeaseSet] = []

    def broken(t) -> None:  # type: ignore[no-untyped-def]
        t.create()
        la = t.launch("--tp-size", "1", worker=["exit=3"], n=1)
        la.expect = chaos.Expect({0}, ("every rank succeeded",))
        la.wait()
        subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(60)", chaos.TAG, "grandchild"],
            env={**t.env, "TTMESH_JOB_ID": la.job},
            start_new_session=True,
        )
        t.fault("link-down", t.bdfs[0], t.bdfs[1])

        from ttmesh.host.base import Host

        held.append(leases.acquire(Host(t.root), ["00008a26321e00c1"], "stray", cmd="stray"))

    try:
        outcome = chaos.run_one(chaos.Case("selftest", "self", broken, ""), 0, "1", tmp_path)
    finally:
        for lease in held:
            lease.release()
    said = "\n".join(outcome.violations)
    assert not outcome.ok
    assert "process left" in said
    assert "lease left on 00008a26321e00c1" in said
    assert "exit 3, expected 0" in said
    assert "record says 'rank 0 exited with code 3'" in said
    assert "host unhealthy after the job" in said and "down" in said


def test_the_short_matrix(tmp_path: Path) -> None:
    """Every case twice with seed 1 (about 2-3 minutes on 2 cores): no violation."""
    out = tmp_path / "chaos.json"
    proc = subprocess.run(
        [sys.executable, str(CHAOS), "--quick", "--seed", "1", "-q", "-v", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    data = json.loads(out.read_text())
    cases = _chaos().CASES
    assert len(data["outcomes"]) == 2 * len(cases)
    assert all(o["ok"] for o in data["outcomes"])
    ran = [o for o in data["outcomes"] if not o["skipped"] and not o["missed"]]
    assert sum(o["faults"] for o in ran) >= len(cases)  # the faults really were injected
