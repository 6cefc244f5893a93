"""What one host of a job over several hosts reports about itself, and reading it back.

``ttmesh _host-report`` runs on every host of the job (started through mpirun, one per host,
as the ranks will be) and prints one line, ``TTMESH-HOST-REPORT {json}``: the host's chips as
discovery finds them there, the links between them, its topology (whose links to remote devices
are the cables to other hosts), on a simulated host the cluster tt-metal maps in mock mode, the
environment its ranks get from the host, which chips cannot be used now (leased, held,
dead) and by whom, which links between its chips are down (with the fix to run there), and
its ends of the cables to other hosts with the state each reads. The launching ttmesh plans the whole job from these reports.
"""

from __future__ import annotations

import json
import socket
from dataclasses import asdict
from typing import Any

from ttmesh.errors import bad_input
from ttmesh.fabric import health
from ttmesh.fabric.devices import Chip, Inventory, LinkSpec, discover
from ttmesh.host import clusterdesc
from ttmesh.host.base import Host
from ttmesh.host.reported import ReportedHost
from ttmesh.mesh.cluster import HostView

SCHEMA = "ttmesh.host-report/1"
PREFIX = "TTMESH-HOST-REPORT "


def make(host: Host) -> dict[str, Any]:
    """This host's report (reads it, changes nothing)."""
    from ttmesh.launcher.planning.choose import unavailable_and_beats

    inv = discover(host)
    why, who, beats = unavailable_and_beats(inv)
    links_down = [
        {"what": p.what, "fix": p.fix, "chips": list(p.chips)}
        for p in health.preflight(inv, [c.asic_id for c in inv.chips], heartbeats=False)
        if p.kind == "link-down"
    ]
    from ttmesh.recovery import cables

    every = [c.asic_id for c in inv.chips]
    ends = [e.to_json() for e in cables.read(inv, cables.ends(inv, every))]
    mock = host.mock_cluster()
    return {
        "schema": SCHEMA,
        "hostname": socket.gethostname(),
        "root": str(host.root),
        "simulated": host.simulated,
        "driver": inv.driver,
        "topology": inv.topology,
        "chips": [asdict(c) for c in inv.chips],
        "links": [list(lk.key()) for lk in inv.links],
        "missing": inv.missing,
        "notes": inv.notes,
        "beats": beats,
        "descriptor": clusterdesc.to_plain(inv.descriptor) if inv.descriptor else None,
        "mock": clusterdesc.to_plain(mock) if mock is not None else None,
        "rank_env": host.rank_env([]),
        "unavailable": why,
        "who": who,
        "links_down": links_down,
        "cable_ends": ends,
    }


def line(host: Host) -> str:
    return PREFIX + json.dumps(make(host), separators=(",", ":"))


def parse(data: Any, name: str) -> tuple[HostView, dict[str, str], dict[str, str]]:
    """(the host as a plan sees it, asic -> why it can't be used, asic -> who has it)."""
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise bad_input(
            f"host {name}: its ttmesh sent no report ttmesh understands",
            "run the same ttmesh version on every host",
        )
    try:
        descriptor = clusterdesc.from_plain(data["descriptor"]) if data.get("descriptor") else None
        mock = clusterdesc.from_plain(data["mock"]) if data.get("mock") else None
        host = ReportedHost(
            name, data["root"], bool(data["simulated"]), data.get("rank_env"), mock, descriptor
        )
        inv = Inventory(
            host=host,
            driver=str(data["driver"]),
            chips=[Chip(**c) for c in data["chips"]],
            links=[LinkSpec(*lk) for lk in data["links"]],
            topology=str(data["topology"]),
            missing=list(data.get("missing") or []),
            notes=list(data.get("notes") or []),
            beats=dict(data.get("beats") or {}),
            descriptor=descriptor,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise bad_input(f"host {name}: malformed report ({exc})", "run the same ttmesh everywhere")
    down = [
        (str(d["what"]), str(d["fix"]), tuple(str(a) for a in d["chips"]))
        for d in data.get("links_down") or []
        if isinstance(d, dict) and {"what", "fix", "chips"} <= set(d)
    ]
    ends = [
        e
        for e in data.get("cable_ends") or []
        if isinstance(e, dict) and {"chip", "name", "chan", "peer", "peer_chan", "state"} <= set(e)
    ]
    view = HostView(name, inv, mock, str(data.get("hostname") or ""), down, ends)
    return view, dict(data.get("unavailable") or {}), dict(data.get("who") or {})
