"""Serving profiles: each stack as data (``ttmesh/configs/profiles/*.yaml``).

A profile says how its stack is recognised (the module or entry point run, a flag's value, an
environment variable), its process model, how chips are passed, the environment it needs, its
flag rules (:mod:`.rules`), how readiness is known, how it stops, what it leaves behind and the
failure lines it is known for. ``ttmesh profiles`` lists them; ``--profile NAME`` picks one.

Each profile reads its server's command with the server's whole flag table (:mod:`.flags`):
``<name>.flags.json`` beside it, or the table ``flags:`` names (a stock table by name, or a file
beside the profile). Every flag the profile reads (its rules, its chip-count flag, ``--host``,
``--port``, the memory budget's, the flags it is recognised by) must be in that table: a profile
that reads a flag the server does not have is refused when its table is loaded.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ttmesh import numeric
from ttmesh.dataclass import dataclass, field
from ttmesh.errors import TTMeshError, bad_input
from ttmesh.launcher.serving.args import ServerArgs

if TYPE_CHECKING:
    from ttmesh.fabric.syscheck import Requirements
    from ttmesh.launcher.serving.flags import Table

# How chips reach the server (``chips:`` in a profile).
CHIPS_NONE = "none"  # the stack does not run on Tenstorrent chips here (stock SGLang on a CPU)
CHIPS_PASS = "pass"  # TT_VISIBLE_DEVICES and a descriptor of the chips
CHIPS_LIBTT = "libtt"  # the whole host: leave both unset, libtt assigns them; a part: pass them
CHIPS_MESH_DEVICE = "mesh-device"  # vLLM's plugin: MESH_DEVICE names the system or the shape
# The flags the memory budget reads (``budget:`` in a profile names the server's own; null: none).
BUDGET_FLAGS = {
    "fraction": "--mem-fraction-static",
    "tokens": "--max-total-tokens",
    "dtype": "--dtype",
    "kv_dtype": "--kv-cache-dtype",
}
SERVER_FLAGS = ("--host", "--port")  # where it answers: every profile reads them


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
    flags: str = ""  # the flag table's path
    budget: dict[str, str | None] = field(default_factory=lambda: dict(BUDGET_FLAGS))
    # The server's own host flags (SGLang's --nnodes and --node-rank), checked against the job.
    nnodes_flag: str | None = None
    node_rank_flag: str | None = None
    # What it needs of the host's system software (``system:``: min_kmd, min_fw_bundle,
    # hugepages_per_chip), checked by `ttmesh check --profile` and launch pre-flight.
    system: Requirements | None = None
    # Why its own stop leaves the chips to reset (``stop.teardown``): a stop the user asked for
    # then reads as one, the reset after it as an expected step.
    teardown: str = ""
    # The hung-but-healthy probe (``probe:``): a one-token generation, its path, its body (a
    # JSON object) and the seconds it may take (launch --probe-interval turns it on).
    probe: dict[str, Any] = field(default_factory=dict)
    # Its start as a checklist (``checklist:``, as written: compiled and checked by
    # :meth:`steps` when the profile is chosen, so a launch of another command pays nothing).
    checklist_data: Any = None

    def matches(self, args: ServerArgs, environ: dict[str, str]) -> bool:
        """Every ``recognise`` entry holds (``any``: at least one of its entries)."""
        return _holds(self.recognise, args, environ, self)

    def default(self, flag: str) -> str | None:
        return self.defaults.get(flag)

    def steps(self) -> tuple[Any, ...]:
        """Its start's checklist (``launcher.serving.checklist.Step``), compiled once; a bad
        one is refused naming the profile and the step."""
        key = f"{self.path}\0{self.name}"
        if key not in _STEPS:
            from ttmesh.launcher.serving import checklist

            _STEPS[key] = checklist.load(self.checklist_data, f"profile {self.path or self.name}")
        return _STEPS[key]

    @property
    def chipless(self) -> bool:
        """The stack drives no Tenstorrent chip (stock SGLang on a CPU or GPU): its plan has no
        chips, leases, pre-flight or recovery (``launcher.planning.prepare.chipless``)."""
        return self.chips == CHIPS_NONE

    def table(self) -> Table:
        """The server's flag table, checked against every flag this profile reads."""
        from ttmesh.launcher.serving import flags

        if not self.flags:
            raise bad_input(
                f"profile {self.path or self.name}: no flag table",
                "name one with flags: (a stock table: sglang, sglang-jax, ...) or generate "
                "it beside the profile: python scripts/gen_flags.py (docs/serving.md)",
            )
        table = flags.load(Path(self.flags), f"profile {self.name}: flag table")
        key = f"{self.flags}\0{self.path}\0{self.name}"
        if key not in _CHECKED:  # once per process: a profile's reads do not change
            _check(self, table)
            _CHECKED.add(key)
        return table

    def read(self, args: ServerArgs, cwd: str | None = None) -> ServerArgs:
        """``args`` read as the server's parser reads them; a command it refuses is refused
        here with its own complaint (exit 2), before anything starts."""
        from ttmesh.launcher.serving import flags

        table = self.table()
        try:
            return args.read_with(table, cwd)
        except flags.ParseError as exc:  # it quotes the user's words: escaped, one line
            from ttmesh.render import clip, printable

            raise bad_input(
                f"{self.name}: the server refuses its command: {clip(printable(str(exc)), 300)}",
                f"fix its flags; ttmesh reads them with the flag table of {table.server}, "
                "as its parser does; --profile none runs the command unread",
            ) from None

    def reads(self) -> list[tuple[str, str, bool]]:
        """Every flag this profile reads: (who reads it, the flag, read as a number)."""
        out = [(f"rule {rid}", flag, numeric) for rid, flag, numeric in _rules_read(self)]
        if self.tp_flag:
            out.append(("tp_flag", self.tp_flag, True))
        if self.nnodes_flag:
            out.append(("nnodes_flag", self.nnodes_flag, True))
        if self.node_rank_flag:
            out.append(("node_rank_flag", self.node_rank_flag, True))
        out += [("the server's address", flag, flag == "--port") for flag in SERVER_FLAGS]
        out += [("recognise", flag, False) for flag in _recognise_flags(self.recognise)]
        model_flag = (self.extra.get("host_memory") or {}).get("model_flag")
        if model_flag:
            out.append(("host_memory.model_flag", model_flag, False))
        if self.chips != CHIPS_NONE:
            for key, flag in self.budget.items():
                if flag:
                    out.append((f"the memory budget ({key})", flag, key in ("fraction", "tokens")))
        return out


