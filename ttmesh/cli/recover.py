"""``ttmesh _recover --chips A,B,...``: this host's part in recovering a job's chips (internal).

Started on every host of a tt-metal mesh over several hosts, through the job's mpirun, by the
launching ttmesh after an attempt ended badly (and before the start with ``--auto-reset``); see
ttmesh.recovery.afterjob. Not a command for users (they run ``ttmesh reset --hosts``), so hidden
from ``--help``.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from ttmesh.cli.options import CONTEXT, host_options, seconds, whole


@click.command("_recover", context_settings=CONTEXT, hidden=True)
@host_options
@click.option("--chips", "chips", required=True, help="The job's chips (asic ids), on any host.")
@click.option("--always", is_flag=True, help="Reset even when the check finds nothing wrong.")
@click.option("--timeout", type=seconds(zero=False), default=120.0)
@click.option("--retries", type=whole(low=0, high=100), default=2)
@click.option("--tt-smi", "tt_smi", default=None)
@click.option("--job", "job", default=None, help="Let this job's processes still here end first.")
@click.option("--grace", type=seconds(), default=10.0)
def recover_cmd(
    host: Any,
    chips: str,
    always: bool,
    timeout: float,
    retries: int,
    tt_smi: str | None,
    job: str | None,
    grace: float,
) -> int:
    """Check the job's chips on this host, reset them if needed, print the outcome as JSON."""
    from ttmesh.recovery import afterjob

    def log(message: str) -> None:
        sys.stderr.write(f"ttmesh: reset: {message}\n")

    asics = [a.strip() for a in chips.split(",") if a.strip()]
    outcome = afterjob.check_and_reset(
        host,
        asics,
        always=always,
        timeout=timeout,
        retries=retries,
        tt_smi=tt_smi,
        log=log,
        job=job,
        grace=grace,
    )
    click.echo(outcome.line())
    return outcome.exit_code
