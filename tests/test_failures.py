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
    "fw-init": (
        "stderr",
        "RuntimeError: TT_THROW @ tt_metal/impl/context/metal_context.cpp:1021: tt::exception "
        "Device 0 init: failed to initialize FW! Try resetting the board.",
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


def expected_fix(entry_id: str, flag: str, reset_done: bool = False) -> str:
    """The entry's fix for this host; once ttmesh reset the chips and verified them, the one
    that asks for no reset (issue 37)."""
    entry = next(e for e in failures.table() if e.id == entry_id)
    template = (entry.after_reset or failures.AFTER_RESET) if reset_done else entry.fix
    return template.format(flag=f" {flag}", reset=f"ttmesh reset {flag} --chips {QB2_ALL}")


def assert_explained(
    err: str, summary: dict, entry_id: str, where: str, line: str, flag: str,
    reset_done: bool = False,
) -> None:  # fmt: skip
    entry = next(e for e in failures.table() if e.id == entry_id)
    fix = expected_fix(entry_id, flag, reset_done)
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
    from ttmesh import yamlio

    # compiled at once here, as a user's table is (table() compiles a pattern when it is used)
    eager = failures.parse(yamlio.load_file(failures.TABLE), str(failures.TABLE))
    entries = failures.table()
    assert [e.id for e in eager] == [e.id for e in entries]
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
    assert set(summary) == {
        "schema", "job", "host", "user", "uid", "root", "command", "profile", "chips", "server",
        "logs", "started", "ended", "attempts", "restarts", "resets", "source", "rank", "code",
        "reason", "diagnosis", "dumps",
    }  # fmt: skip
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
    """A server that never gets ready (ttmesh stops it: no failing rank): its own output (a
    line explained after the end, not one that stops the job as it comes)."""
    line = SAMPLES["topology-mapping"][1]
    out = tmp_path / "s.json"
    res = run_cli("launch", "--root", str(qb2), "--ready-timeout", "2", "--summary-json", str(out),
                  "--", *SGLANG, *seed(1, port=str(_free_port())),
                  env={**ENV, "FAKE_MODE": "hang", "FAKE_SAY": line})  # fmt: skip
    assert res.code == 124, res.err
    summary = json.loads(out.read_text())
    assert (summary["source"], summary["rank"]) == ("ttmesh", None)
    assert_explained(res.err, summary, "topology-mapping", "the sglang-torchtpu server's stderr",
                     line, f"--root {qb2}")  # fmt: skip
    assert res.err.strip().splitlines()[-1].startswith("ttmesh: exit 124: hung in bring-up")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- lines as they arrive


def test_each_live_line_is_marked_with_its_hint_and_source() -> None:
    """The lines that stop a job as they come: a device that threw (tt-metal's TT_THROWs that
    say to reset the board, a fabric that never synced, a remote chip that stopped answering),
    each with where it is printed upstream; the lock tt-umd waits on is a note."""
    by_id = {e.id: e for e in failures.table()}
    fatal = {i for i, e in by_id.items() if e.live == "fatal"}
    assert fatal == {"active-eth-core", "eth-remote-io", "fw-init", "fabric-router-sync"}
    assert {i for i, e in by_id.items() if e.live == "note"} == {"chip-in-use"}
    for entry_id in fatal | {"chip-in-use"}:
        entry = by_id[entry_id]
        line = SAMPLES[entry_id][1]
        assert any(h in line.encode() for h in entry.hints), entry_id  # its hint is in its line
        assert entry.source.startswith(("tenstorrent/tt-metal", "tenstorrent/tt-umd")), entry_id
    assert "llrt.cpp" in by_id["active-eth-core"].source
    assert "metal_context.cpp" in by_id["fw-init"].source


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"live": "fatal", "hint": "a", "source": None}, "must name its 'source'"),
        ({"live": "fatal", "source": "x"}, "a live entry needs 'hint'"),
        ({"live": "note", "hint": ""}, "a live entry needs 'hint'"),
        ({"live": "note", "hint": ["a", 3]}, "a live entry needs 'hint'"),
        ({"live": "note", "hint": "a" * 201}, "a live entry needs 'hint'"),
        ({"live": "always", "hint": "a"}, "live must be one of fatal, note"),
        ({"hint": "a"}, "'hint' goes with live"),
    ],
)
def test_a_broken_live_entry_is_named(changes: dict, message: str) -> None:
    entry = {k: v for k, v in {**GOOD, **changes}.items() if v is not None}
    with pytest.raises(ValueError, match=r", x:") as info:
        failures.parse({"entries": [entry]}, "t.yaml")
    assert message in str(info.value)


