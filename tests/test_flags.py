"""A server's command read as its own parser reads it (issue 20): every profile's full flag table
(ttmesh/configs/profiles/*.flags.json, scripts/gen_flags.py) and argparse built from it. Last
wins, ``--flag=value``, ``nargs``, prefixes and ``--no-...`` as the server has them; a command the
server's parser refuses is refused with its own complaint before anything starts; a profile that
reads a flag its server does not have is refused when its table is loaded."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, run_cli
from test_serving import ENV, JAX, SEED_1CHIP, SGLANG, plan, refusal, seed

PROFILES = REPO / "ttmesh" / "configs" / "profiles"
STOCK = [*SGLANG, "--model-path", "m", "--device", "cpu"]


def lines_of(err: str) -> list[str]:
    return [ln for ln in err.strip().splitlines() if not ln.startswith("simulated host: ")]


# --------------------------------------------------------------------------- the cases


def test_a_repeated_flag_takes_its_last_value_as_the_server_does(qb2: Path) -> None:
    """``--chunked-prefill-size 64 ... --chunked-prefill-size 256``: SGLang's argparse takes 256,
    larger than the compiled 64, and the server stops on the first long prompt: refused. The
    other order is the valid command the server runs, and passes (with a note)."""
    line = refusal(qb2, "--", *SGLANG, *SEED_1CHIP, "--chunked-prefill-size", "256")
    assert "--chunked-prefill-size 256 is not the largest --tpu-compile-tokens (64)" in line, line
    assert "fix: --chunked-prefill-size 64" in line
    valid = [*seed(1, chunked_prefill_size="256"), "--chunked-prefill-size", "64"]
    data, err = plan(qb2, "--", *SGLANG, *valid)
    assert data["serving"]["findings"] == [], err
    assert "--chunked-prefill-size is given 2 times (--chunked-prefill-size 256, " in err
    assert "--chunked-prefill-size 64): the server takes the last" in err


def test_tp_size_given_twice_plans_the_chips_of_the_last(qb2: Path) -> None:
    """``--tp-size 4 ... --tp-size 1`` is a one-chip server: one chip, passed to it with its
    descriptor, not the whole host; the reverse is the whole host."""
    data, _ = plan(qb2, "--", *SGLANG, *seed(4), "--tp-size", "1")
    (rank,) = data["ranks"]
    assert len(rank["chips"]) == 1 and rank["env"]["TT_VISIBLE_DEVICES"] == rank["bdfs"][0]
    assert data["mesh_shape"] == [1, 1] and "mesh" in data["descriptors"]
    data, _ = plan(qb2, "--", *SGLANG, *seed(1), "--tp-size", "4")
    (rank,) = data["ranks"]
    assert len(rank["chips"]) == 4 and "TT_VISIBLE_DEVICES" not in rank["env"]
    # ttmesh's own --tp-size is compared with the value the server takes.
    data, _ = plan(qb2, "--tp-size", "1", "--", *SGLANG, *seed(4), "--tp-size", "1")
    assert len(data["ranks"][0]["chips"]) == 1
    line = refusal(qb2, "--tp-size", "4", "--", *SGLANG, *seed(4), "--tp-size", "1")
    assert "ttmesh's --tp-size 4 and the server's --tp-size 1 differ" in line


def test_an_unambiguous_prefix_reads_as_the_flag_it_abbreviates(qb2: Path) -> None:
    data, _ = plan(qb2, "--", *STOCK, "--tp", "2")  # stock SGLang: --tp is only --tp-size
    assert data["serving"]["profile"] == "sglang" and data["serving"]["tp_size"] == 2
    line = refusal(qb2, "--", *SGLANG, *seed(1, chunked_prefill_size=None), "--chunked-pre", "256")
    assert "--chunked-prefill-size 256 is not the largest --tpu-compile-tokens (64)" in line
    data, _ = plan(qb2, "--", *STOCK, "--dev", "tpu")  # --dev is --device: SGLang-TorchTPU
    assert data["serving"]["profile"] == "sglang-torchtpu"


def test_an_ambiguous_prefix_is_refused_with_the_servers_complaint(qb2: Path) -> None:
    """Whether a prefix is ambiguous depends on the whole flag set: ``--tp`` is ``--tp-size``
    to stock SGLang, and ambiguous once SGLang-TorchTPU adds ``--tpu-compile-bs``."""
    line = refusal(qb2, "--", *SGLANG, *seed(1), "--tp", "2")
    assert line == (
        "ttmesh: sglang-torchtpu: the server refuses its command: sglang serve: error: ambiguous "
        "option: --tp could match --tp-size, --tpu-compile-bs, --tpu-compile-tokens (fix its "
        "flags; ttmesh reads them with the flag table of SGLang 0.5.23 + SGLang-TorchTPU (the "
        "tpu_oot plugin), as its parser does; --profile none runs the command unread)"
    ), line
    line = refusal(qb2, "--", *STOCK, "--t", "2")
    assert "sglang serve: error: ambiguous option: --t could match --tokenizer-path," in line


def test_flag_equals_value_as_the_server_reads_it(qb2: Path) -> None:
    """``--flag=value`` gives one word to the flag, however many it takes: the next word is no
    longer its (argparse). ``--tp-size=`` is an empty value the server's int() refuses."""
    argv = seed(1, tpu_compile_tokens=None)
    line = refusal(qb2, "--", *SGLANG, *argv, "--tpu-compile-tokens=64", "256")
    assert "sglang serve: error: unrecognized arguments: 256" in line, line
    line = refusal(qb2, "--", *STOCK, "--tp-size=")
    assert "argument --tp-size/--tensor-parallel-size: invalid int value: ''" in line, line
    data, _ = plan(qb2, "--", *STOCK, "--tp-size=2", "--port=31001")
    assert data["serving"]["tp_size"] == 2 and data["serving"]["url"].endswith(":31001")


