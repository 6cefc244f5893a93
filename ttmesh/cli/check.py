"""``ttmesh check``: is the host fit to run a job?"""

from __future__ import annotations

import sys
from typing import Any

import click

from ttmesh.cli.onhosts import hosts_options
from ttmesh.cli.options import CONTEXT, host_options
from ttmesh.errors import bad_input
from ttmesh.render import plural
from ttmesh.vocab import MPI_LAYOUTS, Layout


@click.command("check", context_settings=CONTEXT)
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
    help="Also check what this serving profile needs of the host's system software (its "
    "system: minimum driver and firmware, hugepages per chip; see ttmesh profiles).",
)
@click.option("--strict", is_flag=True, help="Warnings (unknown links, missing links) are errors.")
@click.option(
    "--notes",
    "all_notes",
    is_flag=True,
    help="Say every note about the host, also those already said while it stayed as it is "
    "(device nodes every user can open, stale Open MPI segments: said once per host state).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the ttmesh.check/1 JSON document.")
@click.option(
    "--active",
    is_flag=True,
    help="Also run a small ttnn program on the chips as one mesh (status bits can say up while "
    "the fabric still fails). On a simulated host tt-metal stops at its control plane.",
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
    Per chip: its driver node exists, its heartbeat advances (polled for up to 1 s), and no
    process outside the ttmesh job that leases it holds it. A chip the topology expects but
    the host lost is an error. Per Ethernet link: up, down (an error) or unknown (a warning,
    an error with --strict); a chip pair with fewer links than its peers is a warning.
    Every problem comes with a fix, e.g. `ttmesh reset --chips ...` or `kill 1234 ...`.

    \b
    System software, from the driver's and kernel's files: the driver at least the 2.0.0
    tt-umd needs (an error below); one firmware bundle on every chip (a warning when they
    differ); 1 GiB hugepages on each chip's NUMA node unless an IOMMU translates for it (none:
    an error; fewer than the 4 per chip hugepages-setup.sh sets up: a warning). --profile
    NAME checks what that profile's system: asks (minimums there are errors).

    \b
    tt-umd's lock files (/dev/shm/TT_UMD_LOCK.*; ROOT/dev/shm on a simulated root): a live
    process holding a chip's CHIP_IN_USE lock is an error (a job would wait on it without
    end), named with pid, user and command; a lock whose owner died is a note, never deleted
    (tt-umd recovers it; it relies on the files staying). As a user, only your own processes'
    mappings can be seen; root sees every process.

    \b
    On a real host the expected links are what discovery sees merged with the last
    known-good topology (recorded under ~/.local/state/ttmesh/topology by every check that
    finds all links up), so a link that vanished after a crash shows as down.

    \b
    With --hosts, every cable between the hosts is shown with both ends (each end as its own
    host's firmware reports it); a cable down from either end makes the check fail (exit 1),
    naming it and the reset of both hosts together that brings it back.

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
