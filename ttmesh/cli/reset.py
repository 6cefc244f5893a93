"""``ttmesh reset``: the safe way back to a healthy host."""

from __future__ import annotations

import functools
import sys
from typing import Any

import click

from ttmesh.cli.helpsections import SectionedCommand
from ttmesh.cli.onhosts import hosts_options
from ttmesh.cli.params import CONTEXT, host_options, seconds, whole
from ttmesh.errors import bad_input
from ttmesh.render import plural


@click.command("reset", cls=SectionedCommand, context_settings=CONTEXT)
@hosts_options
@host_options
@click.option(
    "--chips",
    metavar="BDF,...",
    help="Chips to reset (PCI addresses or /dev/tenstorrent/by-id names; a remote chip by its unique id). Default: every chip.",
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
    type=seconds(zero=False, example="120"),
    default=120.0,
    show_default=True,
    metavar="S",
    help="Seconds one tt-smi run may take; then it is killed and the attempt failed.",
)
@click.option(
    "--train-timeout",
    "train_timeout",
    type=seconds(example="60"),
    default=None,
    metavar="S",
    help="Seconds to wait after tt-smi for the chips' links to train (default: the boards' "
    "bound, 60 s; polled).",
)
@click.option(
    "--retries",
    type=whole(low=0, high=100, example="2"),
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
@click.option(
    "--no-live",
    is_flag=True,
    help="On a terminal, print progress lines instead of the live table of chips.",
)
@click.option(
    "--backoff", type=seconds(high=600), default=1.0, hidden=True, help="Seconds before a retry."
)
def reset_cmd(
    host: Any,
    chips: str | None,
    no_expand: bool,
    force: bool,
    timeout: float,
    train_timeout: float | None,
    retries: int,
    tt_smi: str | None,
    as_json: bool,
    no_live: bool,
    backoff: float,
) -> int:
    """Reset chips safely with tt-smi, then verify they recovered.

    \b
    1. The chips named grow to their reset domains (a PCI device and the chips behind it;
       a Galaxy's whole host: see ttmesh ls) and to every chip Ethernet-linked to them,
       transitively (resetting one end of a link leaves the other failing to train); the
       set is printed. It stops only at a link to another live job's chip that neither
       job's mesh uses: that link is left down and recorded, and the next job that needs
       it resets both ends first. --no-expand resets only the chips named, with a warning.
    2. Refuses (exit 3) while another ttmesh job leases a chip of the set, or a process
       holds one; --force stops such processes (never another job's workers).
    3. Runs `tt-smi -r <PCI addresses>`, naming only addresses that exist (tt-smi resets
       EVERY device when no target matches); on a Galaxy `tt-smi -glx_reset`.
    4. Ignores tt-smi's exit code and verifies: every chip back (found by PCI address and
       unique id, whatever its /dev/tenstorrent number), heartbeats advancing, links
       between the chips up, polled until right or --train-timeout passes. Retries up to
       --retries times.

    \b
    On a terminal a live table shows each chip's stage as it goes (resetting, waiting for
    PCI, heartbeat, links; done or failed) and for how long: a Galaxy reset takes about 30 s.
    --no-live, --json, a pipe or CI set in the environment print lines instead.

    \b
    Exit 0 recovered and verified, 1 not recovered (says what is still wrong; also when a
    chip the reset would take is missing from the host: a power-cycle brings it back), 2 bad
    input (or tt-smi missing: pip install tt-smi), 3 refused.

    \b
    Examples:
      ttmesh reset --sim quietbox2
      ttmesh reset --chips 0000:01:00.0            # and everything linked to it
      ttmesh reset --chips 0000:01:00.0 --force --timeout 300 --json
    """
    from ttmesh.fabric import health
    from ttmesh.fabric.devices import discover
    from ttmesh.recovery import reset

    if no_expand and chips is None:
        raise bad_input(
            "--no-expand needs --chips",
            "name the chips to reset alone, e.g. --chips 0000:01:00.0 --no-expand",
        )
    inv = discover(host)
    host.check_changeable()  # before saying what will be reset
    asics = health.parse_chips(inv, chips)
    run = functools.partial(
        reset.recover,
        host,
        asics,
        timeout=timeout,
        retries=retries,
        force=force,
        log=_progress if sys.stderr.isatty() else None,
        announce=_progress,
        expand_set=not no_expand,
        tt_smi=tt_smi,
        backoff=backoff,
        settle=train_timeout,
        inv=inv,
    )
    from ttmesh.cli.streams import live_enabled as enabled

    if as_json or not enabled(sys.stderr, no_live):
        outcome = run()
    else:
        from ttmesh.cli.live import ResetView

        with ResetView() as view:
            outcome = run(progress=view.progress)
    if as_json:
        from ttmesh.render import emit_json

        emit_json(outcome.to_json())
    else:
        from ttmesh.cli.views import reset_text

        click.echo(reset_text(outcome))
    n = len(outcome.attempts)
    if not outcome.recovered:
        wrong = outcome.attempts[-1].still_wrong if outcome.attempts else ["nothing was reset"]
        sys.stderr.write(
            f"ttmesh: not recovered after {plural(n, 'attempt')}: {'; '.join(wrong)}\n"
        )
    elif outcome.missing:  # the chips there are back; the host is not whole
        lost = outcome.missing[0]
        sys.stderr.write(f"ttmesh: not recovered: {lost.what} ({lost.fix})\n")
    return outcome.code


def _progress(message: str) -> None:
    sys.stderr.write(f"ttmesh: {message}\n")
    sys.stderr.flush()
