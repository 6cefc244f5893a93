"""``ttmesh _recover --chips A,B,...``: this host's part in recovering a job's chips (internal).

Started on every host of a tt-metal mesh over several hosts, through the job's mpirun, by the
launching ttmesh after an attempt ended badly (and before the start with ``--auto-reset``), in
two steps (see ttmesh.launcher.nodes.hostrecovery): ``--check`` (this host's chips, its cable
ends, its reset domains), then ``--reset CHIPS --at TIME`` (the chips every host resets, at the
moment they agreed; then the wait for the cables to train). Not a command for users (they run
``ttmesh reset --hosts``), so hidden from ``--help``.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import click

from ttmesh.cli.params import CONTEXT, Number, host_options, seconds, whole
from ttmesh.errors import bad_input


def _asics(text: str) -> list[str]:
    return [a.strip().lower() for a in text.split(",") if a.strip()]


@click.command("_recover", context_settings=CONTEXT, hidden=True)
@host_options
@click.option("--chips", "chips", required=True, help="The job's chips (asic ids), on any host.")
@click.option("--check", "check", is_flag=True, help="Step 1: check, read the cable ends.")
@click.option("--reset", "reset_chips", default=None, help="Step 2: the chips to reset, any host.")
@click.option(
    "--at", "at", type=Number(low=0, high=1e11, unit="seconds"), default=None,
    help="Step 2: when (Unix time) to reset.",
)  # fmt: skip
@click.option("--train-timeout", type=seconds(), default=None)
@click.option("--always", is_flag=True, help="Reset even when the check finds nothing wrong.")
@click.option("--timeout", type=seconds(zero=False), default=120.0)
@click.option("--retries", type=whole(low=0, high=100), default=2)
@click.option("--tt-smi", "tt_smi", default=None)
@click.option("--job", "job", default=None, help="Let this job's processes still here end first.")
@click.option("--grace", type=seconds(), default=10.0)
def recover_cmd(
    host: Any,
    chips: str,
    check: bool,
    reset_chips: str | None,
    at: float | None,
    train_timeout: float | None,
    always: bool,
    timeout: float,
    retries: int,
    tt_smi: str | None,
    job: str | None,
    grace: float,
) -> int:
    """Check the job's chips on this host (--check), or reset them at the agreed moment
    (--reset --at); print the outcome as one line of JSON."""
    from ttmesh.recovery import afterjob

    def log(message: str) -> None:
        sys.stderr.write(f"ttmesh: reset: {message}\n")

    asics = _asics(chips)
    if check == (reset_chips is not None):
        raise bad_input("_recover takes --check or --reset CHIPS", "one of them")
    if check:
        found = afterjob.check_host(host, asics, peers=asics, always=always, log=log, job=job,
                                    grace=grace, train_timeout=train_timeout)  # fmt: skip
        click.echo(found.line())
        return 0
    now = time.time()
    if at is None or not now - afterjob.LATEST_START <= at <= now + afterjob.LATEST_START:
        raise bad_input(
            f"--at {at}: not within {afterjob.LATEST_START:g} s of now ({now:.0f})",
            "the launcher sets it; check the hosts' clocks (NTP)",
        )
    outcome = afterjob.reset_together(
        host, asics, _asics(reset_chips or ""), at=at,
        train_timeout=train_timeout,
        timeout=timeout, retries=retries, tt_smi=tt_smi, log=log,
    )  # fmt: skip
    click.echo(outcome.line())
    return outcome.exit_code