def test_nargs_as_the_server_has_them(qb2: Path) -> None:
    """A flag that takes no value leaves the next word unread (``--enable-torch-compile 256``),
    one that takes one value takes one: the server refuses what is left over."""
    argv = seed(1, tpu_compile_tokens=None, enable_torch_compile=None)
    line = refusal(qb2, "--", *SGLANG, *argv, "--tpu-compile-tokens", "64",
                   "--enable-torch-compile", "256")  # fmt: skip
    assert "unrecognized arguments: 256" in line, line
    line = refusal(qb2, "--", *SGLANG, *seed(1, chunked_prefill_size="64 128"))
    assert "unrecognized arguments: 128" in line, line
    data, _ = plan(qb2, "--", *SGLANG, *seed(1, tpu_compile_tokens="64 256",
                                             chunked_prefill_size="256"))  # fmt: skip
    assert data["serving"]["findings"] == []


def _profile(tmp_path: Path, body: str) -> dict[str, str]:
    """A user profile (TTMESH_PROFILES) for stock SGLang, reading SGLang's stock table."""
    directory = tmp_path / "profiles"
    directory.mkdir(exist_ok=True)
    (directory / "mine.yaml").write_text(
        "name: mine\ntitle: a profile of my own\nrecognise: {program: sglang.launch_server}\n"
        "priority: 100\nchips: none\nflags: sglang\nready: {http: /health}\n" + body
    )
    return {**ENV, "TTMESH_PROFILES": str(directory)}


TF32_RULE = """rules:
  - id: tf32
    severity: warning
    when: [{flag: --enable-tf32-matmul}]
    check: {flag: --device, in: [cuda]}
    message: TF32 matmuls are for GPUs
"""


def test_no_forms_as_the_server_has_them(qb2: Path, tmp_path: Path) -> None:
    """``--x``/``--no-x`` (BooleanOptionalAction): the spelling that comes last decides, a
    prefix of ``--no-x`` is ``--no-x``; a ``--no-`` form the server does not have is refused."""
    env = _profile(tmp_path, TF32_RULE)
    for argv, warned in (
        (["--enable-tf32-matmul"], True),
        (["--enable-tf32-matmul", "--no-enable-tf32-matmul"], False),
        (["--no-enable-tf32-matmul", "--enable-tf32-matmul"], True),
        (["--enable-tf32-matmul", "--no-enable-tf32"], False),
    ):
        data, err = plan(qb2, "--", *STOCK, *argv, env=env)
        assert bool(data["serving"]["findings"]) == warned, (argv, err)
    line = refusal(qb2, "--", *SGLANG, *seed(1), "--no-enable-torch-compile")
    assert "unrecognized arguments: --no-enable-torch-compile" in line, line


