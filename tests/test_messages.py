"""Messages that agree with what happened (issue 37): a launch says the chips it passed over,
in one line, as --dry-run lists them."""

from __future__ import annotations

from pathlib import Path

from conftest import run_cli

C01, C03 = "0000:01:00.0", "0000:03:00.0"


def test_a_launch_says_the_chips_it_passed_over_in_one_line(qb2: Path, runtime: Path) -> None:
    assert run_cli("sim", "fault", "--root", str(qb2), "link-down", C01, C03).code == 0
    env = {"XDG_RUNTIME_DIR": str(runtime)}
    res = run_cli("launch", "--root", str(qb2), "--tp-size", "2", "--", "true", env=env)
    assert res.code == 0, res.err
    said = [ln for ln in res.err.splitlines() if "passed over" in ln]
    assert said == [
        f"ttmesh: note: passed over {C01}, {C03} (2 of 2 links between {C01} and {C03} are "
        "down (ch9<->ch2, ch8<->ch3)): the job runs on 0000:05:00.0, 0000:07:00.0"
    ], res.err
    dry = run_cli("launch", "--root", str(qb2), "--tp-size", "2", "--dry-run", "--", "true")
    assert f"passed over {C01}, {C03}: 2 of 2 links" in dry.out  # the plan, as before
    assert "note: passed over" not in dry.err  # said once: in the plan
