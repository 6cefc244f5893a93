"""A tt-metal mesh over several hosts: one global plan, started by one MPMD ``mpirun``.

``ttmesh launch --hosts a,b --mesh-layout mesh ...`` (and ``ttmesh descriptor --hosts``):

1. **Reports.** One ``mpirun`` runs ``ttmesh _host-report`` on every host (a rankfile puts
   report N on host N): each host's chips, links, cables and unavailable chips, read there.
2. **One plan.** The reports are joined (:mod:`ttmesh.mesh.cluster`) and one mesh is chosen
   over them; each host drives one block of it, the hosts placed by the wiring. Ranks are
   node-major; each gets the torchrun contract with global values (``LOCAL_RANK`` and
   ``GROUP_RANK`` per host), its chips by PCI address on its own host, the one mesh graph
   descriptor every host gets identically, and on simulated hosts its own mock cluster cut
   from all the hosts' clusters (other ranks' chips, here or on another host, as remote
   devices). A Galaxy mesh also gets tt-metal's physical grouping descriptor.
3. **One mpirun** (:mod:`ttmesh.launcher.nodes.mpi`): ``mpirun-ulfm`` when on PATH (as tt-run), the
   rankfile in the form the Open MPI version takes (4.x ``--rankfile``, 5.x ``--map-by
   rankfile:file=``), ``--host`` with each host's slots, tt-run's TCP options (``--mca btl
   self,tcp`` and the interface include/exclude list), and ``--launch-agent`` as the form the
   version takes (``plm_rsh_agent`` / ``plm_ssh_agent``) for clusters reached without ssh.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ttmesh import addresses, numeric, paths
from ttmesh.addresses import shown
from ttmesh.errors import bad_input, refused
from ttmesh.launcher.nodes import hostreport, mpi
from ttmesh.launcher.nodes.reach import MpiHosts
from ttmesh.launcher.planning.prepare import check_mesh_shape
from ttmesh.mesh import cluster as meshcluster
from ttmesh.render import plural

if TYPE_CHECKING:
    from ttmesh.launcher.planning.prepare import Prepared
    from ttmesh.launcher.planning.request import LaunchRequest
    from ttmesh.mesh.select import Selection

REPORT_TIMEOUT = 120.0


def parse_hosts(text: str) -> list[str]:
    """``--hosts a,b,...``: two or more different hosts, each as mpirun's --host takes it."""
    return addresses.hosts(text, "--hosts", example="--hosts node0,node1")


def setup(
    names: list[str],
    mpirun: str | None = None,
    agent: str | None = None,
    tcp_interface: str | None = None,
) -> MpiHosts:
    path = mpi.find_mpirun(mpirun, prefer_ulfm=True)
    if agent is not None and not agent.strip():
        raise bad_input("--launch-agent '': no command named", "e.g. --launch-agent ssh")
    return MpiHosts(names, path, mpi.version(path), agent, tcp_interface, dict(os.environ))


# --------------------------------------------------------------------------- 1. the reports


def gather(mh: MpiHosts) -> list[tuple[meshcluster.HostView, dict[str, str], dict[str, str]]]:
    """Every host's report, in the order of ``mh.names`` (started through one mpirun)."""
    proc, streams = mh.run_each(
        [sys.executable, "-m", "ttmesh", "_host-report"], REPORT_TIMEOUT, "report"
    )
    reports: dict[int, Any] = {}
    errors: dict[int, list[str]] = {}
    for (rank, _name), data in streams.items():
        for text in data.decode(errors="replace").splitlines():
            if text.startswith(hostreport.PREFIX):
                try:
                    reports[rank] = json.loads(text[len(hostreport.PREFIX) :])
                except ValueError:
                    errors.setdefault(rank, []).append("a report that is not JSON")
            elif text.startswith("ttmesh: "):
                errors.setdefault(rank, []).append(text[len("ttmesh: ") :])
    for rank, name in enumerate(mh.names):
        if rank not in reports:
            why = (errors.get(rank) or [_last_line(proc)])[-1]
            raise bad_input(f"host {name} did not report: {why}", f"see ttmesh ls on {name}")
    return [hostreport.parse(reports[r], name) for r, name in enumerate(mh.names)]


def _last_line(proc: subprocess.CompletedProcess[bytes]) -> str:
    said = (proc.stderr + proc.stdout).decode(errors="replace")
    lines = [ln for ln in said.splitlines() if ln.strip()]
    return lines[-1][:300] if lines else f"mpirun exited {proc.returncode}"


# --------------------------------------------------------------------------- 2. one plan


def prepare(req: LaunchRequest, mh: MpiHosts, descriptor_only: bool = False) -> Prepared:
    """The global plan (Prepared) for ``req`` over the hosts; changes nothing (``req``
    included: the plan is made from a new request)."""
    return plan_over(req, gather(mh), mh, descriptor_only)


