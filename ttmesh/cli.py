"""The ``ttmesh`` command line: parse, call one function, render its result.

Kept thin and light: importing this module pulls in click and nothing heavy (no torch, yaml or
rich), so ``ttmesh --help`` is instant. Every command takes ``--sim NAME`` (a cached simulated
host of a stock system) or ``--root DIR`` / ``TTMESH_ROOT`` (any root; default ``/``).
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any

import click

from ttmesh import __version__
from ttmesh.errors import BAD_INPUT, TTMeshError, bad_input

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def host_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--sim / --root, resolved into a ``host`` keyword argument."""

    @click.option(
        "--sim",
        "sim_name",
        metavar="NAME",
        help="Use a simulated host of stock system NAME (created once under ~/.cache/ttmesh/sim); "
        "see `ttmesh sim systems`.",
    )
    @click.option(
        "--root",
        "root",
        metavar="DIR",
        envvar="TTMESH_ROOT",
        help="Read the host under DIR (a simulated root, or / for this machine). Env: TTMESH_ROOT.",
    )
    @functools.wraps(fn)
    def wrapper(*args: Any, sim_name: str | None, root: str | None, **kwargs: Any) -> Any:
        return fn(*args, host=resolve_host(sim_name, root), **kwargs)

    return wrapper


def resolve_host(sim_name: str | None, root: str | None) -> Any:
    from ttmesh.fabric.host import Host

    if sim_name and root and not os.environ.get("TTMESH_ROOT") == root:
        raise bad_input("--sim and --root both given", "use one: --sim NAME or --root DIR")
    if sim_name:
        from ttmesh.sim.roots import ensure_cached

        host = Host(ensure_cached(sim_name))
    else:
        host = Host(root or "/")
        if host.simulated:
            from ttmesh.sim.roots import refresh_tools

            refresh_tools(host.root)
    if host.simulated:
        sys.stderr.write(f"simulated host: {host.root}\n")
    return host


@click.group(context_settings=CONTEXT)
@click.version_option(__version__, "-V", "--version", prog_name="ttmesh")
def main() -> None:
    """Launch and supervise multi-chip Tenstorrent jobs: one worker per chip.

    \b
    Try it without hardware, on a simulated QuietBox 2:
      ttmesh ls --sim quietbox2
    """


# --------------------------------------------------------------------------- ls


@main.command("ls", context_settings=CONTEXT)
@host_options
@click.option("--json", "as_json", is_flag=True, help="Print the ttmesh.ls/1 JSON document.")
def ls_cmd(host: Any, as_json: bool) -> None:
    """List the host's chips, who holds or leases them, and their Ethernet links.

    \b
    Chips are named by unique id (ASIC) and PCI address; /dev/tenstorrent/N numbers are shown
    as they are now (they change across resets). Remote chips (the right half of an n300) have
    no PCI address and are reached through their partner.
    """
    from ttmesh.fabric import listing

    data = listing.report(host)
    if as_json:
        from ttmesh.render import emit_json

        emit_json(data)
        return
    click.echo(_ls_text(data))


def _ls_text(data: dict) -> str:
    from ttmesh.render import table

    rows = []
    bdf_of = {c["asic_id"]: c["bdf"] for c in data["chips"]}
    for c in data["chips"]:
        if c["holders"] is None:
            held = "unknown"
        else:
            held = ",".join(str(h["pid"]) for h in c["holders"]) or "-"
        lease = c["lease"]
        rows.append(
            [
                "-" if c["dev_index"] is None else c["dev_index"],
                c["bdf"] or f"remote via {bdf_of.get(c['via'])}",
                c["asic_id"],
                c["board_type"],
                c["arch"],
                f"{c['dram_mb'] // 1024} GB",
                c["heartbeat"],
                held,
                f"{lease['job']}" if lease else "-",
            ]
        )
    out = [
        table(
            ["DEV", "PCI", "ASIC", "BOARD", "ARCH", "DRAM", "HEARTBEAT", "HELD BY", "LEASE"], rows
        )
    ]
    states: dict[str, int] = {}
    for link in data["links"]:
        states[link["state"]] = states.get(link["state"], 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in sorted(states.items())) or "none known"
    out.append(f"\nEthernet links: {summary}")
    for link in data["links"]:
        if link["state"] != "up":
            a, b = link["a"], link["b"]
            out.append(
                f"  {link['state']}: {a['asic_id']} ch{a['chan']} <-> {b['asic_id']} ch{b['chan']}"
            )
    for note in data["notes"]:
        out.append(f"note: {note}")
    for asic in data["missing"]:
        out.append(f"missing: chip {asic} is in the topology but not on the host")
    return "\n".join(out)


