"""Pre-flight asks tt-metal itself: does its control plane map the job's mesh onto its cluster?

ttmesh's own verdict models tt-metal's rules; where a Python with ttnn is configured
(``TTMESH_TTNN_PYTHON``: ttnn has wheels for Python 3.10 and 3.12 only, so it runs in its own
interpreter, as ``check --active`` does), the launch also asks tt-metal's mock control plane
about the exact files the ranks will get: each rank's mesh graph descriptor and mock cluster
descriptor (written to a private directory), its ``TT_MESH_ID``, ``TT_MESH_HOST_RANK`` and
``TT_VISIBLE_DEVICES``. The probes (``ttmesh/probes/ttnn_mesh_probe.py``) start as soon as the
plan exists and run while the launch reads heartbeats, takes leases and writes its record;
their verdict is awaited before any rank starts. A refusal is tt-metal's own reason in one
line, exit 3. Where nothing is configured, or the plan is one the mock cannot answer for, the
check is skipped and said so (``--dry-run``'s ``checks``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import time
from pathlib import Path

from ttmesh import procs
from ttmesh.dataclass import dataclass, field
from ttmesh.errors import TTMeshError, bad_input, refused
from ttmesh.launcher.planning.plan import LaunchPlan
from ttmesh.vocab import Layout

ENV = "TTMESH_TTNN_PYTHON"
NAME = "tt-metal control plane"
PROBE = Path(__file__).resolve().parents[2] / "probes" / "ttnn_mesh_probe.py"
HOW = (
    f"set {ENV} to a Python 3.10 or 3.12 with ttnn: python3.12 -m venv ~/ttnn && "
    "~/ttnn/bin/pip install ttnn"
)
STAGES = "TTMESH_PROBE_STAGES"  # the probe says how far it got (its module's STAGES)
STAGE = "PROBE-STAGE "
PARALLEL = max(2, os.cpu_count() or 2)  # probes running at once
TIMEOUT = 180.0  # seconds for tt-metal to answer (importing ttnn takes a few)
# What a rank's tt-metal reads of its environment to build its control plane.
KEYS = ("TT_MESH_GRAPH_DESC_PATH", "TT_METAL_MOCK_CLUSTER_DESC_PATH", "TT_MESH_ID",
        "TT_MESH_HOST_RANK", "TT_VISIBLE_DEVICES")  # fmt: skip


def configured(environ: dict[str, str] | None = None) -> str | None:
    """The ttnn Python the user configured, checked to be an executable; None when unset."""
    python = (os.environ if environ is None else environ).get(ENV, "")
    if not python:
        return None
    found = shutil.which(python) if os.sep not in python else python
    if not found or not os.path.isfile(found) or not os.access(found, os.X_OK):
        raise bad_input(f"{ENV}={python}: no such interpreter", f"{HOW}, or unset it")
    check_trusted(python, found)
    return found


def check_trusted(name: str, path: str, what: str = f"{ENV}=") -> None:
    """ttmesh runs as root on shared hosts: never run an interpreter (or a link to one, or in
    a directory) another user could have replaced. Each of the link, its target and their
    directories must be root's or yours, and writable by no one else (``what`` prefixes
    ``name`` in the refusal: how the user gave it)."""
    real = os.path.realpath(path)
    for p in dict.fromkeys([path, os.path.dirname(os.path.abspath(path)), real,
                            os.path.dirname(real)]):  # fmt: skip
        try:
            st = os.lstat(p)
        except OSError:
            continue
        shared = st.st_mode & 0o022 and not stat.S_ISLNK(st.st_mode)  # a link's mode is 777
        if shared and stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX:
            shared = False  # a sticky directory (/tmp): only an entry's owner may replace it
        if st.st_uid not in (0, os.getuid()) or shared:
            from ttmesh.errors import owner_of

            why = (
                f"is owned by {owner_of(p) or st.st_uid}"
                if st.st_uid not in (0, os.getuid())
                else "is writable by others"
            )
            raise bad_input(
                f"{what}{name}: refusing to run it: {p} {why}",
                "use a ttnn Python that only you or root can change",
            )


def skip_reason(plan: LaunchPlan) -> str | None:
    """Why tt-metal's mock cannot be asked about this plan (None: it can)."""
    if plan.chipless:
        return "the server drives no Tenstorrent chip"
    if plan.hosts:
        return "a mesh over several hosts: each rank's tt-metal maps it when the job starts"
    if not all(r.env.get("TT_METAL_MOCK_CLUSTER_DESC_PATH") for r in plan.ranks):
        return (
            "on this machine the job's tt-metal maps the mesh onto the real chips when it "
            "opens them (a mock cluster is for simulated hosts)"
        )
    return None


