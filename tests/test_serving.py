"""Serving stacks (issue 12) with the stand-in servers in tests/fakes: profiles, flag rules, the
environment and descriptors per profile, the memory budget, readiness, health, stop, recovery."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import REPO, alive, run_cli, start_launch, wait_for

from ttmesh import procs

FAKES = str(REPO / "tests" / "fakes")
# The user's shell sets PYTHONUNBUFFERED here, so the exact environments below are what
# ttmesh adds for a server (without it ttmesh adds PYTHONUNBUFFERED=1: test_torchrun_output).
ENV = {"PYTHONPATH": FAKES, "PYTHONUNBUFFERED": "1"}
# A known failure read after the end (the server exits on its own), not a line stopped live.
ETH_LINE = "ETH core heartbeat check failed for chip 1 core (x=1,y=25)"
C01, C03, C05, C07 = "0000:01:00.0", "0000:03:00.0", "0000:05:00.0", "0000:07:00.0"
SEED_1CHIP = [
    "--model-path", "Qwen/Qwen3-8B", "--host", "127.0.0.1", "--port", "31000",
    "--device", "tpu", "--tp-size", "1", "--dtype", "bfloat16", "--kv-cache-dtype", "bfloat16",
    "--mem-fraction-static", "0.75", "--max-total-tokens", "16384",
    "--enable-torch-compile", "--page-size", "64",
    "--context-length", "2048", "--chunked-prefill-size", "64",
    "--torch-compile-max-bs", "4", "--tpu-compile-bs", "1", "4", "--tpu-compile-tokens", "64",
    "--grammar-backend", "none",
]  # fmt: skip
SGLANG = [sys.executable, "-m", "sglang.launch_server"]
JAX = [sys.executable, "-m", "sgl_jax.launch_server"]
TPU_ENV = {
    "LIBTT_TPU_COMPAT": "1",
    "SGLANG_PLATFORM": "tpu_oot",
    "TORCH_TPU_INTERNAL_XLA_OPTIONS": "enable_trace=true",
    "LIBTT_SYMMETRIC_DRAM_MB": "2048",
}


def seed(tp: int, **changes: str | None) -> list[str]:
    """The seed's Qwen3-8B command with ``--tp-size tp`` and flags changed (None drops one)."""
    argv = list(SEED_1CHIP)
    argv[argv.index("--tp-size") + 1] = str(tp)
    for flag, value in changes.items():
        name = "--" + flag.replace("_", "-")
        if name in argv:
            i = argv.index(name)
            end = i + 1
            while end < len(argv) and not argv[end].startswith("--"):
                end += 1
            del argv[i:end]
        if value is not None:
            argv += [name, *value.split()]
    return argv


def plan(root: Path, *args: str, env: dict[str, str] | None = None) -> tuple[dict, str]:
    res = run_cli(
        "launch", "--root", str(root), "--dry-run", "--json", *args, env={**ENV, **(env or {})}
    )
    assert res.code == 0, res.err
    return json.loads(res.out), res.err


def refusal(root: Path, *args: str, env: dict[str, str] | None = None) -> str:
    res = run_cli("launch", "--root", str(root), "--dry-run", *args, env={**ENV, **(env or {})})
    assert res.code == 2, res.err + res.out
    assert "Traceback" not in res.err
    return res.err.strip().splitlines()[-1]


def chip_env(data: dict) -> dict[str, str]:
    env = data["ranks"][0]["env"]
    return {
        k: v for k, v in env.items() if not k.startswith(("TTMESH_", "TORCHELASTIC_", "TT_METAL_"))
    }


# --------------------------------------------------------------------------- profiles and plans


@pytest.mark.parametrize(
    ("command", "env", "profile"),
    [
        ([*SGLANG, "--model-path", "m", "--device", "tpu"], {}, "sglang-torchtpu"),
        (
            [*SGLANG, "--model-path", "m", "--device", "cpu"],
            {"SGLANG_PLATFORM": "tpu_oot"},
            "sglang-torchtpu",
        ),
        ([*SGLANG, "--model-path", "m", "--device", "cpu"], {}, "sglang"),
        ([*JAX, "--model-path", "m", "--device", "tt"], {}, "sglang-jax"),
    ],
)
def test_profile_is_recognised_from_the_command(
    qb2: Path, command: list[str], env: dict[str, str], profile: str
) -> None:
    data, _ = plan(qb2, "--", *command, env=env)
    assert data["serving"]["profile"] == profile
    assert len(data["ranks"]) == 1