# --------------------------------------------------------------------------- launch

LAUNCH_CONTEXT = {**CONTEXT, "ignore_unknown_options": True, "allow_interspersed_args": False}


def _shape(value: str | None) -> tuple[int, int] | None:
    if value is None:
        return None
    import re

    match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", value)
    if not match or int(match.group(1)) < 1 or int(match.group(2)) < 1:
        raise bad_input(f"--mesh-shape {value!r}: expected ROWSxCOLS", "e.g. --mesh-shape 2x2")
    return int(match.group(1)), int(match.group(2))


def _ranks(value: str | None) -> set[int] | None:
    if value is None:
        return None
    try:
        return {int(v) for v in value.split(",") if v.strip()}
    except ValueError:
        raise bad_input(
            f"--ranks-filter {value!r}: expected rank numbers", "e.g. --ranks-filter 0,2"
        )


@main.command("launch", context_settings=LAUNCH_CONTEXT)
@host_options
@click.option(
    "--tp-size",
    type=int,
    metavar="N",
    help="Chips to use; one worker per chip (per board on n300 systems).",
)
@click.option(
    "--nproc-per-node",
    "--nproc_per_node",
    "nproc",
    type=int,
    metavar="N",
    help="Workers on this host (torchrun's flag). Default: one per chip (per board on n300 "
    "systems); fewer, each driving a block of chips, with --mesh-layout mesh or multi-mesh "
    "(alone, it splits the host's whole mesh).",
)
@click.option("--chips", metavar="BDF,...", help="Use exactly these chips (PCI addresses).")
@click.option("--exclude", metavar="BDF,...", help="Never use these chips.")
@click.option(
    "--mesh-shape",
    metavar="RxC",
    help="Mesh shape of the chips (default: the squarest the host has).",
)
@click.option(
    "--mesh-layout",
    default="isolated",
    show_default=True,
    type=click.Choice(["isolated", "single-process", "mesh", "multi-mesh"]),
    help="isolated: each worker its own chip and one-chip descriptor; single-process: one "
    "worker drives every chip; mesh/multi-mesh: one tt-metal world (needs MPI).",
)
@click.option(
    "--symmetric-dram-mb",
    type=int,
    default=2048,
    show_default=True,
    metavar="MB",
    help="LIBTT_SYMMETRIC_DRAM_MB, equal on every rank (DRAM reserved per chip for collectives).",
)
@click.option(
    "--env",
    "env_items",
    multiple=True,
    metavar="KEY=VALUE",
    help="Set for every rank (repeatable).",
)
@click.option(
    "--master-port",
    "--master_port",
    type=int,
    default=0,
    metavar="PORT",
    help="torch.distributed's port (default: a free one).",
)
@click.option(
    "--max-restarts",
    "--max_restarts",
    type=int,
    default=0,
    show_default=True,
    metavar="K",
    help="Relaunch every rank up to K times after a failure.",
)
@click.option(
    "--grace",
    "--shutdown-timeout",
    "--shutdown_timeout",
    type=float,
    default=5.0,
    show_default=True,
    metavar="S",
    help="Seconds between SIGTERM and SIGKILL when stopping workers.",
)
@click.option(
    "--ranks-filter",
    "--local-ranks-filter",
    "--local_ranks_filter",
    metavar="R,...",
    help="Show only these ranks' output on the console (log files get everything).",
)
@click.option(
    "--log-dir",
    "--log_dir",
    metavar="DIR",
    help="Write each rank's stdout and stderr to files in DIR.",
)
@click.option("--quiet", "-q", is_flag=True, help="No worker output on the console.")
@click.option(
    "-m", "--module", is_flag=True, help="COMMAND is a Python module (python -m COMMAND)."
)
@click.option(
    "--no-python", "--no_python", is_flag=True, help="Run COMMAND as is, even if it ends in .py."
)
@click.option(
    "--strict-links", is_flag=True, help="Descriptors demand the exact link count (STRICT)."
)
@click.option(
    "--launcher",
    type=click.Choice(["direct", "mpi"]),
    default=None,
    help="How ranks start: direct (one process each, the default) or mpi (one MPMD mpirun, the "
    "default for --mesh-layout mesh/multi-mesh: tt-metal worlds form through MPI).",
)
@click.option(
    "--auto-reset",
    is_flag=True,
    help="When pre-flight finds the chips unhealthy (links down, a hung chip), recover them with "
    "tt-smi -r, verify, then start.",
)
@click.option(
    "--reset-on-failure",
    is_flag=True,
    help="After an abnormal end, always reset the job's chips (default: only when links are down).",
)
@click.option(
    "--ready-timeout",
    type=float,
    metavar="S",
    help="Every rank must be ready within S seconds (it creates TTMESH_READY_FILE, or prints a line "
    "matching --ready-pattern), or the job is treated as hung: stopped, recovered, restarted.",
)
@click.option(
    "--ready-pattern", metavar="REGEX", help="A line of output that means a rank is ready."
)
@click.option("--tt-smi", "tt_smi", metavar="PATH", help="The tt-smi to recover chips with.")
@click.option(
    "--rank-binding",
    metavar="FILE.yaml",
    help="Run a tt-run rank-binding file: its ranks, chips (TT_VISIBLE_DEVICES), mesh ids and "
    "descriptor, under mpirun, with ttmesh's environment and supervision added.",
)
@click.option(
    "--workdir",
    metavar="DIR",
    help="Ranks' working directory. Default: yours; under --launcher mpi a directory of the job's "
    "own (tt-metal writes generated/ there), with TTMESH_ORIGINAL_CWD set; '.' keeps yours.",
)
@click.option(
    "--job-id",
    "--run-id",
    "--rdzv-id",
    "job_id",
    metavar="ID",
    help="Name the job (default: generated).",
)
@click.option("--dry-run", is_flag=True, help="Print the plan and start nothing.")
@click.option(
    "--json", "as_json", is_flag=True, help="With --dry-run: the ttmesh.plan/1 JSON document."
)
@click.option(
    "--show-env", is_flag=True, help="Show --env values in plans and records (hidden by default)."
)
@click.option(
    "--summary-json", metavar="FILE", help="Write the outcome {source, rank, code, reason} to FILE."
)
@click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="[--] COMMAND [ARGS]...")
def launch_cmd(
    host: Any,
    command: tuple[str, ...],
    tp_size: int | None,
    nproc: int | None,
    chips: str | None,
    exclude: str | None,
    mesh_shape: str | None,
    mesh_layout: str,
    symmetric_dram_mb: int,
    env_items: tuple[str, ...],
    master_port: int,
    max_restarts: int,
    grace: float,
    ranks_filter: str | None,
    log_dir: str | None,
    quiet: bool,
    module: bool,
    no_python: bool,
    strict_links: bool,
    job_id: str | None,
    dry_run: bool,
    as_json: bool,
    show_env: bool,
    summary_json: str | None,
    launcher: str | None,
    workdir: str | None,
    rank_binding: str | None,
    auto_reset: bool,
    reset_on_failure: bool,
    ready_timeout: float | None,
    ready_pattern: str | None,
    tt_smi: str | None,
) -> int:
    """Run COMMAND once per chip, supervised: the torchrun contract plus chips and fabric.

    \b
    Each rank gets RANK, WORLD_SIZE, MASTER_ADDR/PORT and the rest of torchrun's environment,
    its chip (TT_VISIBLE_DEVICES, by PCI address), a mesh graph descriptor
    (TT_MESH_GRAPH_DESC_PATH) and LIBTT_SYMMETRIC_DRAM_MB. The first rank to fail stops the
    job: every worker's process tree is stopped (SIGTERM, SIGKILL after --grace) and ttmesh
    exits with that rank's code.

    \b
    Examples:
      ttmesh launch --sim quietbox2 --tp-size 4 examples/allreduce.py
      ttmesh launch --tp-size 2 --chips 0000:01:00.0,0000:03:00.0 -- python -m mypkg.serve
      ttmesh launch --sim quietbox2 --tp-size 4 --dry-run --json -- ./run.sh
    """
    from ttmesh.launcher import launch
    from ttmesh.launcher.plan import LaunchRequest, parse_env
    from ttmesh.launcher.supervisor import Options

    if command and command[0] == "--":
        command = command[1:]
    if nproc is not None and nproc <= 0:
        raise bad_input(f"--nproc-per-node {nproc}: must be positive")
    binding = None
    if rank_binding:
        from ttmesh.launcher.adapters import ttrun

        binding = ttrun.load(rank_binding, dict(os.environ), os.getcwd())
    if tp_size is None and nproc is None and not chips and binding is None:
        raise bad_input("--tp-size is required", "e.g. --tp-size 4 (or name chips with --chips)")
    if max_restarts < 0:
        raise bad_input(f"--max-restarts {max_restarts}: cannot be negative")
    if grace < 0:
        raise bad_input(f"--grace {grace}: cannot be negative")
    if as_json and not dry_run:
        raise bad_input("--json goes with --dry-run", "the job's own output is not JSON")
    request = LaunchRequest(
        command=list(command),
        tp_size=tp_size,  # type: ignore[arg-type]
        module=module,
        no_python=no_python,
        layout=mesh_layout,
        mesh_shape=_shape(mesh_shape),
        symmetric_dram_mb=symmetric_dram_mb,
        env=parse_env(list(env_items)),
        master_port=master_port,
        max_restarts=max_restarts,
        grace=grace,
        job=job_id or "",
        strict_links=strict_links,
        nproc=nproc,
        launcher=launcher
        or ("mpi" if mesh_layout in ("mesh", "multi-mesh") or binding is not None else "direct"),
        workdir=os.path.abspath(workdir) if workdir else "",
        binding=binding,
        environ=dict(os.environ),
        ready_timeout=ready_timeout,
        ready_pattern=ready_pattern,
    )
    if ready_timeout is not None and ready_timeout <= 0:
        raise bad_input(f"--ready-timeout {ready_timeout}: must be positive")
    if ready_pattern is not None:
        import re

        try:
            re.compile(ready_pattern)
        except re.error as exc:
            raise bad_input(f"--ready-pattern {ready_pattern!r}: not a regular expression ({exc})")
    options = Options(ranks_filter=_ranks(ranks_filter), log_dir=log_dir, quiet=quiet)
    try:
        prepared = launch.prepare(request, host, chips, exclude, allow_mpi_layouts=dry_run)
    except TTMeshError as exc:
        if summary_json and not dry_run:
            launch.write_refusal(summary_json, exc)
        raise
    if dry_run:
        from ttmesh.render import emit_json

        data = prepared.plan.to_json(show_env)
        if as_json:
            emit_json(data)
        else:
            click.echo(_plan_text(data))
        return 0
    recovery = launch.Recovery(
        auto_reset=auto_reset, reset_on_failure=reset_on_failure, tt_smi=tt_smi
    )
    return launch.execute(prepared, options, summary_json, recovery=recovery)