_CHECKED: set[str] = set()
_STEPS: dict[str, tuple[Any, ...]] = {}


def _rules_read(profile: Profile) -> list[tuple[str, str, bool]]:
    from ttmesh.launcher.serving import rules

    return rules.flags_read(list(profile.rules))


def _recognise_flags(spec: dict[str, Any]) -> list[str]:
    out = list((spec.get("flag") or {}).keys())
    for alt in spec.get("any") or []:
        out += _recognise_flags(alt)
    return out


def _check(profile: Profile, table: Table) -> None:
    """A flag the profile reads that the server's table lacks, or reads as a number where the
    server does not convert one, is refused (a profile must never guess what the server read)."""
    hint = (
        "the profile names a flag its server does not have: fix the profile, or regenerate the "
        "table from the server's parser (python scripts/gen_flags.py)"
    )
    for who, option, as_number in profile.reads():
        flag = table.flag(option)
        where = f"profile {profile.path or profile.name}: {who} reads {option}"
        if flag is None:
            raise bad_input(f"{where}, which {table.server}'s parser has no flag for", hint)
        if as_number and not flag.numeric:
            raise bad_input(
                f"{where} as a number, but {table.server}'s parser reads it as "
                f"{flag.type or 'text'} ({flag.kind})",
                hint,
            )
        if not flag.typed:
            raise bad_input(
                f"{where}, which {table.server}'s parser converts with {flag.type}, a function "
                "ttmesh does not know",
                "read another flag, or teach ttmesh.launcher.serving.flags.TYPES its conversion",
            )


def _holds(
    spec: dict[str, Any], args: ServerArgs, environ: dict[str, str], profile: Profile
) -> bool:
    for key, want in spec.items():
        if key == "program":
            options = want if isinstance(want, list) else [want]
            if args.program not in options:
                return False
        elif key == "flag":
            for flag, value in want.items():
                if (_peek(profile, args, flag) or "").lower() != str(value).lower():
                    return False
        elif key == "env":
            for name, value in want.items():
                if environ.get(name) != str(value):
                    return False
        elif key == "any":  # what needs no parse first (a flag's value needs the table's)
            ordered = sorted(want, key=lambda alt: "flag" in alt)
            if not any(_holds(alt, args, environ, profile) for alt in ordered):
                return False
        else:
            raise ValueError(f"unknown recognise key {key!r}")
    return True