@dataclass
class Pending:
    """The probes under way: one tt-metal process per rank, each with that rank's files."""

    python: str
    workdir: str
    procs: list[tuple[int, subprocess.Popen[bytes]]] = field(default_factory=list)
    started: float = 0.0
    seconds: float | None = None  # how long tt-metal took, once answered
    queued: list[tuple[int, list[str], dict[str, str]]] = field(default_factory=list)

    def spawn(self, rank: int, argv: list[str], env: dict[str, str]) -> None:
        """Start a rank's probe now, or queue it while PARALLEL are running (each imports
        ttnn: a Galaxy's 32 one-chip ranks at once would take every core and gigabytes)."""
        if len(self.procs) - self._finished() >= PARALLEL:
            self.queued.append((rank, argv, env))
            return
        prefix = procs.pdeathsig_wrapper()
        proc = subprocess.Popen(
            [*prefix, *argv] if prefix else argv,
            env=env,
            cwd=self.workdir,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
            preexec_fn=None if prefix else procs.pdeathsig_preexec(os.getpid()),
        )
        self.procs.append((rank, proc))

    def _finished(self) -> int:
        return sum(1 for _r, p in self.procs if p.poll() is not None)

    def wait(self) -> str:
        """tt-metal's verdict: the mesh shapes it mapped; raises its refusal (exit 3) or, for a
        configured Python without ttnn, bad input (exit 2)."""
        try:
            reports: list[tuple[int, int, dict | None, set[str]]] = []
            deadline = self.started + TIMEOUT
            i = 0
            while i < len(self.procs):
                rank, proc = self.procs[i]
                i += 1
                try:
                    out, _ = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    raise refused(
                        "pre-flight: tt-metal's control plane did not answer"
                        + (f" for rank {rank}" if rank >= 0 else "")
                        + f" within {TIMEOUT:g} s",
                        f"check {self.python} runs ttnn, or unset {ENV}",
                    ) from None
                found, stages = _reports(out), _stages(out)
                if rank < 0:  # one MPI world: every rank's report, in rank order
                    found.sort(key=lambda r: r.get("rank", 0))
                    failed = [r for r in found if "error" in r]
                    got: list[dict | None] = [*(failed[:1] or found)] or [None]
                    for r in got:
                        reports.append((r.get("rank", 0) if r else 0, proc.returncode, r, stages))
                    if proc.returncode and not failed:
                        reports.append((0, proc.returncode, None, stages))
                else:
                    reports.append((rank, proc.returncode, found[0] if found else None, stages))
                if any(r is None or "error" in r for _, _, r, _ in reports):
                    break  # one refusal is the answer: the rest are stopped
                while self.queued and len(self.procs) - self._finished() < PARALLEL:
                    self.spawn(*self.queued.pop(0))
            self.seconds = time.monotonic() - self.started
            for rank, code, report, stages in reports:
                if report is None and "ttnn" not in stages:
                    raise self._broken(code, stages)
                if report is None and code == 0:  # it ran, but is no Python running the probe
                    raise bad_input(
                        f"{ENV}={self.python} gave no answer (it exited 0 without the probe's "
                        "line): is it a Python with ttnn?",
                        f"{HOW}, or unset it",
                    )
                if report is None or "error" in report:
                    why = (report or {}).get("error") or (
                        f"its control plane {_ended(code)} without an answer"
                    )
                    if code == 3 or "not importable" in why:
                        raise bad_input(
                            f"{ENV}={self.python} cannot import ttnn", f"{HOW}, or unset it"
                        )
                    raise refused(
                        f"pre-flight: tt-metal refuses rank {rank}'s mesh: {_reason(why)}",
                        "its control plane would fail the same way when the job opens the mesh; "
                        "nothing started: choose other chips, another --mesh-shape or "
                        "--mesh-layout, or fix the mesh graph descriptor",
                    )
            shapes = sorted(
                {"x".join(map(str, r.get("global", []))) for _, _, r, _ in reports if r}
            )
            return f"tt-metal mapped the mesh {', '.join(shapes)} ({self.seconds:.1f} s)"
        finally:
            self.close()

    def _broken(self, code: int | None, stages: set[str]) -> TTMeshError:
        """The checker failed before tt-metal could judge the mesh (bad environment, exit 2:
        the check is broken, not the mesh): it never ran the probe (no Python: /bin/false),
        or ttnn crashed while being imported."""
        how = _ended(code)
        if "python" in stages:
            what = f"{ENV}={self.python} {how} importing ttnn"
        else:
            what = f"{ENV}={self.python} did not run tt-metal's check: it {how} before starting it"
        return bad_input(f"{what}: the checker is broken, not the mesh", f"{HOW}, or unset {ENV}")

    def close(self) -> None:
        """Stop what is still running and remove the files (idempotent)."""
        for _rank, proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(OSError):
                    os.killpg(proc.pid, 9)
                with contextlib.suppress(Exception):
                    proc.communicate(timeout=5)
        self.procs = []
        self.queued = []
        shutil.rmtree(self.workdir, ignore_errors=True)


