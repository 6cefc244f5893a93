"""``ttmesh doctor``: capture what a host shows, for someone to reproduce a failure elsewhere."""

from __future__ import annotations

from typing import Any

import click

from ttmesh.cli.options import CONTEXT, host_options


@click.command("doctor", context_settings=CONTEXT)
@host_options
@click.option(
    "--capture",
    "capture",
    required=True,
    metavar="FILE",
    help="Write one archive (.tar.gz) of everything the host shows about its chips.",
)
@click.option("--force", is_flag=True, help="Overwrite FILE if it exists.")
@click.option(
    "--tt-smi",
    "tt_smi",
    metavar="PATH",
    help="The tt-smi to take the snapshot with (default: the host's own; env TTMESH_TT_SMI).",
)
def doctor_cmd(host: Any, capture: str, force: bool, tt_smi: str | None) -> int:
    """Capture a host's state into one archive: the driver's files, the cluster descriptor,
    `tt-smi -s`, kernel messages about the chips, and `ttmesh ls` / `check` as JSON.

    \b
    The kernel's system files go in too (hugepages in all and per NUMA node, each device's
    numa_node and IOMMU group, /proc/meminfo), each device's hwmon sensors, the
    /dev/tenstorrent/by-id names, tt-umd's lock files in /dev/shm (name, size, fields and
    verdict each; never the directory) and the container signs ttmesh reads. What system
    pre-flight finds there (the driver, the chips' firmware, hugepages) is printed after the
    archive's line.

    \b
    A part that cannot be captured (no tt-smi, kernel messages not readable) is recorded in
    the archive's manifest.json with the reason; the rest is still written. Nothing on the
    host changes. Rebuild the host anywhere as a simulated one:
      ttmesh sim create --from-capture FILE --root DIR

    \b
    Examples:
      ttmesh doctor --capture /tmp/host.tar.gz
      ttmesh doctor --sim quietbox2 --capture qb2.tar.gz --force
    """
    import os

    from ttmesh.errors import bad_input
    from ttmesh.paths import not_replaceable, writable_file
    from ttmesh.recovery import capture as cap

    path = writable_file(capture, "--capture")
    kind = not_replaceable(path)
    if kind is not None:  # --force would put the archive where /dev/null was
        raise bad_input(f"--capture {capture} is {kind}, not a file", "give a new file name")
    if os.path.lexists(path) and not force:
        raise bad_input(f"--capture {capture} already exists", "add --force to overwrite it")
    if tt_smi is not None:  # one the user named must exist; the host's own may be missing
        from ttmesh.recovery.reset import find_tt_smi

        find_tt_smi(host, tt_smi)
    found = cap.collect(host, tt_smi)
    cap.write_archive(found, path, force=force)
    size = path.stat().st_size
    parts = [name for name, info in found.sections.items() if info.get("ok")]
    click.echo(f"wrote {path} ({size // 1024 or 1} KiB): {', '.join(parts)}")
    for miss in found.missed:
        click.echo(f"  not captured: {miss['what']}: {miss['why']}")
    # System pre-flight's findings (driver, firmware, hugepages), as ttmesh check says them.
    for p in found.sections.get("ttmesh check", {}).get("system") or []:
        click.echo(f"  system: {p['severity']}: {p['what']}")
        click.echo(f"    fix: {p['fix']}")
    return 0
