"""Host names, IP addresses and ports people give ttmesh, read by one rule.

A host name travels far: into mpirun's ``--host``, a rank's ``MASTER_ADDR``, torch's store,
``getaddrinfo`` and ttmesh's own lines on a terminal. There a newline or a space splits a word
or a line, a leading ``-`` turns the name into an option of mpirun or ssh, an escape sequence
reaches a terminal, and a name in another script is one name to one program and another (or
none) to the next. So every host a person names (``--rdzv-endpoint``, ``--hosts``,
``--local-addr``, ``--master-addr``, ``metrics --listen``, a Slurm node list and the NodeAddr
Slurm gives for a node) is one of:

* a name: labels of ASCII letters, digits, ``-`` and ``_`` separated by dots (RFC 1123's host
  names, plus the ``_`` that /etc/hosts and Slurm node names carry and torchrun's endpoint rule
  takes), each 1 to 63 characters, not starting or ending with ``-``, 253 in all, with an
  optional final dot; a name of numbers only is an IPv4 address;
* an IPv4 address, four numbers 0-255 (no leading zeros: ``010`` is 8 to some programs);
* an IPv6 address, in brackets where a port may follow (``[::1]:29400``).

A port is a whole number from 1 to 65535 in ASCII digits (:func:`ttmesh.numeric.port`).
Anything else is one line (exit 2) naming the value as given, what is wrong with it, and what
to give.
"""

from __future__ import annotations

import ipaddress
import re

from ttmesh import numeric
from ttmesh.errors import TTMeshError, bad_input

MAX_NAME = 253  # a DNS name's characters (RFC 1035), the final dot aside
MAX_LABEL = 63
_LABEL = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?", re.ASCII)
WHAT = "a host name, an IPv4 address or an IPv6 address"


def shown(text: str) -> str:
    """A value as a line may show it: quoted, escapes visible, when it holds anything a terminal
    must not be sent, a space, or nothing; at most 60 characters."""
    quoted = not text or not text.isprintable() or text != text.strip() or " " in text
    out = repr(text) if quoted else text
    return out if len(out) <= 60 else out[:59] + "…"


def problem(name: str, *, ipv6: bool = True) -> str | None:
    """What is wrong with ``name`` as a host (None: nothing). ``ipv6``: an IPv6 address is one
    (without brackets); mpirun's ``--host NAME:SLOTS`` cannot take one."""
    if not name:
        return "no host named"
    if "\n" in name or "\r" in name:
        return "it has a line break"
    if not name.isprintable():
        return "it has a control or invisible character"
    if any(c.isspace() for c in name):
        return "it has a space"
    if name.startswith("-"):
        return "it starts with '-', which mpirun and ssh take for an option"
    if not name.isascii():
        return "it is not ASCII: write an international name in its xn-- form"
    if ":" in name:
        if not _is_ipv6(name):
            return "':' is in no host name, and it is no IPv6 address"
        return None if ipv6 else "an IPv6 address, which mpirun's --host cannot take"
    labels = (name[:-1] if name.endswith(".") else name).split(".")
    if len(name.rstrip(".")) > MAX_NAME:
        return f"longer than the {MAX_NAME} characters of a DNS name"
    for label in labels:
        if not label:
            return "an empty label (two dots, or a dot first)"
        if len(label) > MAX_LABEL:
            return f"a label longer than {MAX_LABEL} characters"
        if not _LABEL.fullmatch(label):
            odd = next((c for c in label if not (c.isalnum() or c in "-_")), None)
            if odd is not None:
                return f"{odd!r} is no letter, digit, '-', '_' or '.'"
            return f"its label {label!r} starts or ends with '-'"
    if all(numeric.digits(label) for label in labels):
        try:
            ipaddress.IPv4Address(name.rstrip("."))
        except ValueError:
            return "not an IPv4 address: four numbers 0-255, without leading zeros"
    return None


def _is_ipv6(text: str) -> bool:
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


