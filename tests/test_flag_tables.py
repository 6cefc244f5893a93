"""The stock flag tables against the real SGLang 0.5.23 (the rig scripts/sglang-cpu builds): for
every flag a profile's rules, chip count, address or memory budget reads, SGLang's own parser
and ttmesh's table read a set of command lines to the same values and the same complaints; and
each stored table is what scripts/gen_flags.py makes from the rig now. A change in SGLang (or in
a table, or in a rule) that makes them differ fails here, in ``.ci/run``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

pytestmark = pytest.mark.sglang
PROFILES = REPO / "ttmesh" / "configs" / "profiles"

# Run by the rig's Python: SGLang's parser as prepare_server_args builds it, each sample read as
# the server reads it (--config merged by SGLang's own merger), values of the destinations asked
# or the complaint's last line.
REAL = r"""
import argparse, contextlib, io, json, sys
from sglang.srt.server_args import ServerArgs
from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger

job = json.load(sys.stdin)
out = []
parser = argparse.ArgumentParser(prog="sglang serve")
ServerArgs.add_cli_args(parser)  # once: parsing changes no parser (building one is 25 ms)
for argv in job["samples"]:
    err = io.StringIO()
    try:
        if "--config" in argv:
            argv = ConfigArgumentMerger(parser).merge_config_with_args(argv)
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            ns = vars(parser.parse_args(argv))
        out.append({"values": {d: ns.get(d) for d in job["dests"]}})
    except SystemExit as exc:
        out.append({"help": True} if exc.code == 0 else {"error": err.getvalue().strip().splitlines()[-1]})
    except ValueError as exc:
        out.append({"config_error": str(exc)})
print(json.dumps(out, default=repr))
"""


@pytest.fixture(scope="session")
def rig() -> Path:
    path = Path(os.environ.get("TTMESH_SGLANG_DIR") or Path.home() / ".cache" / "ttmesh-sglang")
    if not (path / ".complete").exists():
        proc = subprocess.run(
            ["bash", str(REPO / "scripts" / "sglang-cpu" / "setup"), str(path)],
            capture_output=True, text=True, timeout=1800,
        )  # fmt: skip
        if proc.returncode != 0:
            pytest.skip(f"SGLang could not be built here: {proc.stderr.strip()[-300:]}")
    return path


def _read_flags() -> list[str]:
    """Every flag the stock SGLang profiles read (the TorchTPU plugin's own flags aside: stock
    SGLang has none of them)."""
    from ttmesh.launcher.serving import profiles

    out: set[str] = set()
    for profile in profiles.every():
        if profile.name in ("sglang", "sglang-torchtpu"):
            out |= {flag for _who, flag, _n in profile.reads()}
    by_hand = json.loads((PROFILES / "sglang-torchtpu.flags.json").read_text())["by_hand"]
    return sorted(out - set(by_hand))


def _samples(table, options: list[str], cfg: Path) -> list[list[str]]:
    base = ["--model-path", "m"]
    values = {
        "int": ["4", "64", "1_0", " 8", "-1", "nan", "", "0x10", "2k", "4.0"],
        "human_readable_int": ["16384", "2k", "1.5k", "1Ki", "1.5Ki", "4M", "x", "nan", ""],
        "float": ["0.75", "1e-1", "nan", "inf", "", ".5", "1_0.5"],
    }
    out = [base, [], ["--model", "m", "-h"]]
    for option in options:
        flag = table.flag(option)
        words = values.get(flag.type or "str")
        if words is None:
            words = [*(map(str, flag.choices or ())), "BOGUS", "", "bfloat16", "tpu"]
        if flag.kind in ("store_true", "store_false", "boolean_optional"):
            out += [[*base, option], [*base, option, option], [*base, option, "1"],
                    [*base, f"{option}=1"], [*base, "--no-" + option[2:]]]  # fmt: skip
        else:
            for word in words:
                out += [[*base, option, word], [*base, f"{option}={word}"]]
            out += [
                [*base, option, words[0], option, words[1]],
                [*base, option, words[1], option, words[0]],
                [*base, option],
                [*base, option, words[0], words[1]],
                [*base, option, "--", words[0]],
                [option, words[0]],
            ]
        for cut in range(3, len(option)):  # every prefix: unambiguous, ambiguous, or none
            out.append([*base, option[:cut], *([] if flag.nargs == 0 else [words[0]])])
    # --config: the file's flags before the command's, merged as SGLang merges them
    out += [
        [*base, "--config", str(cfg)],
        [*base, "--config", str(cfg), "--tp-size", "1"],
        [*base, "--tp-size", "3", "--config", str(cfg)],
        [*base, f"--config={cfg}"],
        [*base, "--config", str(cfg.with_name("underscore.yaml"))],
    ]
    return out


def test_ttmesh_reads_every_flag_a_rule_reads_as_sglang_does(rig: Path, tmp_path: Path) -> None:
    from ttmesh.launcher.serving import flags

    table = flags.load(PROFILES / "sglang.flags.json")
    options = _read_flags()
    assert {"--tp-size", "--chunked-prefill-size", "--kv-cache-dtype", "--port"} <= set(options)
    cfg = tmp_path / "server.yaml"
    cfg.write_text("tp-size: 2\nchunked-prefill-size: 256\nenable-torch-compile: true\n"
                   "kv-cache-dtype: bf16\ntorch-compile-max-bs: 8\n")  # fmt: skip
    cfg.with_name("underscore.yaml").write_text("enable_torch_compile: true\n")
    samples = _samples(table, options, cfg)
    dests = sorted({table.flag(o).dest for o in options})
    proc = subprocess.run(
        [str(rig / "venv" / "bin" / "python"), "-c", REAL],
        input=json.dumps({"samples": samples, "dests": dests}),
        capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONWARNINGS": "ignore"},
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    real = json.loads(proc.stdout)
    defaults = {table.flag(o).dest: table.flag(o).default for o in options}
    differ = []
    for argv, want in zip(samples, real, strict=True):
        try:
            parsed = table.parse(argv, str(tmp_path))
            if parsed.help:
                got: dict = {"help": True}
            else:
                values = {d: defaults[d] for d in dests}
                values.update({d: r.value for d, r in parsed.reads.items() if d in values})
                got = {"values": json.loads(json.dumps(values, default=repr))}
        except flags.ParseError as exc:
            got = {"error": str(exc).strip()}  # as the real one's line is read
            if "config_error" in want:  # SGLang raises ValueError (a traceback): ttmesh refuses
                got = {"config_error": str(exc).split(": ", 1)[1]}
        if got != want:
            differ.append((argv, got, want))
    assert not differ, "\n".join(f"{a}:\n  ttmesh {g}\n  sglang {w}" for a, g, w in differ[:20])
    assert len(samples) > 300, len(samples)


def test_the_stored_tables_are_what_the_generator_makes_from_the_rig(rig: Path) -> None:
    """Regenerating is one command: python scripts/gen_flags.py (docs/serving.md)."""
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gen_flags.py"), "--check", "sglang",
         "sglang-torchtpu"],
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "TTMESH_SGLANG_DIR": str(rig)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
