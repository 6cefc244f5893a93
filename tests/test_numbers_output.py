"""Numbers are numbers, and output that cannot be written is said (issue 19).

Two classes of hostile input, each tested as a class:

* every number ttmesh reads (a flag, a serving profile's YAML, the environment, a rank
  binding) is plain, finite and in range: ``nan``, ``inf``, ``1e400``, ``0x10``, ``1_000``,
  ``True``, ``1.5`` where a count is meant, or a value out of range is one line naming where it
  came from (the flag as typed, ``profile FILE: stop.grace``, ``SLURM_NNODES``), exit 2;
* output ttmesh cannot write (stdout closed, ``/dev/full``, a reader gone, a ``--summary-json``
  on a full disk) is one line and a non-zero exit (74, 141 for a reader gone, 2 for a file the
  user named), never a traceback, never a silent 0.

Plus the small ones seen by users: a job id starting with ``-``, ``ps`` rows hundreds of
columns wide, "1 chips".
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
from pathlib import Path

import click
import pytest
from conftest import REPO, env_without, run_cli, worker

from ttmesh.sim import core

C01 = "0000:01:00.0"


def ttmesh_lines(err: str) -> list[str]:
    """ttmesh's own lines (the simulated-host notice aside); never a traceback."""
    assert "Traceback" not in err and "Exception ignored" not in err, err
    return [ln for ln in err.splitlines() if not ln.startswith("simulated host: ")]


def one_line(err: str) -> str:
    lines = ttmesh_lines(err)
    assert len(lines) == 1 and lines[0].startswith("ttmesh: "), err
    return lines[0]


# --------------------------------------------------------------------------- numbers: flags

# Every number option or argument of the command line: (the command's words, the option as
# typed, what it counts). {ROOT} is a simulated host; {V} the value tried.
L = ["launch", "--root", "{ROOT}", "--dry-run"]
SECONDS = "seconds"
POSITIVE = "positive seconds"  # a timeout, an interval: 0 makes no sense
WHOLE = "whole"
NUMBER_OPTIONS: list[tuple[str, list[str], str, str]] = [
    ("launch", [*L, "--tp-size", "1", "--grace", "{V}", "true"], "--grace", SECONDS),
    ("launch", [*L, "--tp-size", "1", "--shutdown-timeout", "{V}", "true"], "--shutdown-timeout", SECONDS),
    ("launch", [*L, "--tp-size", "1", "--ready-timeout", "{V}", "true"], "--ready-timeout", POSITIVE),
    ("launch", [*L, "--tp-size", "1", "--fabric-grace", "{V}", "true"], "--fabric-grace", SECONDS),
    ("launch", [*L, "--tp-size", "1", "--op-timeout", "{V}", "true"], "--op-timeout", POSITIVE),
    ("launch", [*L, "--tp-size", "1", "--hang-timeout", "{V}", "true"], "--hang-timeout", POSITIVE),
    ("launch", [*L, "--tp-size", "1", "--heartbeat-timeout", "{V}", "true"], "--heartbeat-timeout", POSITIVE),
    ("launch", [*L, "--tp-size", "1", "--rdzv-timeout", "{V}", "true"], "--rdzv-timeout", POSITIVE),
    ("launch", [*L, "--tp-size", "1", "--health-interval", "{V}", "true"], "--health-interval", POSITIVE),
    ("launch", [*L, "--tp-size", "1", "--probe-interval", "{V}", "true"], "--probe-interval", POSITIVE),
    ("launch", [*L, "--tp-size", "1", "--probe-timeout", "{V}", "true"], "--probe-timeout", POSITIVE),
    ("launch", [*L, "--tp-size", "{V}", "true"], "--tp-size", WHOLE),
    ("launch", [*L, "--nproc-per-node", "{V}", "true"], "--nproc-per-node", WHOLE),
    ("launch", [*L, "--tp-size", "1", "--symmetric-dram-mb", "{V}", "true"], "--symmetric-dram-mb", WHOLE),
    ("launch", [*L, "--tp-size", "1", "--master-port", "{V}", "true"], "--master-port", WHOLE),
    ("launch", [*L, "--tp-size", "1", "--max-restarts", "{V}", "true"], "--max-restarts", WHOLE),
    ("launch", [*L, "--tp-size", "1", "--node-rank", "{V}", "true"], "--node-rank", WHOLE),
    ("launch", [*L, "--tp-size", "1", "--health-failures", "{V}", "true"], "--health-failures", WHOLE),
    ("launch", [*L, "--tp-size", "1", "--replicas", "{V}", "true"], "--replicas", WHOLE),
    ("launch", [*L, "--tp-size", "1", "--train-timeout", "{V}", "true"], "--train-timeout", SECONDS),
    ("launch", [*L, "--tp-size", "1", "--fleet-of", "f", "--events-fd", "{V}", "true"], "--events-fd", WHOLE),
    ("descriptor", ["descriptor", "--root", "{ROOT}", "--tp-size", "{V}"], "--tp-size", WHOLE),
    ("descriptor", ["descriptor", "--root", "{ROOT}", "--nproc-per-node", "{V}"], "--nproc-per-node", WHOLE),
    ("reset", ["reset", "--root", "{ROOT}", "--timeout", "{V}"], "--timeout", POSITIVE),
    ("reset", ["reset", "--root", "{ROOT}", "--backoff", "{V}"], "--backoff", SECONDS),
    ("reset", ["reset", "--root", "{ROOT}", "--train-timeout", "{V}"], "--train-timeout", SECONDS),
    ("reset", ["reset", "--root", "{ROOT}", "--retries", "{V}"], "--retries", WHOLE),
    ("top", ["top", "--root", "{ROOT}", "--once", "--interval", "{V}"], "--interval", POSITIVE),
    ("stop", ["stop", "some-job", "--wait", "{V}"], "--wait", SECONDS),
    ("logs", ["logs", "some-job", "--rank", "{V}"], "--rank", WHOLE),
    ("logs", ["logs", "some-job", "--replica", "{V}"], "--replica", WHOLE),
    ("logs", ["logs", "some-job", "--attempt", "{V}"], "--attempt", WHOLE),
    ("logs", ["logs", "some-job", "--tail", "{V}"], "--tail", WHOLE),
    ("sim config", ["sim", "config", "--root", "{ROOT}", "--heartbeat-hz", "{V}"], "--heartbeat-hz", POSITIVE),
    ("sim config", ["sim", "config", "--root", "{ROOT}", "--reset-seconds", "{V}"], "--reset-seconds", SECONDS),
    ("sim fault reset-hangs", ["sim", "fault", "--root", "{ROOT}", "reset-hangs", "--", "{V}"], "reset-hangs", SECONDS),
    ("sim fault reset-fails", ["sim", "fault", "--root", "{ROOT}", "reset-fails", "--times", "{V}"], "--times", WHOLE),
    ("sim fault link-down", ["sim", "fault", "--root", "{ROOT}", "link-down", C01, "0000:03:00.0", "--channel", "{V}"], "--channel", WHOLE),
    ("sim fault container", ["sim", "fault", "--root", "{ROOT}", "container", "--shm-size", "{V}"], "--shm-size", WHOLE),
    ("sim create", ["sim", "create", "--system", "quietbox2", "--root", "{NEW}", "--host", "{V}"], "--host", WHOLE),
    ("sim create", ["sim", "create", "--system", "quietbox2", "--root", "{NEW}", "--heartbeat-hz", "{V}"], "--heartbeat-hz", POSITIVE),
    ("_recover", ["_recover", "--root", "{ROOT}", "--chips", "x", "--timeout", "{V}"], "--timeout", POSITIVE),
    ("_recover", ["_recover", "--root", "{ROOT}", "--chips", "x", "--retries", "{V}"], "--retries", WHOLE),
    ("_recover", ["_recover", "--root", "{ROOT}", "--chips", "x", "--grace", "{V}"], "--grace", SECONDS),
    ("_recover", ["_recover", "--root", "{ROOT}", "--chips", "x", "--check", "--train-timeout", "{V}"], "--train-timeout", SECONDS),
    ("_recover", ["_recover", "--root", "{ROOT}", "--chips", "x", "--reset", "x", "--at", "{V}"], "--at", SECONDS),
    ("sim config", ["sim", "config", "--root", "{ROOT}", "--cable-window", "{V}"], "--cable-window", SECONDS),
    ("sim config", ["sim", "config", "--root", "{ROOT}", "--cable-train-seconds", "{V}"], "--cable-train-seconds", SECONDS),
    ("sim create", ["sim", "create", "--system", "dual-t3k", "--host", "0", "--root", "{NEW}", "--cable-window", "{V}"], "--cable-window", SECONDS),
    ("sim create", ["sim", "create", "--system", "dual-t3k", "--host", "0", "--root", "{NEW}", "--cable-train-seconds", "{V}"], "--cable-train-seconds", SECONDS),
    ("sim fault bad-cable", ["sim", "fault", "--root", "{ROOT}", "bad-cable", C01, "--channel", "{V}"], "--channel", WHOLE),
]  # fmt: skip

