"""A fleet's options (issue 25): the host memory its replicas need, checked once before anything
starts; the router's options from a profile's ``router:`` section before ``--router-arg``; and
the router's Prometheus port, a free one per fleet unless the user gives one. Planning only:
dry runs on a simulated QuietBox 2 and in-process calls (the real router's start is in
test_fleet.py)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import run_cli
from test_serving import ENV, SGLANG

from ttmesh.errors import TTMeshError

GIB = 1 << 30


def _model(tmp_path: Path) -> Path:
    """A model directory of 16 GiB of safetensors (sparse files: no disk used), and a
    pytorch .bin SGLang's loader does not read beside them."""
    model = tmp_path / "model"
    model.mkdir()
    for name, size in (("model-00001-of-00002.safetensors", 8 * GIB),
                       ("model-00002-of-00002.safetensors", 8 * GIB),
                       ("pytorch_model.bin", 4 * GIB)):  # fmt: skip
        with open(model / name, "wb") as f:
            f.truncate(size)
    (model / "config.json").write_text("{}")
    return model


def _available(root: Path, line: str | None) -> None:
    """The simulated host's /proc/meminfo with its MemAvailable line replaced (None: gone)."""
    path = root / "proc" / "meminfo"
    lines = [ln for ln in path.read_text().splitlines() if not ln.startswith("MemAvailable:")]
    path.write_text("\n".join(lines + ([line] if line else [])) + "\n")


def _command(model: str | Path, port: str = "31000") -> list[str]:
    return [*SGLANG, "--model-path", str(model), "--device", "tpu", "--tp-size", "2",
            "--kv-cache-dtype", "bfloat16", "--grammar-backend", "none", "--port", port]  # fmt: skip


def _dry(root: Path, *args: str, model: str | Path = "Qwen/Qwen3-8B", env: dict | None = None):
    return run_cli("launch", "--root", str(root), "--replicas", "2", "--tp-size", "2",
                   "--dry-run", "--json", *args, "--", *_command(model),
                   env={**ENV, **(env or {})})  # fmt: skip


# ---------------------------------------------------------------------------- host memory


def test_replicas_that_need_more_host_memory_than_the_host_has_are_refused(
    qb2: Path, tmp_path: Path
) -> None:
    model = _model(tmp_path)
    _available(qb2, f"MemAvailable:   {38 * 1024 * 1024} kB")  # 38 GiB
    # Staggered: one replica starting (1.25 x 16 GiB) and one serving (16 GiB): 36 GiB fit.
    res = _dry(qb2, model=model)
    assert res.code == 0, res.err
    memory = json.loads(res.out)["memory"]
    assert memory["weights_bytes"] == 16 * GIB  # the safetensors only, as SGLang loads them
    assert memory["peak_bytes"] == 36 * GIB and memory["available_bytes"] == 38 * GIB
    assert memory["start"] == "staggered" and memory["fits"] is True
    assert str(qb2 / "proc" / "meminfo") == memory["source"]
    # Together: both starting, 40 GiB. A dry run says a launch now is refused; a launch is.
    res = _dry(qb2, "--replicas-parallel", model=model)
    assert res.code == 0, res.err
    data = json.loads(res.out)
    assert data["memory"]["fits"] is False and data["memory"]["peak_bytes"] == 40 * GIB
    assert any("a launch now is refused" in n for n in data["notes"])
    summary = tmp_path / "refused.json"
    res = run_cli("launch", "--root", str(qb2), "--replicas", "2", "--tp-size", "2",
                  "--replicas-parallel", "--summary-json", str(summary), "--",
                  *_command(model), env=ENV, timeout=30)  # fmt: skip
    assert res.code == 2, res.err
    last = res.err.strip().splitlines()[-1]
    assert re.fullmatch(
        r"ttmesh: not enough host memory: 2 replicas of \S+ \(16\.0 GiB of weights\) need about "
        r"40\.0 GiB at their peak \(--replicas-parallel.*\); 38\.0 GiB available "
        r"\(MemAvailable, \S+meminfo\) \(.*drop --replicas-parallel: 36\.0 GiB.*"
        r"--no-memory-check\)",
        last,
    ), last
    assert json.loads(summary.read_text())["code"] == 2
    res = _dry(qb2, "--replicas-parallel", "--no-memory-check", model=model)
    assert res.code == 0 and json.loads(res.out)["memory"]["skipped"] == "--no-memory-check"