def test_profile_none_runs_a_server_like_any_command(qb2: Path) -> None:
    data, _ = plan(qb2, "--tp-size", "2", "--profile", "none", "--", *SGLANG, "--device", "tpu")
    assert data["serving"] is None and len(data["ranks"]) == 2
    assert data["ranks"][1]["env"]["RANK"] == "1"


def test_seed_single_chip_command(qb2: Path) -> None:
    """One chip of a QuietBox 2: its PCI address and a one-chip descriptor, the TPU
    compatibility environment, no torchrun contract; the seed's flags pass every rule."""
    data, err = plan(qb2, "--", *SGLANG, *SEED_1CHIP)
    assert data["serving"]["findings"] == [] and "warning" not in err
    (rank,) = data["ranks"]
    assert rank["bdfs"] == [C01] and len(rank["chips"]) == 1
    assert rank["argv"] == [*SGLANG, *SEED_1CHIP]
    desc = rank["env"]["TT_MESH_GRAPH_DESC_PATH"]
    assert chip_env(data) == {**TPU_ENV, "TT_VISIBLE_DEVICES": C01, "TT_MESH_GRAPH_DESC_PATH": desc}
    assert data["descriptors"] == {"mesh": desc}
    assert data["mesh_shape"] == [1, 1]
    assert data["serving"]["url"] == "http://127.0.0.1:31000"
    assert data["serving"]["health"] == "http://127.0.0.1:31000/health"
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS"):
        assert key not in rank["env"]


def test_seed_four_chips_leaves_the_chips_to_libtt(qb2: Path) -> None:
    data, _err = plan(qb2, "--", *SGLANG, *seed(4))
    (rank,) = data["ranks"]
    assert sorted(rank["bdfs"]) == [C01, C03, C05, C07] and len(rank["chips"]) == 4
    assert chip_env(data) == TPU_ENV  # TT_VISIBLE_DEVICES and TT_MESH_GRAPH_DESC_PATH unset
    assert data["descriptors"] == {}
    assert any("left unset, libtt gives each" in n for n in data["serving"]["notes"])
    assert data["serving"]["findings"] == []


def test_a_part_of_the_host_is_passed_with_a_note(qb2: Path) -> None:
    data, err = plan(qb2, "--", *SGLANG, *seed(2))
    env = chip_env(data)
    assert (
        env["TT_VISIBLE_DEVICES"].split(",") == data["ranks"][0]["bdfs"]
        and len(data["ranks"][0]["bdfs"]) == 2
    )
    assert data["mesh_shape"] == [1, 2]
    assert any("relies on libtt honouring" in n for n in data["serving"]["notes"])
    assert "relies on libtt honouring" in err


def test_tp_size_is_read_from_the_servers_flag(qb2: Path) -> None:
    data, _ = plan(qb2, "--", *SGLANG, *seed(2))
    assert len(data["ranks"][0]["chips"]) == 2
    line = refusal(qb2, "--tp-size", "4", "--", *SGLANG, *seed(2))
    assert "ttmesh's --tp-size 4 and the server's --tp-size 2 differ" in line


def test_the_users_own_values_win_and_are_named(qb2: Path) -> None:
    options = "enable_trace=true xla_debug=1"
    data, err = plan(qb2, "--env", f"TORCH_TPU_INTERNAL_XLA_OPTIONS={options}", "--show-env",
                     "--", *SGLANG, *SEED_1CHIP)  # fmt: skip
    assert data["ranks"][0]["env"]["TORCH_TPU_INTERNAL_XLA_OPTIONS"] == options
    assert f"TORCH_TPU_INTERNAL_XLA_OPTIONS={options} from your environment" in err
    data, err = plan(qb2, "--", *SGLANG, *SEED_1CHIP, env={"SGLANG_PLATFORM": "tpu_oot"})
    assert "SGLANG_PLATFORM" not in data["ranks"][0]["env"]  # yours, inherited as is


