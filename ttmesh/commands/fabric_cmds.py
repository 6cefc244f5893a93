"""``ttmesh check`` and ``ttmesh reset``: the host's health, and the safe way back to it.

Thin, like the rest of the CLI: parse, call :mod:`ttmesh.fabric.health` or
:mod:`ttmesh.fabric.reset`, render. Nothing heavy is imported at module level.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import click

from ttmesh.cli import CONTEXT, host_options
from ttmesh.errors import bad_input

# --------------------------------------------------------------------------- check


@click.command("check", context_settings=CONTEXT)
@host_options
@click.option(
    "--chips",
    metavar="BDF,...",
    help="Check only these chips (PCI addresses; a remote chip by its unique id) and their links.",
)
@click.option("--strict", is_flag=True, help="Warnings (unknown links, missing links) are errors.")
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
    type=click.Choice(["single-process", "mesh", "multi-mesh"]),
    help="With --active: probe as one process (single-process, the default), or as one "
    "process per chip under MPI (mesh, multi-mesh).",
)
def check_cmd(
    host: Any,
    chips: str | None,
    strict: bool,
    as_json: bool,
    active: bool,
    ttnn_python: str | None,
    mesh_layout: str | None,
) -> int:
    """Is the host fit to run a job? Exit 0 healthy, 1 unhealthy, 2 bad input.

    \b
    Per chip: its driver node exists, its heartbeat advances (polled for up to 1 s), and no
    process outside the ttmesh job that leases it holds it. A chip the topology expects but
    the host lost is an error. Per Ethernet link: up, down (an error) or unknown (a warning,
    an error with --strict); a chip pair with fewer links than its peers is a warning.
    Every problem comes with a fix, e.g. `ttmesh reset --chips ...` or `stop pid 1234 ...`.

    \b
    On a real host the expected links are what discovery sees merged with the last
    known-good topology (recorded under ~/.local/state/ttmesh/topology by every check that
    finds all links up), so a link that vanished after a crash shows as down.

    \b
    Examples:
      ttmesh check --sim quietbox2
      ttmesh check --chips 0000:01:00.0,0000:03:00.0 --strict
      ttmesh check --json | jq '.problems[] | .fix'
    """
    from ttmesh.fabric import health
    from ttmesh.fabric.devices import discover

    for flag, value in (("--mesh-layout", mesh_layout), ("--ttnn-python", ttnn_python)):
        if value is not None and not active:
            raise bad_input(f"{flag} goes with --active", f"add --active, or drop {flag}")
    mesh_layout = mesh_layout or "single-process"
    inv = discover(host)
    lost = {bdf: asic for asic, bdf in health.expected(inv).names.items()}
    selected = health.parse_chips(inv, chips, extra=lost)
    python = None
    if active:
        from ttmesh.fabric import active as activemod

        python = activemod.find_ttnn_python(ttnn_python)  # no ttnn: exit 2 before anything
    report = health.check(inv, selected, strict=strict)
    probe = None
    if active and report.healthy:
        bdfs = None
        if selected is not None:
            chosen = [c for c in inv.chips if c.asic_id in set(selected)]
            bdfs = sorted({c.bdf or inv.chip(c.via).bdf for c in chosen if c.bdf or c.via})
        probe = activemod.run(host, bdfs, python, layout=mesh_layout)  # type: ignore[arg-type]
    if as_json:
        from ttmesh.render import emit_json

        data = report.to_json()
        if active:
            data["active"] = (
                probe.to_json() if probe else {"ok": False, "reason": "not run: unhealthy"}
            )
            data["healthy"] = bool(report.healthy and probe and probe.ok)
        emit_json(data)
    else:
        click.echo(_check_text(report))
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
        sys.stderr.write(f"ttmesh: unhealthy: {len(errors)} error(s){detail}\n")
        return 1
    return 0


def _check_text(report: Any) -> str:
    from ttmesh.render import table

    rows = []
    for c in report.chips:
        pids = ",".join(str(h.pid) for h in c.holders or [])
        held = "unknown" if c.holders is None else (pids or "-")
        rows.append(
            [
                c.bdf or "remote",
                c.asic_id,
                "-" if c.dev_index is None else c.dev_index,
                c.board_type or "-",
                c.heartbeat if c.present else "GONE",
                held,
                c.lease["job"] if c.lease else "-",
                "ok" if c.healthy else "PROBLEM",
            ]
        )
    out = [table(["CHIP", "ASIC", "DEV", "BOARD", "HEARTBEAT", "HELD BY", "LEASE", "STATE"], rows)]
    counts: dict[str, int] = {}
    for link in report.links:
        counts[link.state] = counts.get(link.state, 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "none expected"
    out.append(f"Ethernet links: {summary}")
    errors = len(report.errors)
    warnings = len(report.problems) - errors
    if report.healthy:
        out.append("healthy" + (f" ({warnings} warning(s))" if warnings else ""))
    else:
        out.append(f"UNHEALTHY: {errors} error(s), {warnings} warning(s)")
    for p in report.problems:
        out.append(f"{p.severity}: {p.what}")
        out.append(f"  fix: {p.fix}")
    return "\n".join(out)


# --------------------------------------------------------------------------- reset


def _seconds(name: str, value: float, allow_zero: bool = False) -> float:
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise bad_input(
            f"{name} {value:g}: give a positive number of seconds",
            f"e.g. {name} 120" if name == "--timeout" else None,
        )
    return value


@click.command("reset", context_settings=CONTEXT)
@host_options
@click.option(
    "--chips",
    metavar="BDF,...",
    help="Chips to reset (PCI addresses; a remote chip by its unique id). Default: every chip.",
)
@click.option(
    "--no-expand",
    is_flag=True,
    help="Reset only the chips named (and the remote chips behind them), not the chips "
    "linked to them. Their links to the rest stay down.",
)
@click.option(
    "--force",
    is_flag=True,
    help="Stop processes holding the chips (SIGTERM, then SIGKILL). Never another ttmesh "
    "job's workers or leased chips.",
)
@click.option(
    "--timeout",
    type=float,
    default=120.0,
    show_default=True,
    metavar="S",
    help="Seconds one tt-smi run may take; then it is killed and the attempt failed.",
)
@click.option(
    "--retries",
    type=int,
    default=2,
    show_default=True,
    metavar="K",
    help="Reset again up to K times while the chips do not verify.",
)
@click.option(
    "--tt-smi",
    "tt_smi",
    metavar="PATH",
    help="The tt-smi to run (default: $TTMESH_TT_SMI, the simulated host's, or PATH).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the ttmesh.reset/1 JSON document.")
@click.option("--backoff", type=float, default=1.0, hidden=True, help="Seconds before a retry.")
def reset_cmd(
    host: Any,
    chips: str | None,
    no_expand: bool,
    force: bool,
    timeout: float,
    retries: int,
    tt_smi: str | None,
    as_json: bool,
    backoff: float,
) -> int:
    """Reset chips safely with tt-smi, then verify they recovered.

    \b
    1. The chips named grow to whole boards and to every chip Ethernet-linked to them,
       transitively (resetting one end of a link leaves the other failing to train); the
       set is printed. --no-expand resets only the chips named, with a warning.
    2. Refuses (exit 3) while another ttmesh job leases a chip of the set, or a process
       holds one; --force stops such processes (never another job's workers).
    3. Runs `tt-smi -r <PCI addresses>`, naming only addresses that exist (tt-smi resets
       EVERY device when no target matches); on a Galaxy `tt-smi -glx_reset`.
    4. Ignores tt-smi's exit code and verifies: every chip back (found by PCI address and
       unique id, whatever its /dev/tenstorrent number), heartbeats advancing, links
       between the chips up. Retries up to --retries times.

    \b
    Exit 0 recovered and verified, 1 not recovered (says what is still wrong), 2 bad input
    (or tt-smi missing: pip install tt-smi), 3 refused.

    \b
    Examples:
      ttmesh reset --sim quietbox2
      ttmesh reset --chips 0000:01:00.0            # and everything linked to it
      ttmesh reset --chips 0000:01:00.0 --force --timeout 300 --json
    """
    from ttmesh.fabric import health, reset
    from ttmesh.fabric.devices import discover

    _seconds("--timeout", timeout)
    _seconds("--backoff", backoff, allow_zero=True)
    if retries < 0:
        raise bad_input(f"--retries {retries}: cannot be negative", "e.g. --retries 2")
    if no_expand and chips is None:
        raise bad_input(
            "--no-expand needs --chips",
            "name the chips to reset alone, e.g. --chips 0000:01:00.0 --no-expand",
        )
    inv = discover(host)
    asics = health.parse_chips(inv, chips)
    plan = reset.plan(inv, asics, no_expand=no_expand)
    tool = reset.find_tt_smi(host, tt_smi)
    sys.stderr.write(f"ttmesh: {plan.describe()}\n")
    for warning in plan.warnings:
        sys.stderr.write(f"ttmesh: warning: {warning.what}\n")
    sys.stderr.flush()
    log = _progress if sys.stderr.isatty() else None
    outcome = reset.execute(
        host,
        inv,
        plan,
        tool,
        timeout=timeout,
        retries=retries,
        force=force,
        log=log,
        backoff=backoff,
    )
    if as_json:
        from ttmesh.render import emit_json

        emit_json(outcome.to_json())
    else:
        click.echo(_reset_text(outcome))
    n = len(outcome.attempts)
    if not outcome.recovered:
        wrong = outcome.attempts[-1].still_wrong if outcome.attempts else ["nothing was reset"]
        sys.stderr.write(f"ttmesh: not recovered after {n} attempt(s): {'; '.join(wrong)}\n")
    return outcome.code


def _progress(message: str) -> None:
    sys.stderr.write(f"ttmesh: {message}\n")
    sys.stderr.flush()


def _reset_text(outcome: Any) -> str:
    from ttmesh.render import table

    n = len(outcome.attempts)
    rows = []
    for c in outcome.chips:
        dev = (
            f"{_dev(c['dev_before'])}->{_dev(c['dev_after'])}"
            if c["dev_before"] != c["dev_after"]
            else _dev(c["dev_after"])
        )
        rows.append(
            [
                c["bdf"] or f"remote {c['asic_id']}",
                c["asic_id"],
                c["before"],
                c["after"],
                dev,
                n,
            ]
        )
    out = [table(["CHIP", "ASIC", "BEFORE", "AFTER", "DEV", "ATTEMPTS"], rows)]
    if outcome.stopped:
        out.append("stopped holder pid(s): " + ", ".join(map(str, outcome.stopped)))
    if outcome.recovered:
        out.append(
            f"recovered and verified: {len(outcome.chips)} chip(s) after {n} attempt(s), "
            f"{outcome.seconds:.1f} s"
        )
    else:
        out.append(f"NOT RECOVERED after {n} attempt(s)")
    for p in outcome.problems:
        out.append(f"{p.severity}: {p.what}")
        out.append(f"  fix: {p.fix}")
    return "\n".join(out)


def _dev(value: int | None) -> str:
    return "-" if value is None else str(value)