def _plan_text(data: dict) -> str:
    from ttmesh.render import table

    lines = [
        f"job {data['job']}: layout {data['layout']}, mesh {data['mesh_shape'][0]}x{data['mesh_shape'][1]}, "
        f"symmetric DRAM {data['symmetric_dram_mb']} MB per chip, master {data['master']['addr']}:{data['master']['port']}"
    ]
    if data["grouping"]:
        lines.append(data["grouping"])
    rows = [
        [
            r["rank"],
            ",".join(r["bdfs"]),
            ",".join(r["chips"]),
            "x".join(map(str, r["coord"])),
            r["host_rank"],
            " ".join(r["argv"]),
        ]
        for r in data["ranks"]
    ]
    lines.append(table(["RANK", "PCI", "CHIPS", "COORD", "HOST RANK", "COMMAND"], rows))
    for name, path in data["descriptors"].items():
        lines.append(f"descriptor {name}: {path}")
    lines.append("environment of rank 0 (what ttmesh sets):")
    for key, value in sorted(data["ranks"][0]["env"].items()):
        lines.append(f"  {key}={value}")
    return "\n".join(lines)


@main.command("ps", context_settings=CONTEXT)
@host_options
@click.option("--json", "as_json", is_flag=True, help="Print the ttmesh.ps/1 JSON document.")
@click.option("--all-hosts", is_flag=True, help="Jobs on every root, not only this host's.")
def ps_cmd(host: Any, as_json: bool, all_hosts: bool) -> None:
    """List running ttmesh jobs: id, chips, ranks and their PIDs, command, start time."""
    import time

    from ttmesh.launcher import jobs

    records = jobs.running(None if all_hosts else str(host.root))
    if as_json:
        from ttmesh.render import emit_json

        emit_json({"schema": "ttmesh.ps/1", "jobs": records})
        return
    from ttmesh.render import table

    rows = []
    for r in records:
        ranks = r.get("ranks", [])
        rows.append(
            [
                r["job"],
                r["pid"],
                len(ranks),
                ",".join(b for rank in ranks for b in rank.get("bdfs", [])),
                time.strftime("%H:%M:%S", time.localtime(r.get("started", 0))),
                " ".join(r.get("command", [])),
            ]
        )
    if not rows:
        click.echo("no ttmesh jobs running")
        return
    click.echo(table(["JOB", "PID", "RANKS", "CHIPS", "STARTED", "COMMAND"], rows))