def test_sglang_jax_and_stock_sglang_environments(qb2: Path) -> None:
    data, _ = plan(qb2, "--", *JAX, "--model-path", "m", "--tp-size", "1", "--device", "tt")
    env = chip_env(data)
    assert env == {"JAX_PLATFORMS": "tt", "LIBTT_SYMMETRIC_DRAM_MB": "2048", "TT_VISIBLE_DEVICES": C01,
                   "TT_MESH_GRAPH_DESC_PATH": env["TT_MESH_GRAPH_DESC_PATH"]}  # fmt: skip
    data, _ = plan(qb2, "--", *SGLANG, "--model-path", "m", "--device", "cpu", "--tp-size", "2")
    assert chip_env(data) == {}  # stock SGLang: readiness, stop and supervision only
    assert set(data["ranks"][0]["env"]) <= {"TTMESH_JOB_ID", "TTMESH_RANK", "TTMESH_READY_FILE",
                                            "TTMESH_FABRIC_FILE", "TTMESH_SIM_ROOT", "TTMESH_JOB_CHIPS"}  # fmt: skip


@pytest.fixture
def fake_vllm(tmp_path: Path) -> dict[str, str]:
    """A ``vllm`` on PATH (the command must exist; the plan is what is checked)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "vllm"
    tool.write_text("#!/bin/sh\nexit 0\n")
    tool.chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


@pytest.mark.parametrize(
    ("system", "args", "mesh_device", "chips"),
    [
        ("quietbox2", [], "P300x2", 4),
        ("p150x4", [], "P150x4", 4),
        ("t3k", [], "T3K", 8),
        ("n150", [], "N150", 1),
        ("quietbox2", ["--tp-size", "2"], "P300", 2),
        ("p150x8", ["--tp-size", "4", "--mesh-shape", "2x2"], "P150x4", 4),
        ("galaxy-wh", ["--tp-size", "4", "--mesh-shape", "2x2"], "(2,2)", 4),
    ],
)
def test_vllm_mesh_device(
    make_sim: Callable[..., Path], fake_vllm: dict[str, str], system: str, args: list[str],
    mesh_device: str, chips: int,
) -> None:  # fmt: skip
    root = make_sim(system)
    data, _ = plan(root, *args, "--", "vllm", "serve", "Qwen/Qwen3-8B", env=fake_vllm)
    env = chip_env(data)
    assert data["serving"]["profile"] == "vllm-tt"
    assert env["MESH_DEVICE"] == mesh_device
    assert env["TT_VISIBLE_DEVICES"].split(",") == data["ranks"][0]["bdfs"]
    assert len(data["ranks"][0]["chips"]) == chips and env["VLLM_RPC_TIMEOUT"] == "100000"


# --------------------------------------------------------------------------- rules


ERRORS = [
    (SGLANG, seed(1, chunked_prefill_size="256"), {}, "--chunked-prefill-size 256 is not the largest --tpu-compile-tokens (64)", "--chunked-prefill-size 64"),
    (SGLANG, seed(1, chunked_prefill_size=None), {}, "--chunked-prefill-size (not given) is not", "--chunked-prefill-size 64"),
    (SGLANG, seed(1), {"LIBTT_TPU_COMPAT": "0"}, "LIBTT_TPU_COMPAT is 0", "unset LIBTT_TPU_COMPAT"),
    (JAX, ["--model-path", "Qwen/Qwen3-30B-A3B", "--tp-size", "1", "--moe-backend", "fused"], {}, "needs at least two chips (it has 1)", "--tp-size 2"),
    (JAX, ["--model-path", "Qwen/Qwen3.8-Flash-Next", "--tp-size", "2", "--moe-backend", "fused"], {}, "needs four chips (it has 2)", "--tp-size 4"),
    (JAX, ["--model-path", "Qwen/Qwen3-30B-A3B", "--tp-size", "2"], {}, "mixture-of-experts model: its experts run on TTNN's fused MoE kernel", "--moe-backend fused"),
    (JAX, ["--model-path", "Qwen/Qwen3-8B", "--tp-size", "2", "--speculative-algorithm", "DFLASH", "--disable-overlap-schedule"], {}, "DFlash speculative decoding does not compile on more than one chip", "--tp-size 1"),
]  # fmt: skip
WARNINGS = [
    (SGLANG, seed(1, kv_cache_dtype=None), "--kv-cache-dtype fp8_e5m2: TTNN's paged attention reads BF16", "--kv-cache-dtype bfloat16"),
    (SGLANG, seed(1, kv_cache_dtype="fp8_e4m3"), "about 50x slower", "--kv-cache-dtype bfloat16"),
    (SGLANG, seed(1, max_running_requests="8"), "--max-running-requests 8 is above the largest --tpu-compile-bs (4)", "add 8 to --tpu-compile-bs"),
    (SGLANG, seed(1, torch_compile_max_bs="2"), "--torch-compile-max-bs 2 is below the largest --tpu-compile-bs (4)", "--torch-compile-max-bs 4"),
    (SGLANG, seed(1, grammar_backend=None), "--grammar-backend xgrammar: structured output is not tested", "--grammar-backend none"),
    (JAX, ["--model-path", "Qwen/Qwen3.5-9B", "--tp-size", "1", "--max-running-requests", "16"], "--max-recurrent-state-size (not given) is not --max-running-requests (16)", "--max-recurrent-state-size 16"),
    (JAX, ["--model-path", "Qwen/Qwen3-8B", "--tp-size", "1", "--speculative-algorithm", "DFLASH"], "DFlash runs with overlap scheduling only when", "--disable-overlap-schedule"),
]  # fmt: skip


@pytest.mark.parametrize(("program", "argv", "env", "message", "fix"), ERRORS)
def test_every_error_rule_refuses_before_anything_starts(
    qb2: Path, program: list[str], argv: list[str], env: dict[str, str], message: str, fix: str
) -> None:
    line = refusal(qb2, "--", *program, *argv, env=env)
    assert message in line and f"fix: {fix}" in line, line
    assert line.startswith("ttmesh: error: "), line  # an error says so, as a warning does


@pytest.mark.parametrize(("program", "argv", "message", "fix"), WARNINGS)
def test_every_warning_rule_warns_and_strict_refuses(
    qb2: Path, program: list[str], argv: list[str], message: str, fix: str
) -> None:
    data, err = plan(qb2, "--", *program, *argv)
    warned = [f for f in data["serving"]["findings"] if f["severity"] == "warning"]
    assert len(warned) == 1 and message in warned[0]["message"] and fix in warned[0]["fix"], warned
    assert re.search(rf"ttmesh: warning: .*{re.escape(message)}", err), err
    line = refusal(qb2, "--strict", "--", *program, *argv)
    assert message in line and "--strict makes warnings errors" in line


def test_vllm_tensor_parallel_is_refused(qb2: Path, fake_vllm: dict[str, str]) -> None:
    for flag in ("--tensor-parallel-size", "-tp"):
        line = refusal(qb2, "--", "vllm", "serve", "m", flag, "4", env=fake_vllm)
        assert "the Tenstorrent plugin asserts 1" in line


def test_every_rule_is_silent_on_the_seeds_commands(qb2: Path) -> None:
    for tp in (1, 2, 4):
        data, err = plan(qb2, "--", *SGLANG, *seed(tp))
        assert data["serving"]["findings"] == [] and "warning" not in err and "error" not in err


# --------------------------------------------------------------------------- memory budget


def _model(tmp_path: Path, name: str, **config: object) -> Path:
    path = tmp_path / name
    path.mkdir()
    base = {"num_hidden_layers": 36, "hidden_size": 4096, "intermediate_size": 12288,
            "vocab_size": 151936, "num_attention_heads": 32, "num_key_value_heads": 8,
            "head_dim": 128, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}  # fmt: skip
    (path / "config.json").write_text(json.dumps({**base, **config}))
    return path


def test_memory_budget_of_the_seeds_qwen3_8b(qb2: Path, tmp_path: Path) -> None:
    model = _model(tmp_path, "Qwen3-8B")
    data, _ = plan(qb2, "--", *SGLANG, *seed(1, model_path=str(model)))
    memory = data["serving"]["memory"]
    assert memory["parameters"] == 8_190_735_360  # 36 layers, hidden 4096, vocab 151936, ...
    assert 16.0 < memory["weights_gb"] < 16.5  # "about 16 GB of BF16"
    assert memory["weights_fit"] and memory["kv_fits"] and data["serving"]["findings"] == []
    kv = 36 * 8 * 128 * 2 * 2 * 16384 / 1e9  # layers x KV heads x head dim x (K,V) x BF16 x tokens
    assert abs(memory["kv_gb_per_chip"] - kv) < 0.01
    # Room for the weights, not for the KV cache --max-total-tokens asks: a warning, whose fix
    # is the fraction this job's chips need (0.61 of a 34.4 GB chip: 0.65).
    data, _err = plan(
        qb2, "--", *SGLANG, *seed(1, model_path=str(model), mem_fraction_static="0.6")
    )
    (finding,) = data["serving"]["findings"]
    assert finding["rule"] == "memory-kv" and finding["severity"] == "warning"
    assert "--mem-fraction-static 0.6 leaves no room for 2.42 GB of KV cache" in finding["message"]
    assert finding["fix"].startswith("--mem-fraction-static 0.65 (what 1 chip needs"), finding
    text = run_cli("launch", "--root", str(qb2), "--dry-run", "--", *SGLANG,
                   *seed(1, model_path=str(model)), env=ENV)  # fmt: skip
    assert "MEMORY (1 chip)" in text.out and "8.19 B parameters" in text.out


def test_weights_beyond_what_the_fraction_leaves_are_refused_with_this_jobs_fix(
    qb2: Path, tmp_path: Path
) -> None:
    """The weights (and the reservation) need more than --mem-fraction-static leaves per chip:
    the server would fail after minutes of loading, so it is refused (exit 2), as the docs say,
    with the fraction that fits this job's chips, not one chip's (issue 37)."""
    model = _model(tmp_path, "Qwen3-8B")
    four = refusal(qb2, "--", *SGLANG, *seed(4, model_path=str(model), mem_fraction_static="0.01"))
    assert four.startswith("ttmesh: error: sglang-torchtpu: the weights need 4.1 GB per chip"), four
    assert "--mem-fraction-static 0.01 leaves 0.3 GB per chip" in four
    assert "(fix: --mem-fraction-static 0.2 (what 4 chips need" in four and "one chip" not in four
    # The default 0.4 on one chip: 16.4 GB of weights, 13.7 GB left: refused too.
    one = refusal(qb2, "--", *SGLANG, *seed(1, model_path=str(model), mem_fraction_static=None))
    assert "--mem-fraction-static 0.4 leaves 13.7 GB per chip" in one
    assert "(fix: --mem-fraction-static 0.65 (what 1 chip needs" in one
    res = run_cli("launch", "--root", str(qb2), "--", *SGLANG,
                  *seed(4, model_path=str(model), mem_fraction_static="0.01"), env=ENV)  # fmt: skip
    assert res.code == 2 and "[r0]" not in res.out + res.err  # nothing started


def test_weights_that_do_not_fit_are_refused_and_split_over_chips(
    qb2: Path, tmp_path: Path
) -> None:
    model = _model(tmp_path, "Qwen3-32B", num_hidden_layers=64, hidden_size=5120,
                   intermediate_size=25600, num_attention_heads=64)  # fmt: skip
    line = refusal(qb2, "--", *SGLANG, *seed(1, model_path=str(model)))
    assert "the weights need" in line and "use more chips" in line
    data, _ = plan(qb2, "--", *SGLANG, *seed(4, model_path=str(model), mem_fraction_static="0.85"))
    memory = data["serving"]["memory"]
    assert memory["chips"] == 4 and memory["weights_fit"]
    assert abs(memory["weights_gb_per_chip"] * 4 - memory["weights_gb"]) < 0.01


def test_a_model_name_skips_the_budget_with_a_note(qb2: Path) -> None:
    data, _err = plan(qb2, "--", *SGLANG, *SEED_1CHIP)
    assert data["serving"]["memory"] is None
    assert "not a local directory (nothing is downloaded)" in data["serving"]["memory_note"]


def test_the_model_is_a_flag_or_an_entry_points_positional_never_a_script() -> None:
    from ttmesh.launcher.serving import args, rules

    def model(command: list[str]) -> str:
        return rules.Context(args.parse(command), {}, {}, 1).model()

    parsed = args.parse(["vllm", "serve", "meta-llama/Llama-3.1-8B", "--max-model-len", "8192"])
    assert (parsed.program, parsed.positionals) == ("vllm serve", ["meta-llama/Llama-3.1-8B"])
    script = args.parse(["python", "serve.py", "--tp-size", "2"])
    assert (script.program, script.positionals) == ("python serve.py", [])
    flagged = args.parse(["python", "-m", "sglang.launch_server", "--model-path", "/m/q"])
    assert flagged.value("--model-path") == "/m/q" and flagged.positionals == []
    assert model(["vllm", "serve", "meta-llama/Llama-3.1-8B"]) == "meta-llama/Llama-3.1-8B"
    assert model(["python", "serve.py", "--tp-size", "2"]) == ""
    assert model(["python", "-m", "sglang.launch_server", "--model-path", "/m/q"]) == "/m/q"


# --------------------------------------------------------------------------- running


def _serve(root: Path, tmp_path: Path, *extra: str, tp: int = 4, env: dict[str, str] | None = None,
           port: int | None = None) -> tuple[subprocess.Popen, int]:  # fmt: skip
    port = port or _free_port()
    argv = seed(tp, port=str(port))
    proc = start_launch(root, "--job-id", f"serve-{os.getpid()}-{port}", *extra, "--", *SGLANG, *argv,
                        env={**ENV, "FAKE_REPORT": str(tmp_path), **(env or {})})  # fmt: skip
    return proc, port


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tree(pid: int) -> list[int]:
    return [pid, *procs.descendants(pid)]


def _links(root: Path) -> set[str]:
    return {
        lk["state"] for lk in json.loads(run_cli("ls", "--root", str(root), "--json").out)["links"]
    }


def _wait_ready(proc: subprocess.Popen, lines: list[str]) -> str:
    """Read ttmesh's stderr until the server is ready; the URL it printed."""
    assert proc.stderr is not None
    for line in proc.stderr:
        lines.append(line)
        match = re.search(r"ready after [\d.:]+(?: s)? at (http://\S+)", line)
        if match:
            return match.group(1)
    raise AssertionError("never ready:\n" + "".join(lines))