def plan_over(
    req: LaunchRequest,
    reported: list[tuple[meshcluster.HostView, dict[str, str], dict[str, str]]],
    mh: MpiHosts,
    descriptor_only: bool = False,
) -> Prepared:
    """The global plan from the hosts' reports (in ``mh.names`` order)."""

    if req.numa_binding:
        raise bad_input(
            "--numa-binding with a job planned over several hosts",
            "drop it, or run one ttmesh per host (--nnodes)",
        )
    cluster = meshcluster.join([view for view, _why, _who in reported])
    why: dict[str, str] = {}
    who: dict[str, str] = {}
    if not descriptor_only:
        for view, w, h in reported:
            why.update(w)
            who.update({a: f"{text} on host {view.name}" for a, text in h.items()})
    count = len(cluster.hosts)
    if req.tp_size is None or req.tp_size == 0:
        req = replace(req, tp_size=len(cluster.inv.chips))
    check_mesh_shape(req.mesh_shape, req.tp_size)
    blocked = {a: w for a, w in why.items()}
    if req.binding is not None:
        req, sel, hosts_of_ranks = _binding(req, cluster)
        return _finish(req, cluster, sel, mh, descriptor_only, hosts_of_ranks)
    try:
        sel, _grid = meshcluster.select(
            cluster, req.tp_size, shape=req.mesh_shape, unavailable=blocked
        )
    except Exception as exc:
        if not blocked or getattr(exc, "code", None) != 2:
            raise
        try:
            meshcluster.select(cluster, req.tp_size, shape=req.mesh_shape)
        except Exception:
            raise exc from None
        first = sorted(blocked)[0]
        raise refused(
            f"tp-size {req.tp_size}: not enough free chips; {first} is {blocked[first]}: "
            f"{who.get(first, '?')}",
            "wait for them, or see ttmesh ps on that host",
        )
    if req.nproc is not None:
        req = replace(req, nproc=req.nproc * count)  # --nproc-per-node counts one host's workers
    return _finish(req, cluster, sel, mh, descriptor_only, None)


def _finish(
    req: LaunchRequest,
    cluster: meshcluster.Cluster,
    sel: Selection,
    mh: MpiHosts,
    descriptor_only: bool,
    hosts_of_ranks: list[str] | None,
) -> Prepared:
    from ttmesh.launcher.planning.plan import build, plan_split, surroundings
    from ttmesh.launcher.planning.prepare import Prepared
    from ttmesh.launcher.planning.request import resolve_command
    from ttmesh.mesh import memory, mock
    from ttmesh.runtime import jobs

    dram = memory.plan(req.symmetric_dram_mb, [cluster.inv.chip(a).dram_mb for a in sel.chips])
    req = replace(req, cluster=cluster, symmetric_dram_mb=dram)
    argv = [] if descriptor_only else resolve_command(req)
    job_id = req.job or jobs.new_job_id()
    req = replace(
        req,
        job=job_id,
        run_dir=req.run_dir or str(jobs.runs_dir() / job_id),
        cwd=req.cwd or paths.cwd(),
        master_addr=mh.names[0],
        master_port=req.master_port or 29500,
    )
    sp = plan_split(req, sel)  # (over req.cluster's hosts)
    if req.binding is not None:
        rank_chips = [[a for u in units for a in u.chips] for units in req.binding_units]
    else:
        rank_chips = [list(b.chips) for b in sp.blocks]
        hosts_of_ranks = [cluster.name_of(b.chips[0]) for b in sp.blocks]
    assert hosts_of_ranks is not None
    if all(view.mock is not None for view in cluster.hosts):
        merged = meshcluster.merged_descriptor(cluster)
        mocks = {
            r: mock.chips_view(merged, chips, f"ttmesh job {req.job}, rank {r}")
            for r, chips in enumerate(rank_chips)
        }
        req = replace(req, mocks=mocks)
    # mpirun runs in the run directory
    req = replace(req, mpi_args=mh.args(hosts_of_ranks, "mpi/rankfile"))
    plan = build(req, cluster.inv, sel, argv, sp, surroundings(req))
    rankfile = {f"{req.run_dir}/mpi/rankfile": mpi.rankfile_text(hosts_of_ranks)}
    plan = replace(plan, files={**plan.files, **rankfile}, mpirun=mh.mpirun)
    job = set(plan.all_chips())
    not_ready = [
        (view.name, what, fix)
        for view in cluster.hosts
        for what, fix, chips in view.links_down
        if set(chips) <= job
    ] + _cables_down(cluster, job)
    # The hosts' heartbeats as they reported them (pre-flight polls only the others).
    return Prepared(
        plan, cluster.inv, sel, mesh_hosts=mh, hosts_not_ready=tuple(not_ready),
        beats=cluster.inv.beats, request=req,
    )  # fmt: skip


