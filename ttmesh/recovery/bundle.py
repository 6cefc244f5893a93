"""A support bundle (``ttmesh doctor --bundle FILE``): the host's capture, and what someone
helping needs besides: the versions of ttmesh and of the stack it finds, the ``TT_*``,
``TTMESH_*`` and ``LIBTT_*`` variables, this user's job records and the last bytes of each
job's output. Secrets are redacted (:mod:`ttmesh.recovery.redact`); what could not be
collected is said in the manifest, with why; the whole is bounded.

The archive is a capture (``ttmesh sim create --from-capture`` rebuilds the host from it) with
one more directory::

    bundle/manifest.json         ttmesh.bundle/1: what is in it, what is not and why, sizes
    bundle/versions.json         each Python found: its packages' versions (dist-info only:
                                 nothing is imported), and tt-smi's
    bundle/environment.json      TT_*, TTMESH_*, LIBTT_* (redacted), Python, platform
    bundle/jobs/<job>.json       each job record kept (ttmesh ps --all), redacted
    bundle/logs/<job>/attempt_<N>/<owner>/<stream>.log   the last TAIL bytes of each stream
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from ttmesh import __version__
from ttmesh.host.base import Host
from ttmesh.recovery import capture, redact

SCHEMA = "ttmesh.bundle/1"
DIR = "bundle"
MAX_EXTRA = 16 << 20  # bytes the bundle adds to the capture (uncompressed)
TAIL = 64 << 10  # bytes kept of the end of each stream of a job
JOBS = 20  # the last jobs (running first, then ended, newest first)
PACKAGES = (
    "ttmesh", "tt-smi", "tt-umd", "tt-flash", "pyluwen", "ttnn", "torch", "torch_tpu",
    "jax-tt-plugin", "jax", "jaxlib", "sglang", "sglang-router", "sgl-jax", "vllm",
    "tt-inference-server",
)  # fmt: skip
PREFIXES = ("TT_", "TTMESH_", "LIBTT_")
PROBE_TIMEOUT = 15.0
PROBE_OUTPUT = 64 << 10
# Run in another Python, isolated (-I: no environment variables, no user site, not the current
# directory): the versions of what it has installed, from its dist-info, importing nothing.
PROBE = """
import importlib.metadata as m, json, sys
out = {}
for name in sys.argv[1:]:
    try:
        out[name] = m.version(name)
    except Exception:
        out[name] = None
print(json.dumps({"python": sys.executable, "version": sys.version.split()[0], "packages": out}))
"""


class Bundle:
    """What the bundle adds to a capture, bounded and redacted as it goes."""

    def __init__(self, cap: capture.Capture) -> None:
        self.cap = cap
        self.used = 0
        self.redacted = 0
        self.missed: list[dict[str, str]] = []
        self.sections: dict[str, dict[str, Any]] = {}

    def add(self, name: str, data: bytes) -> bool:
        """One member under ``bundle/``, if the bound still has room (else said, False)."""
        if self.used + len(data) > MAX_EXTRA:
            self.miss(name, f"the bundle's {MAX_EXTRA >> 20} MiB bound was reached")
            return False
        self.cap.files[f"{DIR}/{name}"] = data
        self.used += len(data)
        return True

    def add_json(self, name: str, value: Any) -> bool:
        clean, n = redact.document(value)
        self.redacted += n
        return self.add(name, (json.dumps(clean, indent=1, default=str) + "\n").encode())

    def miss(self, what: str, why: str) -> None:
        self.missed.append({"what": what, "why": why})

    def section(self, name: str, fn: Callable[[], dict[str, Any]]) -> None:
        """One part; its failure is said in the manifest, never fatal."""
        try:
            self.sections[name] = {"ok": True, **fn()}
        except Exception as exc:
            if os.environ.get("TTMESH_DEBUG"):
                raise
            why = f"{type(exc).__name__}: {exc}".splitlines()[0]
            self.miss(name, why)
            self.sections[name] = {"ok": False, "why": why}


def collect(
    host: Host, tt_smi: str | None = None, environ: dict[str, str] | None = None
) -> capture.Capture:
    """The host's capture, then the bundle's parts (changes nothing on the host)."""
    env = dict(os.environ if environ is None else environ)
    cap = capture.collect(host, tt_smi)
    b = Bundle(cap)
    b.section("redaction of the capture", lambda: _redact_capture(b))
    b.section("versions", lambda: _versions(b, env))
    b.section("environment", lambda: _environment(b, env))
    b.section("jobs", lambda: _jobs(b))
    manifest = {
        "schema": SCHEMA,
        "ttmesh": __version__,
        "capture": capture.MANIFEST,
        "sections": b.sections,
        "contents": sorted(k for k in cap.files if k.startswith(f"{DIR}/")),
        "not_collected": b.missed,
        "bytes": b.used,
        "limit": MAX_EXTRA,
        "redacted": b.redacted,
    }
    cap.files[f"{DIR}/manifest.json"] = (json.dumps(manifest, indent=1) + "\n").encode()
    return cap


def _redact_capture(b: Bundle) -> dict[str, Any]:
    """The capture's own members that quote processes' command lines (holders in ls and
    check, tt-umd's lock owners, tt-smi, kernel messages): redacted like the rest. The
    driver's files under host/ are the driver's, and stay as read (a rebuild needs them)."""
    count = 0
    for name, raw in list(b.cap.files.items()):
        if name.startswith(f"{capture.HOST_DIR}/"):
            continue
        if name.endswith(".json"):
            try:
                doc = json.loads(raw)
            except ValueError:
                doc = None
            if doc is not None:
                clean, n = redact.document(doc)
                if n:
                    b.cap.files[name] = (json.dumps(clean, indent=1) + "\n").encode()
                count += n
                continue
        new, n = redact.data(raw)
        if n:
            b.cap.files[name] = new
        count += n
    manifest, n = redact.document(b.cap.manifest)
    b.cap.manifest = {**manifest, "redacted": count + n}  # it says the capture was redacted
    b.redacted += count + n
    return {"secrets": count}


def _versions(b: Bundle, env: dict[str, str]) -> dict[str, Any]:
    """Each Python's packages of the stack (ttmesh's own, python3 on PATH, the one
    TTMESH_TTNN_PYTHON names), read from their dist-info; tt-smi's path and version."""
    pythons: list[dict[str, Any]] = [_own_versions()]
    seen = {os.path.realpath(sys.executable)}
    others = [("python3 on PATH", shutil.which("python3", path=env.get("PATH")))]
    others.append(("TTMESH_TTNN_PYTHON", env.get("TTMESH_TTNN_PYTHON")))
    for label, path in others:
        if not path:
            continue
        real = os.path.realpath(path)
        if real in seen:
            continue
        seen.add(real)
        try:
            found = _probe(path)
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            b.miss(f"versions in {path} ({label})", str(exc).splitlines()[0] or type(exc).__name__)
            continue
        found["found_as"] = label
        pythons.append(found)
    b.add_json("versions.json", {"pythons": pythons})
    own = pythons[0]["packages"]
    return {"pythons": len(pythons), "ttmesh": own.get("ttmesh"), "tt-smi": own.get("tt-smi")}