# --------------------------------------------------------------------------- descriptor


@main.command("descriptor", context_settings=CONTEXT)
@host_options
@click.option("--tp-size", type=int, metavar="N", help="Chips in the mesh (default: every chip).")
@click.option(
    "--mesh-shape", metavar="RxC", help="Mesh shape (default: the squarest the host has)."
)
@click.option(
    "--mesh-layout",
    default="single-process",
    show_default=True,
    type=click.Choice(["isolated", "single-process", "mesh", "multi-mesh"]),
    help="How the mesh is split over processes (see ttmesh launch --help).",
)
@click.option(
    "--nproc-per-node",
    "--nproc_per_node",
    "nproc",
    type=int,
    metavar="N",
    help="Processes the mesh is split over (mesh, multi-mesh).",
)
@click.option("--chips", metavar="BDF,...", help="Use exactly these chips.")
@click.option("--exclude", metavar="BDF,...", help="Never use these chips.")
@click.option(
    "--strict-links", is_flag=True, help="STRICT channel policy: exactly the links the host has."
)
@click.option(
    "--per-rank",
    is_flag=True,
    help="Show each rank's mesh ids and chips (and, with -o on a "
    "simulated host, write each rank's mock cluster descriptor).",
)
@click.option(
    "-o", "--output", "out_dir", metavar="DIR", help="Write the files to DIR instead of printing."
)
@click.option(
    "--export-rank-binding", metavar="FILE.yaml", help="Also write tt-run's rank-binding YAML."
)
def descriptor_cmd(
    host: Any,
    tp_size: int | None,
    mesh_shape: str | None,
    mesh_layout: str,
    nproc: int | None,
    chips: str | None,
    exclude: str | None,
    strict_links: bool,
    per_rank: bool,
    out_dir: str | None,
    export_rank_binding: str | None,
) -> None:
    """Write tt-metal mesh graph descriptors for a set of chips, as ttmesh launch would.

    \b
    Examples:
      ttmesh descriptor --sim quietbox2                       # the whole 2x2 mesh, one process
      ttmesh descriptor --sim galaxy-wh --tp-size 8 --strict-links
      ttmesh descriptor --sim quietbox2 --mesh-layout mesh --per-rank -o /tmp/qb2
      ttmesh descriptor --sim t3k --mesh-layout multi-mesh --export-rank-binding bind.yaml -o out
    """
    from pathlib import Path

    from ttmesh.launcher import launch
    from ttmesh.launcher.plan import LaunchRequest

    if nproc is not None and nproc <= 0:
        raise bad_input(f"--nproc-per-node {nproc}: must be positive")
    if export_rank_binding and not out_dir:
        raise bad_input(
            "--export-rank-binding needs -o DIR", "the binding points at the written descriptor"
        )
    if tp_size is None and not chips:
        from ttmesh.fabric.devices import discover

        tp_size = len(discover(host).chips)
    target = Path(out_dir).resolve() if out_dir else Path("/nonexistent")
    request = LaunchRequest(
        command=[],
        tp_size=tp_size,  # type: ignore[arg-type]
        layout=mesh_layout,
        mesh_shape=_shape(mesh_shape),
        strict_links=strict_links,
        nproc=nproc,
        job="descriptor",
        run_dir=str(target).removesuffix("/mesh"),
    )
    prepared = launch.prepare(
        request, host, chips, exclude, allow_mpi_layouts=True, descriptor_only=True
    )
    plan = prepared.plan
    files = {Path(p).name: text for p, text in plan.files.items()}
    mocks: dict[str, str] = {}
    if per_rank and host.simulated and out_dir:
        from ttmesh.mesh import mock

        for r in plan.ranks:
            mocks[f"rank{r.rank}_cluster_descriptor.yaml"] = mock.for_chips(
                host, list(r.chips), f"ttmesh: rank {r.rank} of a {plan.layout} plan"
            )
    if out_dir:
        target.mkdir(parents=True, exist_ok=True)
        for name, text in {**files, **mocks}.items():
            (target / name).write_text(text)
            click.echo(str(target / name))
        if export_rank_binding:
            from ttmesh.launcher.adapters import ttrun

            plan_for_files = _relocate(plan, target)
            desc = str(
                target / ("mesh.textproto" if "mesh.textproto" in files else "rank0.textproto")
            )
            data = ttrun.rank_binding(plan_for_files, desc)
            Path(export_rank_binding).write_text(
                ttrun.dump(data, "ttmesh: rank bindings for tt-run")
            )
            click.echo(str(Path(export_rank_binding).resolve()))
    else:
        for name, text in files.items():
            if len(files) > 1:
                click.echo(f"# ---- {name}")
            click.echo(text, nl=False)
    if per_rank:
        from ttmesh.render import table

        rows = [
            [
                r.rank,
                ",".join(r.bdfs),
                r.mesh_id,
                r.host_rank,
                "x".join(map(str, r.coord)),
                ",".join(r.chips),
            ]
            for r in plan.ranks
        ]
        click.echo(
            table(
                ["RANK", "TT_VISIBLE_DEVICES", "TT_MESH_ID", "TT_MESH_HOST_RANK", "COORD", "CHIPS"],
                rows,
            ),
            err=not out_dir,
        )


