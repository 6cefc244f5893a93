"""Slurm's host lists, expanded as ``scontrol show hostnames`` does.

``galaxy[01-03,07]`` is galaxy01, galaxy02, galaxy03 and galaxy07 (zero padding kept);
``rack[1-2]-n[1-2]`` is every combination; commas outside brackets separate entries.
A node's name is not always its network name: :func:`address` asks Slurm for its NodeAddr.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess

from ttmesh import addresses, numeric
from ttmesh.addresses import shown
from ttmesh.errors import bad_input
from ttmesh.numeric import MAX_CHIPS

_BRACKET = re.compile(r"\[([^\[\]]*)\]")
MAX_HOSTS = MAX_CHIPS  # a node list naming more is a typo (and would fill the memory)


def _split_top(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def _range(spec: str, where: str) -> list[str]:
    out = []
    for item in spec.split(","):
        low, sep, high = item.partition("-")
        if not numeric.digits(low) or (sep and not numeric.digits(high)):
            raise bad_input(f"SLURM_JOB_NODELIST {shown(where)}: cannot read {shown(f'[{spec}]')}")
        if not sep:
            out.append(low)
            continue
        if len(out) + int(high) - int(low) >= MAX_HOSTS:  # node[0-99999999999]: a typo
            raise bad_input(
                f"SLURM_JOB_NODELIST {shown(where)}: {shown(f'[{spec}]')} names more than {MAX_HOSTS} hosts"
            )
        width = len(low)
        out += [str(n).zfill(width) for n in range(int(low), int(high) + 1)]
    return out


def expand(nodelist: str) -> list[str]:
    """Every host name of a Slurm node list, in order."""
    names: list[str] = []
    for entry in _split_top(nodelist):
        expanded = [""]
        pos = 0
        for match in _BRACKET.finditer(entry):
            literal = entry[pos : match.start()]
            values = _range(match.group(1), entry)
            if len(expanded) * len(values) > MAX_HOSTS:
                raise bad_input(
                    f"SLURM_JOB_NODELIST {shown(entry)}: names more than {MAX_HOSTS} hosts"
                )
            expanded = [e + literal + v for e in expanded for v in values]
            pos = match.end()
        expanded = [e + entry[pos:] for e in expanded]
        names += expanded
    if not names:
        raise bad_input(f"SLURM_JOB_NODELIST {shown(nodelist)}: no host in it")
    return names


def first_address(nodelist: str) -> str:
    """Where the first host of ``nodelist`` (node 0) is reached, both its name and the NodeAddr
    Slurm gives for it read as every host name ttmesh is given (:mod:`ttmesh.addresses`)."""
    example = "SLURM_JOB_NODELIST=node[0-1]"
    name = addresses.host(expand(nodelist)[0], "SLURM_JOB_NODELIST: host", example=example)
    found = address(name)
    if found == name:
        return name
    return addresses.host(
        found, f"scontrol show node {name}: NodeAddr", example="NodeAddr=10.0.0.1"
    )


def address(name: str) -> str:
    """Where node ``name`` is reached: the name itself when it resolves, else the NodeAddr
    slurmctld has for it (``scontrol show node``; slurm.conf may give a node a NodeAddr that
    DNS does not know as its name), else the name (whatever uses it then says it can't)."""
    try:
        socket.getaddrinfo(name, None)
        return name
    except (OSError, UnicodeError):
        pass
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        return name
    try:
        shown = subprocess.run(
            [scontrol, "show", "node", "--oneliner", name],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return name
    found = re.search(r"(?:^|\s)NodeAddr=(\S+)", shown.stdout)
    return found.group(1) if shown.returncode == 0 and found else name