def _own_versions() -> dict[str, Any]:
    import importlib.metadata as meta

    packages: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            packages[name] = meta.version(name)
        except Exception:
            packages[name] = None
    packages["ttmesh"] = packages["ttmesh"] or __version__
    return {
        "python": sys.executable,
        "version": platform.python_version(),
        "packages": packages,
        "found_as": "ttmesh's own",
    }


def _probe(python: str) -> dict[str, Any]:
    """Another interpreter's versions (isolated, bounded in time and output)."""
    proc = subprocess.run(
        [python, "-I", "-c", PROBE, *PACKAGES],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=PROBE_TIMEOUT,
        env={"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"},
        check=False,
    )
    if proc.returncode != 0:
        raise ValueError(f"exit {proc.returncode}: {proc.stderr[-300:].decode(errors='replace')}")
    found = json.loads(proc.stdout[:PROBE_OUTPUT])
    if not isinstance(found, dict) or not isinstance(found.get("packages"), dict):
        raise ValueError("it printed no versions")
    return {
        "python": str(found.get("python")),
        "version": str(found.get("version")),
        "packages": {
            str(k): v if isinstance(v, str) else None for k, v in found["packages"].items()
        },
    }


def _environment(b: Bundle, env: dict[str, str]) -> dict[str, Any]:
    """TT_*, TTMESH_*, LIBTT_* as this process sees them, redacted; the Python and platform."""
    shown: dict[str, str] = {}
    for name in sorted(env):
        if name.startswith(PREFIXES):
            value, n = redact.variable(name, env[name][:4096])
            shown[name] = value
            b.redacted += n
    b.add(
        "environment.json",
        (json.dumps({
            "variables": shown,
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "machine": platform.machine(),
        }, indent=1) + "\n").encode(),
    )  # fmt: skip
    return {"variables": len(shown)}


def _jobs(b: Bundle) -> dict[str, Any]:
    """This user's job records (running first, then the newest ended) and the last bytes of
    each of their streams, redacted."""
    from ttmesh.runtime import jobs, logread

    records = jobs.every()
    records.sort(
        key=lambda r: (bool(r.get("ended")), -float(r.get("ended") or r.get("started") or 0))
    )
    taken = records[:JOBS]
    if len(records) > JOBS:
        b.miss(f"{len(records) - JOBS} older job records", f"a bundle takes the last {JOBS}")
    streams = 0
    for r in taken:
        job = str(r.get("job"))
        if not b.add_json(f"jobs/{job}.json", r):
            break
        for where, data in logread.tail_bytes(job, TAIL).items():
            clean, n = redact.data(data)
            b.redacted += n
            if not b.add(f"logs/{job}/{where}.log", clean):
                return {"records": len(taken), "streams": streams}
            streams += 1
    return {"records": len(taken), "streams": streams}