def _relocate(plan: Any, target: Any) -> Any:
    """The plan with its descriptor paths pointing into ``target`` (where -o wrote them)."""
    import dataclasses

    ranks = []
    for r in plan.ranks:
        env = dict(r.env)
        env["TT_MESH_GRAPH_DESC_PATH"] = str(
            target / env["TT_MESH_GRAPH_DESC_PATH"].rsplit("/", 1)[-1]
        )
        ranks.append(dataclasses.replace(r, env=env))
    return dataclasses.replace(plan, ranks=ranks)


# --------------------------------------------------------------------------- sim


@main.group("sim", context_settings=CONTEXT)
def sim_group() -> None:
    """Simulated hosts: the same files and tt-smi as a real machine, with fault injection."""


@sim_group.command("systems", context_settings=CONTEXT)
def sim_systems() -> None:
    """List the stock systems a simulated host can be."""
    from ttmesh.render import table
    from ttmesh.sim.system import load, stock_names

    rows = []
    for name in stock_names():
        model = load(name)
        rows.append([name, len(model.chips), model.arch, model.title])
    click.echo(table(["SYSTEM", "CHIPS", "ARCH", "DESCRIPTION"], rows))


@sim_group.command("create", context_settings=CONTEXT)
@click.option(
    "--system",
    "system",
    required=True,
    metavar="NAME|FILE",
    help="A stock system (ttmesh sim systems) or a system YAML file.",
)
@click.option("--root", "root", required=True, metavar="DIR", help="Where to build the host.")
@click.option("--force", is_flag=True, help="Recreate DIR if it already is a simulated host.")
def sim_create(system: str, root: str, force: bool) -> None:
    """Build a simulated host under DIR: driver files, cluster descriptor, tt-smi stand-in."""
    from pathlib import Path

    from ttmesh.sim.create import create
    from ttmesh.sim.system import load

    model = load(system)
    path = create(model, Path(root), force=force)
    click.echo(f"simulated {model.name} ({len(model.chips)} chips) at {path}")