# What is wrong with each bad value, for a duration and for a count.
BAD_SECONDS = {
    "nan": "not a number",
    "inf": "not a number",
    "-inf": "not a number",
    "1e400": "too large",
    "99999999": "too large",  # more than 30 days
    "-1": "cannot be negative",
    "0x10": "not a number",
    "1_000": "not a number",
    "５": "not a number",  # a full-width digit: float() takes it
    "": "not a number",
}
BAD_WHOLE = {
    "nan": "not a number",
    "inf": "not a number",
    "1.5": "not a whole number",
    "1e3": "not a whole number",
    "99999999999999999999": "too large",
    "-5": "cannot be negative|too small",
    "0x10": "not a number",
    "True": "not a number",
    "-0": "digits only, no sign",  # a count is digits only: -0 and +3 are typos, not counts
    "+3": "digits only, no sign",
}
EVERY_VALUE = {"--grace", "--tp-size"}  # every bad value; the other options a few of them
FEW = {SECONDS: ["nan", "inf", "1e400", "-1"], WHOLE: ["nan", "1.5", "99999999999999999999", "-0"]}
FEW[POSITIVE] = [*FEW[SECONDS], "0"]


def _cases() -> list[tuple[list[str], str, str, str]]:
    out = []
    for _path, argv, flag, kind in NUMBER_OPTIONS:
        bad = dict(BAD_WHOLE if kind == WHOLE else BAD_SECONDS)
        if kind == POSITIVE:
            bad["0"] = "must be more than 0"
        values = bad if flag in EVERY_VALUE and argv[0] == "launch" else FEW[kind]
        out += [(argv, flag, value, bad[value]) for value in values]
    return out


def _shown(value: str) -> str:
    return repr(value) if not value.strip() else value