def test_the_servers_complaint_is_one_line_with_the_users_words_escaped(qb2: Path) -> None:
    """The server's parser quotes the words it refuses: a word with a newline (a second line
    that could pose as ttmesh's) or a terminal escape is said on one line, escaped."""
    res = run_cli("launch", "--root", str(qb2), "--dry-run", "--", *SGLANG, *seed(1),
                  "--no-such\nttmesh: all good\x1b]0;owned\x07", env=ENV)  # fmt: skip
    assert res.code == 2, res.err
    (line,) = lines_of(res.err)
    assert line.startswith(
        "ttmesh: sglang-torchtpu: the server refuses its command: sglang serve: error: "
        "unrecognized arguments: --no-such ttmesh: all good (fix its flags;"
    ), line
    assert "\x1b" not in res.err and "\x07" not in res.err, res.err


def test_a_command_the_server_refuses_is_refused_before_anything_starts(
    qb2: Path, tmp_path: Path
) -> None:
    """Not a dry run: the server (the stand-in reports it started) never runs, no job is left."""
    res = run_cli("launch", "--root", str(qb2), "--", *SGLANG, *seed(1), "--no-such-flag", "3",
                  env={**ENV, "FAKE_REPORT": str(tmp_path)})  # fmt: skip
    assert res.code == 2, res.err
    (line,) = lines_of(res.err)
    assert line.startswith(
        "ttmesh: sglang-torchtpu: the server refuses its command: sglang serve: error: "
        "unrecognized arguments: --no-such-flag 3 (fix its flags;"
    ), line
    assert not (tmp_path / "server.json").exists()
    jobs = json.loads(run_cli("ps", "--all", "--json").out)["jobs"]
    assert not [j for j in jobs if "--no-such-flag" in json.dumps(j["command"])]
    line = refusal(qb2, "--", *SGLANG, "--device", "tpu", "--tp-size", "2")
    assert "the following arguments are required: --model-path/--model" in line, line


def test_help_is_the_servers_and_checks_nothing(qb2: Path) -> None:
    """``-h``: the server prints its help and exits, reading no further: no rule applies."""
    data, err = plan(qb2, "--", *SGLANG, "--device", "tpu", "-h")
    assert data["serving"]["findings"] == [], err
    assert "the server prints its help and exits (-h/--help): no rule was checked" in err


def test_sglangs_config_file_is_read_as_the_server_merges_it(qb2: Path, tmp_path: Path) -> None:
    """``--config FILE``: SGLang puts the file's flags before the command's (the command wins);
    ``--config=FILE`` is stored and ignored by SGLang, so by ttmesh too."""
    (tmp_path / "two.yaml").write_text("tp-size: 2\ndevice: cpu\nenable-torch-compile: true\n")

    def chips(*argv: str) -> int:
        res = run_cli("launch", "--root", str(qb2), "--dry-run", "--json", "--", *SGLANG,
                      "--model-path", "m", *argv, env=ENV, cwd=tmp_path)  # fmt: skip
        assert res.code == 0, res.err
        data = json.loads(res.out)
        assert data["serving"]["profile"] == "sglang"
        return int(data["serving"]["tp_size"])  # stock SGLang: its own ranks, no chips

    assert chips("--config", "two.yaml") == 2
    assert chips("--config", "two.yaml", "--tp-size", "1") == 1
    assert chips("--tp-size", "3", "--config", "two.yaml") == 3
    assert chips("--device", "cpu", "--config=two.yaml") == 1
    (tmp_path / "bad.yaml").write_text("tp-size: [1, 2]\n")
    res = run_cli("launch", "--root", str(qb2), "--dry-run", "--", *SGLANG, "--model-path", "m",
                  "--config", "bad.yaml", env=ENV, cwd=tmp_path)  # fmt: skip
    assert res.code == 2 and "unrecognized arguments: 2" in res.err, res.err
    (tmp_path / "lora.yaml").write_text("lora-paths: [a]\n")
    res = run_cli("launch", "--root", str(qb2), "--dry-run", "--", *SGLANG, "--model-path", "m",
                  "--config", "lora.yaml", env=ENV, cwd=tmp_path)  # fmt: skip
    assert res.code == 2, res.err
    assert "Unsupported config option 'lora_paths' with action 'LoRAPathAction'" in res.err
    res = run_cli("launch", "--root", str(qb2), "--dry-run", "--", *SGLANG, "--model-path", "m",
                  "--config", "nope.yaml", env=ENV, cwd=tmp_path)  # fmt: skip
    assert res.code == 2 and "--config: Config file not found: nope.yaml" in res.err, res.err