def _peek(profile: Profile, args: ServerArgs, flag: str) -> str | None:
    """``flag``'s value as the profile's server reads it; for a command that server refuses (the
    refusal comes later, if this profile is chosen), the last exact ``flag VALUE`` or
    ``flag=VALUE``."""
    from ttmesh.launcher.serving import flags

    try:
        return profile.read(args).text(flag)
    except (TTMeshError, flags.ParseError):
        values = args.plain().get(flag)
        return values[0] if values else None


MAX_BYTES = 1024 * 1024  # a profile is a few KiB


def profiles_dir() -> Path:
    return Path(__file__).resolve().parent.parent.parent / "configs" / "profiles"


def _load(path: Path) -> Profile:
    from ttmesh import yamlio
    from ttmesh.fabric import syscheck

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
            teardown=" ".join(str(stop.get("teardown") or "").split()),
            checklist_data=data.get("checklist"),
            probe=_probe(path, data.get("probe")),
            critical=tuple(str(c) for c in data.get("critical") or ()),
            leftovers=tuple(str(c) for c in data.get("leftovers") or ()),
            rules=tuple(data.get("rules") or ()),
            request=str(data.get("request", "")),
            notes=tuple(str(n) for n in data.get("notes") or ()),
            part_note=str(data.get("part_note", "")),
            path=str(path),
            extra={
                k: v
                for k, v in data.items()
                if k in ("mesh_device", "failures", "replicas", "ports")
            }
            | _fleet_sections(path, data),
            flags=_table_path(path, data.get("flags")),
            budget=_budget(data.get("budget")),
            nnodes_flag=data.get("nnodes_flag"),
            node_rank_flag=data.get("node_rank_flag"),
            system=syscheck.requirements(data.get("system"), where, f"profile {data['name']}"),
        )
    except TTMeshError as exc:  # a bad value: named by its key, with the range to give
        raise bad_input(exc.message, f"{exc.hint}; compare with a stock profile")
    except (KeyError, TypeError, ValueError) as exc:
        raise bad_input(f"profile {path}: malformed ({exc})", "compare with a stock profile")


def _fleet_sections(path: Path, data: dict[str, Any]) -> dict[str, Any]:
    """A fleet's sections (``launch --replicas``), checked as the rest of the profile is: a
    value of the wrong type is one line naming the file and the key.

    ``router: {args: [ARG, ...]}``: words given to SGLang's router before ``--router-arg``'s
    (read with the router's own parser when the fleet is planned: ``fleet.routeropts``).
    ``host_memory: {model_flag: FLAG, starting: X, serving: Y}``: a replica's host memory as
    multiples of its model's weight files on disk (``fleet.memory``)."""
    out: dict[str, Any] = {}
    router = data.get("router")
    if router is not None:
        if not isinstance(router, dict) or set(router) - {"args"}:
            raise bad_input(
                f"profile {path}: router must be a map with args: [ARG, ...]",
                "e.g. router: {args: [--policy, cache_aware]}",
            )
        args = router.get("args") or []
        if not isinstance(args, list) or not all(
            isinstance(a, (str, int, float)) and not isinstance(a, bool) for a in args
        ):
            raise bad_input(
                f"profile {path}: router.args must be a list of words (the router's flags "
                f"and values), not {_shown(args)}",
                "e.g. router: {args: [--policy, cache_aware]}",
            )
        out["router"] = {"args": [str(a) for a in args]}
    memory = data.get("host_memory")
    if memory is not None:
        keys = {"model_flag", "starting", "serving"}
        if not isinstance(memory, dict) or set(memory) - keys:
            raise bad_input(
                f"profile {path}: host_memory must be a map of {', '.join(sorted(keys))}",
                "e.g. host_memory: {model_flag: --model-path, starting: 1.25, serving: 1.0}",
            )
        flag = memory.get("model_flag")
        if flag is not None and not (isinstance(flag, str) and flag.startswith("-")):
            raise bad_input(
                f"profile {path}: host_memory.model_flag must be the server's flag that names "
                f"the model, not {_shown(flag)}",
                "e.g. model_flag: --model-path",
            )
        where = f"profile {path}: host_memory"
        out["host_memory"] = {
            "model_flag": flag,
            "starting": numeric.number(
                memory.get("starting", 1.25), f"{where}.starting", low=0, high=1000
            ),
            "serving": numeric.number(
                memory.get("serving", 1.0), f"{where}.serving", low=0, high=1000
            ),
        }
    return out


MAX_PROBE_BODY = 4096  # bytes of a probe's request body