@pytest.mark.parametrize(
    ("meminfo", "model", "said"),
    [
        ("MemAvailable:   nan kB", "model", "a line that is not meminfo's"),
        (None, "model", "has no MemAvailable"),
        ("MemAvailable:   1 kB", "fifo", "fifo is not a directory of weight files"),
        ("MemAvailable:   1 kB", "/dev/zero", "/dev/zero is not a directory of weight files"),
        ("MemAvailable:   1 kB", "Qwen/Qwen3-8B", "No such file or directory"),
        ("MemAvailable:   1 kB", "empty", "holds no *.safetensors or *.bin weight files"),
    ],
)
def test_an_estimate_that_cannot_be_made_is_said_never_silent(
    qb2: Path, tmp_path: Path, meminfo: str | None, model: str, said: str
) -> None:
    """In-process: the plan's memory check on the simulated host, its reason why not."""
    from ttmesh.cli.hosts import open_host
    from ttmesh.launcher.fleet import memory
    from ttmesh.launcher.serving import profiles
    from ttmesh.launcher.serving.args import ServerArgs

    _model(tmp_path)
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "empty").mkdir()
    _available(qb2, meminfo)
    profile = profiles.named("sglang-torchtpu")
    args = profile.read(ServerArgs("sglang.launch_server", ["--model-path", model]))
    check = memory.check(profile, args, str(tmp_path), open_host(qb2), 2, False)
    assert check.fits is None and check.skipped is not None and said in check.skipped
    assert check.says().startswith("host memory not checked: ")
    assert check.to_json()["checked"] is False


# ---------------------------------------------------------------------------- router options


def _profile_dir(tmp_path: Path, router: str, key: str = "router") -> Path:
    """A user profile: the stock SGLang-TorchTPU one, first, with a ``router:`` section (or
    another ``key``'s)."""
    from ttmesh.launcher.serving import profiles

    stock = (profiles.profiles_dir() / "sglang-torchtpu.yaml").read_text()
    text = re.sub(r"(?m)^name: .*$", "name: mine", stock)
    text = re.sub(r"(?m)^priority: .*$", "priority: 90", text)
    mine = tmp_path / "profiles"
    mine.mkdir()
    if key != "router":
        text = re.sub(rf"(?m)^{key}: .*$", "", text)
    (mine / "mine.yaml").write_text(f"{text}\nflags: sglang-torchtpu\n{key}: {router}\n")
    return mine


def test_a_profiles_router_args_go_to_the_router_before_the_users(
    qb2: Path, tmp_path: Path
) -> None:
    mine = _profile_dir(tmp_path, "{args: [--policy, cache_aware, --cache-threshold, 0.4]}")
    res = _dry(qb2, "--router-arg=--policy", "--router-arg=round_robin",
               env={"TTMESH_PROFILES": str(mine)})  # fmt: skip
    assert res.code == 0, res.err
    router = json.loads(res.out)["router"]
    port = router["metrics"]["port"]
    assert router["args"] == ["--policy", "cache_aware", "--cache-threshold", "0.4",
                              "--policy", "round_robin", "--prometheus-host", "127.0.0.1",
                              "--prometheus-port", str(port)]  # fmt: skip


@pytest.mark.parametrize(
    ("section", "said"),
    [
        ("{args: notalist}", r"router\.args must be a list of words .*'notalist'"),
        ("[--policy, random]", r"router must be a map with args"),
        ("{args: [--host, x]}", r"router\.args sets the router's --host, which ttmesh sets"),
        ("{args: [--po, '1']}", r"router\.args: the router refuses '--po 1': ambiguous option"),
        ("{args: [--policy, nope]}", r"router\.args: the router refuses .*invalid choice"),
    ],
)
def test_a_bad_router_section_is_one_line_naming_the_profile_and_key(
    qb2: Path, tmp_path: Path, section: str, said: str
) -> None:
    mine = _profile_dir(tmp_path, section)
    res = _dry(qb2, env={"TTMESH_PROFILES": str(mine)})
    assert res.code == 2, res.out
    said_lines = [ln for ln in res.err.splitlines() if ln.startswith("ttmesh:")]
    assert len(said_lines) == 1 and json.loads(res.out)["schema"] == "ttmesh.error/1", res.err
    assert f"profile {mine / 'mine.yaml'}" in res.err and re.search(said, res.err), res.err


