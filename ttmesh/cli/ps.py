"""``ttmesh ps``: your jobs, on every host."""

from __future__ import annotations

import click

from ttmesh.cli.options import CONTEXT, resolve_host


@click.command("ps", context_settings=CONTEXT)
@click.option(
    "--sim",
    "sim_name",
    metavar="NAME",
    help="Only jobs on the cached simulated host NAME.",
)
@click.option(
    "--root",
    "root",
    metavar="DIR",
    envvar="TTMESH_ROOT",
    help="Only jobs on the host under DIR. Env: TTMESH_ROOT.",
)
@click.option("--all", "show_all", is_flag=True, help="Also jobs that ended (the last 50).")
@click.option("--json", "as_json", is_flag=True, help="Print the ttmesh.ps/1 JSON document.")
@click.option("--all-hosts", is_flag=True, hidden=True, help="(the default now)")
def ps_cmd(
    sim_name: str | None, root: str | None, show_all: bool, as_json: bool, all_hosts: bool
) -> None:
    """List your ttmesh jobs on every host (real or simulated): id, state, root, chips, ranks.

    \b
    A job runs while its launcher or its guardian lives; it is "stopped" while one of its
    processes is (SIGSTOP, Ctrl-Z: nothing moves until kill -CONT PID). --all adds the jobs
    that ended and how (exit code, "launcher killed", ...). --root/--sim show one host's jobs
    only.
    """
    import time

    from ttmesh.runtime import jobs

    only = None
    if sim_name is not None or root is not None:
        only = str(resolve_host(sim_name, root).root)
    jobs.sweep()
    records = jobs.every(only) if show_all else jobs.running(only)
    for r in records:
        # A stopped process (SIGSTOP, Ctrl-Z) lives, so its job is not ended, but nothing of
        # it moves until it is continued: say so, naming which (kill -CONT PID continues it).
        r["stopped"] = jobs.stopped(r)
        r["state"] = "ended" if r.get("ended") else "stopped" if r["stopped"] else "running"
    if as_json:
        from ttmesh.render import emit_json

        emit_json({"schema": "ttmesh.ps/1", "jobs": records})
        return
    from ttmesh.render import note, printable, table

    rows = []
    for r in records:
        ranks = r.get("ranks", [])
        state = "running" if not r.get("ended") else (r.get("status") or "ended")
        if r["stopped"]:
            state = "stopped: " + ", ".join(f"{p['what']} {p['pid']}" for p in r["stopped"])
        rows.append(
            [
                r["job"],
                state,
                r.get("pid"),
                len(ranks),
                # A chipless server (stock SGLang on a CPU): no chips, no host read.
                ",".join(b for rank in ranks for b in rank.get("bdfs", [])) or "-",
                r.get("root", "?") or "-",
                time.strftime("%H:%M:%S", time.localtime(r.get("started", 0))),
                printable(" ".join(r.get("command", []))),  # one line, no escapes
            ]
        )
        fleet = r.get("fleet") if not r.get("ended") else None
        if isinstance(fleet, dict):
            rows[-1][3] = len(fleet.get("replicas") or [])
            every = [b for rep in fleet.get("replicas") or [] for b in rep.get("chips") or []]
            rows[-1][4] = printable(",".join(every)) or "-"  # the fleet's chips: its replicas'
            rows += fleet_rows(fleet, r["job"])
    if not rows:
        click.echo(
            "no ttmesh jobs" + ("" if show_all else " running") + (f" on {only}" if only else "")
        )
        return
    # One long state or command must not make every row hundreds of columns wide: the table
    # fits the terminal (a pipe: COLUMNS, else 160); --json keeps every value whole.
    headers = ["JOB", "STATE", "PID", "RANKS", "CHIPS", "ROOT", "STARTED", "COMMAND"]
    click.echo(table(headers, rows, fitted=True, keep=[0]))
    for r in records:
        if r["stopped"]:
            held = ", ".join(f"{p['what']} {p['pid']}" for p in r["stopped"])
            pids = " ".join(str(p["pid"]) for p in r["stopped"])
            note(
                f"job {r['job']} is stopped ({held}: SIGSTOP or Ctrl-Z): they do nothing until "
                f"kill -CONT {pids} (ttmesh stop {r['job']} continues them as it stops the job)"
            )


def fleet_rows(fleet: dict, job: str) -> list[list[object]]:
    """A fleet's router and replicas under its own row: each replica's state, PID, chips, then
    its URL (its port), restarts and last line; the router's state, PID, URL, restarts and
    metrics URL. A last line is the server's own text: through ``printable``, never raw."""
    from ttmesh.cli.fleetview import router_state
    from ttmesh.render import plural, printable

    rows: list[list[object]] = []
    router = fleet.get("router") or {}
    state = router_state(router)  # waiting (for a replica), running, down, stopped
    what = [str(router.get("url") or "-"), plural(int(router.get("restarts") or 0), "restart")]
    if router.get("metrics_url"):
        what.append(f"metrics {router['metrics_url']}")
    rows.append([f"{job}/router", state, router.get("pid"), "-", "-", "-", "-",
                 printable(" · ".join(what))])  # fmt: skip
    for rep in fleet.get("replicas") or []:
        state = str(rep.get("state") or "?")
        if state == "exited" and rep.get("code") is not None:
            state = f"exited {rep.get('code')}"
        what = [str(rep.get("url") or f"port {rep.get('port')}"),
                plural(int(rep.get("restarts") or 0), "restart")]  # fmt: skip
        if rep.get("last_line"):
            what.append(f"last: {rep['last_line']}")
        rows.append(
            [
                f"{job}/r{rep.get('replica')}", printable(state), rep.get("pid"), 1,
                printable(",".join(rep.get("chips") or [])) or "-", "-", "-",
                printable(" · ".join(what)),
            ]
        )  # fmt: skip
    return rows
