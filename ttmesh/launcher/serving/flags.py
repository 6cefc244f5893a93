"""A server's whole flag table, and its command read with argparse built from it.

A partial list of flags cannot read a command as the server does: whether ``--tp`` is an
unambiguous prefix, which flag a value belongs to, that a repeated flag's last value wins, all
depend on the server's whole flag set. So each profile carries its server's full table
(``ttmesh/configs/profiles/<name>.flags.json``, ``ttmesh.flags/1``), generated from the server's own
parser by ``scripts/gen_flags.py``: every option string with its aliases, destination, ``nargs``,
action kind, type (by name), choices and whether it is required. :meth:`Table.parse` builds an
``argparse`` parser with the server's settings (``prog``, ``allow_abbrev``, ``add_help``) from it
and reads the command: last wins, ``--flag=value``, ``nargs="+"``, prefixes and ``--no-...``
forms behave as in the server, and a command the server's parser refuses is refused with the
server's own complaint (:class:`ParseError`) before anything starts.

Cost: a table is read once per process (JSON, under a millisecond) and its parser built once
(about 2 ms for SGLang's 532 flags: actions are added directly, not through ``add_argument``,
whose help-formatter check asks the terminal its size for every flag).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ttmesh.launcher.serving import configfile

SCHEMA = "ttmesh.flags/1"
MAX_BYTES = 4 * 1024 * 1024  # SGLang's table is 80 KiB
# Action kinds whose value is a constant (no words of their own to convert).
CONSTANT = {"store_const", "store_true", "store_false", "append_const", "boolean_optional", "count"}
NUMERIC_TYPES = {"int", "float", "human_readable_int"}
KINDS = CONSTANT | {"store", "append", "extend", "help", "version", "error", "ignore", "custom"}


class ParseError(Exception):
    """The server's parser refuses the command: ``str()`` is its own line (``prog: error: ...``)."""


class _Help(Exception):
    """``-h``/``--help`` (or ``--version``): the server prints it and exits 0."""


# --------------------------------------------------------------------------- types, by name
# Each behaves as the server's function of that name (SGLang 0.5.23's srt/utils/common.py), so
# argparse accepts, converts and refuses the same words with the same message.


def human_readable_int(value: str) -> int:
    """SI (1k, 1M) and IEC (1Ki, 1Mi) suffixes, case-sensitive; decimals with SI only."""
    import re
    from decimal import Decimal

    value = value.strip()
    si = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
    iec = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", value)
    if match:
        number, suffix = match.groups()
        if suffix in iec:
            if "." in number:
                raise argparse.ArgumentTypeError(
                    f"Decimals are not allowed with IEC suffixes like '{suffix}'. "
                    f"Use an integer IEC value such as '{int(Decimal(number))}{suffix}', "
                    f"or an SI value such as '{number}{suffix[0]}'."
                )
            return int(number) * iec[suffix]
        return int(Decimal(number) * si[suffix])
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"Invalid integer value: '{value}'. "
            "Use a plain integer, SI suffixes (1k, 1M), or IEC suffixes (1Ki, 1Mi). "
            "Suffixes are case-sensitive."
        ) from None


def nullable_str(val: str) -> str | None:
    if not val or val == "None":
        return None
    return val


def json_list_type(value: str) -> Any:
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        raise argparse.ArgumentTypeError(
            f"Invalid JSON list: {value}. Please provide a valid JSON list."
        ) from None


TYPES: dict[str, Any] = {
    "str": str,
    "int": int,
    "float": float,
    "loads": json.loads,
    "human_readable_int": human_readable_int,
    "nullable_str": nullable_str,
    "json_list_type": json_list_type,
}


# --------------------------------------------------------------------------- the table


@dataclass(slots=True, eq=False)  # hundreds a table: slots make them cheap to build
class Flag:
    """One action of the server's parser (compared by identity: which action it is)."""

    options: tuple[str, ...]
    dest: str
    kind: str
    nargs: Any = None
    type: str | None = None
    choices: tuple[Any, ...] | None = None
    const: Any = None
    required: bool = False
    default: Any = None
    message: str | None = None
    cls: str | None = None  # the server's own action class, when not argparse's

    @property
    def name(self) -> str:
        """The flag's first long spelling (``--tp-size``), as ttmesh names it."""
        return next(
            (o for o in self.options if o.startswith("--")),
            self.options[0] if self.options else self.dest,
        )

    @property
    def typed(self) -> bool:
        """Its words are converted the way the server converts them (a type ttmesh knows)."""
        return self.type is None or self.type in TYPES

    @property
    def numeric(self) -> bool:
        return self.type in NUMERIC_TYPES