@sim_group.group("fault", context_settings=CONTEXT)
@host_options
@click.pass_context
def sim_fault(ctx: click.Context, host: Any) -> None:
    """Inject a fault into a simulated host (see each KIND's --help).

    \b
    Examples:
      ttmesh sim fault --sim quietbox2 link-down 0000:01:00.0 0000:05:00.0
      ttmesh sim fault --root /tmp/qb2 chip-dead 0000:03:00.0 --permanent
      ttmesh sim fault --root /tmp/qb2 reset-fails --times 2
    """
    ctx.obj = host  # each KIND refuses a root that is not simulated (so --help works anywhere)


@sim_fault.command("link-down", context_settings=CONTEXT)
@click.argument("chip_a", metavar="BDF_A")
@click.argument("chip_b", metavar="BDF_B")
@click.option("--channel", type=int, metavar="C", help="Only the link on chip A's channel C.")
@click.pass_obj
def fault_link_down(host: Any, chip_a: str, chip_b: str, channel: int | None) -> None:
    """Take the Ethernet links between two linked chips down (all, or one channel)."""
    from ttmesh.sim import faults

    keys = faults.link_down(host, chip_a, chip_b, channel)
    click.echo(f"link-down: {len(keys)} link(s) between {chip_a} and {chip_b}")


