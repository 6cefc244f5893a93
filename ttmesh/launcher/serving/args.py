"""A server's command line: which program runs, and its flags as the server's own parser reads
them.

:func:`parse` finds the program (the Python module, or an entry point's name with its command)
and the words the server's parser will read. Those words are read with argparse built from the
profile's flag table (:meth:`ServerArgs.read_with`, :mod:`.flags`), so rules and plans see what
the server will: the last of a repeated flag, a prefix as the flag it abbreviates, ``--flag=value``,
every word of ``nargs="+"``, ``--no-x``. Before a profile is chosen (recognising one by a flag's
value) the words are read plainly (:meth:`ServerArgs.plain`); nothing decides a plan that way.
Nothing is rewritten: the server gets its argv as the user typed it.
"""

from __future__ import annotations

import math
import os
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ttmesh.dataclass import dataclass, field

if TYPE_CHECKING:
    from ttmesh.launcher.serving.flags import Parsed, Read, Table


@dataclass(frozen=True)
class ServerArgs:
    """A server's command: the program run, the words its parser reads, and (once a profile's
    table has read them) what they mean."""

    program: str  # "sglang.launch_server" (a module), or an entry point's name ("vllm serve")
    words: list[str] = field(default_factory=list)  # the server's own argv, after the program
    # Words before the first flag, after the program: ``vllm serve MODEL`` gives ["MODEL"].
    positionals: list[str] = field(default_factory=list)
    parsed: Parsed | None = None

    def read_with(self, table: Table, cwd: str | None = None) -> ServerArgs:
        """These words read by ``table``'s parser (:class:`.flags.ParseError` when the server
        would refuse them)."""
        return replace(self, parsed=table.parse(self.words, cwd))

    def read(self, flag: str) -> Read | None:
        return self.parsed.read(flag) if self.parsed is not None else None

    def has(self, flag: str) -> bool:
        """``flag`` was given (and, for ``--x``/``--no-x``, that spelling came last)."""
        if self.parsed is not None:
            return self.parsed.given(flag)
        return flag in self.plain()

    def value(self, flag: str) -> Any:
        """The value the server stores for ``flag`` (typed, as its parser converts it), or None."""
        if self.parsed is not None:
            read = self.parsed.read(flag)
            return read.value if read is not None else None
        values = self.plain().get(flag)
        return values[0] if values else None

    def text(self, flag: str) -> str | None:
        """:meth:`value` as text (a list's items joined by spaces), None when not given."""
        return shown(self.value(flag))

    def numbers(self, flag: str) -> list[float]:
        """The flag's values that are finite numbers (``nan`` or ``inf`` is no size to check
        a rule or a memory budget against: the server refuses it itself)."""
        value = self.value(flag)
        items = value if isinstance(value, list) else [value]
        out = []
        for item in items:
            if isinstance(item, bool) or item is None:
                continue
            try:
                number = float(item)
            except (TypeError, ValueError):
                continue
            if math.isfinite(number):
                out.append(number)
        return out

    def plain(self) -> dict[str, list[str]]:
        """The words read without a table: each exact ``--flag`` with its words (the last time
        it was given wins). Only for recognising a profile by a flag before its table is known."""
        return _plain(self.words)


def shown(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return " ".join(str(v) for v in value)
    return str(value)


def parse(command: list[str], module: bool = False) -> ServerArgs:
    """``command`` as ttmesh will run it (``module``: ttmesh's own ``-m`` was given)."""
    if module and command:
        return ServerArgs(command[0], command[1:])
    for i, word in enumerate(command[:4]):  # python [-u] -m MODULE ...
        if word == "-m" and i + 1 < len(command):
            return ServerArgs(command[i + 1], command[i + 2 :])
    if not command:
        return ServerArgs("")
    name = os.path.basename(command[0])
    if len(command) > 1 and not command[1].startswith("-"):
        rest = command[2:]  # vllm serve MODEL ...; python serve.py ...
        lead = next((i for i, w in enumerate(rest) if w.startswith("-")), len(rest))
        return ServerArgs(f"{name} {command[1]}", rest, rest[:lead])
    return ServerArgs(name, command[1:])


def _plain(words: list[str]) -> dict[str, list[str]]:
    flags: dict[str, list[str]] = {}
    current: str | None = None
    for word in words:
        if word == "--":
            break
        if word.startswith("--") and len(word) > 2:
            name, eq, value = word.partition("=")
            flags[name] = [value] if eq else []  # given again: the last one wins
            current = None if eq else name
        elif word.startswith("-") and word[1:2].isalpha():
            current = word  # a short option such as -tp (a negative number is a value)
            flags[word] = []
        elif current is not None:
            flags[current].append(word)
    return flags