@dataclass
class Table:
    """A server's flag table (``ttmesh.flags/1``) and the parser built from it."""

    path: str
    server: str
    source: str
    how: str
    complete: bool
    prog: str
    allow_abbrev: bool
    add_help: bool
    prefix_chars: str
    flags: list[Flag]
    config_file: str | None = None  # "sglang": --config FILE merged as SGLang does
    dashes: bool = False  # vLLM: --flag_name is --flag-name
    by_option: dict[str, Flag] = field(default_factory=dict)
    _parser: Any = None

    def __post_init__(self) -> None:
        self.by_option = {o: f for f in self.flags for o in f.options}

    def flag(self, option: str) -> Flag | None:
        """The flag spelled exactly ``option`` (an alias too; never a prefix)."""
        return self.by_option.get(option)

    def parser(self) -> argparse.ArgumentParser:
        """argparse built from the table, once (a table argparse refuses is one line, exit 2)."""
        if self._parser is None:
            try:
                self._parser = _build(self)
            except (argparse.ArgumentError, TypeError, ValueError) as exc:
                from ttmesh.errors import bad_input

                raise bad_input(
                    f"flag table {self.path}: malformed ({exc})",
                    "regenerate it: python scripts/gen_flags.py (docs/serving.md, Flag tables)",
                ) from None
        return self._parser

    def parse(self, words: list[str], cwd: str | None = None) -> Parsed:
        """``words`` (the server's argv after its program) as the server's parser reads them;
        :class:`ParseError` with the server's own complaint when it refuses them."""
        given = list(words)
        if self.dashes:
            given = [_dashed(w) for w in given]
        config = None
        if self.config_file == "sglang" and "--config" in given:
            try:
                given, config = configfile.merge_sglang(self.flags, given, cwd)
            except configfile.Refused as exc:
                raise ParseError(str(exc)) from None
        parser = self.parser()
        namespace = argparse.Namespace()
        extra: list[str] = []
        wanted_help = False
        try:
            if self.complete:
                parser.parse_args(given, namespace)
            else:
                _, extra = parser.parse_known_args(given, namespace)
        except _Help:
            wanted_help = True
        reads = namespace.__dict__.get(_READS, {})
        return Parsed(self, dict(reads), wanted_help, extra, config, given)


def _dashed(word: str) -> str:
    """vLLM's FlexibleArgumentParser: ``--a_b.c_d=x`` is ``--a-b.c_d=x`` (names up to a dot)."""
    if not word.startswith("--"):
        return word
    key, eq, value = word.partition("=")
    head, dot, tail = key[2:].partition(".")
    return "--" + head.replace("_", "-") + dot + tail + eq + value


_CACHE: dict[str, Table] = {}


