"""The seed's own stack, real, under ttmesh on a simulated host: torch_tpu 0.2.0 and libtt's PJRT
plugin (jax-tt-plugin 0.1.3) from the package index, in mock mode (tt-metal's mock cluster: ops
run, results are zeros). Slow (the ``torchtpu_dir`` fixture installs them once, cached; each
start of libtt unpacks its 415 MB runtime): one ttmesh start per group of assertions."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import run_cli

from ttmesh.runtime import jobs

# A job of these makes libtt's mock chips' files, named by the simulated chips' unique ids.
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("mock_chip_files")]

# A plain script on torch_tpu, as the seed's users write it: no TPU_LIBRARY_PATH, no patched
# device count, no torch_tpu variables of its own.
PLAIN = """\
import torch

device = torch.device("tpu")
x = torch.ones(4, device=device) + torch.ones(4, device=device)
print("result", x.cpu().tolist(), "devices", torch.accelerator.device_count(), flush=True)
"""

# A rank on libtt that says which chip libtt opened: its mock chip's shared memory
# (/dev/shm/tt_device_<unique id>_memory), mapped or held by the process.
WHICH = r"""
import json, os, re, sys
def chips():
    seen = set(re.findall(r"tt_device_(\d+)_memory", open("/proc/self/maps").read()))
    for fd in os.listdir("/proc/self/fd"):
        try:
            seen |= set(re.findall(r"tt_device_(\d+)_memory", os.readlink(f"/proc/self/fd/{fd}")))
        except OSError:
            pass
    return sorted(int(c) for c in seen)
"""

JAX = (
    WHICH
    + r"""
import jax
devices = jax.devices()
print("RANK " + json.dumps({"rank": int(os.environ["RANK"]), "devices": len(devices),
      "kinds": sorted({d.device_kind for d in devices}), "bdfs": os.environ["TT_VISIBLE_DEVICES"],
      "chips": chips()}), flush=True)
"""
)

TORCH = (
    WHICH
    + r"""
import torch
x = torch.ones(4, device="tpu") + torch.ones(4, device="tpu")
x.cpu()
print("RANK " + json.dumps({"rank": int(os.environ["RANK"]), "bdfs": os.environ.get("TT_VISIBLE_DEVICES"),
      "chips": chips()}), flush=True)