def test_ready_generate_then_ctrl_c_leaves_nothing(qb2: Path, tmp_path: Path) -> None:
    # A proxy in the environment (as on many company hosts) that nothing answers at: ttmesh's
    # own probes of the server on loopback go direct, never through it.
    proxies = {k: "http://127.0.0.1:9" for k in ("http_proxy", "HTTP_PROXY", "all_proxy")}
    proc, port = _serve(qb2, tmp_path, env={**proxies, "no_proxy": "", "NO_PROXY": ""})
    lines: list[str] = []
    try:
        url = _wait_ready(proc, lines)
        assert url == f"http://127.0.0.1:{port}"
        # ttmesh ps shows the server's URL and state, as a fleet's replicas (issue 37).
        job = f"serve-{os.getpid()}-{port}"
        (mine,) = [j for j in json.loads(run_cli("ps", "--json").out)["jobs"] if j["job"] == job]
        assert mine["server"]["state"] == "serving" and mine["server"]["url"] == url
        assert mine["profile"] == "sglang-torchtpu" and len(mine["chips"]) == 4
        rows = run_cli("ps", env={"COLUMNS": "300"}).out.splitlines()
        (row,) = [r for r in rows if r.startswith(f"{job}/server ")]
        assert " serving " in row and url in row
        (main,) = [r for r in rows if r.startswith(f"{job} ")]
        assert "0000:01:00.0 +3" in main  # the chips: a count, the full list in ps JOB
        narrow = run_cli("ps", env={"COLUMNS": "80"}).out.splitlines()
        (row,) = [r for r in narrow if r.startswith(f"{job}/server ")]
        assert url in row  # an identity: the command is cut, never the URL
        curl = next(proc.stderr).strip()  # type: ignore[arg-type]
        assert curl.startswith(f"ttmesh: try: curl -sS {url}/generate ")
        body = json.dumps({"text": "The capital of the Netherlands is"}).encode()
        with urllib.request.urlopen(
            urllib.request.Request(f"{url}/generate", body), timeout=10
        ) as r:
            assert json.loads(r.read())["text"] == " Amsterdam."
        server = json.loads((tmp_path / "server.json").read_text())["pid"]
        tree = _tree(server)
        assert len(tree) == 5  # the server and one process per chip
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.communicate()
    assert proc.returncode == 130, "".join(lines) + err
    wait_for(lambda: not any(alive(p) for p in tree), timeout=5, what="the server's tree gone")
    assert "[r0] fake server: drained and stopped" in out  # its own drain, on SIGTERM
    # Its schedulers were SIGKILLed holding the chips: ttmesh checked and reset them, and says
    # so as the expected step of a stop the user asked for, not as a failure (issue 36).
    assert ("ttmesh: interrupted: stopping the server (SIGTERM: its own drain, up to 30 s; "
            "Ctrl-C again to kill at once)\n") in err, err  # fmt: skip
    assert re.search(r"^ttmesh: the server stopped as asked: SGLang kills its schedulers with "
                     r"SIGKILL when it stops, so they never close the chips; resetting them, as "
                     r"expected \(2 of 2 links between .* are down .*\)$", err, re.M), err  # fmt: skip
    assert "the job ended" not in err and "failed" not in err, err
    assert "chips recovered and verified" in err
    assert _links(qb2) == {"up"} and run_cli("check", "--root", str(qb2)).code == 0