@pytest.mark.parametrize(
    ("argv", "flag", "value", "problem"),
    _cases(),
    ids=lambda v: " ".join(v[:2]) if isinstance(v, list) else repr(v),
)
def test_every_number_option_refuses_what_is_no_number(
    qb2: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    flag: str,
    value: str,
    problem: str,
) -> None:
    """One line naming the option as typed, what is wrong and the range to give; exit 2,
    nothing changed (read in-process: this is the parser, hundreds of cases)."""
    import ttmesh.cli

    words = [
        w.replace("{ROOT}", str(qb2)).replace("{NEW}", str(tmp_path / "new")).replace("{V}", value)
        for w in argv
    ]
    state = (qb2 / core.STATE_FILE).read_bytes()
    code = ttmesh.cli.run(words)
    out, err = capsys.readouterr()
    assert code == 2, (words, out, err)
    line = one_line(err)
    assert re.match(rf"ttmesh: {re.escape(flag)} {re.escape(_shown(value))}: ({problem}) \(give ",
                    line), line  # fmt: skip
    assert out == ""
    assert (qb2 / core.STATE_FILE).read_bytes() == state
    assert not (tmp_path / "new").exists()


def _number_params() -> set[tuple[str, str]]:
    """(command path, option or argument) of every parameter that takes a number."""
    import importlib

    import ttmesh.cli
    from ttmesh.cli.params import Number

    numeric = (click.types.IntParamType, click.types.FloatParamType, Number)
    found: set[tuple[str, str]] = set()

    def walk(cmd: click.Command, path: str) -> None:
        for p in cmd.params:
            if isinstance(p.type, numeric):
                found.add((path, p.opts[0] if isinstance(p, click.Option) else path.split()[-1]))
                assert isinstance(p.type, Number), f"{path} {p.opts[0]}: not a ttmesh Number"
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, f"{path} {name}")

    table = {**ttmesh.cli.COMMANDS, **{k: (*v, "") for k, v in ttmesh.cli.HIDDEN.items()}}
    for name, (module, attribute, *_) in table.items():
        walk(getattr(importlib.import_module(module), attribute), name)
    return found


def test_the_table_has_every_number_option() -> None:
    """Every option that takes a number reads it as a ttmesh Number (finite, in range), and
    the table above tries each: a new option cannot slip past."""
    aliases = {"--shutdown-timeout": "--grace"}
    tried = {(path, aliases.get(flag, flag)) for path, _argv, flag, _kind in NUMBER_OPTIONS}
    missing = _number_params() - tried
    assert not missing, sorted(missing)


def test_a_nan_grace_never_reaches_a_real_launch(qb2: Path) -> None:
    """The end-to-end case: --grace nan made a SIGKILL that never came; now nothing starts."""
    res = run_cli("launch", "--root", str(qb2), "--tp-size", "1", "--grace", "nan",
                  *worker("exit=0"))  # fmt: skip
    assert res.code == 2
    line = one_line(res.err)
    assert line == ("ttmesh: --grace nan: not a number (give seconds from 0 to 2592000, "
                    "e.g. --grace 5)"), line  # fmt: skip


# --------------------------------------------------------------------------- numbers: profiles


def _profile(directory: Path, grace: str = "5", timeout: str = "10", priority: str = "5") -> Path:
    directory.mkdir(exist_ok=True)
    path = directory / "myserv.yaml"
    path.write_text(
        "name: myserv\ntitle: a test server\nrecognise:\n  program: myserv.launch\n"
        f"priority: {priority}\ntp_flag: --tp-size\nready:\n  http: /health\n"
        f"  timeout: {timeout}\nstop:\n  grace: {grace}\n"
    )
    return path


@pytest.mark.parametrize(
    ("key", "value", "problem"),
    [
        ("stop.grace", "-1", "cannot be negative"),
        ("stop.grace", '"nan"', "not a number"),
        ("stop.grace", "1.0e400", "too large"),
        ("stop.grace", "true", "not a number"),
        ("stop.grace", "[1]", "not a number"),
        ("ready.timeout", "0", "must be more than 0"),
        ("ready.timeout", '"inf"', "not a number"),
        ("priority", "1.5", "not a whole number"),
    ],
)
def test_a_profiles_numbers_are_named_by_file_and_key(
    qb2: Path, tmp_path: Path, key: str, value: str, problem: str
) -> None:
    """A bad number in a profile names the profile and its key, never a flag the user did not
    type (``stop.grace: -1`` was reported as ``--grace -1.0``)."""
    kw = {"stop.grace": "grace", "ready.timeout": "timeout", "priority": "priority"}[key]
    path = _profile(tmp_path / "profiles", **{kw: value})
    res = run_cli("launch", "--root", str(qb2), "--dry-run", "-m", "myserv.launch",
                  env={"TTMESH_PROFILES": str(path.parent)})  # fmt: skip
    assert res.code == 2, res.err
    line = one_line(res.err)
    assert line.startswith(f"ttmesh: profile {path}: {key} "), line
    assert f": {problem} (give " in line and "--grace" not in line and "--ready" not in line


# --------------------------------------------------------------------------- numbers: environment

SLURM = {"SLURM_JOB_NODELIST": "n[0-1]", "SLURM_NODEID": "0", "SLURM_STEP_ID": "0",
         "SLURM_NNODES": "2"}  # fmt: skip


