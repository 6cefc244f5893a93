"""Failures explained (issue 14): the known Tenstorrent failure lines in ``configs/failures.yaml``,
matched in what a failing rank, a server or mpirun printed, in the summary and --summary-json."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, TAG, run_cli
from test_serving import ENV, SGLANG, seed

from ttmesh.launcher.attempt import failures

QB2_ALL = "0000:01:00.0,0000:03:00.0,0000:05:00.0,0000:07:00.0"  # linked: reset together

# What users saw, as the failing process printed it (stream, line), one per table entry.
SAMPLES = {
    "soc-descriptor": (
        "stderr",
        "RuntimeError: TT_FATAL @ tt_metal/llrt/tt_cluster.cpp:153: "
        "SoC descriptor file does not exist: /home/me/job/tt_metal/soc_descriptors/"
        "blackhole_140_arch.yaml",
    ),
    "chip-in-use": (
        "stdout",
        "Waiting for lock 'CHIP_IN_USE_0_PCIe' which is currently held by thread TID: 4242, "
        "PID: 4242",
    ),
    "active-eth-core": (
        "stderr",
        "RuntimeError: TT_THROW @ tt_metal/impl/device/device.cpp:612: Timed out while waiting "
        "for active ethernet core (x=20,y=25) to become active again. Try resetting the board.",
    ),
    "eth-heartbeat": ("stderr", "ETH core heartbeat check failed for chip 1 core (x=1,y=25)"),
    "eth-remote-io": (
        "stderr",
        "RuntimeError: Timeout waiting for Ethernet core service remote IO request.",
    ),
    "fabric-router-sync": (
        "stdout",
        "TT_THROW @ tt_metal/fabric/fabric_host_utils.cpp:418: Fabric Router Sync Timeout "
        "(open_mesh_device)",
    ),
    "topology-mapping": (
        "stderr",
        "RuntimeError: TT_FATAL @ tt_metal/fabric/topology_mapper.cpp:1202: mapping_result.success",
    ),
    "gloo-teardown": ("stderr", "terminate called without an active exception"),
    "libtt-extract": ("stderr", "failed to extract embedded tt-metal runtime archive"),
    "libtt-bad-bdf": (
        "stderr",
        "Invalid BDF in TT_VISIBLE_DEVICES: 0000:99:00.0. Valid BDFs are part of the cluster "
        "descriptor.",
    ),
    "libtt-mesh-id": (
        "stderr",
        "Invalid TT_MESH_ID: Local mesh binding mesh_id 1 not found in mesh graph descriptor",
    ),
}

# Prints argv[3] on argv[2] between other lines, then a C++ backtrace of argv[4] frames (the
# line is not among the last few), and fails.
SAY = (
    "import sys\n"
    "out = sys.stdout if sys.argv[2] == 'stdout' else sys.stderr\n"
    "print('starting the mesh', file=out)\n"
    "print(sys.argv[3], file=out)\n"
    "print('backtrace:', file=out)\n"
    "for i in range(int(sys.argv[4])):\n"
    "    print(f' --- tt::tt_metal::frame_{i}()', file=out)\n"
    "out.flush()\n"
    "sys.exit(1)\n"
)


def say(stream: str, line: str, frames: int = 40) -> list[str]:
    return ["--", sys.executable, "-c", SAY, TAG, stream, line, str(frames)]


def expected_fix(entry_id: str, flag: str) -> str:
    entry = next(e for e in failures.table() if e.id == entry_id)
    return entry.fix.format(flag=f" {flag}", reset=f"ttmesh reset {flag} --chips {QB2_ALL}")


def assert_explained(err: str, summary: dict, entry_id: str, where: str, line: str, flag: str):
    entry = next(e for e in failures.table() if e.id == entry_id)
    fix = expected_fix(entry_id, flag)
    assert summary["diagnosis"] == {
        "id": entry_id,
        "cause": entry.cause,
        "fix": fix,
        "link": entry.link,
        "line": line,
    }
    assert f"ttmesh: known failure ({entry_id}): {entry.cause}\n" in err, err
    assert f"ttmesh:   seen in {where}: {line}\n" in err, err
    assert f"ttmesh:   fix: {fix}\n" in err, err
    assert f"ttmesh:   see {entry.link}" in err, err


# --------------------------------------------------------------------------- the table


def test_the_table_is_valid_and_packaged() -> None:
    entries = failures.table()
    assert [e.id for e in entries] == list(SAMPLES)  # every entry has its test below
    for e in entries:
        assert e.id and e.cause and e.fix and e.regex.pattern
        assert e.link.startswith("https://github.com/") and not e.regex.search("")
        e.fix.format(flag=" --sim x", reset="ttmesh reset --sim x")  # only known placeholders
    by_id = {e.id: e for e in entries}
    assert by_id["active-eth-core"].link.endswith("tt-inference-server/issues/4923")
    assert by_id["fabric-router-sync"].link.endswith("tt-metal/issues/54017")
    assert by_id["eth-remote-io"].link.endswith("tt-umd/issues/1846")
    assert [by_id["chip-in-use"].link, *by_id["chip-in-use"].also] == [
        "https://github.com/tenstorrent/tt-umd/issues/2551",
        "https://github.com/tenstorrent/tt-umd/issues/1756",
    ]
    assert "{reset}" in by_id["active-eth-core"].fix
    assert "unset TT_METAL_RUNTIME_ROOT" in by_id["soc-descriptor"].fix
    assert '"configs/failures.yaml"' in (REPO / "pyproject.toml").read_text()


GOOD = {"id": "x", "pattern": "a", "cause": "c", "fix": "f", "link": "https://github.com/a"}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"link": None}, "'link' must be"),
        ({"pattern": "("}, "pattern does not compile"),
        ({"pattern": "a|"}, "matches every line"),
        ({"fix": "{host}"}, "fix names host"),
        ({"link": "http://example.com"}, "not a GitHub address"),
        ({"severity": "error"}, "unknown key severity"),
    ],
)
def test_a_broken_entry_is_named(changes: dict, message: str) -> None:
    entry = {k: v for k, v in {**GOOD, **changes}.items() if v is not None}
    with pytest.raises(ValueError, match=r"entry 1|, x:") as info:
        failures.parse({"entries": [entry]}, "t.yaml")
    assert message in str(info.value)


def test_the_table_is_read_only_on_failure() -> None:
    """Importing the launch path reads no YAML; the first failure reads the table, once."""
    code = (
        "import sys\n"
        "from ttmesh.launcher.job import run\nfrom ttmesh.launcher.attempt import guardian, failures\n"
        "assert 'yaml' not in sys.modules\n"
        "assert failures.match([('rank 0', [])]) is None and 'yaml' not in sys.modules\n"
        "found = failures.match([('rank 0', ['\\x1b[31mFabric Router Sync Timeout\\x1b[0m'])])\n"
        "assert found['id'] == 'fabric-router-sync' and found['line'] == 'Fabric Router Sync Timeout'\n"
        "assert failures.table.cache_info().misses == 1\n"
        "failures.match([('rank 0', ['mapping_result.success'])])\n"
        "assert failures.table.cache_info().misses == 1\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_the_first_entry_in_table_order_wins() -> None:
    """A root cause is listed before what it leads to: the lock before a later timeout."""
    found = failures.match(
        [
            ("rank 0's stderr", ["Timed out while waiting for active ethernet core (x=1,y=1)"]),
            ("mpirun's stderr", ["Waiting for lock 'CHIP_IN_USE_3_PCIe' held by PID 9"]),
        ]
    )
    assert found is not None
    assert (found["id"], found["where"]) == ("chip-in-use", "mpirun's stderr")


# --------------------------------------------------------------------------- one per entry


@pytest.mark.parametrize("entry_id", list(SAMPLES))
def test_known_failure_is_explained(entry_id: str, qb2: Path, tmp_path: Path) -> None:
    stream, line = SAMPLES[entry_id]
    out = tmp_path / "s.json"
    res = run_cli("launch", "--root", str(qb2), "--tp-size", "1", "--summary-json", str(out),
                  *say(stream, line))  # fmt: skip
    assert res.code == 1, res.err
    summary = json.loads(out.read_text())
    assert (summary["source"], summary["rank"], summary["code"]) == ("worker", 0, 1)
    assert_explained(res.err, summary, entry_id, f"rank 0's {stream}", line, f"--root {qb2}")
    assert res.err.strip().splitlines()[-1] == "ttmesh: exit 1: rank 0's exit code"


def test_an_unknown_failure_has_no_diagnosis(qb2: Path, tmp_path: Path) -> None:
    out = tmp_path / "s.json"
    res = run_cli("launch", "--root", str(qb2), "--tp-size", "2", "--summary-json", str(out),
                  *say("stderr", "ValueError: boom at step 7"))  # fmt: skip
    assert res.code == 1, res.err
    summary = json.loads(out.read_text())
    assert summary["diagnosis"] is None
    assert set(summary) == {"source", "rank", "code", "reason", "attempts", "diagnosis", "dumps"}
    assert summary["dumps"] == []  # no hung attempt: no stacks taken
    assert "known failure" not in res.err


def test_the_fix_names_the_host_as_the_user_did(tmp_path: Path) -> None:
    """--sim NAME in, --sim NAME in the fix; each attempt's line names what it met."""
    out = tmp_path / "s.json"
    res = run_cli("launch", "--sim", "quietbox2", "--tp-size", "2", "--max-restarts", "1",
                  "--summary-json", str(out), *say("stderr", SAMPLES["active-eth-core"][1]))  # fmt: skip
    assert res.code == 1, res.err
    summary = json.loads(out.read_text())
    assert summary["diagnosis"]["fix"] == expected_fix("active-eth-core", "--sim quietbox2")
    assert "ttmesh reset --sim quietbox2 --chips " in res.err
    assert res.err.count("; known failure: active-eth-core") == 2