def test_crash_after_ready_is_recovered_and_restarted(qb2: Path, tmp_path: Path) -> None:
    # Ready for 2 s before it crashes: ttmesh probes every 0.5 s (a window as long as that
    # could fall between two probes on a loaded machine).
    env = {"FAKE_MODE": "crash", "FAKE_FAIL_AFTER": "2", "FAKE_SAY": ETH_LINE}
    summary = tmp_path / "summary.json"
    proc, port = _serve(qb2, tmp_path, "--max-restarts", "1", "--summary-json", str(summary),
                        env=env)  # fmt: skip
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, err
    assert err.count("ready after") == 2  # restarted once, after recovery
    assert "ttmesh: the job ended (" in err and "as asked" not in err  # a failure reads as one
    assert "chips recovered and verified" in err
    assert "attempt 2: rank 0 exited with code 3" in err
    assert "fake server: crashing on purpose" in err
    assert _links(qb2) == {"up"}
    # What happened, with times, in --summary-json and the record (issue 37): the restart,
    # the resets (verified) and the known failure, whose fix asks no reset the job had
    # already done and verified (its last line said "chips recovered and verified").
    job = f"serve-{os.getpid()}-{port}"
    record = json.loads(run_cli("ps", job, "--json").out)["jobs"][0]
    for doc in (json.loads(summary.read_text()), record):
        (restart,) = doc["restarts"]
        first, second = doc["attempts"]
        assert restart["attempt"] == 1 and first["ended"] <= restart["at"] <= second["started"]
        assert [r["recovered"] for r in doc["resets"]] == [True, True]
        assert first["ended"] <= doc["resets"][0]["at"] <= second["started"]
        assert doc["diagnosis"]["id"] == "eth-heartbeat"
        assert "ttmesh reset" not in doc["diagnosis"]["fix"], doc["diagnosis"]
        assert doc["diagnosis"]["fix"].startswith("nothing to reset now")
    assert "fix: stop every process" not in err and "fix: nothing to reset now" in err
    logs = run_cli("logs", job).out.splitlines()
    assert logs.count("fake server: crashing on purpose") == 2
    assert logs.index("ttmesh: attempt 1") < logs.index("ttmesh: attempt 2")


