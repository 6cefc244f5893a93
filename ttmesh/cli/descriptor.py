"""``ttmesh descriptor``: the mesh graph descriptors (and tt-run bindings) a launch would use."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from ttmesh import numeric, paths
from ttmesh.cli.helpsections import SectionedCommand
from ttmesh.cli.params import CONTEXT, host_options, whole
from ttmesh.errors import bad_input
from ttmesh.launcher.planning.request import parse_shape
from ttmesh.vocab import LAYOUTS, Layout


@click.command("descriptor", cls=SectionedCommand, context_settings=CONTEXT)
@host_options
@click.option(
    "--tp-size",
    type=whole(low=1, high=numeric.MAX_CHIPS, unit="chips", example="4"),
    metavar="N",
    help="Chips in the mesh (default: every chip).",
)
@click.option(
    "--mesh-shape", metavar="RxC", help="Mesh shape (default: the squarest the host has)."
)
@click.option(
    "--mesh-layout",
    default=str(Layout.SINGLE_PROCESS),
    show_default=True,
    type=click.Choice(LAYOUTS),
    help="How the mesh is split over processes (see ttmesh launch --help).",
)
@click.option(
    "--nproc-per-node",
    "--nproc_per_node",
    "nproc",
    type=whole(low=1, high=numeric.MAX_CHIPS, unit="processes", example="2"),
    metavar="N",
    help="Processes the mesh is split over (mesh, multi-mesh).",
)
@click.option("--chips", metavar="BDF,...", help="Use exactly these chips.")
@click.option("--exclude", metavar="BDF,...", help="Never use these chips.")
@click.option(
    "--strict-links",
    is_flag=True,
    help="STRICT channel policy: every neighbour pair needs the links of the weakest pair "
    "tt-metal may place on.",
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
    "--export-rank-binding",
    metavar="FILE.yaml",
    help="Also write tt-run's rank-binding YAML (with --hosts, and FILE.rankfile for mpirun).",
)
@click.option(
    "--hosts",
    metavar="HOST,...",
    help="One mesh over these hosts (their chips reported through mpirun; --tp-size counts every "
    "host's chips).",
)
@click.option(
    "--launch-agent",
    metavar="CMD",
    help="With --hosts: how mpirun reaches the hosts instead of ssh (Open MPI's plm agent).",
)
@click.option(
    "--tcp-interface", metavar="IF", help="With --hosts: MPI's TCP traffic on this interface."
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
    hosts: str | None,
    launch_agent: str | None,
    tcp_interface: str | None,
) -> None:
    """Write tt-metal mesh graph descriptors for a set of chips, as ttmesh launch would.

    Healthy chips first, as a launch chooses them: with no healthy mesh of the size (links
    down), it refuses as the launch would (exit 3, naming the reset), since tt-metal refuses a
    mesh over links that are down. A shape tt-metal's placement refuses is refused (exit 2),
    with the shapes that fit.

    \b
    Examples:
      ttmesh descriptor --sim quietbox2                       # the whole 2x2 mesh, one process
      ttmesh descriptor --sim galaxy-wh --tp-size 8 --strict-links
      ttmesh descriptor --sim quietbox2 --mesh-layout mesh --per-rank -o /tmp/qb2
      ttmesh descriptor --sim t3k --mesh-layout multi-mesh --export-rank-binding bind.yaml -o out
      ttmesh descriptor --hosts t3k-a,t3k-b --mesh-layout mesh --nproc-per-node 1 -o out
    """
    _check_outputs(out_dir, export_rank_binding)
    if hosts is not None:
        return _over_hosts(
            hosts, launch_agent, tcp_interface, tp_size, mesh_shape, mesh_layout, nproc, chips,
            exclude, strict_links, per_rank, out_dir, export_rank_binding,
        )  # fmt: skip
    for flag, value in (("--launch-agent", launch_agent), ("--tcp-interface", tcp_interface)):
        if value is not None:
            raise bad_input(f"{flag} goes with --hosts", "a single host needs no mpirun options")
    target = Path(out_dir).resolve() if out_dir else Path("/nonexistent")
    request = _request(
        _mesh_size(host, tp_size, chips), mesh_shape, mesh_layout, strict_links, nproc,
        run_dir=str(target).removesuffix("/mesh"),
    )  # fmt: skip
    plan = _single_host_plan(host, request, chips, exclude)
    files = {Path(p).name: text for p, text in plan.files.items()}
    if out_dir:
        mocks = _rank_mocks(host, plan) if per_rank else {}
        _write_files(target, {**files, **mocks})
        if export_rank_binding:
            _write_binding(plan, target, files, export_rank_binding)
    else:
        _print_files(files)
    if per_rank:
        from ttmesh.render import table

        rows = [
            [r.rank, ",".join(r.bdfs), r.mesh_id, r.host_rank, "x".join(map(str, r.coord)),
             ",".join(r.chips)]
            for r in plan.ranks
        ]  # fmt: skip
        headers = ["RANK", "TT_VISIBLE_DEVICES", "TT_MESH_ID", "TT_MESH_HOST_RANK", "COORD",
                   "CHIPS"]  # fmt: skip
        click.echo(table(headers, rows, sys.stdout if out_dir else sys.stderr), err=not out_dir)


def _check_outputs(out_dir: str | None, export_rank_binding: str | None) -> None:
    """Refuse outputs that cannot be written before any host is read: the binding points at
    the written descriptor, so it needs -o; -o must be a directory this user may write, the
    binding a file it may create."""
    if export_rank_binding and not out_dir:
        raise bad_input(
            "--export-rank-binding needs -o DIR", "the binding points at the written descriptor"
        )
    if out_dir is not None:
        paths.writable_dir(out_dir, "-o", "the descriptors")
    if export_rank_binding is not None:
        paths.writable_file(export_rank_binding, "--export-rank-binding", new_parent=True)


def _mesh_size(host: Any, tp_size: int | None, chips: str | None) -> int | None:
    """``--tp-size``; without it (and without --chips, which sizes the mesh) every chip."""
    if tp_size is None and not chips:
        from ttmesh.fabric.devices import discover

        return len(discover(host).chips)
    return tp_size


def _request(
    tp_size: int | None,
    mesh_shape: str | None,
    mesh_layout: str,
    strict_links: bool,
    nproc: int | None,
    *,
    run_dir: str,
) -> Any:
    """The launch a descriptor is for: no command, the job named ``descriptor``."""
    from ttmesh.launcher.planning.request import LaunchRequest

    return LaunchRequest(
        command=[],
        tp_size=tp_size,  # type: ignore[arg-type]
        layout=mesh_layout,
        mesh_shape=parse_shape(mesh_shape),
        strict_links=strict_links,
        nproc=nproc,
        job="descriptor",
        run_dir=run_dir,
    )


def _single_host_plan(host: Any, request: Any, chips: str | None, exclude: str | None) -> Any:
    """The plan a launch on this host would make (its chips chosen as a launch chooses them),
    refused as that launch would be when links under the mesh are down."""
    from ttmesh.launcher.job.preflight import descriptor_checks
    from ttmesh.launcher.planning.prepare import prepare

    prepared = prepare(request, host, chips, exclude, allow_mpi_layouts=True, descriptor_only=True)
    descriptor_checks(prepared)
    return prepared.plan


def _rank_mocks(host: Any, plan: Any) -> dict[str, str]:
    """On a simulated host: each rank's mock cluster descriptor (its chips only), by file."""
    cluster = host.mock_cluster()
    if cluster is None:
        return {}
    from ttmesh.mesh import mock

    return {
        f"rank{r.rank}_cluster_descriptor.yaml": mock.chips_view(
            cluster, list(r.chips), f"ttmesh: rank {r.rank} of a {plan.layout} plan"
        )
        for r in plan.ranks
    }


