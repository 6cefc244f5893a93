"""``ttmesh doctor``: capture what a host shows, for someone to reproduce a failure elsewhere;
or a support bundle: the capture, versions, environment, job records and logs, redacted."""

from __future__ import annotations

from typing import Any

import click

from ttmesh.cli.params import CONTEXT, host_options


@click.command("doctor", context_settings=CONTEXT)
@host_options
@click.option(
    "--capture",
    "capture",
    metavar="FILE",
    help="Write one archive (.tar.gz) of everything the host shows about its chips.",
)
@click.option(
    "--bundle",
    "bundle",
    metavar="FILE",
    help="Write a support bundle (.tar.gz): the capture, the versions of ttmesh and the stack "
    "it finds, the TT_*/TTMESH_*/LIBTT_* variables, your job records and their last output; "
    "secrets redacted, bounded in size.",
)
@click.option("--force", is_flag=True, help="Overwrite FILE if it exists.")
@click.option(
    "--tt-smi",
    "tt_smi",
    metavar="PATH",
    help="The tt-smi to take the snapshot with (default: the host's own; env TTMESH_TT_SMI).",
)
def doctor_cmd(
    host: Any, capture: str | None, bundle: str | None, force: bool, tt_smi: str | None
) -> int:
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
    --bundle FILE writes the same capture plus, under bundle/: the versions of ttmesh and of
    the stack each Python finds (tt-smi, tt-umd, ttnn, torch, torch_tpu, jax-tt-plugin,
    sglang, ...; read from their dist-info, nothing imported), the TT_*, TTMESH_* and LIBTT_*
    variables, your job records (ttmesh ps --all) and the last 64 KiB of each job's streams.
    Tokens, keys, passwords and URLs with credentials are replaced by ***; at most 16 MiB is
    added; bundle/manifest.json says what could not be collected and why.

    \b
    A part that cannot be captured (no tt-smi, kernel messages not readable) is recorded in
    the archive's manifest.json with the reason; the rest is still written. Nothing on the
    host changes. Rebuild the host anywhere as a simulated one (a bundle too):
      ttmesh sim create --from-capture FILE --root DIR

    \b
    Examples:
      ttmesh doctor --capture /tmp/host.tar.gz
      ttmesh doctor --sim quietbox2 --capture qb2.tar.gz --force
      ttmesh doctor --bundle /tmp/support.tar.gz
    """
    import os

    from ttmesh.errors import bad_input
    from ttmesh.paths import not_replaceable, writable_file
    from ttmesh.recovery import capture as cap

    if (capture is None) == (bundle is None):
        raise bad_input(
            "give --capture FILE or --bundle FILE" + (", not both" if capture else ""),
            "--capture: the host alone; --bundle: the host, versions, environment, job records "
            "and logs, for a support request",
        )
    flag, named = ("--bundle", bundle) if bundle is not None else ("--capture", capture)
    assert named is not None
    path = writable_file(named, flag)
    kind = not_replaceable(path)
    if kind is not None:  # --force would put the archive where /dev/null was
        raise bad_input(f"{flag} {named} is {kind}, not a file", "give a new file name")
    if os.path.lexists(path) and not force:
        raise bad_input(f"{flag} {named} already exists", "add --force to overwrite it")
    if tt_smi is not None:  # one the user named must exist; the host's own may be missing
        from ttmesh.recovery.reset import find_tt_smi

        find_tt_smi(host, tt_smi)
    if bundle is not None:
        from ttmesh.recovery import bundle as bundlemod

        found = bundlemod.collect(host, tt_smi)
    else:
        found = cap.collect(host, tt_smi)
    cap.write_archive(found, path, force=force, flag=flag)
    size = path.stat().st_size
    parts = [name for name, info in found.sections.items() if info.get("ok")]
    click.echo(f"wrote {path} ({size // 1024 or 1} KiB): {', '.join(parts)}")
    for miss in found.missed:
        click.echo(f"  not captured: {miss['what']}: {miss['why']}")
    if bundle is not None:
        _say_bundle(found)
    # System pre-flight's findings (driver, firmware, hugepages), as ttmesh check says them.
    for p in found.sections.get("ttmesh check", {}).get("system") or []:
        click.echo(f"  system: {p['severity']}: {p['what']}")
        click.echo(f"    fix: {p['fix']}")
    return 0


def _say_bundle(found: Any) -> None:
    """What the bundle added, what it could not, and how many secrets it replaced."""
    import json

    from ttmesh.render import plural

    manifest = json.loads(found.files["bundle/manifest.json"])
    jobs = manifest["sections"].get("jobs") or {}
    versions = manifest["sections"].get("versions") or {}
    click.echo(
        f"  bundle: versions from {plural(int(versions.get('pythons') or 0), 'Python')}, "
        f"{plural(int(jobs.get('records') or 0), 'job record')}, "
        f"{plural(int(jobs.get('streams') or 0), 'log tail')}; "
        f"{plural(int(manifest['redacted']), 'secret')} redacted"
    )
    for miss in manifest["not_collected"]:
        click.echo(f"  not collected: {miss['what']}: {miss['why']}")
