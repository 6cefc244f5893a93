"""A server's command line, read the way its argparse would: which program, which flags.

Only what rules and plans need: the Python module or entry point that was run, and every
``--flag`` with its values (``--tpu-compile-bs 1 4`` has two, ``--enable-torch-compile`` none,
``--port=31000`` one). Nothing is rewritten: the server gets its argv as the user typed it.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ServerArgs:
    """A server's command line: the program run and its flags with their values."""

    program: str  # "sglang.launch_server" (a module), or an entry point's name ("vllm serve")
    flags: dict[str, list[str]] = field(default_factory=dict)
    # Words before the first flag, after the program: ``vllm serve MODEL`` gives ["MODEL"].
    positionals: list[str] = field(default_factory=list)

    def has(self, flag: str) -> bool:
        return flag in self.flags

    def value(self, flag: str) -> str | None:
        values = self.flags.get(flag)
        return values[0] if values else None

    def numbers(self, flag: str) -> list[float]:
        """The flag's values that are finite numbers (``nan`` or ``inf`` is no size to check
        a rule or a memory budget against: the server refuses it itself)."""
        out = []
        for v in self.flags.get(flag, []):
            try:
                number = float(v)
            except ValueError:
                continue
            if math.isfinite(number):
                out.append(number)
        return out


def parse(command: list[str], module: bool = False) -> ServerArgs:
    """``command`` as ttmesh will run it (``module``: ttmesh's own ``-m`` was given)."""
    if module and command:
        return ServerArgs(command[0], _flags(command[1:]))
    for i, word in enumerate(command[:4]):  # python [-u] -m MODULE ...
        if word == "-m" and i + 1 < len(command):
            return ServerArgs(command[i + 1], _flags(command[i + 2 :]))
    if not command:
        return ServerArgs("")
    name = os.path.basename(command[0])
    if len(command) > 1 and not command[1].startswith("-"):
        rest = command[2:]  # vllm serve MODEL ...; python serve.py ...
        lead = next((i for i, w in enumerate(rest) if w.startswith("-")), len(rest))
        return ServerArgs(f"{name} {command[1]}", _flags(rest), rest[:lead])
    return ServerArgs(name, _flags(command[1:]))


def _flags(words: list[str]) -> dict[str, list[str]]:
    flags: dict[str, list[str]] = {}
    current: str | None = None
    for word in words:
        if word.startswith("--") and len(word) > 2:
            name, eq, value = word.partition("=")
            current = name
            flags.setdefault(name, [])
            if eq:
                flags[name].append(value)
                current = None
        elif word.startswith("-") and word[1:2].isalpha():
            current = word  # a short option such as -tp (a negative number is a value)
            flags.setdefault(word, [])
        elif current is not None:
            flags[current].append(word)
    return flags
