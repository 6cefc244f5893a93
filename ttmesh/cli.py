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
    "--strict-links",
    is_flag=True,
    help="Descriptors demand the weakest neighbour pair's link count of every pair (STRICT).",
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


# --------------------------------------------------------------------------- commands

from ttmesh.commands.descriptor_cmd import descriptor_cmd  # noqa: E402
from ttmesh.commands.fabric_cmds import check_cmd, reset_cmd  # noqa: E402
from ttmesh.commands.sim_cmds import sim_group  # noqa: E402

main.add_command(descriptor_cmd, "descriptor")
main.add_command(check_cmd, "check")
main.add_command(reset_cmd, "reset")
main.add_command(sim_group, "sim")


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