def _probe(path: Path, raw: Any) -> dict[str, Any]:
    """A profile's ``probe: {path, body, timeout}``: a one-token generation that tells a hung
    server from a healthy one (its /health may answer while its device hangs)."""
    import json

    if raw is None:
        return {}
    where = f"profile {path}: probe"
    hint = 'e.g. probe: {path: /generate, body: \'{"text": "ping", "sampling_params": {"max_new_tokens": 1}}\', timeout: 60}'
    if not isinstance(raw, dict) or set(raw) - {"path", "body", "timeout"}:
        raise bad_input(f"{where} must be a map of path, body and timeout", hint)
    route = raw.get("path")
    if (
        not isinstance(route, str)
        or not route.startswith("/")
        or len(route) > 200
        or any(c.isspace() or not c.isprintable() for c in route)
    ):
        raise bad_input(f"{where}.path must be the server's path, e.g. /generate", hint)
    body = raw.get("body")
    try:
        parsed = json.loads(body) if isinstance(body, str) else None
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict) or len(str(body).encode()) > MAX_PROBE_BODY:
        raise bad_input(
            f"{where}.body must be a JSON object of at most {MAX_PROBE_BODY} bytes", hint
        )
    timeout = numeric.seconds(raw.get("timeout", 60), f"{where}.timeout", zero=False)
    return {"path": route, "body": body, "timeout": float(timeout)}


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _table_path(path: Path, name: Any) -> str:
    """The profile's flag table: ``flags: NAME`` (a stock table), ``flags: FILE.json`` (beside the
    profile), else ``<profile file's name>.flags.json`` beside it."""
    if name is None:
        return str(path.with_name(f"{path.stem}.flags.json"))
    name = str(name)
    if name.endswith(".json"):
        return str(path.parent / name)
    if "/" in name or not name:
        raise ValueError(f"flags: {name!r} is neither a stock table's name nor a .json file")
    return str(profiles_dir() / f"{name}.flags.json")


def _budget(raw: Any) -> dict[str, str | None]:
    if raw is None:
        return dict(BUDGET_FLAGS)
    if not isinstance(raw, dict) or set(raw) - set(BUDGET_FLAGS):
        raise ValueError(f"budget: a map of {', '.join(BUDGET_FLAGS)} to the server's flags")
    return {
        k: (str(raw[k]) if raw[k] else None) if k in raw else v for k, v in BUDGET_FLAGS.items()
    }


def _env(path: Path, raw: Any) -> dict[str, str]:
    """A profile's ``env``: it may not set what ttmesh sets for every rank (``--env`` may not
    either): a server given another job's chips, or TTMESH_JOB_ID, breaks the lease."""
    from ttmesh.launcher.planning.rankenv import owner_flag

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


def profile_paths() -> list[Path]:
    """Every profile's file: the stock ones, then ``TTMESH_PROFILES``'s."""
    paths = sorted(profiles_dir().glob("*.yaml"))
    extra = user_dir()
    if extra is not None:
        paths += sorted(extra.glob("*.yaml"))
    return paths


def kind_of(path: Path) -> str:
    """A profile's ``kind``: ``server`` (the default: a serving stack, this module's) or
    ``program`` (plain programs on a known stack: ``launcher.planning.programs``)."""
    from ttmesh import yamlio

    try:
        data = yamlio.load_cached(path, "profile", MAX_BYTES)  # (cached: _load reads it again)
    except TTMeshError as exc:
        raise bad_input(exc.message, f"{exc.hint}; compare with a stock profile") from None
    except (KeyError, TypeError, ValueError) as exc:
        raise bad_input(f"profile {path}: malformed ({exc})", "compare with a stock profile")
    kind = data.get("kind", "server") if isinstance(data, dict) else "server"
    if kind not in ("server", "program"):
        raise bad_input(f"profile {path}: kind {kind!r}", "use kind: server or kind: program")
    return str(kind)


def every() -> list[Profile]:
    """Every serving profile, the most specific (highest priority) first."""
    paths = [p for p in profile_paths() if kind_of(p) == "server"]
    return sorted((_load(p) for p in paths), key=lambda p: -p.priority)


def named(name: str, programs: tuple[str, ...] = ()) -> Profile | None:
    """The serving profile ``name``; None when it is one of ``programs`` (the program profiles'
    names: ``launcher.planning.programs``); no profile of either kind is one line naming all."""
    found = {p.name: p for p in every()}
    if name in found:
        return found[name]
    if name in programs:
        return None
    raise bad_input(
        f"--profile {name}: no such profile", "profiles: " + ", ".join([*found, *programs, "none"])
    )


def recognise(args: ServerArgs, environ: dict[str, str]) -> Profile | None:
    """The profile whose stack this command runs, if any."""
    return next((p for p in every() if p.matches(args, environ)), None)
