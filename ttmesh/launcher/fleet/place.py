"""A fleet's plan: N replicas of one server, each on its own chips, port and descriptor.

Each replica is planned as a launch of its own would be (``Launch.from_options`` and
``prepare``: the existing selection, healthy chips first, its flag rules, memory budget and
descriptor), one after the other, every chip an earlier replica took (with the rest of its
boards: ``LaunchPlan.all_chips``) excluded from the next: the replicas are disjoint and each
is whole reset units (a chip and its board peers), so a reset of one replica's chips that stops
at the links no other mesh uses (``fabric.domains``) touches no chip of another. Pure: starts
nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ttmesh import paths
from ttmesh.dataclass import dataclass, field
from ttmesh.errors import TTMeshError, bad_input
from ttmesh.launcher.fleet.drain import recovery_mode
from ttmesh.render import plural

if TYPE_CHECKING:
    from ttmesh.host.base import Host
    from ttmesh.launcher.fleet.memory import MemoryCheck
    from ttmesh.launcher.fleet.routeropts import RouterOptions
    from ttmesh.launcher.planning.options import Launch
    from ttmesh.launcher.planning.prepare import Prepared

REPLICA_HOST = "127.0.0.1"  # where every replica listens: only the router is reached from outside


@dataclass
class Replica:
    """One replica: its job, the server's command rewritten for it, its chips and plan."""

    index: int
    job: str
    port: int
    argv: list[str]  # the server's command as this replica runs it
    bdfs: list[str]  # its chips by PCI address (empty: a server on no Tenstorrent chip)
    prepared: Prepared
    ports: dict[str, int] = field(default_factory=dict)  # every port flag given its own value

    @property
    def url(self) -> str:
        return f"http://{REPLICA_HOST}:{self.port}"

    def to_json(self, show_env: bool = False) -> dict[str, Any]:
        plan = self.prepared.plan
        return {
            "replica": self.index,
            "job": self.job,
            "url": self.url,
            "port": self.port,
            "ports": self.ports,
            "chips": self.bdfs,
            "argv": self.argv,
            "descriptors": plan.descriptors,
            "plan": plan.to_json(show_env),
        }


@dataclass
class FleetPlan:
    """The fleet: its replicas, where the router listens, and what is said before the start."""

    job: str
    host: str  # the user's --host: the router's
    port: int  # the user's --port: the router's
    replicas: list[Replica]
    notes: list[str] = field(default_factory=list)
    whole_host_reset: bool = False  # a Galaxy: one reset takes every chip, so every replica
    router_opts: RouterOptions | None = None  # the router's words and its metrics port
    memory: MemoryCheck | None = None  # the host memory the replicas need, and the host's

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def to_json(self, show_env: bool = False) -> dict[str, Any]:
        return {
            "schema": "ttmesh.fleet-plan/1",
            "job": self.job,
            "router": {
                "host": self.host,
                "port": self.port,
                "url": self.url,
                "args": self.router_opts.args if self.router_opts else [],
                "metrics": self.router_opts.to_json() if self.router_opts else None,
            },
            "memory": self.memory.to_json() if self.memory else None,
            "whole_host_reset": self.whole_host_reset,
            "recovery": recovery_mode(self.whole_host_reset),
            "notes": self.notes,
            "replicas": [r.to_json(show_env) for r in self.replicas],
        }


def rewrite(command: list[str], values: dict[str, str]) -> list[str]:
    """``command`` with each flag of ``values`` given that value: its ``--flag V`` and
    ``--flag=V`` dropped, then ``--flag V`` appended (the server's argparse takes the last)."""
    out: list[str] = []
    skip = False
    for word in command:
        if skip:
            skip = False
            continue
        name = word.split("=", 1)[0]
        if name in values:
            skip = "=" not in word
            continue
        out.append(word)
    for flag, value in values.items():
        out += [flag, value]
    return out