@pytest.mark.parametrize(
    ("env", "extra", "var"),
    [
        ({**SLURM, "SLURM_NNODES": "abc"}, [], "SLURM_NNODES"),
        ({**SLURM, "SLURM_NNODES": "99999999999999999999"}, [], "SLURM_NNODES"),
        ({**SLURM, "SLURM_NODEID": "x"}, [], "SLURM_NODEID"),
        ({**SLURM, "SLURM_NODEID": "-1"}, [], "SLURM_NODEID"),
        ({**SLURM, "SLURM_NODEID": "5"}, [], "SLURM_NODEID"),
        ({**SLURM, "SLURM_JOB_NODELIST": "n[0-99999999999]"}, [], "SLURM_JOB_NODELIST"),
        (
            {"OMPI_COMM_WORLD_RANK": "zz", "TTMESH_AGENT": "1"},
            ["--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:1"],
            "OMPI_COMM_WORLD_RANK",
        ),
    ],
    ids=lambda v: next(iter(v.items()))[0] if isinstance(v, dict) and len(v) < 3 else None,
)
def test_numbers_from_the_environment_are_named_by_their_variable(
    qb2: Path, env: dict[str, str], extra: list[str], var: str
) -> None:
    """Slurm's and mpirun's numbers are read strictly too: one line naming the variable, not
    an internal error, a flag the user never typed, or a host list of 10^11 names."""
    res = run_cli("launch", "--root", str(qb2), "--tp-size", "1", *extra, "--dry-run", "true",
                  env=env, timeout=30)  # fmt: skip
    assert res.code == 2, res.err
    line = one_line(res.err)
    assert line.startswith(f"ttmesh: {var} "), line
    assert "internal error" not in line and "--node-rank" not in line.split(":")[1]


# --------------------------------------------------------------------------- numbers: rank bindings


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("1.5", "not a whole number"),
        ("true", "not a number"),
        ("1.0e400", "too large"),
        ("99999999999", "too large"),
        ("-1", "cannot be negative"),
        ('"nan"', "not a number"),
    ],
)
def test_rank_binding_ranks_that_are_not_small_whole_numbers_are_refused(
    qb2: Path, tmp_path: Path, value: str, problem: str
) -> None:
    """``rank: 1.5`` was rank 1, ``rank: 99999999999`` hung ttmesh counting the gap to it."""
    (tmp_path / "m.textproto").write_text("mesh {}\n")
    path = tmp_path / "b.yaml"
    path.write_text(
        "rank_bindings:\n"
        f'  - {{rank: 0, mesh_id: 0, env_overrides: {{TT_VISIBLE_DEVICES: "{C01}"}}}}\n'
        f'  - {{rank: {value}, mesh_id: 0, env_overrides: {{TT_VISIBLE_DEVICES: "0000:03:00.0"}}}}\n'
        f"mesh_graph_desc_path: {tmp_path / 'm.textproto'}\n"
    )
    res = run_cli("launch", "--root", str(qb2), "--rank-binding", str(path), "--dry-run", "true",
                  timeout=30)  # fmt: skip
    assert res.code == 2, res.err
    line = one_line(res.err)
    assert line.startswith(f"ttmesh: {path}: rank_bindings[1]: rank "), line
    assert f": {problem} (give " in line


# --------------------------------------------------------------------------- plain ASCII everywhere

# Numbers, ports and host names are read by one rule wherever they come from (ttmesh.numeric,
# ttmesh.addresses): a digit is 0-9, a host name is ASCII labels or an IP address, an IPv6
# address with a port is in brackets. Python's int() takes '٣' and str.isdigit() takes '²'
# (then int('²') raised: an internal error); a host name with a line break, a space or a
# leading '-' reached mpirun, which exited 255 with no ttmesh line.
EP = ["launch", "--root", "{ROOT}", "--nnodes", "2", "--node-rank", "0", "--tp-size", "2",
      "--dry-run"]  # fmt: skip
HOSTS = ["launch", "--root", "{ROOT}", "--tp-size", "2", "--dry-run", "--hosts"]
SERVER = ["launch", "--root", "{ROOT}", "--dry-run", "--", "python", "-m", "sglang.launch_server",
          "--model-path", "M", "--device", "tpu", "--tp-size", "1"]  # fmt: skip