def _write_files(target: Path, files: dict[str, str]) -> None:
    """``files`` written into ``target`` (made if need be), each path said as it is written."""
    paths.make_dirs(target, "the output directory")
    for name, text in files.items():
        paths.write_text(target / name, text, "-o")
        click.echo(str(target / name))


def _print_files(files: dict[str, str]) -> None:
    """``files`` on stdout, each under a ``# ---- NAME`` line when there are several."""
    for name, text in files.items():
        if len(files) > 1:
            click.echo(f"# ---- {name}")
        click.echo(text, nl=False)


def _write_binding(plan: Any, target: Path, files: dict[str, str], binding: str) -> None:
    """tt-run's rank-binding YAML, pointing at the descriptor written into ``target``."""
    from ttmesh.launcher.adapters import bindingfile, ttrun

    desc = str(target / ("mesh.textproto" if "mesh.textproto" in files else "rank0.textproto"))
    data = bindingfile.rank_binding(_relocate(plan, target), desc)
    paths.make_dirs(Path(binding).resolve().parent, "the binding's directory")
    paths.write_text(
        binding, ttrun.dump(data, "ttmesh: rank bindings for tt-run"), "--export-rank-binding"
    )
    click.echo(str(Path(binding).resolve()))


def _relocate(plan: Any, target: Any) -> Any:
    """The plan with its descriptor paths pointing into ``target`` (where -o wrote them)."""
    import dataclasses

    ranks = []
    for r in plan.ranks:
        env = dict(r.env)
        for key in ("TT_MESH_GRAPH_DESC_PATH", "TT_METAL_PHYSICAL_GROUPING_DESCRIPTOR_PATH"):
            if key in env:
                env[key] = str(target / env[key].rsplit("/", 1)[-1])
        ranks.append(dataclasses.replace(r, env=env))
    return dataclasses.replace(plan, ranks=ranks)