"""
)


def _python(torchtpu_dir: Path) -> str:
    return str(torchtpu_dir / "venv" / "bin" / "python")


def _env(torchtpu_dir: Path, **more: str) -> dict[str, str]:
    """tt-metal's kernel cache kept beside the stack (ttmesh gives each rank TT_METAL_CACHE/rankN
    under it): compiled once, not in every test."""
    return {"TT_METAL_CACHE": str(torchtpu_dir / "tt-metal-cache"), **more}


def _asic_of(root: Path) -> dict[str, int]:
    from ttmesh.fabric.devices import discover
    from ttmesh.host.base import Host

    return {c.bdf: int(c.asic_id, 16) for c in discover(Host(root)).chips if c.bdf}


def _reports(out: str) -> list[dict]:
    return [json.loads(m) for m in re.findall(r"^\[r\d+\] RANK (\{.*\})$", out, re.M)]


def test_a_plain_torch_tpu_script_runs_on_a_simulated_chip(
    torchtpu_dir: Path, tmp_path: Path
) -> None:
    """(a) `ttmesh launch --sim quietbox2 --tp-size 1` with LIBTT_TPU_COMPAT=1 runs a script
    that uses torch.device("tpu") and nothing else: exit 0, torch_tpu sees the one chip the
    job was given (the simulated /dev/tenstorrent, in the rank's namespace), ops run (mock
    chips answer zeros), and the job leaves no TMPDIR, generated/ or mock chip file."""
    script = tmp_path / "plain.py"
    script.write_text(PLAIN)
    res = run_cli(
        "launch", "--sim", "quietbox2", "--tp-size", "1", "--job-id", "tpu-plain", "--",
        _python(torchtpu_dir), str(script),
        env=_env(torchtpu_dir, LIBTT_TPU_COMPAT="1"), timeout=900,
    )  # fmt: skip
    assert res.code == 0, res.err[-3000:]
    assert "[r0] result [0.0, 0.0, 0.0, 0.0] devices 1" in res.out, res.out[-3000:]
    assert "torch-tpu: PyTorch on torch_tpu" in res.err
    left = re.findall(r"removed (/dev/shm/tt_device_\d+_memory)", res.err)
    assert left and not any(Path(p).exists() for p in left)
    assert not (jobs.runs_dir() / "tpu-plain").exists()


def test_four_one_chip_torch_tpu_ranks(torchtpu_dir: Path, qb2: Path) -> None:
    """(b) Four ranks of one chip each: on a libtt that cannot join processes (0.1.3), the
    refusal, before anything starts; on one that can, each rank's libtt opens the chip ttmesh
    gave it."""
    res = run_cli(
        "launch", "--root", str(qb2), "--tp-size", "4", "--", _python(torchtpu_dir), "-c", TORCH,
        env=_env(torchtpu_dir, LIBTT_TPU_COMPAT="1"), timeout=900,
    )  # fmt: skip
    from importlib import metadata

    site = next((torchtpu_dir / "venv" / "lib").glob("python3*/site-packages"))
    (dist,) = metadata.distributions(name="jax-tt-plugin", path=[str(site)])
    if dist.version.startswith("0.1.3"):
        assert res.code == 2, res.err
        assert "libtt 0.1.3 (jax-tt-plugin in " in res.err
        assert "cannot run 4 processes as one torch_tpu world" in res.err
        return
    assert res.code == 0, res.err[-3000:]  # pragma: no cover (libtt main)
    asic = _asic_of(qb2)
    for report in _reports(res.out):
        assert report["chips"] == [asic[b] for b in (report["bdfs"] or "").split(",") if b]


def test_each_jax_rank_on_the_plugin_sees_exactly_its_chips(torchtpu_dir: Path, qb2: Path) -> None:
    """(c) JAX on libtt (JAX_PLATFORMS=tt: the jax-tt profile), two ranks of one chip each,
    starting together: each sees exactly its chip as a TTDevice, and libtt opened that chip
    (its unique id, as libtt's mock chips name their memory)."""
    asic = _asic_of(qb2)
    res = run_cli(
        "launch", "--root", str(qb2), "--tp-size", "2", "--", _python(torchtpu_dir), "-c", JAX,
        env=_env(torchtpu_dir, JAX_PLATFORMS="tt"), timeout=900,
    )  # fmt: skip
    assert res.code == 0, res.err[-3000:]
    assert "jax-tt: JAX on libtt's PJRT plugin, chosen because JAX_PLATFORMS=tt" in res.err
    reports = sorted(_reports(res.out), key=lambda r: r["rank"])
    assert [r["devices"] for r in reports] == [1, 1], res.out[-3000:]
    assert all(r["kinds"] == ["Blackhole"] for r in reports)
    for report in reports:
        assert report["chips"] == [asic[report["bdfs"]]]
    assert len({r["bdfs"] for r in reports}) == 2


def test_libtts_refusals_arrive_as_ttmeshs_explanation(torchtpu_dir: Path, qb2: Path) -> None:
    """(d) A rank that gives libtt a chip its cluster does not have, then (restarted) a mesh id
    its descriptor does not have: libtt refuses each, and ttmesh names each known failure, its
    cause and its fix."""
    rank = (
        "import os\n"
        "if os.environ['TORCHELASTIC_RESTART_COUNT'] == '0':\n"
        "    os.environ['TT_VISIBLE_DEVICES'] = '0000:99:00.0'\n"
        "else:\n"
        "    os.environ['TT_MESH_ID'] = '1'\n"
        "import jax\n"
        "jax.devices()\n"
    )
    res = run_cli(
        "launch", "--root", str(qb2), "--tp-size", "1", "--max-restarts", "1", "--",
        _python(torchtpu_dir), "-c", rank,
        env=_env(torchtpu_dir, JAX_PLATFORMS="tt"), timeout=900,
    )  # fmt: skip
    assert res.code == 1, res.err[-3000:]
    assert re.search(r"^ttmesh: attempt 1: rank 0 exited with code 1 .*known failure: libtt-bad-bdf$",
                     res.err, re.M), res.err[-3000:]  # fmt: skip
    assert re.search(r"^ttmesh: attempt 2: rank 0 .*known failure: libtt-mesh-id$", res.err, re.M)
    assert "ttmesh: known failure (libtt-mesh-id): TT_MESH_ID or TT_MESH_HOST_RANK" in res.err
    assert "ttmesh:   fix: let ttmesh set TT_MESH_ID" in res.err
