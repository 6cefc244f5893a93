"""``ttmesh check --active``: ask tt-metal itself whether the fabric between the chips works.

Status bits can say "up" while the fabric still fails to come up. The active probe runs a small
ttnn program (ttmesh/probes/ttnn_mesh_probe.py) as a ttmesh job, supervised and under a
timeout: on hardware it opens the chips as one mesh with the fabric on and runs a tiny
collective; on a simulated host tt-metal maps the mesh onto the simulator's cluster descriptor
and stops at the control plane. ttnn has wheels for Python 3.10 and 3.12 only, so it runs in a
separate interpreter (``--ttnn-python``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from ttmesh.dataclass import dataclass, field
from ttmesh.errors import bad_input
from ttmesh.host.base import Host
from ttmesh.vocab import Layout, StartMode

PROBE = Path(__file__).resolve().parents[2] / "probes" / "ttnn_mesh_probe.py"
GET_TTNN = (
    "ttnn has wheels for Python 3.10 and 3.12: python3.12 -m venv ~/ttnn && ~/ttnn/bin/pip "
    "install ttnn, then --ttnn-python ~/ttnn/bin/python (or set TTMESH_TTNN_PYTHON)"
)


@dataclass
class ActiveResult:
    ok: bool
    code: int
    layout: str
    ranks: list[dict[str, Any]] = field(default_factory=list)
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "code": self.code,
            "layout": self.layout,
            "ranks": self.ranks,
            "reason": self.reason,
        }


def _has_ttnn(python: str) -> bool:
    try:
        return (
            subprocess.run(
                [python, "-c", "import ttnn"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=120,
                env={**os.environ, "TT_LOGGER_LEVEL": "error"},
            ).returncode
            == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        return False


def find_ttnn_python(explicit: str | None = None) -> str:
    """--ttnn-python, TTMESH_TTNN_PYTHON, the conformance cache's venv, or this Python."""
    from ttmesh.launcher.planning.metalcheck import check_trusted

    if explicit:
        found = shutil.which(explicit) if os.sep not in explicit else explicit
        if not found or not os.access(found, os.X_OK):
            raise bad_input(f"--ttnn-python {explicit}: no such interpreter", GET_TTNN)
        check_trusted(explicit, found, "--ttnn-python ")  # as a launch's pre-flight does
        if not _has_ttnn(explicit):
            raise bad_input(f"{explicit} cannot import ttnn", GET_TTNN)
        return explicit
    candidates = [os.environ.get("TTMESH_TTNN_PYTHON", "")]
    cache = os.environ.get("TTMESH_CONFORMANCE_CACHE") or os.path.expanduser(
        "~/.cache/ttmesh-conformance"
    )
    candidates.append(os.path.join(cache, "ttnn", "bin", "python"))
    for python in filter(None, candidates):
        if os.access(python, os.X_OK):
            check_trusted(python, python, "the ttnn Python ")
            if _has_ttnn(python):
                return python
    raise bad_input("no Python with ttnn found for the active probe", GET_TTNN)


def run(
    host: Host,
    bdfs: list[str] | None,
    python: str,
    *,
    layout: str = Layout.SINGLE_PROCESS,
    timeout: float = 120.0,
) -> ActiveResult:
    """Run the probe as a ttmesh job on ``bdfs`` (None: every chip) and read its verdict."""
    from ttmesh.fabric.devices import discover
    from ttmesh.launcher.attempt.guardian import Options
    from ttmesh.launcher.job.repair import Recovery
    from ttmesh.launcher.job.run import execute
    from ttmesh.launcher.planning.prepare import prepare
    from ttmesh.launcher.planning.request import LaunchRequest, Policy

    inv = discover(host)
    chips = bdfs if bdfs else [c.bdf for c in inv.chips if c.bdf]
    n = sum(len(inv.board_peers(inv.by_bdf()[b])) for b in chips if b in inv.by_bdf())
    req = LaunchRequest(
        command=[python, str(PROBE)],
        tp_size=n or len(chips),
        no_python=True,
        layout=layout,
        launcher=StartMode.MPI if Layout(layout).one_world else StartMode.DIRECT,
        policy=Policy(ready_timeout=timeout, ready_pattern=r"^PROBE ", grace=2.0),
        env=[("TT_LOGGER_LEVEL", "error"), ("LOGURU_LEVEL", "INFO")],
        environ=dict(os.environ),  # (the plan reads none: its caches go under this HOME)
        strict_links=True,
    )
    with tempfile.TemporaryDirectory(prefix="ttmesh-active-") as logs:
        prepared = prepare(req, host, ",".join(chips), ask_metal=False)
        code = execute(
            prepared, Options(quiet=True, log_dir=logs), recovery=Recovery(preflight=True)
        )
        ranks = []
        for path in sorted(Path(logs).glob("attempt*/rank*.stdout.log")):
            for line in path.read_text(errors="replace").splitlines():
                if line.startswith("PROBE "):
                    try:
                        ranks.append(json.loads(line[6:]))
                    except ValueError:
                        pass
    failed = [r for r in ranks if "error" in r]
    if code == 0 and ranks and not failed:
        shapes = {tuple(r.get("global", ())) for r in ranks}
        return ActiveResult(
            True,
            0,
            layout,
            ranks,
            f"tt-metal mapped the mesh {' '.join('x'.join(map(str, s)) for s in shapes)}",
        )
    reason = (
        failed[0]["error"]
        if failed
        else ("the probe timed out" if code == 124 else f"the probe exited with code {code}")
    )
    return ActiveResult(False, code or 1, layout, ranks, reason)