def test_dry_run_shows_what_was_read(qb2: Path) -> None:
    argv = [*seed(4), "--tp-size", "1", "--no-enable-tf32-matmul"]
    data, _ = plan(qb2, "--", *SGLANG, *argv)
    flags = data["serving"]["flags"]
    assert flags["parser"] == "SGLang 0.5.23 + SGLang-TorchTPU (the tpu_oot plugin)"
    read = {r["dest"]: r for r in flags["read"]}
    assert read["tp_size"]["value"] == 1
    assert read["tp_size"]["given"] == ["--tp-size 4", "--tp-size 1"]
    assert read["tpu_compile_bs"]["value"] == [1, 4]
    assert read["enable_tf32_matmul"]["option"] == "--no-enable-tf32-matmul"
    assert read["enable_tf32_matmul"]["value"] is False
    res = run_cli("launch", "--root", str(qb2), "--dry-run", "--", *SGLANG, *argv, env=ENV)
    assert res.code == 0, res.err
    text = res.out.splitlines()
    assert "    --tp-size 1 (given 2 times: --tp-size 4, --tp-size 1)" in text, res.out
    assert "    --no-enable-tf32-matmul" in text and "    --tpu-compile-bs 1 4" in text


@pytest.fixture
def fake_vllm(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "vllm").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "vllm").chmod(0o755)
    import os

    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


def test_vllm_is_read_as_its_flexible_parser_spells_flags(
    qb2: Path, fake_vllm: dict[str, str]
) -> None:
    """vLLM takes ``--tensor_parallel_size`` for ``--tensor-parallel-size``; its table is partial
    (docs/serving.md), so a flag it does not list is passed on unread, never refused."""
    for flag in ("--tensor_parallel_size", "-tp", "--tensor-parallel-size=4"):
        argv = [flag] if "=" in flag else [flag, "4"]
        line = refusal(qb2, "--", "vllm", "serve", "m", *argv, env=fake_vllm)
        assert "--tensor-parallel-size 4: the Tenstorrent plugin asserts 1" in line, line
    data, _ = plan(qb2, "--", "vllm", "serve", "m", "--max-model-len", "8192", env=fake_vllm)
    assert data["serving"]["flags"]["unread"] == ["--max-model-len", "8192"]
    assert data["serving"]["findings"] == []


def test_sglang_jax_reads_its_own_table(qb2: Path) -> None:
    """SGLang-JAX spells its chip count --tensor-parallel-size (with --tp-size an alias)."""
    data, _ = plan(qb2, "--", *JAX, "--model-path", "m", "--tensor-parallel-size", "2")
    assert len(data["ranks"][0]["chips"]) == 2
    line = refusal(qb2, "--", *JAX, "--model-path", "m", "--tp-size", "1", "--speculative-algorithm",
                   "dflash")  # fmt: skip
    assert "argument --speculative-algorithm: invalid choice: 'dflash'" in line, line


# --------------------------------------------------------------------------- profiles and tables


def test_every_flag_a_stock_profile_reads_is_in_its_table() -> None:
    """A profile never guesses what its server read: every flag a rule, the chip count, the
    address, the memory budget or the recognition reads is the server's (a number where it is
    compared as one). This fails when a rule names a flag its table lacks."""
    from ttmesh.launcher.serving import profiles

    stock = [p for p in profiles.every() if Path(p.path).parent == PROFILES]
    assert {p.name for p in stock} == {"sglang", "sglang-torchtpu", "sglang-jax", "vllm-tt"}
    for profile in stock:
        table = profile.table()
        reads = profile.reads()
        assert reads, profile.name
        for _who, option, numeric in reads:
            flag = table.flag(option)
            assert flag is not None, (profile.name, option)
            assert flag.numeric or not numeric, (profile.name, option)
        assert Path(profile.flags).name == f"{profile.name}.flags.json"