ASCII_RULE: list[tuple[list[str], str]] = [
    ([*EP, "--rdzv-endpoint", "127.0.0.1:²", "true"], "--rdzv-endpoint 127.0.0.1:²: port ²: not a number (give a whole number from 1 to 65535"),
    ([*EP, "--rdzv-endpoint", "127.0.0.1:٣٠٠٠", "true"], "--rdzv-endpoint 127.0.0.1:٣٠٠٠: port ٣٠٠٠: not a number"),
    ([*EP, "--rdzv-endpoint", "127.0.0.1:+5", "true"], "--rdzv-endpoint 127.0.0.1:+5: port +5: digits only"),
    ([*EP, "--rdzv-endpoint", "::1", "true"], "--rdzv-endpoint ::1: an IPv6 address goes in brackets: [::1]:29400"),
    ([*EP, "--rdzv-endpoint", "fe80::1:29400", "true"], "--rdzv-endpoint fe80::1:29400: an IPv6 address goes in brackets: [fe80::1]:29400"),
    ([*EP, "--rdzv-endpoint", "[::1", "true"], "--rdzv-endpoint [::1: '[' without its ']'"),
    ([*EP, "--rdzv-endpoint", "[node0]:29400", "true"], "--rdzv-endpoint [node0]:29400: no IPv6 address in the brackets"),
    ([*EP, "--rdzv-endpoint", "-oProxyCommand=x:1", "true"], "--rdzv-endpoint -oProxyCommand=x:1: it starts with '-'"),
    ([*EP, "--rdzv-endpoint", "nöde0:1", "true"], "--rdzv-endpoint nöde0:1: it is not ASCII"),
    ([*EP, "--rdzv-endpoint", "node\n0:1", "true"], "--rdzv-endpoint 'node\\n0:1': it has a line break"),
    ([*EP, "--rdzv-endpoint", "127.0.0.1:1", "--local-addr", "a b", "true"], "--local-addr 'a b': it has a space"),
    ([*HOSTS, "node0,node 1", "true"], "--hosts: 'node 1' is not a host: it has a space"),
    ([*HOSTS, "node0,-x", "true"], "--hosts: -x is not a host: it starts with '-'"),
    ([*HOSTS, "node0,node\n1", "true"], "--hosts: 'node\\n1' is not a host: it has a line break"),
    ([*HOSTS, "node0,\x1b[2Jnode1", "true"], "--hosts: '\\x1b[2Jnode1' is not a host: it has a control"),
    ([*HOSTS, "node0,::1", "true"], "--hosts: ::1 is not a host: an IPv6 address, which mpirun's --host cannot take"),
    ([*HOSTS, "node0,node1:4", "true"], "--hosts: node1:4 is not a host: ':' is in no host name"),
    (["ls", "--hosts", "node0,-x"], "--hosts: -x is not a host: it starts with '-'"),
    (["launch", "--root", "{ROOT}", "--tp-size", "1", "--master-addr", "a\nb", "--master-port", "5", "--dry-run", "true"], "--master-addr 'a\\nb': it has a line break"),
    (["launch", "--root", "{ROOT}", "--tp-size", "1", "--ranks-filter", "٣", "--dry-run", "true"], "--ranks-filter '٣': expected rank numbers"),
    (["launch", "--root", "{ROOT}", "--tp-size", "1", "--ranks-filter", "1_0", "--dry-run", "true"], "--ranks-filter '1_0': expected rank numbers"),
    (["launch", "--root", "{ROOT}", "--mesh-shape", "٢x٢", "--dry-run", "true"], "--mesh-shape ٢x٢: expected ROWSxCOLS"),
    (["launch", "--root", "{ROOT}", "--tp-size", "1", "--tee", "٠:1", "--dry-run", "true"], "--tee '٠:1': not 0-3 or a map of local ranks"),
    ([*SERVER, "--host", "a\nb", "--port", "30000"], "the server's --host 'a\\nb': it has a line break"),
    ([*SERVER, "--host", "[::1]", "--port", "30000"], "the server's --host [::1]: write the IPv6 address without brackets: ::1"),
    ([*SERVER, "--port", "٣٠٠٠٠"], "--port ٣٠٠٠٠: not a number (give a whole number from 1 to 65535"),
    (["launch", "--root", "{ROOT}", "--nnodes", "abc", "--rdzv-endpoint", "127.0.0.1:1", "--tp-size", "2", "--dry-run", "true"], "--nnodes abc: not a number"),
    (["launch", "--root", "{ROOT}", "--nnodes", "2:٢", "--rdzv-endpoint", "127.0.0.1:1", "--tp-size", "2", "--dry-run", "true"], "--nnodes 2:٢: ttmesh runs a fixed number of hosts (no elastic MIN:MAX) (e.g. --nnodes 2)"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "says"), ASCII_RULE, ids=lambda v: repr(v) if isinstance(v, str) else None
)
def test_numbers_ports_and_host_names_are_plain_ascii(
    qb2: Path, capsys: pytest.CaptureFixture[str], argv: list[str], says: str
) -> None:
    """Each is one line naming the value as given (escapes shown, never sent), what is wrong
    and what to give; exit 2, nothing started (read in-process: the parsers)."""
    import ttmesh.cli

    code = ttmesh.cli.run([w.replace("{ROOT}", str(qb2)) for w in argv])
    out, err = capsys.readouterr()
    assert code == 2, (argv, out, err)
    line = one_line(err)
    assert line.startswith(f"ttmesh: {says}") and line.isprintable(), line
    assert out == ""


@pytest.mark.parametrize(
    ("nodelist", "says"),
    [
        ("-n[0-1]", "SLURM_JOB_NODELIST: host -n0: it starts with '-'"),
        ("n[٠-١]", "SLURM_JOB_NODELIST n[٠-١]: cannot read [٠-١]"),
        ("nöde[0-1]", "SLURM_JOB_NODELIST: host nöde0: it is not ASCII"),
    ],
)
def test_slurms_first_host_follows_the_rule_too(
    qb2: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    nodelist: str, says: str,
) -> None:  # fmt: skip
    """Node 0 of a Slurm step is the endpoint: its name is read as every host name is."""
    import ttmesh.cli

    for key, value in {**SLURM, "SLURM_JOB_NODELIST": nodelist}.items():
        monkeypatch.setenv(key, value)
    code = ttmesh.cli.run(["launch", "--root", str(qb2), "--tp-size", "2", "--dry-run", "true"])
    line = one_line(capsys.readouterr().err)
    assert code == 2 and line.startswith(f"ttmesh: {says}"), line