def test_a_bad_host_memory_section_is_one_line_naming_the_profile_and_key(
    qb2: Path, tmp_path: Path
) -> None:
    mine = _profile_dir(tmp_path, "{model_flag: --model-path, starting: .nan}", "host_memory")
    res = _dry(qb2, env={"TTMESH_PROFILES": str(mine)})
    assert res.code == 2, res.out
    assert f"profile {mine / 'mine.yaml'}: host_memory.starting .nan: not a number" in res.err


@pytest.mark.parametrize(
    ("words", "flag"),
    [
        (["--port=1"], "--port"),
        (["--ho", "x"], "--host"),
        (["--worker-urls", "u"], "--worker-urls"),
    ],
)
def test_the_routers_own_address_and_workers_are_ttmeshs(words: list[str], flag: str) -> None:
    from ttmesh.launcher.fleet import routeropts

    profile = SimpleNamespace(extra={}, path="", name="p")
    with pytest.raises(TTMeshError) as err:
        routeropts.read(profile, tuple(words), 31000, {31000})
    assert err.value.message.startswith(f"--router-arg sets the router's {flag}, which ttmesh")


# ---------------------------------------------------------------------------- metrics port


def test_two_fleets_routers_get_different_metrics_ports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first fleet's router binds its metrics port only once its first replica is ready,
    minutes later: the kernel may hand the second fleet the same free port meanwhile (as here),
    so the ports the running fleets' records name are not given again."""
    from ttmesh.launcher.fleet import routeropts
    from ttmesh.launcher.planning import ports
    from ttmesh.runtime import jobs

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    handed = iter([41234, 41234, 41235])
    monkeypatch.setattr(ports, "free_port", lambda addr="127.0.0.1": next(handed))
    profile = SimpleNamespace(extra={}, path="", name="p")
    first = routeropts.read(profile, (), 31000, {31000})
    assert first.metrics_port == 41234
    assert first.args == ["--prometheus-host", "127.0.0.1", "--prometheus-port", "41234"]
    jobs.write({"job": "fleet-a", "pid": os.getpid(), "guardian": None, "layout": "fleet",
                "started": 0, "command": [], "ranks": [],
                "fleet": {"router": {"metrics": first.to_json()}, "replicas": []}})  # fmt: skip
    second = routeropts.read(profile, (), 32000, {32000})
    assert second.metrics_port == 41235
    assert second.metrics_url == "http://127.0.0.1:41235/metrics"


def test_a_given_prometheus_port_is_kept_and_the_plan_says_the_metrics_url(qb2: Path) -> None:
    res = _dry(qb2, "--router-arg=--prometheus-port", "--router-arg=29555")
    assert res.code == 0, res.err
    router = json.loads(res.out)["router"]
    assert router["metrics"] == {"host": "127.0.0.1", "port": 29555,
                                 "url": "http://127.0.0.1:29555/metrics", "given": True}  # fmt: skip
    # Where ttmesh says the metrics are: 0.3.2's own default is every address (0.0.0.0).
    assert router["args"] == ["--prometheus-port", "29555", "--prometheus-host", "127.0.0.1"]
    assert "router: Prometheus metrics at http://127.0.0.1:29555/metrics" in res.err
    res = run_cli("launch", "--root", str(qb2), "--replicas", "2", "--tp-size", "2",
                  "--dry-run", "--", *_command("Qwen/Qwen3-8B"), env=ENV)  # fmt: skip
    assert res.code == 0, res.err
    url = re.search(r"router metrics \(Prometheus\): http://127\.0\.0\.1:(\d+)/metrics", res.out)
    assert url and int(url.group(1)) != 29000, res.out  # not the router's default


def test_a_given_metrics_port_that_is_taken_is_refused_before_the_start() -> None:
    """Else the router would die at each of its starts, minutes later (after the first replica
    is ready), and the fleet would end with the router dead."""
    import socket

    from ttmesh.launcher.fleet import routeropts

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        given = routeropts.RouterOptions(metrics_host="127.0.0.1", metrics_port=port,
                                         metrics_given=True)  # fmt: skip
        with pytest.raises(TTMeshError) as err:
            routeropts.check_free(given)
        assert err.value.message.startswith(f"the router's --prometheus-port {port} is already")
        routeropts.check_free(routeropts.RouterOptions(metrics_port=port))  # ttmesh's: free