def test_live_lines_are_found_in_blocks_by_their_hints_first() -> None:
    live = failures.live_lines()
    quiet = b"step 1 loss 0.5\n" * 1000  # no hint: never split, never matched
    assert live.scan(quiet, "rank 0's stdout") == []
    block = b"\n".join([b"starting", SAMPLES["fw-init"][1].encode(), b"\x1b[31mdone\x1b[0m"])
    hits = live.scan(block, "rank 0's stderr")
    assert [(h.entry.id, h.where) for h in hits] == [("fw-init", "rank 0's stderr")]
    assert hits[0].found()["line"] == SAMPLES["fw-init"][1]
    note = SAMPLES["chip-in-use"][1].encode()
    first, second = live.scan(note, "w"), live.scan(note, "w")
    assert live.first_note(first[0]) and not live.first_note(second[0])  # said once
    # A hint alone is not the line: the pattern decides.
    assert live.scan(b"the Router Sync is fine", "w") == []
    # A profile's own entry is matched first, and stands for the table's of its id.
    own = failures.parse(
        {"entries": [{**GOOD, "id": "fw-init", "pattern": "mine", "live": "note", "hint": "mine",
                      "source": "me"}]}, "p"
    )  # fmt: skip
    mine = failures.live_lines(own)
    assert [h.entry.live for h in mine.scan(b"mine\n" + SAMPLES["fw-init"][1].encode(), "w")] == [
        "note"
    ]


def test_a_coloured_live_line_is_found_as_the_end_finds_it() -> None:
    """A logger that colours part of a line (loguru on a terminal, a rank that forces
    colour) may put an escape inside a hint's words: the hint is looked for in the line as a
    user reads it, as the diagnosis after the end reads it, or the fatal line waits for the end."""
    live = failures.live_lines()
    for entry_id in ("fw-init", "active-eth-core"):
        line = SAMPLES[entry_id][1]
        hint = next(h for h in failures.live_lines().hints if h.decode() in line).decode()
        cut = line.index(hint) + len(hint) // 2
        coloured = f"\x1b[31m{line[:cut]}\x1b[0m\x1b[1m{line[cut:]}\x1b[0m".encode()
        hits = live.scan(b"starting\n" + coloured + b"\n", "rank 0's stdout")
        assert [h.entry.id for h in hits] == [entry_id]
        assert hits[0].found()["line"] == line
        assert failures.match([("rank 0's stdout", [coloured.decode()])]) is not None


def test_a_server_that_throws_as_it_opens_the_chips_is_stopped_at_once(
    qb2: Path, tmp_path: Path
) -> None:
    """tt-studio#1283: the server printed tt-metal's TT_THROW and sat at "opening device" for
    the whole ready timeout. Now it is stopped (2 s after the line), its chips recovered, the
    line explained; the ready timeout (an hour) never comes into it."""
    out = tmp_path / "s.json"
    res = run_cli("launch", "--root", str(qb2), "--ready-timeout", "3600", "--summary-json",
                  str(out), "--", *SGLANG, *seed(4, port=str(_free_port())),
                  env={**ENV, "FAKE_MODE": "fatal"}, timeout=120)  # fmt: skip
    assert res.code == 1, res.err
    where = "the sglang-torchtpu server's stderr"
    line = res.err.split(f"ttmesh: fatal line in {where} (active-eth-core): ", 1)[1].split("\n")[0]
    assert line.endswith(": stopping every worker"), line
    line = line.removesuffix(": stopping every worker")
    assert "Timed out while waiting for active ethernet core" in line
    summary = json.loads(out.read_text())
    assert (summary["source"], summary["code"]) == ("ttmesh", 1)
    assert_explained(res.err, summary, "active-eth-core", where, line, f"--root {qb2}",
                     reset_done=True)  # fmt: skip
    assert "chips recovered and verified" in res.err  # the chips checked whatever it brought up
    assert "not ready after" not in res.err
    last = res.err.strip().splitlines()[-1]
    assert last.startswith("ttmesh: exit 1: fatal line (active-eth-core): "), last


def test_a_fatal_line_after_ready_stops_a_server_that_answers_on(qb2: Path, tmp_path: Path) -> None:
    res = run_cli("launch", "--root", str(qb2), "--", *SGLANG, *seed(1, port=str(_free_port())),
                  env={**ENV, "FAKE_MODE": "fatal-late", "FAKE_FATAL": SAMPLES["fw-init"][1]},
                  timeout=120)  # fmt: skip
    assert res.code == 1, res.err
    # The stand-in throws once ttmesh's probe got its 200 (an event, not a time): ready first.
    assert "ready after" in res.err and "ttmesh: fatal line in" in res.err, res.err
    assert "ttmesh: known failure (fw-init)" in res.err