def test_a_crashing_server_is_its_own_exit_not_a_dead_scheduler(qb2: Path, tmp_path: Path) -> None:
    """A server that kills its schedulers and then exits (as SGLang does when it fails) ends
    the job with its own exit code, even when its schedulers are seen gone first."""
    env = {"FAKE_MODE": "crash", "FAKE_CRASH_LINGER": "0.8"}
    proc, _ = _serve(qb2, tmp_path, env=env)
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, err
    assert err.strip().splitlines()[-1] == "ttmesh: exit 3: rank 0's exit code"
    assert "died while the server ran" not in err


def test_never_ready_is_hung(qb2: Path, tmp_path: Path) -> None:
    proc, _ = _serve(qb2, tmp_path, "--ready-timeout", "2", tp=1, env={"FAKE_MODE": "hang"})
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 124, err
    assert "not ready after 2 s" in err


def test_failed_health_checks_fail_the_job(qb2: Path, tmp_path: Path) -> None:
    proc, port = _serve(qb2, tmp_path, "--health-interval", "0.2", "--health-failures", "2", tp=1,
                        env={"FAKE_MODE": "unhealthy"})  # fmt: skip
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    assert f"http://127.0.0.1:{port}/health failed 2 times in a row (HTTP 503)" in err
    assert err.strip().splitlines()[-1].startswith("ttmesh: exit 1: unhealthy:")