@sim_fault.command("chip-dead", context_settings=CONTEXT)
@click.argument("chip", metavar="BDF")
@click.option("--permanent", is_flag=True, help="A reset does not bring it back (chip gone).")
@click.pass_obj
def fault_chip_dead(host: Any, chip: str, permanent: bool) -> None:
    """Freeze a chip's heartbeat (its firmware hangs); its links go down."""
    from ttmesh.sim import faults

    faults.chip_dead(host, chip, permanent)
    click.echo(f"chip-dead: {chip}{' (permanent)' if permanent else ''}")


@sim_fault.command("reset-fails", context_settings=CONTEXT)
@click.option(
    "--times", type=int, metavar="N", help="Fail the next N resets (default: until cleared)."
)
@click.pass_obj
def fault_reset_fails(host: Any, times: int | None) -> None:
    """Make tt-smi -r change nothing (while still exiting 0, as the real one does)."""
    from ttmesh.sim import faults

    faults.reset_fails(host, times)
    click.echo(f"reset-fails: {'until cleared' if times is None else f'next {times} reset(s)'}")


@sim_fault.command("reset-renumbers", context_settings=CONTEXT)
@click.pass_obj
def fault_reset_renumbers(host: Any) -> None:
    """The next reset brings chips back under other /dev/tenstorrent numbers."""
    from ttmesh.sim import faults

    faults.reset_renumbers(host)
    click.echo("reset-renumbers: armed for the next reset")


@sim_fault.command("reset-hangs", context_settings={**CONTEXT, "ignore_unknown_options": True})
@click.argument("seconds", type=float)
@click.pass_obj
def fault_reset_hangs(host: Any, seconds: float) -> None:
    """Make every reset take SECONDS (for timeout handling)."""
    from ttmesh.sim import faults

    faults.reset_hangs(host, seconds)
    click.echo(f"reset-hangs: resets take {seconds:g} s")


@sim_fault.command("hold", context_settings=CONTEXT)
@click.argument("chip", metavar="BDF")
@click.pass_obj
def fault_hold(host: Any, chip: str) -> None:
    """Start a detached process that holds the chip until killed or `sim clear`."""
    from ttmesh.sim import faults

    pid = faults.hold(host, chip)
    click.echo(f"hold: pid {pid} holds {chip}")


