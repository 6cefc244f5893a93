"""Serving profiles: each stack as data (``ttmesh/configs/profiles/*.yaml``).

A profile says how its stack is recognised (the module or entry point run, a flag's value, an
environment variable), its process model, how chips are passed, the environment it needs, its
flag rules (:mod:`.rules`), how readiness is known, how it stops, what it leaves behind and the
failure lines it is known for. ``ttmesh profiles`` lists them; ``--profile NAME`` picks one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ttmesh import numeric
from ttmesh.errors import TTMeshError, bad_input
from ttmesh.launcher.serving.args import ServerArgs

# How chips reach the server (``chips:`` in a profile).
CHIPS_NONE = "none"  # the stack does not run on Tenstorrent chips here (stock SGLang on a CPU)
CHIPS_PASS = "pass"  # TT_VISIBLE_DEVICES and a descriptor of the chips
CHIPS_LIBTT = "libtt"  # the whole host: leave both unset, libtt assigns them; a part: pass them
CHIPS_MESH_DEVICE = "mesh-device"  # vLLM's plugin: MESH_DEVICE names the system or the shape


@dataclass(frozen=True)
class Profile:
    """A serving stack: how it is recognised, started, made ready and stopped."""

    name: str
    title: str
    source: str
    recognise: dict[str, Any]
    priority: int
    chips: str
    tp_flag: str | None
    env: dict[str, str]
    defaults: dict[str, str]
    ready_path: str | None
    ready_timeout: float
    phases: dict[str, str]
    grace: float
    critical: tuple[str, ...]
    leftovers: tuple[str, ...]
    rules: tuple[dict[str, Any], ...]
    request: str
    notes: tuple[str, ...] = ()
    part_note: str = ""
    path: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def matches(self, args: ServerArgs, environ: dict[str, str]) -> bool:
        """Every ``recognise`` entry holds (``any``: at least one of its entries)."""
        return _holds(self.recognise, args, environ)

    def default(self, flag: str) -> str | None:
        return self.defaults.get(flag)

    @property
    def chipless(self) -> bool:
        """The stack drives no Tenstorrent chip (stock SGLang on a CPU or GPU): its plan has no
        chips, leases, pre-flight or recovery (``launcher.launch.chipless``)."""
        return self.chips == CHIPS_NONE


def _holds(spec: dict[str, Any], args: ServerArgs, environ: dict[str, str]) -> bool:
    for key, want in spec.items():
        if key == "program":
            options = want if isinstance(want, list) else [want]
            if args.program not in options:
                return False
        elif key == "flag":
            for flag, value in want.items():
                if (args.value(flag) or "").lower() != str(value).lower():
                    return False
        elif key == "env":
            for name, value in want.items():
                if environ.get(name) != str(value):
                    return False
        elif key == "any":
            if not any(_holds(alt, args, environ) for alt in want):
                return False
        else:
            raise ValueError(f"unknown recognise key {key!r}")
    return True


MAX_BYTES = 1024 * 1024  # a profile is a few KiB


def profiles_dir() -> Path:
    return Path(__file__).resolve().parent.parent.parent / "configs" / "profiles"


def _load(path: Path) -> Profile:
    from ttmesh import yamlio

    try:
        data = yamlio.load_cached(path, "profile", MAX_BYTES)  # every launch recognises servers
        if not isinstance(data, dict):
            raise ValueError("not a map")
        ready = data.get("ready") or {}
        stop = data.get("stop") or {}
        if not isinstance(ready, dict) or not isinstance(stop, dict):
            raise ValueError("ready and stop must be maps")
        where = f"profile {path}:"
        return Profile(
            name=str(data["name"]),
            title=str(data.get("title", "")),
            source=str(data.get("source", "")),
            recognise=dict(data["recognise"]),
            priority=numeric.whole(
                data.get("priority", 0), f"{where} priority", low=-1000, high=1000
            ),
            chips=str(data.get("chips", CHIPS_PASS)),
            tp_flag=data.get("tp_flag"),
            env=_env(path, data.get("env") or {}),
            defaults={str(k): str(v) for k, v in (data.get("defaults") or {}).items()},
            ready_path=ready.get("http"),
            ready_timeout=numeric.seconds(
                ready.get("timeout", 1800), f"{where} ready.timeout", zero=False
            ),
            phases={str(k): str(v) for k, v in (ready.get("phases") or {}).items()},
            grace=numeric.seconds(stop.get("grace", 30), f"{where} stop.grace"),
            critical=tuple(str(c) for c in data.get("critical") or ()),
            leftovers=tuple(str(c) for c in data.get("leftovers") or ()),
            rules=tuple(data.get("rules") or ()),
            request=str(data.get("request", "")),
            notes=tuple(str(n) for n in data.get("notes") or ()),
            part_note=str(data.get("part_note", "")),
            path=str(path),
            extra={k: v for k, v in data.items() if k in ("mesh_device", "failures")},
        )
    except TTMeshError as exc:  # a bad value: named by its key, with the range to give
        raise bad_input(exc.message, f"{exc.hint}; compare with a stock profile")
    except (KeyError, TypeError, ValueError) as exc:
        raise bad_input(f"profile {path}: malformed ({exc})", "compare with a stock profile")


def _env(path: Path, raw: Any) -> dict[str, str]:
    """A profile's ``env``: it may not set what ttmesh sets for every rank (``--env`` may not
    either): a server given another job's chips, or TTMESH_JOB_ID, breaks the lease."""
    from ttmesh.launcher.plan import owner_flag

    if not isinstance(raw, dict):
        raise bad_input(f"profile {path}: env must be a map", "compare with a stock profile")
    for key in raw:
        flag = owner_flag(str(key))
        if flag is not None:
            hint = f"drop it: use {flag} instead" if flag.startswith("--") else f"drop it: {flag}"
            raise bad_input(f"profile {path}: env sets {key}, which ttmesh sets", hint)
    return {str(k): str(v) for k, v in raw.items()}


def user_dir() -> Path | None:
    """``TTMESH_PROFILES``, a directory of your own profiles (None when unset or empty); one
    that is missing, not a directory or unreadable is refused, never silently ignored."""
    from ttmesh.errors import from_os_error

    extra = os.environ.get("TTMESH_PROFILES", "")
    if not extra:
        return None
    path = Path(extra)
    hint = "point TTMESH_PROFILES at a directory of profiles (*.yaml), or unset it"
    if not path.exists():
        raise bad_input(f"TTMESH_PROFILES {extra} does not exist", hint)
    if not path.is_dir():
        raise bad_input(f"TTMESH_PROFILES {extra} is not a directory", hint)
    try:
        os.listdir(path)
    except OSError as exc:
        raise from_os_error(exc, "read TTMESH_PROFILES")
    return path


def every() -> list[Profile]:
    """Every profile, the most specific (highest priority) first."""
    paths = sorted(profiles_dir().glob("*.yaml"))
    extra = user_dir()
    if extra is not None:
        paths += sorted(extra.glob("*.yaml"))
    return sorted((_load(p) for p in paths), key=lambda p: -p.priority)


def named(name: str) -> Profile:
    found = {p.name: p for p in every()}
    if name not in found:
        raise bad_input(f"--profile {name}: no such profile", "profiles: " + ", ".join(found))
    return found[name]


def recognise(args: ServerArgs, environ: dict[str, str]) -> Profile | None:
    """The profile whose stack this command runs, if any."""
    return next((p for p in every() if p.matches(args, environ)), None)