def plan_fleet(launch: Launch, host: Host) -> FleetPlan:
    """Every replica planned (or one line saying what the host can give instead)."""
    from ttmesh.launcher.planning import ports
    from ttmesh.launcher.planning.options import Launch as LaunchOf
    from ttmesh.launcher.planning.options import TorchrunFlags
    from ttmesh.runtime import jobs

    o, req = launch.options, launch.request
    assert req is not None and req.profile is not None and o.replicas is not None
    profile, args = req.profile, req.server_args
    assert args is not None
    fleet = req.job or jobs.new_job_id()
    from ttmesh.launcher.fleet import routeropts

    where = routeropts.router_host(args.text("--host") or profile.default("--host") or "127.0.0.1")
    port_text = args.text("--port") or profile.default("--port") or "30000"
    router_port = int(port_text)
    named = [c.strip() for c in (o.chips or "").split(",") if c.strip()]
    excluded = [c.strip() for c in (o.exclude or "").split(",") if c.strip()]
    tp = req.tp_size or 1
    replicas: list[Replica] = []
    taken_ports: set[int] = {router_port}
    router_opts = routeropts.read(profile, o.router_args, router_port, taken_ports)
    for k in range(o.replicas):
        values = {"--host": REPLICA_HOST, "--port": str(_free(ports, taken_ports))}
        for flag in profile.extra.get("ports") or ():
            if args.has(flag):
                values[flag] = str(_free(ports, taken_ports))
        argv = rewrite(list(o.command), values)
        chips = ",".join(named[k * tp : (k + 1) * tp]) if named else None
        one = o.replace(
            command=tuple(argv), replicas=None, replicas_parallel=False, router_args=(),
            no_memory_check=False,
            job_id=f"{fleet[:56]}-r{k}", chips=chips, exclude=",".join(excluded) or None,
            summary_json=None,
            # A replica's job is started without torchrun's flags (fleet.run): plan it so.
            torchrun_flags=TorchrunFlags(master_addr=o.torchrun_flags.master_addr),
        )  # fmt: skip
        try:
            prepared = _prepare(LaunchOf.from_options(one), host, one)
        except TTMeshError as exc:
            if k == 0:
                raise
            raise _cannot_give(o.replicas, tp, replicas, exc) from None
        bdfs = _bdfs(prepared)
        excluded += [b for b in bdfs if b not in excluded]
        ported = {f: int(v) for f, v in values.items() if f != "--host"}
        replicas.append(Replica(k, f"{fleet[:56]}-r{k}", ported["--port"], argv, bdfs, prepared,
                                ported))  # fmt: skip
    fp = FleetPlan(fleet, where, router_port, replicas, router_opts=router_opts)
    _notes(fp)
    if router_opts.read_by is None and router_opts.args:  # a dry run only: a launch needs it
        fp.notes.append(
            "the router's options were not read by its own parser (sglang-router is not "
            "installed: pip install 'ttmesh[router]'); a launch reads them before it starts"
        )
    _memory(fp, launch, host)
    return fp


def _memory(fp: FleetPlan, launch: Launch, host: Host) -> None:
    """The host memory the replicas need against the host's, once for all: too little is
    refused (a dry run notes that a launch now is refused); unknown is a note."""

    from ttmesh.launcher.fleet import memory

    o, req = launch.options, launch.request
    assert req is not None and req.profile is not None and req.server_args is not None
    if o.no_memory_check:
        fp.memory = memory.MemoryCheck(len(fp.replicas), o.replicas_parallel, 0, 0,
                                       skipped="--no-memory-check")  # fmt: skip
    else:
        base = req.workdir or req.cwd or paths.cwd()
        fp.memory = memory.check(req.profile, req.server_args, base,
                                 host,
                                 len(fp.replicas), o.replicas_parallel)  # fmt: skip
    if fp.memory.fits is False:
        refusal = fp.memory.refusal()
        if not o.dry_run:
            raise refusal
        fp.notes.append(f"{refusal.message} (a launch now is refused: {refusal.hint})")
        return
    fp.notes.append(fp.memory.says())


def _free(ports: Any, taken: set[int]) -> int:
    while True:
        port = int(ports.free_port(REPLICA_HOST))
        if port not in taken:
            taken.add(port)
            return port


def _prepare(launch: Launch, host: Host, o: Any) -> Prepared:
    from ttmesh.launcher.planning.prepare import prepare

    assert launch.request is not None
    prepared = prepare(
        launch.request, host, o.chips, o.exclude, repairable=o.auto_reset, dry_run=True,
        ask_metal=False,
    )  # fmt: skip
    return prepared


def _bdfs(prepared: Prepared) -> list[str]:
    """The replica's chips (the rest of their boards too) by the PCI address that reaches them."""
    inv = prepared.inv
    out: list[str] = []
    for asic in prepared.plan.all_chips():
        lead = inv.lead(inv.chip(asic))
        if lead is not None and lead.bdf and lead.bdf not in out:
            out.append(lead.bdf)
    return out


def _cannot_give(want: int, tp: int, replicas: list[Replica], exc: TTMeshError) -> TTMeshError:
    got = len(replicas)
    used = "; ".join(",".join(r.bdfs) for r in replicas)
    return bad_input(
        f"--replicas {want} of {plural(tp, 'chip')}: this host gives "
        f"{plural(got, 'replica')} ({used}); replica {got}: {exc.message}",
        f"give --replicas {got}, or a smaller --tp-size",
    )


def _notes(fp: FleetPlan) -> None:
    from ttmesh.recovery.reset import is_galaxy

    first = fp.replicas[0].prepared
    if first.plan.chipless or not first.inv.chips:
        return
    if is_galaxy(first.inv):
        fp.whole_host_reset = True
        fp.notes.append(
            "this host's reset is the whole host (a Galaxy: tt-smi -glx_reset resets every chip): "
            "a replica whose chips need a reset is recovered by draining every replica (out of "
            "the router, each stopped within --grace), one reset of the host, verified, then "
            "every replica restarted; the others stop serving meanwhile, and the one that failed "
            "counts a restart under --max-restarts (recovery: drain-all)"
        )