def test_a_profile_reading_a_flag_its_server_lacks_is_refused(qb2: Path, tmp_path: Path) -> None:
    rule = """rules:
  - id: plugin-flag
    severity: warning
    when: [{flag: --tpu-compile-bs}]
    check: {flag: --device, in: [tpu]}
    message: "{--tpu-compile-bs}"
"""
    line = refusal(qb2, "--", *STOCK, env=_profile(tmp_path, rule))
    assert (
        "mine.yaml: rule plugin-flag reads --tpu-compile-bs, which SGLang 0.5.23's parser "
        "has no flag for (the profile names a flag its server does not have"
    ) in line, line
    numeric = """rules:
  - id: device-number
    severity: warning
    check: {compare: [--device, ">", 1]}
    message: "?"
"""
    line = refusal(qb2, "--", *STOCK, env=_profile(tmp_path, numeric))
    assert (
        "rule device-number reads --device as a number, but SGLang 0.5.23's parser reads it as str"
        in line
    ), line
    (tmp_path / "profiles" / "mine.yaml").write_text(
        (tmp_path / "profiles" / "mine.yaml").read_text().replace("flags: sglang\n", "")
    )
    env = {**ENV, "TTMESH_PROFILES": str(tmp_path / "profiles")}
    line = refusal(qb2, "--", *STOCK, env=env)
    assert "mine.flags.json does not exist" in line, line


def _table(tmp_path: Path, flags: list[dict], **parser: object) -> Path:
    path = tmp_path / "t.flags.json"
    path.write_text(json.dumps({
        "schema": "ttmesh.flags/1", "server": "test", "flags": flags,
        "parser": {"prog": "srv", "allow_abbrev": True, "add_help": True, "prefix_chars": "-",
                   **parser},
    }))  # fmt: skip
    return path


KINDS = [
    {"options": ["-h", "--help"], "dest": "help", "kind": "help"},
    {"options": ["--size", "-s"], "dest": "size", "kind": "store", "nargs": None, "type": "int"},
    {"options": ["--sizes"], "dest": "sizes", "kind": "store", "nargs": "+", "type": "int"},
    {"options": ["--maybe"], "dest": "maybe", "kind": "store", "nargs": "?", "const": "C"},
    {"options": ["--pair"], "dest": "pair", "kind": "store", "nargs": 2},
    {"options": ["--add"], "dest": "add", "kind": "append", "nargs": None},
    {"options": ["--more"], "dest": "more", "kind": "extend", "nargs": "+"},
    {"options": ["-v", "--verbose"], "dest": "verbose", "kind": "count"},
    {"options": ["--on"], "dest": "on", "kind": "store_true"},
    {"options": ["--no-cache"], "dest": "cache", "kind": "store_false"},
    {"options": ["--fast", "--no-fast"], "dest": "fast", "kind": "boolean_optional"},
    {"options": ["--mode"], "dest": "mode", "kind": "store", "nargs": None, "choices": ["a", "b"]},
    {"options": ["--k"], "dest": "k", "kind": "store_const", "const": 7},
    {"options": ["--tokens"], "dest": "tokens", "kind": "store", "nargs": None,
     "type": "human_readable_int"},
]  # fmt: skip


def _real_parser() -> argparse.ArgumentParser:
    """The same flags declared to argparse itself."""
    p = argparse.ArgumentParser(prog="srv")
    p.add_argument("--size", "-s", type=int)
    p.add_argument("--sizes", nargs="+", type=int)
    p.add_argument("--maybe", nargs="?", const="C")
    p.add_argument("--pair", nargs=2)
    p.add_argument("--add", action="append")
    p.add_argument("--more", action="extend", nargs="+")
    p.add_argument("-v", "--verbose", action="count")
    p.add_argument("--on", action="store_true")
    p.add_argument("--no-cache", dest="cache", action="store_false")
    p.add_argument("--fast", action=argparse.BooleanOptionalAction)
    p.add_argument("--mode", choices=["a", "b"])
    p.add_argument("--k", action="store_const", const=7)
    from ttmesh.launcher.serving.flags import human_readable_int

    p.add_argument("--tokens", type=human_readable_int)
    return p


