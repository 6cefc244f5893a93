"""SGLang's ``--config FILE``: the flags a YAML file adds to the command, merged as SGLang does.

SGLang 0.5.23's ``prepare_server_args`` checks ``"--config" in argv`` (the exact word; ``--config=F``
is stored and ignored), and its ``ConfigArgumentMerger`` turns the file's map into flags placed
before the command's own, so the command wins (argparse: the last value wins). A file that sets
``tp-size: 4`` is as much the server's command as ``--tp-size 4``: ttmesh reads it the same way,
the file read bounded (``paths.read_text``) and parsed as PyYAML's ``safe_load`` parses it.

It knows the server's flags only as :class:`Action` (what a flag table's ``Flag`` has), so the
table (``serving.flags``) can merge a file without this module importing it back.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

MAX_BYTES = 1024 * 1024  # a server's configuration is a few KiB
_CLASSES = {  # argparse's class of each kind, as SGLang's complaint names it
    "store": "_StoreAction",
    "store_const": "_StoreConstAction",
    "store_true": "_StoreTrueAction",
    "store_false": "_StoreFalseAction",
    "append": "_AppendAction",
    "append_const": "_AppendConstAction",
    "extend": "_ExtendAction",
    "count": "_CountAction",
    "boolean_optional": "BooleanOptionalAction",
}


class Refused(Exception):
    """SGLang stops on the file: ``str()`` is its own words (the table's ``ParseError``)."""


class Action(Protocol):
    """What merging needs of one of the server's flags (``serving.flags.Flag`` has it)."""

    options: tuple[str, ...]
    dest: str
    kind: str
    nargs: Any
    cls: str | None


def _keys(flag: Action) -> set[str]:
    # YAML keys may use any long spelling of a flag, not only its destination.
    return {flag.dest} | {o[2:].replace("-", "_") for o in flag.options if o.startswith("--")}


def _store_true(flag: Action) -> bool:
    return flag.kind == "store_true" and flag.cls is None  # argparse's own store_true


def _one_value(flag: Action) -> bool:
    return (flag.kind == "store" and flag.cls is None) or flag.nargs is None


def merge_sglang(
    flags: Sequence[Action], argv: list[str], cwd: str | None
) -> tuple[list[str], str]:
    """(the command with the file's flags merged in, the file), ``flags`` the server's whole
    table; :class:`Refused` where SGLang stops (with its words)."""
    at = [i for i, word in enumerate(argv) if word == "--config"]
    if len(at) > 1:
        raise Refused("--config: Multiple config files specified! Only one allowed.")
    if at[0] == len(argv) - 1:
        raise Refused("--config: No config file specified after --config flag!")
    name = argv[at[0] + 1]
    from ttmesh import paths, yamlio

    path = Path(cwd or paths.cwd(), name)  # the server opens it relative to its directory
    if path.suffix.lower() not in (".yaml", ".yml"):
        raise Refused(f"--config: Config file must be YAML format, got: {path.suffix}")
    if not path.exists():
        raise Refused(f"--config: Config file not found: {name}")

    try:
        data = yamlio.loads_as_pyyaml(paths.read_text(path, "--config", MAX_BYTES))
    except ValueError as exc:
        raise Refused(f"--config {name}: {exc}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise Refused("--config: Config file must contain a dictionary at root level")
    merged = [*_as_flags(flags, data, name), *argv[: at[0]], *argv[at[0] + 2 :]]
    return merged, name


def _as_flags(flags: Sequence[Action], config: dict[Any, Any], name: str) -> list[str]:
    with_flags = [f for f in flags if f.options]
    store_true = {k for f in with_flags if _store_true(f) for k in _keys(f)}
    supported = [f for f in with_flags if _store_true(f) or _one_value(f)]
    supported_keys = {k for f in supported for k in _keys(f)}
    unsupported = {
        key: f
        for f in with_flags
        if f not in supported and not {"--config", "--help", "-h"} & set(f.options)
        for key in _keys(f)
        if key not in supported_keys
    }
    out: list[str] = []
    for key, value in config.items():
        if not isinstance(key, str):
            raise Refused(f"--config {name}: key {key!r} is not a flag's name")
        norm = key.replace("-", "_")
        if norm in unsupported:
            flag = unsupported[norm]
            kind = flag.cls or _CLASSES.get(flag.kind, flag.kind)
            raise Refused(f"--config: Unsupported config option '{norm}' with action '{kind}'")
        if isinstance(value, bool):
            if norm in store_true:
                out += [f"--{key}"] if value else []
            else:
                out += [f"--{key}", str(value).lower()]
        elif isinstance(value, list):
            out += [f"--{key}", *(str(item) for item in value)] if value else []
        elif isinstance(value, dict):
            out += [f"--{key}", json.dumps(value)]
        else:
            out += [f"--{key}", str(value)]
    return out