def test_a_note_is_said_once_and_the_job_goes_on(qb2: Path) -> None:
    line = SAMPLES["chip-in-use"][1]
    code = f"import sys\nfor _ in range(3): print({line!r}, flush=True)\n"
    res = run_cli("launch", "--root", str(qb2), "--tp-size", "1", "--", sys.executable, "-c",
                  code, TAG)  # fmt: skip
    assert res.code == 0, res.err
    notes = [ln for ln in res.err.splitlines() if ln.startswith("ttmesh: note: rank 0's stdout:")]
    assert len(notes) == 1, res.err
    entry = next(e for e in failures.table() if e.id == "chip-in-use")
    assert (
        f": {entry.cause} (fix: stop the process that holds the chips (ttmesh ls --root {qb2}"
        in notes[0]
    )


def test_a_process_that_exits_on_its_own_after_a_fatal_line_keeps_its_code(
    qb2: Path, tmp_path: Path
) -> None:
    """The stop comes FATAL_SETTLE after the line: a process that ends first keeps its code."""
    out = tmp_path / "s.json"
    res = run_cli("launch", "--root", str(qb2), "--tp-size", "1", "--summary-json", str(out),
                  *say("stderr", SAMPLES["eth-remote-io"][1]))  # fmt: skip
    assert res.code == 1, res.err
    summary = json.loads(out.read_text())
    assert (summary["source"], summary["rank"]) == ("worker", 0)
    assert summary["diagnosis"]["id"] == "eth-remote-io"


def test_a_profiles_own_fatal_line_stops_its_server_and_a_broken_one_is_refused(
    qb2: Path, tmp_path: Path
) -> None:
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    stock = (REPO / "ttmesh" / "configs" / "profiles" / "sglang-torchtpu.yaml").read_text()
    own = [{"id": "pjrt-lost", "pattern": "PJRT client lost the device", "cause": "libtt lost it",
            "fix": "reset: {reset}", "link": "https://github.com/pcmoritz/libtt",
            "live": "fatal", "hint": "PJRT client", "source": "libtt's PJRT plugin"}]  # fmt: skip
    mine = stock.replace("name: sglang-torchtpu", "name: mine").replace(
        "priority: 20", "priority: 30"
    )
    mine += "\nflags: sglang-torchtpu\n"
    (profiles / "mine.yaml").write_text(mine + "\nfailures: " + json.dumps(own) + "\n")
    env = {**ENV, "TTMESH_PROFILES": str(profiles), "FAKE_MODE": "fatal-late",
           "FAKE_FATAL": "E0000 PJRT client lost the device 0"}  # fmt: skip
    argv = ["--", *SGLANG, *seed(1, port=str(_free_port()))]
    res = run_cli("launch", "--root", str(qb2), *argv, env=env, timeout=120)
    assert res.code == 1, res.err
    assert "ttmesh: fatal line in the mine server's stderr (pjrt-lost): " in res.err, res.err
    own[0]["pattern"] = "(a+)+\\1"
    (profiles / "mine.yaml").write_text(mine + "\nfailures: " + json.dumps(own) + "\n")
    bad = run_cli("launch", "--root", str(qb2), "--dry-run", *argv, env=env)
    assert bad.code == 2, bad.err
    assert (
        bad.err.strip()
        .splitlines()[-1]
        .startswith(
            f"ttmesh: profile {profiles / 'mine.yaml'}: failures, pjrt-lost: pattern does not compile"
        )
    ), bad.err


def test_a_hostile_line_is_bounded_and_shown_without_its_escapes() -> None:
    """A line with a hint, a backtracking-bait body and terminal escapes: matched in linear
    time (RE2), said without an escape reaching the terminal."""
    live = failures.live_lines()
    hostile = (b"\x1b]0;pwned\x07\x1b[2J" + b"a" * 60_000 + b"!"
               + b" Timed out while waiting for active ethernet core \x07\x08")  # fmt: skip
    [hit] = live.scan(hostile, "w")
    assert hit.entry.id == "active-eth-core"
    assert "\x1b" not in hit.line and "\x07" not in hit.line and "pwned" not in hit.line
    assert hit.found()["line"] == hit.line.strip()[: failures.MAX_LINE]
    assert live.scan(b"active ethernet core" * 10_000, "w") == []  # the hint alone: no line