SAMPLES = [
    ["--size", "4", "--size", "1"], ["--si", "2"], ["--s", "2"], ["-s", "3"], ["-s3"],
    ["--size=5"], ["--size="], ["--size", "nan"], ["--size", "1_0"], ["--size", " 7 "],
    ["--sizes", "1", "2", "--size", "3"], ["--sizes"], ["--sizes=1", "2"], ["--maybe"],
    ["--maybe", "x"], ["--maybe", "--on"], ["--pair", "a", "b"], ["--pair", "a"],
    ["--add", "a", "--add", "b"], ["--more", "a", "b", "--more", "c"], ["-vv", "--verbose"],
    ["--on", "--on"], ["--on=1"], ["--no-cache"], ["--fast", "--no-fast"], ["--no-fast", "--fast"],
    ["--no-f"], ["--fa"], ["--f"], ["--mode", "c"], ["--mode", "b"], ["--k"], ["--tokens", "2k"],
    ["--tokens", "1.5Ki"], ["--tokens", "4Mi"], ["--", "--size", "1"], ["pos"],
    ["--size", "1", "pos"], ["--bogus"], ["--size", "-1"], ["--size", "--on"], ["-x"],
    ["--on", "-h"], ["--size", "x", "-h"],
]  # fmt: skip


@pytest.mark.parametrize("argv", SAMPLES, ids=[" ".join(s) or "-" for s in SAMPLES])
def test_a_table_reads_as_argparse_itself(tmp_path: Path, argv: list[str]) -> None:
    """Every action kind a table holds, against argparse with the same declarations: the same
    values, the same complaint word for word, the same help."""
    import contextlib
    import io

    from ttmesh.launcher.serving import flags

    table = flags.load(_table(tmp_path, KINDS))
    real = _real_parser()
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            want = vars(real.parse_args(argv))
    except SystemExit as exc:
        want = (
            {"help": True} if exc.code == 0 else {"error": err.getvalue().strip().splitlines()[-1]}
        )
    try:
        parsed = table.parse(argv)
        got = {"help": True} if parsed.help else {}
        if not parsed.help:  # what was not given: argparse's defaults (ttmesh needs none)
            got = {a.dest: a.default for a in real._actions if a.dest != "help"}
            got.update({dest: r.value for dest, r in parsed.reads.items()})
    except flags.ParseError as exc:
        got = {"error": str(exc)}
    assert got == want


def test_gen_flags_check_notices_a_stale_table(tmp_path: Path) -> None:
    out = tmp_path / "profiles"
    out.mkdir()
    shutil.copy(PROFILES / "sglang-torchtpu.flags.json", out)
    check = [sys.executable, str(REPO / "scripts" / "gen_flags.py"), "--check", "sglang-torchtpu",
             "--out", str(out)]  # fmt: skip
    proc = subprocess.run(check, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    stale = (out / "sglang-torchtpu.flags.json").read_text().replace('"nargs": "+"', '"nargs": 1')
    (out / "sglang-torchtpu.flags.json").write_text(stale)
    proc = subprocess.run(check, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.strip() == "out of date: sglang-torchtpu (run scripts/gen_flags.py)"


def test_a_malformed_table_is_one_line(qb2: Path, tmp_path: Path) -> None:
    env = _profile(tmp_path, "")
    text = (tmp_path / "profiles" / "mine.yaml").read_text()
    (tmp_path / "profiles" / "mine.yaml").write_text(text.replace("flags: sglang", "flags: t.json"))
    (tmp_path / "profiles" / "t.json").write_text('{"schema": "ttmesh.flags/1", "flags": [{}]}')
    res = run_cli("launch", "--root", str(qb2), "--dry-run", "--", *STOCK, env=env)
    assert res.code == 2 and "Traceback" not in res.err, res.err
    (line,) = lines_of(res.err)
    assert "t.json: malformed ('kind')" in line, line
    twice = {"options": ["--x"], "dest": "x", "kind": "store_true"}
    host = {"options": ["--host"], "dest": "host", "kind": "store", "nargs": None}
    port = {"options": ["--port"], "dest": "port", "kind": "store", "nargs": None, "type": "int"}
    table = _table(tmp_path / "profiles", [host, port, twice, twice])
    table.rename(tmp_path / "profiles" / "t.json")
    res = run_cli("launch", "--root", str(qb2), "--dry-run", "--", *STOCK, env=env)
    assert res.code == 2 and "Traceback" not in res.err, res.err
    (line,) = lines_of(res.err)
    assert "t.json: malformed (argument --x: conflicting option string: --x)" in line, line
