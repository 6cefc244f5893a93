"""``ttmesh profiles`` (the serving stacks ttmesh knows) and ``ttmesh stop JOB``."""

from __future__ import annotations

import signal
import time

import click

from ttmesh.cli.params import CONTEXT, seconds
from ttmesh.errors import bad_input, failed


@click.command("profiles", context_settings=CONTEXT)
@click.option("--json", "as_json", is_flag=True, help="Print the ttmesh.profiles/1 JSON document.")
def profiles_cmd(as_json: bool) -> None:
    """List the serving stacks ttmesh recognises, and how it runs each.

    \b
    A profile is a file in ttmesh/configs/profiles (or in the directory $TTMESH_PROFILES):
    how the stack is recognised, how its chips are passed, the environment it needs, its flag rules, how
    readiness is known and how it stops. `ttmesh launch -- COMMAND` picks the first that
    matches COMMAND; `--profile NAME` picks one, `--profile none` none.

    \b
    Program profiles (kind: program, listed last) are plain programs on a known stack, run once
    per rank: torch-tpu (PyTorch on torch_tpu over libtt, chosen by LIBTT_TPU_COMPAT=1 in the
    job's environment) and jax-tt (JAX on libtt, by JAX_PLATFORMS=tt). See docs/torch-tpu.md.
    """
    from ttmesh.launcher.planning import programs
    from ttmesh.launcher.serving import profiles

    found = profiles.every()
    plain = programs.every()  # plain programs on a stack: after every server
    if as_json:
        from ttmesh.render import emit_json

        emit_json(
            {
                "schema": "ttmesh.profiles/1",
                "profiles": [
                    {
                        "name": p.name,
                        "title": p.title,
                        "recognise": p.recognise,
                        "chips": p.chips,
                        "env": p.env,
                        "ready": p.ready_path,
                        "grace": p.grace,
                        "rules": [r.get("id") for r in p.rules],
                        "path": p.path,
                        "flags": p.flags,  # the server's flag table
                        "kind": "server",
                    }
                    for p in found
                ]
                + [
                    {
                        "name": p.name,
                        "title": p.title,
                        "recognise": {"env": p.recognise},
                        "chips": "pass",
                        "env": p.env,
                        "ready": None,
                        "grace": None,
                        "rules": [],
                        "path": p.path,
                        "flags": None,
                        "kind": "program",
                        "contract": p.contract,
                        "private_dirs": p.private_dirs,
                    }
                    for p in plain
                ],
            }
        )
        return
    from ttmesh.render import table

    rows = [[p.name, _recognised(p.recognise), p.chips, len(p.rules), p.title] for p in found]
    rows += [[p.name, _recognised({"env": p.recognise}), "pass", 0, p.title] for p in plain]
    click.echo(table(["PROFILE", "RECOGNISED BY", "CHIPS", "RULES", "STACK"], rows))


def _recognised(spec: dict) -> str:
    parts = []
    for key, value in spec.items():
        if key == "program":
            parts.append(" | ".join(value) if isinstance(value, list) else str(value))
        elif key == "any":
            parts.append("(" + " or ".join(_recognised(alt) for alt in value) + ")")
        else:
            parts.extend(f"{k} {v}" for k, v in value.items())
    return " and ".join(parts)


@click.command("stop", context_settings=CONTEXT)
@click.argument("job", metavar="JOB")
@click.option(
    "--wait", "wait_s", type=seconds(example="120"), default=120.0, show_default=True, metavar="S",
    help="Seconds to wait for the job to end (0: do not wait).",
)  # fmt: skip
@click.option(
    "--dump", is_flag=True,
    help="Before stopping the ranks, write every rank's Python stacks (py-spy dump) and, when "
    "tt-triage is on PATH, its report, to the job's dump directory; the job's summary and "
    "--summary-json name the files. Needs py-spy: pip install 'ttmesh[debug]'.",
)  # fmt: skip
def stop_cmd(job: str, wait_s: float, dump: bool) -> int:
    """Stop a running job gracefully, from another terminal (as Ctrl-C would).

    \b
    The job's launcher gets SIGTERM: it stops every worker (a server drains first), checks and
    recovers the chips, and exits 143. A rank still bringing up the fabric gets --fabric-grace
    more before SIGKILL. With --dump the ranks' stacks are written first (a hung job: "the
    stack before you kill it"). A launcher stopped with SIGSTOP or Ctrl-Z is continued
    so that it can. Exit 0 once the job has ended, 1 if it is still running after --wait, 2
    when no such job of yours runs (see ttmesh ps).
    """
    from ttmesh import paths, procs
    from ttmesh.runtime import jobs

    paths.safe_name(job, "JOB")
    record = next((r for r in jobs.running() if r["job"] == job), None)
    if record is None:
        raise bad_input(f"no running job {job!r} of yours", "see ttmesh ps")
    pid, start = int(record.get("pid") or -1), record.get("supervisor_start")
    target, target_start = pid, start
    if not procs.alive(pid, start):  # the launcher is gone: its guardian finishes the job
        target, target_start = int(record.get("guardian") or -1), record.get("guardian_start")
    if dump:
        _ask_dump(job)
    try:
        sent = procs.signal_if_same(target, target_start, signal.SIGTERM)
    except PermissionError:
        raise bad_input(f"job {job} is not yours to stop", "run as its owner")
    if not sent:
        raise bad_input(f"job {job} ended before it could be stopped", "see ttmesh ps --all")
    click.echo(f"stopping job {job} (SIGTERM to pid {target})")
    # A stopped ttmesh (SIGSTOP, Ctrl-Z) would hold the SIGTERM, pending, while its ranks ran
    # on and ended by themselves: continue it, as a shell's kill does a stopped job's.
    if procs.continue_stopped(target):
        click.echo(f"pid {target} was stopped (SIGSTOP): continued it, to stop the job")
    elif procs.state(target) == "t" and target == pid:
        # Held by a debugger: it cannot act, its guardian can (it stops the workers; ttmesh
        # finishes the job when the debugger lets it go on).
        guardian = int(record.get("guardian") or -1)
        if procs.signal_if_same(guardian, record.get("guardian_start"), signal.SIGTERM):
            click.echo(f"pid {target} is held by a debugger: SIGTERM to its guardian {guardian}")
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if not any(r["job"] == job for r in jobs.running()):
            ended = next((r for r in jobs.every() if r["job"] == job), {})
            click.echo(f"job {job} ended: {ended.get('status', 'stopped')}")
            return 0
        time.sleep(0.1)
    if wait_s > 0:
        raise failed(f"job {job} is still running after {wait_s:g} s", "see ttmesh ps")
    return 0


def _ask_dump(job: str) -> None:
    """Leave the dump request in the job's run directory (private, the user's), read by its
    guardian when the SIGTERM comes."""
    import os

    from ttmesh.runtime import jobs

    run_dir = jobs.runs_dir() / job
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        os.close(os.open(run_dir / jobs.DUMP_REQUEST, flags, 0o600))
    except OSError as exc:
        raise bad_input(
            f"cannot ask job {job} for its stacks: {run_dir}: {exc.strerror or exc}",
            "stop it without --dump",
        )