def test_a_peers_output_explains_a_rank_that_failed_because_of_it(
    qb2: Path, tmp_path: Path
) -> None:
    """Rank 1 fails with nothing known in its output (as a rank aborting in a collective when
    its peer gave up); rank 0 had said why: the diagnosis is rank 0's line, the code rank 1's."""
    line = SAMPLES["topology-mapping"][1]
    said = tmp_path / "said"
    script = (
        f'if [ "$RANK" = 0 ]; then echo "{line}" >&2; touch {said}; exec sleep 60; fi; '
        f"while [ ! -e {said} ]; do sleep 0.02; done; echo 'Socket closed' >&2; exit 5"
    )
    out = tmp_path / "s.json"
    res = run_cli("launch", "--root", str(qb2), "--tp-size", "2", "--summary-json", str(out),
                  "--", "sh", "-c", script, TAG)  # fmt: skip
    assert res.code == 5, res.err
    summary = json.loads(out.read_text())
    assert (summary["rank"], summary["code"]) == (1, 5)
    assert summary["diagnosis"]["id"] == "topology-mapping"
    assert f"ttmesh:   seen in rank 0's stderr: {line}\n" in res.err


def test_mpiruns_own_output_is_matched(qb2: Path, tmp_path: Path) -> None:
    fake = tmp_path / "mpirun"
    fake.write_text(
        "#!/bin/sh\necho 'Waiting for lock CHIP_IN_USE_1_PCIe (held by PID 77)' >&2\nexit 1\n"
    )
    fake.chmod(0o755)
    out = tmp_path / "s.json"
    res = run_cli("launch", "--root", str(qb2), "--tp-size", "2", "--launcher", "mpi",
                  "--summary-json", str(out), "--", sys.executable, "-c", "pass", TAG,
                  env={"TTMESH_MPIRUN": str(fake)})  # fmt: skip
    assert res.code == 2, res.err
    summary = json.loads(out.read_text())
    assert (summary["source"], summary["rank"]) == ("ttmesh", None)
    assert_explained(res.err, summary, "chip-in-use", "mpirun's stderr",
                     "Waiting for lock CHIP_IN_USE_1_PCIe (held by PID 77)", f"--root {qb2}")  # fmt: skip
    assert res.err.strip().splitlines()[-1].startswith("ttmesh: exit 2: mpirun failed")


def test_a_servers_output_is_matched_when_ttmesh_stops_it(qb2: Path, tmp_path: Path) -> None:
    """A server that never gets ready (ttmesh stops it: no failing rank): its own output."""
    line = SAMPLES["fabric-router-sync"][1]
    out = tmp_path / "s.json"
    res = run_cli("launch", "--root", str(qb2), "--ready-timeout", "2", "--summary-json", str(out),
                  "--", *SGLANG, *seed(1, port=str(_free_port())),
                  env={**ENV, "FAKE_MODE": "hang", "FAKE_SAY": line})  # fmt: skip
    assert res.code == 124, res.err
    summary = json.loads(out.read_text())
    assert (summary["source"], summary["rank"]) == ("ttmesh", None)
    assert_explained(res.err, summary, "fabric-router-sync", "the sglang-torchtpu server's stderr",
                     line, f"--root {qb2}")  # fmt: skip
    assert res.err.strip().splitlines()[-1].startswith("ttmesh: exit 124: hung in bring-up")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