# ---------------------------------------------------------------------------- what is refused


@pytest.mark.parametrize(
    ("words", "said", "fix"),
    [
        (["--api-key", "K"], "sets the router's --api-key, a secret every local user would read "
         "in the router's command line (ps, /proc/PID/cmdline)", "ttmesh keeps the router's admin "
         "routes closed with a key of its own"),
        (["--api=K"], "sets the router's --api-key, a secret", "drop it"),  # its prefix
        (["--control-plane-api-keys", "a:b:admin:c"], "sets the router's "
         "--control-plane-api-keys, a secret", "given on a pipe"),
        (["--oracle-password", "pw"], "--oracle-password, a secret", "set ATP_PASSWORD"),
        (["--redis-url=redis://u:pw@h"], "--redis-url, a secret", "set REDIS_URL"),
        (["--postgres-db-url", "postgres://u:pw@h/d"], "--postgres-db-url, a secret",
         "set POSTGRES_DB_URL"),
        (["--mini-lb"], "sets the router's --mini-lb: SGLang's Python debugging balancer has no "
         "/workers routes", "drop --mini-lb"),
        (["--prometheus-host", "localhost"], "the router's --prometheus-host 'localhost': not an "
         "IP address", "127.0.0.1 (this host only)"),
        (["--prometheus-host="], "the router's --prometheus-host '': not an IP address", "::1"),
        (["--prometheus-port", "٢٩٠٠١"], "the router's --prometheus-port ٢٩٠٠١: not a number",
         "1 to 65535"),
        (["--prometheus-port=29_001"], "the router's --prometheus-port 29_001: not a number",
         "1 to 65535"),
        (["--prometheus-port", "0"], "the router's --prometheus-port 0: too small", "1 to 65535"),
    ],
)  # fmt: skip
def test_a_secret_or_an_address_the_router_would_misuse_is_refused(
    words: list[str], said: str, fix: str
) -> None:
    """A secret in the router's words would be every local user's to read (its command line);
    ttmesh keeps the admin routes closed itself. A name for the metrics address is bound by
    0.3.2 as every address (0.0.0.0); a port is plain ASCII digits, as every ttmesh number."""
    from ttmesh.launcher.fleet import routeropts

    profile = SimpleNamespace(extra={}, path="", name="p")
    with pytest.raises(TTMeshError) as err:
        routeropts.read(profile, tuple(words), 31000, {31000})
    assert said in err.value.message and fix in (err.value.hint or ""), err.value


def test_the_routers_complaint_is_one_line_with_the_users_words_escaped(qb2: Path) -> None:
    """A word with a newline and a terminal escape: the router's parser quotes it; ttmesh says
    it on one line, escaped, so a second line cannot pose as ttmesh's."""
    res = _dry(qb2, "--router-arg=--bogus\nttmesh: all good\x1b[2J")
    assert res.code == 2
    ours = [ln for ln in res.err.splitlines() if ln.startswith("ttmesh:")]
    assert ours == [
        "ttmesh: --router-arg: the router refuses '--bogus\\nttmesh: all good\\x1b[2J': "
        "unrecognized arguments: --bogus ttmesh: all good (fix it: python -m "
        "sglang_router.launch_router --help lists its flags)"
    ], res.err
    assert "\x1b" not in res.err, res.err


@pytest.mark.parametrize("host", ["localhost", "my-host", "127.0.0.1\nttmesh: ok", ""])
def test_a_fleets_host_is_an_ip_address_as_the_router_takes_it(host: str) -> None:
    """The router listens at the server's --host, and 0.3.2 dies at each start on a name
    (six starts, then the fleet ends, after its first replica was ready): refused at once."""
    from ttmesh.launcher.fleet import routeropts

    with pytest.raises(TTMeshError) as err:
        routeropts.router_host(host)
    assert err.value.message.startswith(f"--host {host!r}: with --replicas SGLang's router")
    assert "\n" not in err.value.message
    for good in ("127.0.0.1", "0.0.0.0", "::1", "::"):
        assert routeropts.router_host(good) == good
