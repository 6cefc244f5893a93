"""One meaning of ``--tp-size``: the tensor-parallel degree, the chips of one model instance over
every host of the job, as SGLang means its own ``--tp-size`` (``--tp-size 16 --nnodes 2`` is 8
chips on each node: its scheduler runs ``tp_size // nnodes`` ranks per node).
``--nproc-per-node`` is per host, as in torchrun.

A job over N hosts therefore takes ``--tp-size / N`` chips on each host (:func:`per_host`); a
size the hosts cannot share equally is refused before anything starts, saying what to write
for the job an old per-host command meant. A server's own ``--tp-size`` is the job's too, and
its ``--nnodes`` and ``--node-rank`` must be the job's (:func:`server_hosts`).
"""

from __future__ import annotations

import re
from typing import Any

from ttmesh import numeric
from ttmesh.errors import TTMeshError, bad_input
from ttmesh.render import plural


def per_host(tp: int, hosts: int, flag: str = "--tp-size", write: str = "--tp-size") -> int:
    """The chips each of ``hosts`` hosts takes for a job of ``tp`` chips. ``flag`` names where
    ``tp`` came from in the refusal, ``write`` the flag to write instead (a server's own)."""
    if hosts <= 1:
        return tp
    if tp % hosts:
        lower = tp - tp % hosts
        other = (
            f", or {write} {lower} for {plural(lower // hosts, 'chip')} on each" if lower else ""
        )
        raise bad_input(
            f"{flag} {tp} over {hosts} hosts: {plural(tp, 'chip')} cannot be shared equally "
            f"(--tp-size is the job's chips over every host, as SGLang's --tp-size)",
            f"{write} {tp * hosts} for {plural(tp, 'chip')} on each host, what {tp} meant per "
            f"host before{other}",
        )
    return tp // hosts


def over_hosts(exc: TTMeshError, tp: int | None, hosts: int, mine: int | None) -> TTMeshError:
    """A refusal about this host's ``mine`` chips, in the words of the job's ``tp`` over
    ``hosts`` hosts (``tp-size 8: this host has 4 chips`` is ``tp-size 16 over 2 hosts (8 chips
    on each): ...`` when the user wrote --tp-size 16)."""
    if tp is None or mine is None or hosts <= 1:
        return exc
    words = re.compile(rf"\b(--)?tp-size (is )?{mine}\b")
    if not words.search(exc.message):
        return exc
    said = words.sub(
        lambda m: (
            f"{m.group(1) or ''}tp-size {m.group(2) or ''}{tp} over {hosts} hosts "
            f"({plural(mine, 'chip')} on each)"
        ),
        exc.message,
        count=1,
    )
    hint = exc.hint or ""
    if "over every host" not in hint:
        hint = (hint + "; " if hint else "") + "--tp-size counts the chips of every host"
    return TTMeshError(said, hint, exc.code)


def note(tp: int, hosts: int) -> str:
    """What ``--dry-run`` says about a job's chips over its hosts."""
    return (
        f"tp-size {tp} over {hosts} hosts: {plural(tp // hosts, 'chip')} on each (--tp-size is "
        "the job's chips over every host, --nproc-per-node one host's workers)"
    )


def server_hosts(profile: Any, args: Any, hosts: int, node_rank: int) -> list[Any]:
    """The server's own host flags against the job's: its ``--nnodes`` must be the job's host
    count (a server told one host would take the whole tensor-parallel degree on each), its
    ``--node-rank`` this host's. Rule findings (errors), as the profile's rules give."""
    from ttmesh.launcher.serving.rules import Finding

    flag = getattr(profile, "nnodes_flag", None)
    if not flag:
        return []
    rank_flag = getattr(profile, "node_rank_flag", None)
    given = args.value(flag)
    theirs = (
        numeric.whole(
            given,
            f"the server's {flag}",
            low=1,
            high=numeric.MAX_CHIPS,
            unit="hosts",
            example=f"{flag} 2",
        )
        if given is not None
        else 1
    )
    rank_given = args.value(rank_flag) if rank_flag else None
    out = []
    if given is None and hosts > 1:
        out.append(
            Finding(
                "nnodes",
                "error",
                f"the job runs on {hosts} hosts but the server's command has no {flag}: each "
                "host's server would take the whole --tp-size for itself",
                f"add {flag} {hosts} {rank_flag or '--node-rank'} {node_rank} (and "
                "--dist-init-addr NODE0:PORT) to the server's command on this host",
            )
        )
    elif theirs != hosts:
        out.append(
            Finding(
                "nnodes",
                "error",
                f"the server's {flag} {theirs} but the job runs on {plural(hosts, 'host')}",
                f"give ttmesh --nnodes {theirs} (one ttmesh per host, or --hosts), or make the "
                f"server's {flag} {hosts}"
                if hosts > 1
                else f"give ttmesh --nnodes {theirs} (one ttmesh per host, or --hosts), or drop "
                f"the server's {flag}",
            )
        )
    if rank_given is not None and hosts > 1:
        rank = numeric.whole(rank_given, f"the server's {rank_flag}", low=0, high=numeric.MAX_CHIPS)
        if rank != node_rank:
            out.append(
                Finding(
                    "node-rank",
                    "error",
                    f"the server's {rank_flag} {rank} but this host is node {node_rank}",
                    f"give each host's server its own {rank_flag} (here: {rank_flag} {node_rank})",
                )
            )
    return out