def _reason(text: str) -> str:
    """tt-metal's message without its backtrace and empty sections."""
    text = text.split(" | backtrace:")[0]
    return " | ".join(p for p in text.split(" | ") if p.strip() not in ("", "info:"))[:400]


def _ended(code: int | None) -> str:
    """How a probe ended: ``exited with code 1``, ``was killed by SIGSEGV`` (never ``-11``)."""
    if code is not None and code < 0:
        return f"was killed by {procs.signal_name(-code)}"
    return f"exited with code {code}"


def _stages(out: bytes) -> set[str]:
    """How far the probes got (``PROBE-STAGE python``, ``PROBE-STAGE ttnn``)."""
    return {
        line[len(STAGE) :].strip()
        for line in out.decode(errors="replace").splitlines()
        if line.startswith(STAGE)
    }


def _reports(out: bytes) -> list[dict]:
    """The probes' ``PROBE {json}`` lines (one per rank; several from one MPI world)."""
    found = []
    for line in out.decode(errors="replace").splitlines():
        if line.startswith("PROBE "):
            with contextlib.suppress(ValueError):
                doc = json.loads(line[6:])
                if isinstance(doc, dict):
                    found.append(doc)
    return found


def start(plan: LaunchPlan, python: str) -> Pending:
    """Start one probe per rank on copies of the files that rank will get (the plan's paths are
    in a run directory that does not exist yet)."""
    import tempfile  # (random, hashlib): only with a ttnn Python configured

    workdir = tempfile.mkdtemp(prefix="ttmesh-metal-")
    pending = Pending(python, workdir, started=time.monotonic())
    try:
        moved: dict[str, str] = {}
        for i, (path, text) in enumerate(sorted(plan.files.items())):
            if path.endswith((".textproto", ".yaml")):
                target = os.path.join(workdir, f"{i}-{os.path.basename(path)}")
                with open(target, "x") as f:
                    f.write(text)
                moved[path] = target
        base = {k: v for k, v in os.environ.items() if not k.startswith(("TT_", "TTMESH_"))}
        envs = []
        for rank in plan.ranks:
            env = {"TT_LOGGER_LEVEL": "error", "LOGURU_LEVEL": "INFO", STAGES: "1"}
            for key in KEYS:
                if key in rank.env:
                    env[key] = moved.get(rank.env[key], rank.env[key])
            envs.append((rank.rank, env))
        if Layout(plan.layout).one_world and len(plan.ranks) > 1:
            # One tt-metal world over several processes forms over MPI, as the job's will:
            # one MPMD mpirun, each rank with its own files (as launcher.nodes.mpi starts the job).
            from ttmesh.launcher.nodes.mpi import find_mpirun

            argv = [find_mpirun(plan.mpirun or None), "--bind-to", "none", "--oversubscribe"]
            if os.geteuid() == 0:
                argv.append("--allow-run-as-root")
            for i, (_rank, env) in enumerate(envs):
                argv += [":"] if i else []
                argv += ["-np", "1", *(a for k, v in env.items() for a in ("-x", f"{k}={v}"))]
                argv += [python, str(PROBE)]
            pending.spawn(-1, argv, base)
        else:
            for rank_no, env in envs:
                pending.spawn(rank_no, [python, str(PROBE)], {**base, **env})
    except OSError as exc:
        pending.close()
        raise bad_input(f"{ENV}={python}: cannot run it: {exc.strerror}", HOW) from None
    except BaseException:
        pending.close()
        raise
    return pending


def check(plan: LaunchPlan) -> tuple[Pending | None, str]:
    """Start the check for ``plan``, or say why it is skipped: (pending or None, the reason)."""
    python = configured()
    if python is None:
        return None, f"no ttnn Python configured: {HOW} to have tt-metal check the mesh"
    why = skip_reason(plan)
    if why is not None:
        return None, why
    return start(plan, python), ""


__all__ = ["ENV", "NAME", "Pending", "TTMeshError", "check", "configured", "skip_reason"]