@sim_group.command("clear", context_settings=CONTEXT)
@host_options
def sim_clear(host: Any) -> None:
    """Remove every fault: chips alive, links up, fabric marks and fault holders gone."""
    from ttmesh.sim import faults

    done = faults.clear(host)
    click.echo(f"cleared ({done['holders_killed']} holder process(es) stopped)")


@sim_group.command("show", context_settings=CONTEXT)
@host_options
@click.option("--json", "as_json", is_flag=True, help="Print the state as JSON.")
def sim_show(host: Any, as_json: bool) -> None:
    """Show a simulated host's state: chips, links down, armed faults, fabric marks."""
    from ttmesh.render import emit_json, table
    from ttmesh.sim import faults

    view = faults.show(host)
    if as_json:
        emit_json(view)
        return
    rows = [
        [
            c["dev_index"],
            c["bdf"] or "remote",
            c["asic_id"],
            "alive" if c["alive"] else "dead",
            "yes" if c["present"] else "GONE",
            ",".join(map(str, c["holders"])) or "-",
        ]
        for c in view["chips"]
    ]
    click.echo(f"{view['system']} at {view['root']}")
    click.echo(table(["DEV", "PCI", "ASIC", "FIRMWARE", "PRESENT", "HOLDERS"], rows))
    click.echo(f"links down: {len(view['links_down'])}")
    for link in view["links_down"]:
        a, b = link["a"], link["b"]
        click.echo(
            f"  {a['asic_id']} ch{a['chan']} <-> {b['asic_id']} ch{b['chan']} ({link['why']})"
        )
    f = view["faults"]
    armed = []
    if f["reset_fails"]:
        times = f["reset_fails"].get("times")
        armed.append(f"reset-fails ({'until cleared' if times is None else f'{times} more'})")
    if f["reset_renumbers"]:
        armed.append("reset-renumbers")
    if f["reset_hangs"]:
        armed.append(f"reset-hangs {f['reset_hangs']:g}s")
    if f["permanent"]:
        armed.append("permanently dead: " + ", ".join(f["permanent"]))
    click.echo("armed: " + (", ".join(armed) or "none"))
    for m in view["fabric_marks"]:
        status = "open" if m["alive"] else "ABANDONED (links down)"
        click.echo(f"fabric mark: pid {m['pid']} {status}: {', '.join(m['chips'])}")


@sim_group.command("config", context_settings=CONTEXT)
@host_options
@click.option("--heartbeat-hz", type=float, help="How fast live chips' heartbeats advance.")
@click.option("--reset-seconds", type=float, help="How long a simulated reset takes.")
def sim_config(host: Any, heartbeat_hz: float | None, reset_seconds: float | None) -> None:
    """Show or change a simulated host's timing."""
    from ttmesh.sim import faults

    config = faults.set_config(host, heartbeat_hz, reset_seconds)
    click.echo(", ".join(f"{k}={v:g}" for k, v in sorted(config.items())))


from ttmesh.commands.fabric_cmds import check_cmd, reset_cmd  # noqa: E402

main.add_command(check_cmd, "check")
main.add_command(reset_cmd, "reset")


# --------------------------------------------------------------------------- entry point


def run(args: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code instead of raising SystemExit."""
    try:
        code = main.main(args=args, prog_name="ttmesh", standalone_mode=False)
    except TTMeshError as exc:
        sys.stderr.write(f"ttmesh: {exc}\n")
        return exc.code
    except click.exceptions.NoArgsIsHelpError as exc:
        click.echo(exc.ctx.get_help() if exc.ctx else "", err=True)
        return BAD_INPUT
    except click.UsageError as exc:
        cmd = exc.ctx.command_path if exc.ctx else "ttmesh"
        sys.stderr.write(f"ttmesh: {exc.format_message()} (see: {cmd} --help)\n")
        return BAD_INPUT
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.Abort:
        sys.stderr.write("ttmesh: aborted\n")
        return 130
    except BrokenPipeError:
        return 1
    return code if isinstance(code, int) else 0


def entry() -> None:
    code = run()
    # Leave without the interpreter's teardown (tens of milliseconds of module cleanup that
    # delays a launcher's exit): everything ttmesh writes is flushed or closed by now.
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (BrokenPipeError, ValueError):
        pass
    os._exit(code)