def host(text: str, where: str, *, example: str, ipv6: bool = True, brackets: bool = True) -> str:
    """``text`` (stripped) as a host, or bad input: ``WHERE VALUE: what is wrong (give ...)``.
    An IPv6 address may be given in brackets (``[::1]``), as it is written with a port, unless
    ``brackets`` is False (a program's own ``--host``, which takes the bare address)."""
    name = text.strip()
    bracketed = name.startswith("[") and name.endswith("]") and _is_ipv6(name[1:-1])
    if bracketed and not brackets:
        raise _bad(where, text, f"write the IPv6 address without brackets: {name[1:-1]}", example)
    if ipv6 and bracketed:
        name = name[1:-1]
    why = problem(name, ipv6=ipv6)
    if why is not None:
        raise _bad(where, text, why, example)
    return name


def hosts(text: str, where: str, *, example: str) -> list[str]:
    """A comma-separated list of two or more different hosts (``--hosts``): each a name or an
    IPv4 address, as mpirun's ``--host`` takes them; the bad one is named."""
    names = [h.strip() for h in text.split(",") if h.strip()]
    for name in names:
        why = problem(name, ipv6=False)
        if why is not None:
            raise bad_input(
                f"{where}: {shown(name)} is not a host: {why}",
                "give a host name (letters, digits, '-', '_' and '.') or an IPv4 address for "
                f"each host, e.g. {example}",
            )
    if len(names) < 2 or len({n.lower().rstrip(".") for n in names}) != len(names):
        raise bad_input(f"{where} {shown(text)}: name two or more different hosts",
                        f"e.g. {example}")  # fmt: skip
    return names


def endpoint(
    text: str, where: str, default_port: int | None, *, example: str, zero: bool = False
) -> tuple[str, int]:
    """``HOST[:PORT]`` as torchrun reads ``--rdzv-endpoint`` (torch 2.13's
    ``torch/distributed/elastic/rendezvous/utils.py:68-114``, ``parse_rendezvous_endpoint``):
    the text stripped; ``[ADDR]`` or ``[ADDR]:PORT`` an IPv6 address; otherwise the port after
    the last ``:`` (``default_port`` when there is none; None: a port must be given). Where
    torchrun misreads, ttmesh refuses: an IPv6 address without brackets (torchrun reads
    ``::1`` as host ``:`` and port 1, and ``fe80::1:29400`` as host ``fe80::1``), a ``[``
    without its ``]``, a host it would take with a space or another script's letters
    (``\\w``), and a port 0 unless ``zero`` (a rendezvous port the other hosts must know)."""
    value = text.strip()
    port_text: str | None
    if value.startswith("["):
        close = value.find("]")
        if close < 0:
            raise _bad(where, text, "'[' without its ']'", example)
        name, rest = value[1:close], value[close + 1 :]
        if rest and not rest.startswith(":"):
            raise _bad(where, text, f"{rest[:20]!r} after ']' (expected :PORT)", example)
        why = problem(name) or (None if _is_ipv6(name) else "no IPv6 address in the brackets")
        if why is not None:
            raise _bad(where, text, why, example)
        port_text = rest[1:] if rest else None
    else:
        name, sep, port_text = value.rpartition(":")
        if not sep:
            if default_port is None:
                raise _bad(where, text, "no port (expected HOST:PORT)", example)
            name, port_text = value, None
        if _is_ipv6(value) or (":" in name and _is_ipv6(name)):
            # ::1:9464 is an address, or ::1 and a port: the last ':' before digits a port
            split = _is_ipv6(name) and numeric.digits(port_text or "")
            fix = f"[{name}]:{port_text}" if split else f"[{value}]:{default_port or 'PORT'}"
            raise _bad(where, text, f"an IPv6 address goes in brackets: {fix}", example)
        why = problem(name)
        if why is not None:
            raise _bad(where, text, why, example)
    if port_text is None:
        if default_port is None:
            raise _bad(where, text, "no port (expected HOST:PORT)", example)
        return name, default_port
    return name, numeric.port(port_text, f"{where} {shown(text)}: port", zero=zero,
                              example=example)  # fmt: skip


def _bad(where: str, text: str, why: str, example: str) -> TTMeshError:
    return bad_input(f"{where} {shown(text)}: {why}", f"give {WHAT}, e.g. {example}")
