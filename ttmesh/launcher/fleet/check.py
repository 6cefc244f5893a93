"""What ``--replicas N`` takes and refuses, checked once with the other options (one line,
exit 2, before the host is read): a fleet is one server's command run N times on this host,
so every flag that spans hosts, names ranks or fixes one port for all is refused here."""

from __future__ import annotations

from typing import Any

from ttmesh.errors import bad_input
from ttmesh.render import plural

# ``o``: planning.options.LaunchOptions and ``req``: planning.request.LaunchRequest, untyped
# here, as planning.options calls this module (no import circle, even for the type checker).

# Flags a fleet cannot take: (option field, the flag, why).
_NOT_IN_A_FLEET = (
    ("hosts", "--hosts", "a fleet is the replicas of one host"),
    ("rank_binding", "--rank-binding", "a fleet runs a server, which starts its own processes"),
    ("nproc", "--nproc-per-node", "a server starts its own processes"),
    ("ranks_filter", "--ranks-filter", "each replica is one server: its output is shown whole"),
    ("redirects", "--redirects", "each replica's output goes to the console, prefixed"),
    ("tee", "--tee", "each replica's output goes to the console, prefixed"),
    ("fleet_of", "--fleet-of", "it names the fleet a replica belongs to: ttmesh sets it"),
    ("events_fd", "--events-fd", "it is a replica's pipe to its fleet: ttmesh sets it"),
)


def mode(o: Any, rank_binding: str | None, tt_metal_world: bool) -> None:
    """The flags that no fleet takes, refused before anything else is read."""
    given = {"rank_binding": rank_binding}
    for name, flag, why in _NOT_IN_A_FLEET:
        value = given[name] if name in given else getattr(o, name)
        if value is not None:
            raise bad_input(f"--replicas with {flag}: {why}", f"drop {flag}")
    if o.nnodes is not None and o.nnodes.strip() != "1":
        raise bad_input(
            "--replicas with --nnodes: a fleet is the replicas of one host", "drop --nnodes"
        )
    if tt_metal_world:
        raise bad_input(
            "--replicas with --mesh-layout: each replica is a server that drives its chips "
            "from one process",
            "drop --mesh-layout",
        )
    if o.master_port:
        raise bad_input(
            "--replicas with --master-port: each replica needs a port of its own",
            "drop --master-port (each gets a free one)",
        )


def request(o: Any, req: Any) -> None:
    """The command is a server ttmesh knows, whose stack lets ttmesh assign its chips."""
    profile = req.profile
    if profile is None:
        raise bad_input(
            "--replicas runs a server behind SGLang's router, and COMMAND is no server ttmesh "
            "knows",
            "give a server's command (see ttmesh profiles), or --profile NAME",
        )
    says = profile.extra.get("replicas") or {}
    if says.get("refuse"):
        raise bad_input(
            f"--replicas with {profile.name}: {says['refuse']}",
            says.get("fix") or "drop --replicas",
        )
    if o.chips is not None and req.tp_size is not None and o.replicas is not None:
        named = [c for c in o.chips.split(",") if c.strip()]
        want = o.replicas * req.tp_size
        if len(named) != want:
            raise bad_input(
                f"--chips names {plural(len(named), 'chip')}; --replicas {o.replicas} of "
                f"{plural(req.tp_size, 'chip')} take {want}",
                f"name {want} chips (replica k takes the k-th {req.tp_size}), or drop --chips",
            )