def test_an_ipv6_endpoint_in_brackets_is_taken_and_passed_on_in_brackets(
    qb2: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``[::1]:29400`` and ``[::1]`` (torchrun's default port) are node 0 at ::1; the agents
    ``--hosts`` starts are given it in brackets (``::1:29400`` would be host ``::1:29400``)."""
    import ttmesh.cli

    for endpoint in ("[::1]:29400", "[::1]"):
        argv = [w.replace("{ROOT}", str(qb2)) for w in EP]
        assert ttmesh.cli.run([*argv, "--rdzv-endpoint", endpoint, "true"]) == 0, endpoint
        capsys.readouterr()
    with socket.socket(socket.AF_INET6) as s:
        s.bind(("::1", 0))  # ranks meet on ::1 (was: "--master-port P is already in use on ::1")
        port = s.getsockname()[1]
    one = ["launch", "--root", str(qb2), "--tp-size", "1", "--dry-run", "--master-addr", "::1"]
    assert ttmesh.cli.run([*one, "--master-port", str(port), "true"]) == 0
    assert f", master [::1]:{port}\n" in capsys.readouterr().out
    if shutil.which("mpirun") is None:
        pytest.skip("needs mpirun (apt-get install openmpi-bin)")
    argv = [w.replace("{ROOT}", str(qb2)) for w in HOSTS]
    assert ttmesh.cli.run([*argv, "node0,node1", "--rdzv-endpoint", "[::1]", "true"]) == 0
    out = capsys.readouterr().out
    assert " --rdzv-endpoint [::1]:29400 --job-id rdzv---1-29400 " in out, out


def test_a_rankfiles_ranks_are_plain_digits() -> None:
    """``rank ٠=node0`` was rank 0 (``\\d`` and int() take any script's digits)."""
    from ttmesh.errors import TTMeshError
    from ttmesh.launcher.nodes import meshhosts

    text = "rank 0=node0 slot=0\nrank 1=node1 slot=0\n"
    assert meshhosts.parse_rankfile(text, "b.rankfile", ["node0", "node1"], 2) == ["node0", "node1"]
    with pytest.raises(TTMeshError) as bad:
        meshhosts.parse_rankfile(
            text.replace("rank 0", "rank ٠"), "b.rankfile", ["node0", "node1"], 2
        )
    assert str(bad.value).startswith("b.rankfile: not a rankfile line: 'rank ٠=node0 slot=0'")


# Where ttmesh may still test digits otherwise, and why (each a program ttmesh stands in for,
# read as that program reads it, or work that moves to the rule elsewhere).
DIGITS_ELSEWHERE = {
    "launcher/serving/flags.py": "SGLang's own argument types, word for word: a server's flag "
    "is accepted and refused as the server does",
    "sim/tt_smi.py": "the tt-smi stand-in reads its targets as tt-smi does",
    "sim/smitable.py": "COLUMNS and LINES read as rich reads them (tt-smi's tables, byte for byte)",
    "fabric/resetscope.py": "a reset notice's tt-smi targets, read as tt-smi 6.8.0 reads them "
    "(its int() of '٣' is 3: that tt-smi resets chip 3)",
    "sim/standin/ttmesh_standin.py": "the stand-in server reads its flags as the server it "
    "stands in for does (standard library only: it runs without ttmesh)",
}


SUSPECT = re.compile(r"isdigit|isdecimal|isnumeric|\\[dD]")  # the files worth tokenizing


def test_every_digit_is_read_by_the_rule() -> None:
    """No ``str.isdigit()``/``isdecimal()``/``isnumeric()`` and no ``\\d`` in a pattern (both
    take '²' and '٣'): ttmesh.numeric.digits, or a pattern of [0-9] (bytes patterns are ASCII)."""
    import io
    import tokenize

    found = []
    for path in sorted((REPO / "ttmesh").rglob("*.py")):
        rel = str(path.relative_to(REPO / "ttmesh"))
        text = path.read_text()
        if rel in DIGITS_ELSEWHERE or rel == "numeric.py" or not SUSPECT.search(text):
            continue
        previous = None
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.NAME and previous == "." and tok.string in (
                "isdigit", "isdecimal", "isnumeric"
            ):  # fmt: skip
                found.append(f"{rel}:{tok.start[0]}: .{tok.string}()")
            if tok.type == tokenize.STRING:
                prefix = re.match(r"[A-Za-z]*", tok.string)
                kind = prefix.group(0).lower() if prefix else ""
                escaped = "\\d" if "r" in kind else "\\\\d"
                if "b" not in kind and (escaped in tok.string or escaped.upper() in tok.string):
                    found.append(f"{rel}:{tok.start[0]}: {tok.string[:50]}")
            previous = tok.string if tok.type == tokenize.OP else None
    assert not found, "digits read outside the rule:\n" + "\n".join(found)


# --------------------------------------------------------------------------- output: stdout

PY = [sys.executable, "-m", "ttmesh"]


def _env(unbuffered: bool, **more: str) -> dict[str, str]:
    env = env_without("PYTHONUNBUFFERED", "COLUMNS")
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"
    return {**env, **more}


def run_redirected(args: list[str], redirect: str, unbuffered: bool = False, **env: str):
    """``ttmesh ARGS`` with the shell redirection ``redirect`` (``>&-``, ``>/dev/full``,
    ``2>&-``...); what the other stream says is captured."""
    proc = subprocess.run(
        ["sh", "-c", f'exec "$@" {redirect}', "sh", *PY, *args],
        capture_output=True, text=True, timeout=60, env=_env(unbuffered, **env),
    )  # fmt: skip
    return proc


STDOUT_COMMANDS = [
    ["ls", "--root", "{ROOT}"],
    ["ls", "--root", "{ROOT}", "--json"],
    ["check", "--root", "{ROOT}"],
    ["check", "--root", "{ROOT}", "--json"],
    ["ps"],
    ["ps", "--all", "--json"],
    ["top", "--root", "{ROOT}", "--once"],
    ["top", "--root", "{ROOT}", "--json"],
    ["reset", "--root", "{ROOT}", "--json"],
    ["sim", "show", "--root", "{ROOT}"],
    ["sim", "systems"],
    ["profiles"],
    ["profiles", "--json"],
    ["descriptor", "--root", "{ROOT}"],
    ["launch", "--root", "{ROOT}", "--tp-size", "1", "--dry-run", "true"],
    ["launch", "--root", "{ROOT}", "--tp-size", "1", "--dry-run", "--json", "true"],
    ["--help"],
    ["launch", "--help"],
    ["--version"],
    ["ls", "--root", "/nonexistent", "--json"],  # a failure's JSON document, unwritable too
]
LINES = {
    ">&-": "ttmesh: cannot write to stdout: it is closed (give it a file, or > /dev/null)",
    ">/dev/full": (
        "ttmesh: cannot write to stdout: No space left on device (free some space, or write "
        "elsewhere)"
    ),
}


@pytest.mark.parametrize("redirect", list(LINES))
@pytest.mark.parametrize("args", STDOUT_COMMANDS, ids=" ".join)
def test_every_command_says_when_stdout_cannot_be_written(
    qb2: Path, runtime: Path, args: list[str], redirect: str
) -> None:
    """One line, exit 74 (a command that failed keeps its code), never a traceback or a 0
    (users' shells do not set PYTHONUNBUFFERED: block-buffered output fails at the end)."""
    res = run_redirected([a.replace("{ROOT}", str(qb2)) for a in args], redirect)
    lines = ttmesh_lines(res.stderr)
    expected = 2 if "/nonexistent" in args else 74
    assert res.returncode == expected, res.stderr
    assert lines[-1] == LINES[redirect], res.stderr
    assert sum("cannot write" in ln for ln in lines) == 1, res.stderr


@pytest.mark.parametrize("redirect", list(LINES))
@pytest.mark.parametrize("args", [["ls", "--root", "{ROOT}"], ["ps", "--all", "--json"],
                                  ["--help"]], ids=" ".join)  # fmt: skip
def test_unbuffered_stdout_that_cannot_be_written(
    qb2: Path, runtime: Path, args: list[str], redirect: str
) -> None:
    """With PYTHONUNBUFFERED (this machine's shells) the first write fails, mid-command."""
    res = run_redirected([a.replace("{ROOT}", str(qb2)) for a in args], redirect, True)
    assert res.returncode == 74, res.stderr
    assert ttmesh_lines(res.stderr) == [LINES[redirect]]


@pytest.mark.parametrize("unbuffered", [False, True])
@pytest.mark.parametrize(
    "args", [["ls", "--root", "{ROOT}"], ["ls", "--root", "{ROOT}", "--json"], ["--help"]],
    ids=" ".join,
)  # fmt: skip
def test_a_reader_that_went_away_is_a_quiet_end(
    qb2: Path, args: list[str], unbuffered: bool
) -> None:
    """``ttmesh ls | head -0``: as a Unix tool killed by SIGPIPE, quietly, exit 141."""
    r, w = os.pipe()
    os.close(r)  # the reader is gone before ttmesh writes
    try:
        proc = subprocess.run(
            [*PY, *(a.replace("{ROOT}", str(qb2)) for a in args)], stdout=w,
            stderr=subprocess.PIPE, text=True, timeout=60, env=_env(unbuffered),
        )  # fmt: skip
    finally:
        os.close(w)
    assert proc.returncode == 141, proc.stderr
    assert ttmesh_lines(proc.stderr) == []


@pytest.mark.parametrize("redirect", ["2>&-", "2>/dev/full"])
def test_stderr_that_cannot_be_written(qb2: Path, tmp_path: Path, redirect: str) -> None:
    """The notice (or an error) on stderr cannot be written: the listing still arrives, and
    the exit says something was lost (74); an error keeps its own code."""
    out = tmp_path / "out"
    res = run_redirected(["ls", "--root", str(qb2)], f">{out} {redirect}")
    assert res.returncode == 74
    assert "Ethernet links: 8 up" in out.read_text()
    res = run_redirected(["ls", "--root", str(tmp_path / "missing")], f">{out} {redirect}")
    assert res.returncode == 2


@pytest.mark.parametrize("redirect", list(LINES))
def test_a_jobs_output_that_cannot_be_written(qb2: Path, runtime: Path, redirect: str) -> None:
    """The ranks' console is lost: said once, the job goes on and ends with its own code."""
    code = "import sys; print('hello'); sys.stdout.flush(); sys.exit(3)"
    res = run_redirected(["launch", "--root", str(qb2), "--tp-size", "1", "--",
                          sys.executable, "-c", code], redirect)  # fmt: skip
    assert res.returncode == 3, res.stderr
    lines = ttmesh_lines(res.stderr)
    lost = [ln for ln in lines if "cannot write the ranks' output to stdout" in ln]
    assert len(lost) == 1 and "; ttmesh logs " in lost[0], res.stderr  # the job's own copy
    assert lost[0].endswith(" keeps every line)"), res.stderr
    assert not any("supervisor error" in ln for ln in lines), res.stderr
    assert lines[-1] == "ttmesh: exit 3: rank 0's exit code"


@pytest.mark.parametrize("redirect", ["2>&-", "2>/dev/full"])
def test_a_job_whose_messages_cannot_be_written_keeps_its_code(
    qb2: Path, runtime: Path, tmp_path: Path, redirect: str
) -> None:
    """Once the job runs, its code is ttmesh's: a notice lost on stderr does not turn a job
    that succeeded into a failure (nor a failed one into 74)."""
    out = tmp_path / "out"
    for code in (0, 3):
        job = f"import sys; print('hello'); sys.exit({code})"
        res = run_redirected(["launch", "--root", str(qb2), "--tp-size", "1", "--",
                              sys.executable, "-c", job], f">{out} {redirect}")  # fmt: skip
        assert res.returncode == code
        assert out.read_text() == "[r0] hello\n"


# --------------------------------------------------------------------------- output: files named

FULL = "/dev/full"
SUMMARY_LINE = (
    f"ttmesh: cannot write --summary-json {FULL}: No space left on device (free some space)"
)


@pytest.mark.skipif(not os.path.exists(FULL), reason="no /dev/full")
@pytest.mark.parametrize(
    ("command", "code"),
    [(["--tp-size", "1", *worker("exit=0")], 2), (["--tp-size", "1", *worker("exit=5")], 5),
     (["--tp-size", "99", *worker("exit=0")], 2)],
    ids=["succeeded", "failed", "refused"],
)  # fmt: skip
def test_a_summary_that_cannot_be_written_is_said(
    qb2: Path, runtime: Path, command: list[str], code: int
) -> None:
    """A job that failed keeps the worker's code; one that succeeded ends 2 (a script must
    not take 0 with no summary); a refusal keeps its code. Always one line naming the file."""
    res = run_cli("launch", "--root", str(qb2), "--summary-json", FULL, *command)
    assert res.code == code, res.err
    lines = ttmesh_lines(res.err)
    assert lines.count(SUMMARY_LINE) == 1, res.err
    if code == 5:
        assert lines[-1] == "ttmesh: exit 5: rank 0's exit code"


@pytest.mark.skipif(not os.path.exists(FULL), reason="no /dev/full")
def test_a_rank_binding_export_that_cannot_be_written(qb2: Path, tmp_path: Path) -> None:
    res = run_cli("descriptor", "--root", str(qb2), "--mesh-layout", "mesh", "-o",
                  str(tmp_path / "out"), "--export-rank-binding", FULL)  # fmt: skip
    assert res.code == 2
    assert one_line(res.err) == (
        f"ttmesh: cannot write --export-rank-binding {FULL}: No space left on device "
        "(free some space)"
    )


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_capture_never_replaces_a_device_or_fifo(qb2: Path, tmp_path: Path, kind: str) -> None:
    """``doctor --capture /dev/null --force`` as root replaced /dev/null with an archive."""
    target = tmp_path / kind
    if kind == "fifo":
        os.mkfifo(target)
    else:
        if os.geteuid() != 0:
            pytest.skip("mknod needs root")
        os.mknod(target, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a /dev/null of our own
    for force in ([], ["--force"]):
        res = run_cli("doctor", "--root", str(qb2), "--capture", str(target), *force)
        assert res.code == 2, res.err
        what = "a FIFO" if kind == "fifo" else "a character device"
        assert one_line(res.err) == (
            f"ttmesh: --capture {target} is {what}, not a file (give a new file name)"
        )
        mode = os.lstat(target).st_mode
        assert stat.S_ISFIFO(mode) if kind == "fifo" else stat.S_ISCHR(mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == [kind]  # no temporary file left


# --------------------------------------------------------------------------- the smaller ones


@pytest.mark.parametrize("job", ["-x", "-rf", "-"])
def test_a_job_id_starting_with_a_dash_is_refused(qb2: Path, runtime: Path, job: str) -> None:
    """``--job-id -x`` was accepted, then ``ttmesh stop -x`` read it as an option."""
    res = run_cli("launch", "--root", str(qb2), "--tp-size", "1", f"--job-id={job}",
                  *worker("exit=0"))  # fmt: skip
    assert res.code == 2
    assert one_line(res.err).startswith(f"ttmesh: --job-id {job!r}: not a valid name")
    assert not (runtime / "ttmesh" / "runs" / job).exists()
    res = run_cli("stop", "--", job)
    assert res.code == 2
    assert one_line(res.err).startswith(f"ttmesh: JOB {job!r}: not a valid name")


def test_ps_rows_fit_the_width(qb2: Path, runtime: Path) -> None:
    """One long command (or state) made every row of ``ps --all`` 600 columns wide: a row
    fits (160 columns in a pipe, COLUMNS when set) with an ellipsis; --json keeps it whole."""
    long = "a" * 600
    res = run_cli("launch", "--root", str(qb2), "--tp-size", "1", "--job-id", "longjob",
                  "--", sys.executable, "-c", "pass", long)  # fmt: skip
    assert res.code == 0, res.err
    for columns, width in ((None, 160), ("100", 100)):
        env = env_without("COLUMNS")
        if columns:
            env["COLUMNS"] = columns
        proc = subprocess.run([*PY, "ps", "--all"], capture_output=True, text=True, env=env)
        assert proc.returncode == 0, proc.stderr
        rows = proc.stdout.splitlines()
        assert max(len(r) for r in rows) <= width, proc.stdout
        row = next(r for r in rows if r.startswith("longjob "))
        assert row.endswith("…"), row
        assert " every rank succeeded " in row and "0000:" in row  # never cut (issue 37)
        assert "quietbox2 " in row  # a long root loses its start, never its last names
    jobs = json.loads(run_cli("ps", "--all", "--json").out)["jobs"]
    assert next(j for j in jobs if j["job"] == "longjob")["command"][-1] == long


def test_one_chip_is_one_chip(make_sim, tmp_path: Path) -> None:
    """ "1 chips": every count goes through render.plural."""
    res = run_cli("sim", "create", "--system", "n150", "--root", str(tmp_path / "n150"))
    assert res.code == 0, res.err
    assert "(1 chip) at" in res.out
    root = make_sim("n150")
    res = run_cli("launch", "--root", str(root), "--tp-size", "2", "--dry-run", "true")
    assert res.code == 2
    assert one_line(res.err).startswith("ttmesh: tp-size 2: this host has 1 chip (")


def test_no_message_says_s_in_parentheses() -> None:
    """No "chip(s)", "link(s)", "process(es)", "entr(ies)" in what ttmesh prints: counts agree
    with their noun (render.plural, render.noun)."""
    found = []
    for path in sorted((REPO / "ttmesh").rglob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"""["'][^"']*[a-z]\((e?s|ies)\)""", line):
                found.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert not found, "\n".join(found)