def load(path: Path, where: str = "flag table") -> Table:
    """The table at ``path`` (its ``base`` table first), read once per process; a table that
    is not one is one line naming the file (exit 2)."""
    key = str(path)
    if key in _CACHE:
        return _CACHE[key]
    from ttmesh import fileread
    from ttmesh.errors import bad_input

    hint = "regenerate it: python scripts/gen_flags.py (docs/serving.md, Flag tables)"
    try:
        data = json.loads(fileread.read_bytes(path, MAX_BYTES, where))
    except FileNotFoundError:
        raise bad_input(f"{where} {path} does not exist", hint) from None
    except (OSError, ValueError) as exc:  # fileread.Refused is a ValueError
        raise bad_input(f"{where} {path}: {exc}", hint) from None
    try:
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise ValueError(f"not a {SCHEMA} table")
        flags = [_flag(f) for f in data["flags"]]
        parser = data.get("parser")
        base = data.get("base")
        if base is not None:
            if parser is not None or not isinstance(base, str) or "/" in base:
                raise ValueError("base names a stock table (and then the parser is the base's)")
            under = load(path.with_name(f"{base}.flags.json"), where)
            flags = [*under.flags, *flags]
            prog, abbrev, add_help, prefix = (
                under.prog,
                under.allow_abbrev,
                under.add_help,
                under.prefix_chars,
            )
            config_file = data.get("config_file", under.config_file)
        else:
            if not isinstance(parser, dict):
                raise ValueError("no parser settings")
            prog, abbrev = str(parser["prog"]), bool(parser["allow_abbrev"])
            add_help, prefix = bool(parser["add_help"]), str(parser["prefix_chars"])
            config_file = data.get("config_file")
        table = Table(
            path=key,
            server=str(data["server"]),
            source=str(data.get("source", "")),
            how=str(data.get("how", "")),
            complete=bool(data.get("complete", True)),
            flags=flags,
            config_file=config_file,
            dashes=bool(data.get("dashes", False)),
            prog=prog,
            allow_abbrev=abbrev,
            add_help=add_help,
            prefix_chars=prefix,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise bad_input(f"{where} {path}: malformed ({exc})", hint) from None
    _CACHE[key] = table
    return table


def _flag(raw: dict[str, Any]) -> Flag:
    kind = raw["kind"]
    if kind not in KINDS:
        raise ValueError(f"unknown action kind {kind!r}")
    choices = raw.get("choices")
    # A kind that reads no words has nargs 0 (argparse's); the table omits it.
    nargs = (
        raw["nargs"] if "nargs" in raw else (0 if kind in CONSTANT | {"help", "version"} else None)
    )
    return Flag(
        options=tuple(str(o) for o in raw["options"]),
        dest=str(raw["dest"]),
        kind=kind,
        nargs=nargs,
        type=raw.get("type"),
        choices=tuple(choices) if choices is not None else None,
        const=raw.get("const"),
        required=bool(raw.get("required", False)),
        default=raw.get("default"),
        message=raw.get("message"),
        cls=raw.get("class"),
    )


# --------------------------------------------------------------------------- the parser

_READS = "_ttmesh_reads"  # the namespace's record of what set each destination, in order


@dataclass(frozen=True)
class Read:
    """A destination as the command set it: the flag, its value as the server stores it, and
    every time it was given (``(option, words)``, in order; the last one won)."""

    flag: Flag
    value: Any
    option: str  # the option string argparse matched (a prefix is matched to its flag)
    times: tuple[tuple[str, tuple[str, ...]], ...]

    @property
    def words(self) -> tuple[str, ...]:
        return self.times[-1][1]


@dataclass(frozen=True)
class Parsed:
    """A command as the server's parser reads it."""

    table: Table
    reads: dict[str, Read]  # by destination
    help: bool = False  # -h/--help: the server prints its help and exits
    extra: list[str] = field(default_factory=list)  # words an incomplete table does not know
    config: str | None = None  # --config FILE the server merges
    argv: list[str] = field(default_factory=list)  # what was parsed (after --config merged)

    def read(self, option: str) -> Read | None:
        """What set ``option``'s destination (by any of its spellings), if the command did."""
        flag = self.table.flag(option)
        return self.reads.get(flag.dest) if flag is not None else None

    def given(self, option: str) -> bool:
        """``option`` itself decided its destination: for ``--x``/``--no-x``, the spelling
        that came last; for a destination two flags share, the flag that came last."""
        flag = self.table.flag(option)
        read = self.read(option)
        if flag is None or read is None or read.flag is not flag:
            return False
        if flag.kind == "boolean_optional":
            return read.option.startswith("--no-") == option.startswith("--no-")
        return True


class _Parser(argparse.ArgumentParser):
    """argparse, with its complaints raised (not printed with the usage and exited) and the
    words each action consumed recorded."""

    _words: tuple[str, ...] = ()

    def error(self, message: str) -> Any:
        raise ParseError(f"{self.prog}: error: {message}")

    def exit(self, status: int = 0, message: str | None = None) -> Any:
        raise ParseError((message or "").strip() or f"{self.prog}: exit {status}")

    def _get_values(self, action: argparse.Action, arg_strings: list[str]) -> Any:
        words = list(arg_strings)
        if action.nargs not in (argparse.PARSER, argparse.REMAINDER) and "--" in words:
            words.remove("--")  # as argparse drops it before converting
        self._words = tuple(words)
        return super()._get_values(action, arg_strings)


class _Action(argparse.Action):
    """Every kind of the table's actions: stores what the server's action would store."""

    def __init__(self, flag: Flag) -> None:
        # flag.nargs: 0 for a kind that reads no words, or what the server's action reads (a
        # retired valued flag of SGLang's reads one word and stores a constant).
        nargs = flag.nargs
        convert = TYPES.get(flag.type) if flag.type else None
        super().__init__(
            list(flag.options),
            flag.dest,
            nargs=nargs,
            const=flag.const,
            default=argparse.SUPPRESS,
            type=convert,
            choices=list(flag.choices) if flag.choices is not None else None,
            required=flag.required,
        )
        self.flag = flag

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        kind = self.flag.kind
        if kind in ("help", "version"):
            raise _Help()
        if kind == "error":
            parser.error(self.flag.message or f"{option_string} is no longer accepted")
        if kind == "ignore":
            return
        old = getattr(namespace, self.dest, None)
        value: Any
        if kind in ("store_const", "store_true", "store_false"):
            value = {"store_true": True, "store_false": False}.get(kind, self.const)
        elif kind == "boolean_optional":
            value = not (option_string or "").startswith("--no-")
        elif kind == "append":
            value = [*(old if isinstance(old, list) else _listed(self.flag.default)), values]
        elif kind == "append_const":
            value = [*(old if isinstance(old, list) else _listed(self.flag.default)), self.const]
        elif kind == "extend":
            value = [*(old if isinstance(old, list) else _listed(self.flag.default)), *values]
        elif kind == "count":
            value = (old if isinstance(old, int) else 0) + 1
        else:  # store, custom
            value = values
        setattr(namespace, self.dest, value)
        reads: dict[str, Read] = namespace.__dict__.setdefault(_READS, {})
        words = getattr(parser, "_words", ()) if kind not in CONSTANT else ()
        before = reads.get(self.dest)
        times = (*(before.times if before else ()), (option_string or self.flag.name, words))
        reads[self.dest] = Read(self.flag, value, option_string or self.flag.name, times)
        if isinstance(parser, _Parser):
            parser._words = ()


def _listed(default: Any) -> list[Any]:
    return list(default) if isinstance(default, list) else []


def _build(table: Table) -> argparse.ArgumentParser:
    parser = _Parser(
        prog=table.prog,
        add_help=False,
        allow_abbrev=table.allow_abbrev,
        prefix_chars=table.prefix_chars,
    )
    for flag in table.flags:
        parser._add_action(_Action(flag))
    return parser
