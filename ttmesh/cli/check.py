"""``ttmesh check``: is the host fit to run a job?"""

from __future__ import annotations

import sys
from typing import Any

import click

from ttmesh.cli.helpsections import SectionedCommand
from ttmesh.cli.onhosts import hosts_options
from ttmesh.cli.params import CONTEXT, host_options
from ttmesh.errors import bad_input
from ttmesh.render import plural
from ttmesh.vocab import MPI_LAYOUTS, Layout


@click.command("check", cls=SectionedCommand, context_settings=CONTEXT)
@hosts_options
@host_options
@click.option(
    "--chips",
    metavar="BDF,...",
    help="Check only these chips (PCI addresses or /dev/tenstorrent/by-id names; a remote chip by its unique id) and their links.",
)
@click.option(
    "--profile",
    "profile_name",
    metavar="NAME",
    help="Also check what this serving profile needs of the host's system software (its system:, "
    "see ttmesh profiles).",
)
@click.option("--strict", is_flag=True, help="Warnings (unknown links, missing links) are errors.")
@click.option(
    "--notes",
    "all_notes",
    is_flag=True,
    help="Say every note about the host, also those said before while it stayed as it is.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the ttmesh.check/1 JSON document.")
@click.option(
    "--active",
    is_flag=True,
    help="Also run a small ttnn program on the chips as one mesh (status bits can say up while "
    "the fabric still fails).",
)
@click.option("--ttnn-python", metavar="PATH", help="A Python with ttnn installed (3.10 or 3.12).")
@click.option(
    "--mesh-layout",
    type=click.Choice((str(Layout.SINGLE_PROCESS), *MPI_LAYOUTS)),
    help="With --active: probe as one process (single-process, the default), or as one "
    "process per chip under MPI (mesh, multi-mesh).",
)
def check_cmd(
    host: Any,
    chips: str | None,
    strict: bool,
    all_notes: bool,
    as_json: bool,
    active: bool,
    ttnn_python: str | None,
    mesh_layout: str | None,
    profile_name: str | None = None,
) -> int:
    """Is the host fit to run a job? Exit 0 healthy, 1 unhealthy, 2 bad input.

    \b
    Each chip (its driver node, an advancing heartbeat, no holder outside its job, no live
    tt-umd CHIP_IN_USE lock), each Ethernet link (up, down, unknown), and the system software
    tt-umd needs (driver, one firmware bundle, 1 GiB hugepages). Every problem comes with a
    fix, e.g. `ttmesh reset --chips ...`. What each check means: docs/quickstart.md (Is it
    healthy?); over several hosts, the cables between them: docs/multihost.md.

    \b
    Examples:
      ttmesh check --sim quietbox2
      ttmesh check --chips 0000:01:00.0,0000:03:00.0 --strict
      ttmesh check --json | jq '.problems[] | .fix'
      ttmesh check --hosts node0,node1
    """
    from ttmesh.fabric import health
    from ttmesh.fabric.devices import discover

    for flag, value in (("--mesh-layout", mesh_layout), ("--ttnn-python", ttnn_python)):
        if value is not None and not active:
            raise bad_input(f"{flag} goes with --active", f"add --active, or drop {flag}")
    mesh_layout = mesh_layout or Layout.SINGLE_PROCESS
    requires = _requires(profile_name)
    inv = discover(host)
    lost = {bdf: asic for asic, bdf in health.expected(inv).names.items()}
    selected = health.parse_chips(inv, chips, extra=lost)
    python = None
    if active:
        from ttmesh.launcher.job import active as activemod

        python = activemod.find_ttnn_python(ttnn_python)  # no ttnn: exit 2 before anything
    report = health.check(inv, selected, strict=strict, requires=requires)
    from ttmesh.cli.onhosts import CABLES_META
    from ttmesh.fabric.links import observe_cables

    cables = observe_cables(inv)  # this host's ends; check --hosts joins both ends of each
    click.get_current_context().meta[CABLES_META] = cables
    shm = _stale_segments(report)
    probe = None
    if active and report.healthy:
        bdfs = None
        if selected is not None:
            chosen = [c for c in inv.chips if c.asic_id in set(selected)]
            bdfs = sorted({lead.bdf for c in chosen if (lead := inv.lead(c)) and lead.bdf})
        probe = activemod.run(host, bdfs, python, layout=mesh_layout)  # type: ignore[arg-type]
    if as_json:
        from ttmesh.render import emit_json

        data = report.to_json()
        data["shm"] = shm.to_json()
        data["cables"] = cables
        _said_before(inv, shm, report.notes, say=False)
        if active:
            data["active"] = (
                probe.to_json() if probe else {"ok": False, "reason": "not run: unhealthy"}
            )
            data["healthy"] = bool(report.healthy and probe and probe.ok)
        emit_json(data)
    else:
        from ttmesh.cli.views import check_text

        held = set() if all_notes else _said_before(inv, shm, report.notes)
        click.echo(check_text(report, held))
        if probe is not None:
            click.echo(
                f"active probe ({probe.layout}): {'ok' if probe.ok else 'FAILED'}: {probe.reason}"
            )
    if probe is not None and not probe.ok:
        sys.stderr.write(f"ttmesh: unhealthy: the active probe failed: {probe.reason}\n")
        return 1
    if not report.healthy:
        errors = report.errors
        if as_json:  # stdout is for programs: the first problem, for a person, here
            detail = f"; first: {errors[0].what} (fix: {errors[0].fix})"
        else:  # every problem and its fix is printed above, once
            detail = " (each with its fix above)"
        sys.stderr.write(f"ttmesh: unhealthy: {plural(len(errors), 'error')}{detail}\n")
        return 1
    return 0


def _stale_segments(report: Any) -> Any:
    """The machine's stale Open MPI segments (ranks run here, whatever root is read), and
    their note in the report when there are any."""
    from ttmesh.runtime import leftovers

    shm = leftovers.stale_segments()
    if (shm_note := shm.note()) is not None:
        report.notes.append(shm_note)
    return shm


def _said_before(inv: Any, shm: Any, notes: list[str], say: bool = True) -> set[str]:
    """The notes about the host as a whole that this user was told while it was as it is now
    (runtime.said): not said again. A note about a chip or a lock is always said. ``say``
    False (--json, which always has every note): only forget what is gone from the host."""
    from ttmesh.fabric.health import device_notes
    from ttmesh.runtime import said

    nodes, shm_key = f"device-nodes {inv.host.root}", f"shm {shm.directory}"
    states = {nodes: "", shm_key: ""}  # nothing to say: forgotten, said again when it comes
    about: dict[str, str] = {}  # note -> what it is about
    for note in device_notes(inv):
        about[note], states[nodes] = nodes, note
    if (shm_note := shm.note()) is not None:  # a count that grows is the same state
        about[shm_note] = shm_key
        states[shm_key] = f"{shm.count.bit_length()} {shm.unjudged.bit_length()}"
    if not say:
        said.fresh({key: state for key, state in states.items() if not state})
        return set()
    fresh = said.fresh(states)
    return {n for n in notes if n in about and about[n] not in fresh}


def _requires(profile_name: str | None) -> Any:
    """What the serving profile ``profile_name`` asks of the host's system software (None:
    ttmesh's defaults; a program profile asks nothing more)."""
    if profile_name is None:
        return None
    from ttmesh.launcher.planning import programs
    from ttmesh.launcher.serving import profiles

    server = profiles.named(profile_name, tuple(p.name for p in programs.every()))
    return server.system if server is not None else None