def test_a_dead_scheduler_fails_the_job(qb2: Path, tmp_path: Path) -> None:
    proc, _ = _serve(qb2, tmp_path, tp=2, env={"FAKE_MODE": "child-dies"})
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    assert re.search(r"sglang::scheduler_TP0 \(pid \d+\) died while the server ran", err), err
    assert _links(qb2) == {"up"}


def test_a_server_that_ignores_sigterm_is_killed_after_the_grace(qb2: Path, tmp_path: Path) -> None:
    proc, _ = _serve(qb2, tmp_path, "--grace", "1", tp=1, env={"FAKE_MODE": "ignore-term"})
    lines: list[str] = []
    try:
        _wait_ready(proc, lines)
        server = json.loads((tmp_path / "server.json").read_text())["pid"]
        tree = _tree(server)
        proc.send_signal(signal.SIGINT)
        _out, _err = proc.communicate(timeout=30)
    finally:
        proc.kill()
        proc.communicate()
    assert proc.returncode == 130
    assert not any(alive(p) for p in tree)


def test_a_servers_drain_says_what_it_does(qb2: Path, tmp_path: Path) -> None:
    """A server's drain (SIGTERM to its main process, the profile's or --grace's wait) says it
    runs and what its end killed, in the words every drain uses (issue 19)."""
    proc, _ = _serve(qb2, tmp_path, "--grace", "1", tp=1,
                     env={"FAKE_MODE": "ignore-term", "PYTHONUNBUFFERED": ""})  # fmt: skip
    lines: list[str] = []
    try:
        _wait_ready(proc, lines)
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
        proc.communicate()
    assert proc.returncode == 130, err
    assert re.search(r"^ttmesh: draining, [\d.]+ s left \(1 rank still running\)$", err, re.M), err
    assert re.search(r"^ttmesh: grace over: SIGKILL of \d+ process(es)?$", err, re.M), err