def _over_hosts(
    hosts: str,
    launch_agent: str | None,
    tcp_interface: str | None,
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
    """One mesh over several hosts: the descriptor every host gets, and per rank its host."""
    from ttmesh.launcher.nodes import meshhosts
    from ttmesh.vocab import MPI_LAYOUTS

    if chips or exclude:
        raise bad_input("--chips/--exclude name one host's chips", "drop them with --hosts")
    if mesh_layout not in MPI_LAYOUTS:
        raise bad_input(
            f"--hosts with --mesh-layout {mesh_layout}: a mesh over several hosts is one "
            "tt-metal world",
            "use --mesh-layout mesh or multi-mesh",
        )
    names = meshhosts.parse_hosts(hosts)
    mh = meshhosts.setup(names, agent=launch_agent, tcp_interface=tcp_interface)
    target = Path(out_dir).resolve() if out_dir else Path("/nonexistent")
    request = _request(tp_size, mesh_shape, mesh_layout, strict_links, nproc, run_dir=str(target))
    plan = meshhosts.prepare(request, mh, descriptor_only=True).plan
    mesh_files = {Path(p).name: t for p, t in plan.files.items() if Path(p).parent.name == "mesh"}
    mocks = {Path(p).name: t for p, t in plan.files.items() if Path(p).parent.name == "mock"}
    if out_dir:
        _write_files(target, {**mesh_files, **(mocks if per_rank else {})})
        if export_rank_binding:
            from ttmesh.launcher.adapters import bindingfile, ttrun
            from ttmesh.launcher.nodes import mpi

            relocated = _relocate(plan, target)
            data = bindingfile.rank_binding(relocated, str(target / "mesh.textproto"))
            groupings = relocated.ranks[0].env.get("TT_METAL_PHYSICAL_GROUPING_DESCRIPTOR_PATH")
            if groupings:
                data["global_env"]["TT_METAL_PHYSICAL_GROUPING_DESCRIPTOR_PATH"] = str(
                    target / Path(groupings).name
                )
            binding = Path(export_rank_binding).resolve()
            rankfile = binding.with_suffix(".rankfile")
            on = [plan.hosts[r.node] for r in plan.ranks]
            paths.make_dirs(binding.parent, "the binding's directory")
            paths.write_text(rankfile, mpi.rankfile_text(on), "--export-rank-binding")
            paths.write_text(
                binding,
                ttrun.dump(
                    data,
                    "ttmesh: rank bindings for tt-run over several hosts; rank N runs on the host\n"
                    f"rank N names in {rankfile.name}:\n"
                    f'  tt-run --rank-binding {binding.name} --mpi-args "--host '
                    f'{mpi.host_slots(on)} --rankfile {rankfile.name} --bind-to none" PROGRAM',
                ),
                "--export-rank-binding",
            )
            click.echo(str(binding))
            click.echo(str(rankfile))
    else:
        _print_files(mesh_files)
    if per_rank:
        from ttmesh.render import table

        rows = [
            [r.rank, plan.hosts[r.node], ",".join(r.bdfs), r.mesh_id, r.host_rank,
             "x".join(map(str, r.coord)), ",".join(r.chips)]
            for r in plan.ranks
        ]  # fmt: skip
        headers = ["RANK", "HOST", "TT_VISIBLE_DEVICES", "TT_MESH_ID", "TT_MESH_HOST_RANK",
                   "COORD", "CHIPS"]  # fmt: skip
        click.echo(table(headers, rows, sys.stdout if out_dir else sys.stderr), err=not out_dir)
