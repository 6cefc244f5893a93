"""``ttmesh doctor --bundle`` (issue 37): the host's capture plus versions, environment, job
records and log tails, secrets redacted, what failed said, bounded; still a capture."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from conftest import run_cli

from ttmesh.recovery import redact

SECRETS = {
    "--api-key sk-proj-abcdefghijklmnop1234": "sk-proj-abcdefghijklmnop1234",
    "--hf-token=hf_abcdefghijklmnopqrstuvwxyz12": "hf_abcdefghijklmnopqrstuvwxyz12",
    "https://alice:hunter2@example.com/models": "hunter2",
    "Authorization: Bearer abcdef.ghijkl": "abcdef.ghijkl",
    "password=correct-horse": "correct-horse",
    '{"token": "t0ps3cret"}': "t0ps3cret",
    "db_password: 'sw0rdfish'": "sw0rdfish",
    "key AKIAABCDEFGHIJKLMNOP here": "AKIAABCDEFGHIJKLMNOP",
    "gh ghp_abcdefghijklmnopqrstuvwxyz0123": "ghp_abcdefghijklmnopqrstuvwxyz0123",
    "slack xoxb-1234567890-abcdefghij": "xoxb-1234567890-abcdefghij",
    "jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.abcdefghijkl": "eyJzdWIiOiIxMjM0In0",
    "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXk\n-----END OPENSSH PRIVATE KEY-----": (
        "b3BlbnNzaC1rZXk"
    ),
    "MY_SECRET_KEY=abc123xyz": "abc123xyz",
    "--password 'two words'": "two words",
}
KEPT = [
    "--max-total-tokens 16384",
    "num_key_value_heads: 8",
    "http://127.0.0.1:31000/health",
    "TT_VISIBLE_DEVICES=0000:01:00.0,0000:03:00.0",
    "asic 00008a26321e00c1 key_value cache",
    "rank 0/4 chip 0000:01:00.0: all_reduce = 10 ok",
    "git@github.com:tenstorrent/tt-metal.git",
]


@pytest.mark.parametrize("line", list(SECRETS))
def test_every_kind_of_secret_is_replaced(line: str) -> None:
    out, n = redact.text(f"before {line} after")
    assert SECRETS[line] not in out and n >= 1 and "***" in out, out
    assert out.startswith("before ") and out.endswith(" after")


def test_what_is_no_secret_is_kept() -> None:
    for line in KEPT:
        assert redact.text(line) == (line, 0)
    assert redact.variable("TTMESH_RDZV_TOKEN", "abc") == ("***", 1)
    assert redact.variable("LIBTT_SYMMETRIC_DRAM_MB", "2048") == ("2048", 0)
    doc, n = redact.document({"cmd": ["x", "--api-key", "zzzz1234"], "api_key": 5, "a": [{"b": 1}]})
    assert doc == {"cmd": ["x", "--api-key", "zzzz1234"], "api_key": "***", "a": [{"b": 1}]}
    assert n == 1  # a word of an argv list alone is not a secret; the key says it is


def test_versions_are_read_without_importing_the_stack() -> None:
    code = (
        "import sys; from ttmesh.recovery import bundle; v = bundle._own_versions(); "
        "heavy = [m for m in ('torch', 'ttnn', 'sglang', 'jax', 'torch_tpu') if m in sys.modules]; "
        "print(heavy, v['packages']['ttmesh'], v['packages']['torch'])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    heavy, ttmesh_version, torch_version = out.stdout.split(" ", 2)
    assert heavy == "[]" and ttmesh_version and torch_version.strip() != "None"


def test_a_bundle_is_bounded_and_says_what_it_left_out(
    qb2: Path, runtime: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    from ttmesh.cli.hosts import open_host
    from ttmesh.recovery import bundle
    from ttmesh.runtime import joblogs, jobs

    for i in range(3):
        job = f"j{i}"
        jobs.write({"job": job, "pid": os.getpid(), "started": time.time(), "ended": time.time()})
        logs = joblogs.JobLogs.create(job)
        attempt = logs.attempt(0, ["0"])
        assert attempt is not None
        log = attempt.stream("0", "stdout")
        assert log is not None
        log.write(b"x" * 3000 + b"\n")
        attempt.close()
        logs.close()
    monkeypatch.setattr(bundle, "MAX_EXTRA", 6000)
    env = {"TTMESH_TTNN_PYTHON": "/nonexistent/python", "PATH": os.environ["PATH"]}
    found = bundle.collect(open_host(str(qb2)), environ=env)
    manifest = json.loads(found.files["bundle/manifest.json"])
    assert manifest["schema"] == "ttmesh.bundle/1" and manifest["bytes"] <= 6000
    whys = {m["what"]: m["why"] for m in manifest["not_collected"]}
    assert any("bound was reached" in why for why in whys.values()), whys
    assert any(w.startswith("versions in /nonexistent/python (TTMESH_TTNN_PYTHON)") for w in whys)
    assert sum(len(v) for k, v in found.files.items() if k.startswith("bundle/")) < 6000 + 4096


def test_doctor_bundle_end_to_end_redacted_and_still_a_capture(
    qb2: Path, runtime: Path, tmp_path: Path
) -> None:
    env = {
        "XDG_RUNTIME_DIR": str(runtime),
        "TTMESH_RDZV_TOKEN": "rdzv-s3cr3t",
        "TT_METAL_CACHE_URL": "https://bob:pa55word@cache.example/x",
        "LIBTT_SYMMETRIC_DRAM_MB": "2048",
    }
    script = "print('Authorization: Bearer zzsecretzz'); print('loaded hf_abcdefghijklmnopqrstu12')"
    res = run_cli("launch", "--root", str(qb2), "--tp-size", "1", "--job-id", "leaky", "--",
                  sys.executable, "-c", script, "--api-key", "sk-abcdefghijklmnop99", env=env)  # fmt: skip
    assert res.code == 0, res.err
    out = tmp_path / "b.tar.gz"
    made = run_cli("doctor", "--root", str(qb2), "--bundle", str(out), env=env)
    assert made.code == 0, made.err
    assert "secrets redacted" in made.out and "1 job record" in made.out, made.out
    assert out.stat().st_mode & 0o777 == 0o600  # the tails of the user's 0600 logs: theirs alone
    with tarfile.open(out) as tar:
        data = {m.name.split("/", 1)[1]: tar.extractfile(m).read()  # type: ignore[union-attr]
                for m in tar.getmembers() if m.isfile()}  # fmt: skip
    everything = b"\n".join(data.values())
    for secret in (b"rdzv-s3cr3t", b"pa55word", b"zzsecretzz", b"hf_abcdefghij", b"sk-abcdefgh"):
        assert secret not in everything, secret
    environment = json.loads(data["bundle/environment.json"])["variables"]
    assert environment["TTMESH_RDZV_TOKEN"] == "***"
    assert environment["TT_METAL_CACHE_URL"] == "https://***@cache.example/x"
    assert environment["LIBTT_SYMMETRIC_DRAM_MB"] == "2048"
    record = json.loads(data["bundle/jobs/leaky.json"])
    assert record["job"] == "leaky" and "--api-key" in record["command"]
    tail = data["bundle/logs/leaky/attempt_0/0/stdout.log"].decode()
    assert "Authorization: Bearer ***" in tail and "loaded ***" in tail
    versions = json.loads(data["bundle/versions.json"])["pythons"][0]["packages"]
    assert versions["ttmesh"] and "tt-smi" in versions and "sglang" in versions
    assert "manifest.json" in data  # the capture's own: the bundle is a capture
    rebuilt = run_cli("sim", "create", "--from-capture", str(out), "--root", str(tmp_path / "r"))
    assert rebuilt.code == 0, rebuilt.err
    again = run_cli("doctor", "--root", str(qb2), "--bundle", str(out), env=env)
    assert again.code == 2 and "--bundle" in again.err and "already exists" in again.err
    both = run_cli("doctor", "--root", str(qb2), "--bundle", "x", "--capture", "y")
    assert both.code == 2 and "not both" in both.err
    assert run_cli("doctor", "--root", str(qb2)).code == 2


def test_a_link_planted_at_the_archives_temporary_name_is_never_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The archive is written to a temporary name beside it, then renamed: in a shared
    directory another user may plant a link at that name. It is made, never opened through a
    link (O_EXCL | O_NOFOLLOW), and its name is not guessable (here it is forced, to plant)."""
    from ttmesh.errors import TTMeshError
    from ttmesh.recovery import capture

    victim = tmp_path / "victim"
    victim.write_text("keep me")
    dest = tmp_path / "shared" / "b.tar.gz"
    dest.parent.mkdir()
    monkeypatch.setattr(os, "urandom", lambda n: b"\0" * n)
    (dest.parent / f".{dest.name}.{os.getpid()}.{'00' * 6}.tmp").symlink_to(victim)
    cap = capture.Capture.__new__(capture.Capture)
    cap.files, cap.links = {"a": b"x"}, {}
    cap.manifest = {"host": {"hostname": "h"}, "unix_time": 0}
    with pytest.raises(TTMeshError) as info:
        capture.write_archive(cap, dest, flag="--bundle")
    assert info.value.code == 2 and "bundle" in str(info.value)
    assert victim.read_text() == "keep me" and not dest.exists()