def _cables_down(cluster: meshcluster.Cluster, job: set[str]) -> list[tuple[str, str, str]]:
    """The job's cables either end reads down (one host reset alone, a job that died with the
    fabric open), as a host not ready: the first named by both ends, and how many more."""
    from ttmesh.recovery import together

    ends = {
        v.name: [e for e in v.cable_ends if e["chip"] in job and e["peer"] in job]
        for v in cluster.hosts
    }
    try:
        down = [c for c in together.cables(ends) if c.down]
    except (KeyError, TypeError, ValueError):
        return []  # a report's ends malformed: its host's own recovery reads them again
    if not down:
        return []
    first = down[0]
    more = f" (and {len(down) - 1} more)" if len(down) > 1 else ""
    hosts = ",".join(dict.fromkeys([first.a.host] + ([first.b.host] if first.b else [])))
    what = f"cable {first.label()} is down{more}"
    return [(first.a.host, what, f"reset both ends together: ttmesh reset --hosts {hosts}")]


def _binding(
    req: LaunchRequest, cluster: meshcluster.Cluster
) -> tuple[LaunchRequest, Selection, list[str]]:
    """A tt-run rank binding over the hosts: each rank's host (the binding's rankfile,
    ``FILE.rankfile`` beside it, else node-major over --hosts), its chips there, and the
    pre-flight of its mesh host ranks against the wiring."""
    from ttmesh.launcher.adapters import ttrun
    from ttmesh.mesh import descriptor as mgd
    from ttmesh.mesh import select as meshselect

    bf = req.binding
    assert bf is not None
    names = [v.name for v in cluster.hosts]
    count = len(bf.bindings)
    rankfile = Path(bf.path).with_suffix(".rankfile")
    if rankfile.is_file():
        text = paths.read_text(rankfile, "rankfile", ttrun.MAX_BYTES)
        placed = parse_rankfile(text, str(rankfile), names, count)
    else:
        if count % len(names):
            raise bad_input(
                f"{bf.path}: {plural(count, 'rank')} do not share {len(names)} hosts equally",
                f"write {rankfile.name} (rank N=HOST slot=0 per line) beside it",
            )
        per = count // len(names)
        placed = [names[r // per] for r in range(count)]
    # Each host's ranks together: no two of them on the same chips (a rank that names none
    # drives every chip of its host, so it must be the host's only rank).
    of_rank: dict[int, Any] = {}
    for name in names:
        here = [b for b, at in zip(bf.bindings, placed, strict=True) if at == name]
        if not here:
            continue
        view = cluster.hosts[names.index(name)]
        part = ttrun.BindingFile(
            bf.path, here, bf.global_env, bf.mesh_graph_desc_path, bf.subcontext_sizes
        )
        got = ttrun.rank_units(part, view.inv, meshselect.units_of(view.inv), host=name)
        of_rank.update({b.rank: us for b, us in zip(here, got, strict=True)})
    units = [of_rank[b.rank] for b in bf.bindings]
    chips = [a for us in units for u in us for a in u.chips]
    req = replace(req, binding_units=units, tp_size=len(chips))
    # Each descriptor's mesh 0 (one per sub-context with --rank-bindings-mapping) against the
    # wiring: its ranks' host ranks must be their places.
    for desc in dict.fromkeys(bf.descriptor_of(b) for b in bf.bindings):
        try:
            text = paths.read_text(desc, "mesh graph descriptor", ttrun.MAX_BYTES)
            graph = mgd.parse(text)
            host_dims = graph.meshes[0].host_dims
        except (OSError, mgd.DescriptorError, IndexError) as exc:
            raise bad_input(f"{desc}: not a mesh graph descriptor ttmesh reads ({exc})")
        ranks = [
            (b.rank, b.mesh_host_rank or 0, [a for u in us for a in u.chips])
            for b, us in zip(bf.bindings, units, strict=True)
            if b.mesh_id == 0 and bf.descriptor_of(b) == desc
        ]
        problem = meshcluster.check_host_ranks(cluster, tuple(host_dims), ranks)  # type: ignore[arg-type]
        if problem:
            raise refused(
                f"pre-flight: {bf.path}: {problem}",
                "give each rank the host rank of its place in the wiring (ttmesh descriptor "
                "--hosts ... --export-rank-binding writes one)",
            )
    return req, meshselect.as_given(cluster.inv, chips), placed


def parse_rankfile(text: str, where: str, names: list[str], count: int) -> list[str]:
    """``rank N=HOST slot=...`` lines: the host of ranks 0..count-1, each among ``names``."""
    import re

    placed: dict[int, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = re.match(r"rank\s+([0-9]+)\s*=\s*(\S+)", line, re.ASCII)
        if not match:
            raise bad_input(f"{where}: not a rankfile line: {shown(line)}", "rank N=HOST slot=0")
        rank = numeric.whole(match.group(1), f"{where}: rank", high=numeric.MAX_CHIPS)
        host = match.group(2)
        if host not in names:
            raise bad_input(
                f"{where}: rank {rank} is on {shown(host)}, which --hosts does not name"
            )
        placed[rank] = host
    missing = [r for r in range(count) if r not in placed]
    if missing:
        raise bad_input(f"{where}: no host for rank {missing[0]}", "one line per rank")
    return [placed[r] for r in range(count)]
