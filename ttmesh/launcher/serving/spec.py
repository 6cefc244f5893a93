"""A server as a plan: which profile, how many chips, which environment, its rules' verdict,
where it answers and the memory budget. Pure: reads the command, the environment and (for the
budget) a local ``config.json``; changes nothing.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ttmesh import addresses, numeric
from ttmesh.dataclass import dataclass, field
from ttmesh.launcher.serving import rules
from ttmesh.launcher.serving.args import ServerArgs
from ttmesh.launcher.serving.profiles import (
    CHIPS_LIBTT,
    CHIPS_MESH_DEVICE,
    CHIPS_NONE,
    Profile,
)
from ttmesh.mesh import memory
from ttmesh.render import plural

MODEL_CONFIG = 16 * 1024 * 1024  # a model's config.json is KiB; anything larger is not one
_NO_ENV: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True)
class ServingSpec:
    """What ttmesh knows about the server it starts (``plan.serving`` in ``ttmesh.plan/1``).
    Built whole by planning (:func:`build`); a later word (a note) makes a new one."""

    profile: Profile
    args: ServerArgs
    findings: tuple[rules.Finding, ...] = ()
    notes: tuple[str, ...] = ()
    # What the profile adds (users' values won); read-only.
    env: Mapping[str, str] = field(default_factory=lambda: _NO_ENV)
    host: str = "127.0.0.1"  # where ttmesh asks it (its --host; 127.0.0.1 when that is "any")
    port: int = 30000
    bind_host: str = "127.0.0.1"  # where the server listens (its --host as given)
    budget: memory.Budget | None = None
    budget_note: str = ""
    ready_timeout: float = 1800.0
    health_interval: float | None = None
    health_failures: int = 3
    probe_interval: float | None = None  # a one-token generation every S s after ready (opt-in)
    probe_timeout: float = 60.0  # the seconds it may take: no answer is a hung server
    tp: int = 1  # the chips it drives; a chipless server: its own ranks (its --tp-size)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host  # an IPv6 address
        return f"http://{host}:{self.port}"

    @property
    def health_url(self) -> str | None:
        return self.url + self.profile.ready_path if self.profile.ready_path else None

    @property
    def chipless_what(self) -> str:
        """``sglang on --device cpu drives no Tenstorrent chip``: why a chipless server's plan
        has no chips (and why flags about chips are refused)."""
        device = self.args.value("--device")
        on = f" on --device {device}" if device else ""
        return f"{self.profile.name}{on} drives no Tenstorrent chip"

    @property
    def process_model(self) -> str:
        if self.profile.chipless:  # its ranks are its own processes, on its own device
            return f"one server process, no Tenstorrent chip ({plural(self.tp, 'rank')} of its own)"
        return "one server process for every chip"

    def errors(self, strict: bool) -> list[rules.Finding]:
        return [f for f in self.findings if f.severity == "error" or strict]

    def curl(self) -> str:
        path = "/v1/completions" if self.profile.name == "vllm-tt" else "/generate"
        body = self.profile.request.replace("'", "'\\''")
        return f"curl -sS {self.url}{path} -H 'Content-Type: application/json' -d '{body}'"

    def to_json(self) -> dict[str, Any]:
        return {
            "profile": self.profile.name,
            "title": self.profile.title,
            "process_model": self.process_model,
            "chips": self.profile.chips,
            "tp_size": self.tp,
            "program": self.args.program,
            "url": self.url,
            "health": self.health_url,
            "ready_timeout": self.ready_timeout,
            "grace": self.profile.grace,
            "findings": [f.to_json() for f in self.findings],
            "notes": list(self.notes),
            "memory": self.budget.to_json() if self.budget else None,
            "memory_note": self.budget_note or None,
            "flags": read_flags(self.args),
        }


def read_flags(args: ServerArgs) -> dict[str, Any] | None:
    """What ttmesh read of the server's command, and with which parser (``--dry-run``): every
    destination the command set, the flag (its first long spelling), the value the server
    stores, and each time it was given (the last one won)."""
    parsed = args.parsed
    if parsed is None:
        return None
    return {
        "parser": parsed.table.server,
        "table": parsed.table.path,
        "config": parsed.config,
        "help": parsed.help,
        "unread": list(parsed.extra),
        "read": [
            {
                "flag": r.flag.name,
                "option": r.option,
                "kind": r.flag.kind,
                "dest": dest,
                "value": r.value,
                "given": [" ".join((option, *words)) for option, words in r.times],
            }
            for dest, r in parsed.reads.items()
        ],
    }


def repeats(args: ServerArgs) -> list[str]:
    """A note for each flag given more than once with different values: the server takes the
    last (argparse), which is easy to miss in a long command."""
    if args.parsed is None:
        return []
    out = []
    for read in args.parsed.reads.values():
        given = [" ".join(words) for _, words in read.times]
        if (
            len(read.times) > 1
            and len(set(given)) > 1
            and read.flag.kind not in ("append", "extend", "count", "append_const")
        ):
            shown = ", ".join(f"{option} {' '.join(words)}".strip() for option, words in read.times)
            out.append(
                f"{read.flag.name} is given {len(read.times)} times ({shown}): the server takes the last"
            )
    return out


def server_tp(
    profile: Profile, args: ServerArgs, tp_size: int | None
) -> tuple[int | None, list[rules.Finding]]:
    """ttmesh's chip count, read from the server's own flag when ``--tp-size`` was not given;
    a disagreement between the two is an error."""
    flag = profile.tp_flag
    read = args.read(flag) if flag else None
    if flag is None or read is None:
        return tp_size, []
    # The value the server's parser took (the last given), spelled as ttmesh reads numbers: the
    # server's int() also takes "1_0" or " 4", which ttmesh refuses rather than guess at.
    theirs = read.words[-1] if read.words else read.value
    value = numeric.whole(
        theirs, read.option, low=1, high=numeric.MAX_CHIPS, unit="chips", example=f"{flag} 4"
    )
    if tp_size is not None and tp_size != value:
        finding = rules.Finding(
            "tp-size",
            "error",
            f"ttmesh's --tp-size {tp_size} and the server's {flag} {value} differ: the server "
            f"would drive {plural(value, 'chip')} of the {tp_size} leased",
            f"drop ttmesh's --tp-size (it is read from {flag}), or make them equal",
        )
        return tp_size, [finding]
    return value, []


def build(
    profile: Profile,
    args: ServerArgs,
    *,
    tp: int,
    environ: dict[str, str],
    user_env: dict[str, str],
    symmetric_mb: int,
    chip_mb: int | None,
    cwd: str,
    findings: list[rules.Finding] | None = None,
) -> ServingSpec:
    """The spec for ``tp`` chips; ``environ`` and ``user_env`` (``--env``) win over the profile."""
    profile.steps()  # its checklist, checked before anything starts
    mine = {**environ, **user_env}
    env: dict[str, str] = {}
    notes: list[str] = []
    for key, value in profile.env.items():
        theirs = mine.get(key)
        if theirs is None:
            env[key] = value
        elif theirs != value:
            notes.append(f"{key}={theirs} from your environment, not the profile's {value}")
    server_env = {**environ, **env, **user_env}
    ctx = rules.Context(args, profile.defaults, server_env, tp)
    found = list(findings or [])
    helps = args.parsed is not None and args.parsed.help
    if helps:  # the server reads no further than its help: nothing to check
        notes.append("the server prints its help and exits (-h/--help): no rule was checked")
    else:
        found += rules.check(list(profile.rules), ctx, profile.path or profile.name)
    notes += repeats(args)
    bind_host = args.text("--host") or profile.default("--host") or "127.0.0.1"
    if bind_host.strip():  # a host ttmesh checks, asks and names (the rule of every host)
        bind_host = addresses.host(bind_host, "the server's --host", brackets=False,
                                   example="--host 127.0.0.1")  # fmt: skip
    host = "127.0.0.1" if bind_host in ("0.0.0.0", "::", "") else bind_host  # everywhere: here
    read = args.read("--port")
    port = (read.words[-1] if read.words else read.value) if read else None
    where = read.option if read else f"profile {profile.path or profile.name}: defaults: --port"
    port = port if port is not None else profile.default("--port") or "30000"
    number = numeric.port(port, where, example="--port 30000")
    budget, budget_note = None, ""
    if not helps:
        budget, budget_note = _budget(args, ctx, tp, chip_mb, symmetric_mb, cwd, profile)
    if budget is not None:
        found += _budget_findings(budget, profile.budget.get("fraction"), tp)
    return ServingSpec(
        profile, args, findings=tuple(found), notes=tuple(notes), env=MappingProxyType(env),
        host=host, port=number, bind_host=bind_host,
        budget=budget, budget_note=budget_note, ready_timeout=profile.ready_timeout, tp=tp,
    )  # fmt: skip


def _budget_findings(b: memory.Budget, flag: str | None, tp: int) -> list[rules.Finding]:
    """The memory budget's verdict, each fix for this job's chips: weights that no chip holds,
    or that fill what the static fraction leaves (an error: the server fails once loaded), or
    a KV cache that does not fit beside them (a warning)."""
    chips = plural(tp, "chip")
    needs = "needs" if tp == 1 else "need"
    if not b.weights_fit:
        return [rules.Finding(
            "memory-weights", "error",
            f"the weights need {b.weights_gb:.1f} GB per chip on {chips}, more than a chip's "
            f"{b.chip_gb:.1f} GB less the {b.symmetric_gb:.1f} GB reserved",
            f"use more chips (--tp-size {b.chips_needed()} or more), or a smaller or quantized "
            "model",
        )]  # fmt: skip
    fraction = b.fraction_needed()
    held = "the weights, the reservation and " + f"{b.kv_gb:.2f} GB of KV cache"
    held = held if b.max_total_tokens else "the weights and the reservation"
    fix = f"{flag} {fraction:g} (what {chips} {needs} for {held})"
    if flag is None or fraction > 0.95:  # no flag to raise, or none high enough
        fix = f"use more chips (--tp-size {b.chips_needed()} or more)"
    said = f"{flag} {b.fraction:g}" if flag else f"a static fraction of {b.fraction:g}"
    if b.room_gb <= 0:
        return [rules.Finding(
            "memory-weights", "error",
            f"the weights need {b.weights_gb:.1f} GB per chip on {chips}, and the reservation "
            f"{b.symmetric_gb:.1f} GB: {said} leaves {b.static_gb:.1f} GB per chip, no room "
            "for a KV cache (the server fails once it has loaded them)",
            fix,
        )]  # fmt: skip
    if not b.kv_fits:
        need = f"{b.kv_gb:.2f} GB of KV cache" if b.max_total_tokens else "a KV cache"
        return [rules.Finding(
            "memory-kv", "warning",
            f"{said} leaves no room for {need} per chip next to "
            f"{b.weights_gb:.1f} GB of weights and the {b.symmetric_gb:.1f} GB reservation "
            f"({b.static_gb:.1f} GB static per chip)",
            f"{fix}, or lower --max-total-tokens",
        )]  # fmt: skip
    return []


def _budget(
    args: ServerArgs,
    ctx: rules.Context,
    tp: int,
    chip_mb: int | None,
    symmetric_mb: int,
    cwd: str,
    profile: Profile,
) -> tuple[memory.Budget | None, str]:
    model = ctx.model()
    if not model or profile.chips == CHIPS_NONE or not chip_mb:
        return None, ""
    path = Path(cwd, os.path.expanduser(model))
    config = path / "config.json"
    if not path.is_dir():
        return (
            None,
            f"memory budget skipped: {model} is not a local directory (nothing is downloaded)",
        )
    if not config.is_file():
        return None, f"memory budget skipped: {path} has no config.json"
    try:
        from ttmesh import fileread

        shape = memory.model_shape(json.loads(fileread.read_bytes(config, MODEL_CONFIG, "config")))
    except (OSError, ValueError, KeyError, TypeError) as exc:  # fileread.Refused: ValueError
        return None, f"memory budget skipped: {config} is not a decoder's config ({exc})"
    flags = profile.budget
    fraction = ctx.number(flags["fraction"]) if flags["fraction"] else None
    tokens = ctx.number(flags["tokens"]) if flags["tokens"] else None
    return (
        memory.budget(
            shape,
            chips=tp,
            chip_mb=chip_mb,
            fraction=fraction if fraction is not None else 0.9,
            dtype=(ctx.text(flags["dtype"]) if flags["dtype"] else None) or "auto",
            kv_dtype=(ctx.text(flags["kv_dtype"]) if flags["kv_dtype"] else None) or "auto",
            max_total_tokens=int(tokens) if tokens else None,
            symmetric_mb=symmetric_mb if profile.chips != CHIPS_NONE else 0,
        ),
        "",
    )


def chip_env(
    profile: Profile,
    *,
    whole_host: bool,
    bdfs: list[str],
    descriptor: str | None,
    mesh_device: str,
) -> tuple[dict[str, str], list[str]]:
    """How the chips reach the server: (variables, notes)."""
    if profile.chips == CHIPS_NONE:
        return {}, []
    if profile.chips == CHIPS_MESH_DEVICE:
        return {"MESH_DEVICE": mesh_device, "TT_VISIBLE_DEVICES": ",".join(bdfs)}, []
    if profile.chips == CHIPS_LIBTT and whole_host:
        return {}, [
            "the whole host: TT_VISIBLE_DEVICES and TT_MESH_GRAPH_DESC_PATH are left unset, libtt "
            "gives each of the server's processes its chip"
        ]
    env = {"TT_VISIBLE_DEVICES": ",".join(bdfs)}
    if descriptor:
        env["TT_MESH_GRAPH_DESC_PATH"] = descriptor
    notes = [profile.part_note] if profile.part_note and len(bdfs) > 1 else []
    return env, notes


def mesh_device(profile: Profile, chips: int, board: str, shape: tuple[int, int]) -> str:
    """vLLM's MESH_DEVICE: the system's name when the chips are a whole stock system of that
    board, else the mesh shape as "(R,C)"."""
    for entry in profile.extra.get("mesh_device") or []:
        if int(entry["chips"]) == chips and board.startswith(str(entry["board"])):
            return str(entry["name"])
    return f"({shape[0]},{shape[1]})"