def test_ttmesh_stop_stops_a_server(qb2: Path, tmp_path: Path) -> None:
    proc, port = _serve(qb2, tmp_path, tp=1)
    job = f"serve-{os.getpid()}-{port}"
    lines: list[str] = []
    try:
        _wait_ready(proc, lines)
        assert job in run_cli("ps").out
        res = run_cli("stop", job)
        assert res.code == 0, res.err
        assert f"job {job} ended: terminated (SIGTERM)" in res.out
        _out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
        proc.communicate()
    assert proc.returncode == 143
    said = "ttmesh: terminated (SIGTERM): stopping the server (SIGTERM: its own drain, up to 30 s)"
    assert said in err and "the job ended" not in err, err  # one chip: no link to reset
    res = run_cli("stop", job)
    assert res.code == 2 and f"no running job '{job}'" in res.err


def test_profiles_lists_the_stacks() -> None:
    res = run_cli("profiles", "--json")
    assert res.code == 0
    names = [p["name"] for p in json.loads(res.out)["profiles"]]
    assert set(names) == {"sglang-torchtpu", "sglang-jax", "vllm-tt", "sglang", "jax-tt",
                          "torch-tpu"}  # fmt: skip
    assert (
        "sglang.launch_server and (--device tpu or SGLANG_PLATFORM tpu_oot)"
        in run_cli("profiles").out
    )
