"""``ttmesh ps``: your jobs, on every host; ``ttmesh ps JOB``: one job in detail."""

from __future__ import annotations

import re
from typing import Any

import click

from ttmesh.cli.params import CONTEXT, resolve_host

# Ended jobs a plain ``ps`` shows besides the running ones: the job you just ran (or that just
# failed) is the one you look for; --all shows every one kept.
RECENT = 3


@click.command("ps", context_settings=CONTEXT)
@click.argument("job", required=False)
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
@click.option(
    "--all", "show_all", is_flag=True, help="Every job kept, running or ended (the last 50)."
)
@click.option("--json", "as_json", is_flag=True, help="Print the ttmesh.ps/1 JSON document.")
@click.option("--all-hosts", is_flag=True, hidden=True, help="(the default now)")
def ps_cmd(
    job: str | None,
    sim_name: str | None,
    root: str | None,
    show_all: bool,
    as_json: bool,
    all_hosts: bool,
) -> None:
    """List your ttmesh jobs on every host (real or simulated): id, state, root, chips, ranks.

    \b
    By default: every running job, and the 3 that ended last (how: exit code, "launcher
    killed", ...). --all: every job kept (TTMESH_JOB_HISTORY). --root/--sim: one host's jobs
    only. ps JOB: one job in detail (its chips, server, attempts, restarts, resets, diagnosis,
    logs), running or ended. A job runs while its launcher or its guardian lives; it is
    "stopped" while one of its processes is (SIGSTOP, Ctrl-Z: nothing moves until kill -CONT
    PID).
    """
    import time

    from ttmesh.runtime import jobs

    only = None
    if sim_name is not None or root is not None:
        only = str(resolve_host(sim_name, root).root)
    jobs.sweep()
    if job is not None:
        _one(job, only, as_json)
        return
    records = jobs.every(only) if show_all else recent(jobs.every(only))
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
                short_state(state, r),  # the whole of it: ps JOB
                r.get("pid"),
                len(ranks),
                # A chipless server (stock SGLang on a CPU): no chips, no host read.
                chips_cell([b for rank in ranks for b in rank.get("bdfs", [])]),
                root_cell(r.get("root")),
                time.strftime("%H:%M:%S", time.localtime(r.get("started", 0))),
                printable(" ".join(r.get("command", []))),  # one line, no escapes
            ]
        )
        fleet = r.get("fleet") if not r.get("ended") else None
        if isinstance(fleet, dict):
            rows[-1][3] = len(fleet.get("replicas") or [])
            every = [b for rep in fleet.get("replicas") or [] for b in rep.get("chips") or []]
            rows[-1][4] = chips_cell(every)  # the fleet's chips: its replicas'
            rows += fleet_rows(fleet, r["job"])
        elif not r.get("ended"):
            rows += server_rows(r)
    if not rows:
        click.echo(
            "no ttmesh jobs" + ("" if show_all else " running") + (f" on {only}" if only else "")
        )
        return
    # One long state or command must not make every row hundreds of columns wide: the table
    # fits the terminal (a pipe: COLUMNS, else 160), cutting the command first; the job, its
    # state (said short) and its chips (a count) are never cut. --json keeps every value whole.
    headers = ["JOB", "STATE", "PID", "RANKS", "CHIPS", "ROOT", "STARTED", "COMMAND"]
    # A server's or replica's URL (its row's last cell, up to " · ") is an identity too.
    urls = [len(str(row[7]).split(" · ")[0]) for row in rows if "/" in str(row[0])]
    floors = {7: max(urls) + 2} if urls else {}  # the URL, a space, then "…"
    # A long root loses its start: its last names tell the hosts apart (ps JOB says it whole).
    click.echo(table(headers, rows, fitted=True, keep=[0, 1, 4], floors=floors, left=[5]))
    for r in records:
        if r["stopped"]:
            held = ", ".join(f"{p['what']} {p['pid']}" for p in r["stopped"])
            pids = " ".join(str(p["pid"]) for p in r["stopped"])
            note(
                f"job {r['job']} is stopped ({held}: SIGSTOP or Ctrl-Z): they do nothing until "
                f"kill -CONT {pids} (ttmesh stop {r['job']} continues them as it stops the job)"
            )


STATE_WIDTH = 20  # a state cell longer than this is said shorter (ps JOB says it whole)
_RANK_EXIT = re.compile(r"rank ([0-9]+) exited with code (-?[0-9]+)")


def short_state(state: str, record: dict[str, Any]) -> str:
    """How a job stands, in a cell never cut: ``running``, ``launcher killed``,
    ``rank 1 exit 3`` (for "rank 1 exited with code 3"), ``refused``, ``hung in bring-up``
    (what comes before its ``:`` or ``(``), else ``exit CODE``."""
    from ttmesh.render import printable

    state = printable(state)
    if len(state) <= STATE_WIDTH:
        return state
    if m := _RANK_EXIT.fullmatch(state):
        return f"rank {m.group(1)} exit {m.group(2)}"
    head = re.split(r":| \(", state, maxsplit=1)[0].strip()
    if head and len(head) <= STATE_WIDTH:
        return head
    code = record.get("code")
    return f"exit {code}" if isinstance(code, int) else state[: STATE_WIDTH - 1] + "…"


def recent(records: list[dict[str, Any]], count: int = RECENT) -> list[dict[str, Any]]:
    """Running jobs and the ``count`` that ended last, oldest first (``records`` is)."""
    ended = sorted((r for r in records if r.get("ended")), key=lambda r: r["ended"])
    shown = {id(r) for r in ended[max(0, len(ended) - count) :]}
    return [r for r in records if not r.get("ended") or id(r) in shown]


def chips_cell(bdfs: list[str]) -> str:
    """A job's chips in a listing: the first one whole and how many more (``ps JOB`` lists
    them all); never cut."""
    from ttmesh.render import printable

    if not bdfs:
        return "-"
    first = printable(bdfs[0])
    return first if len(bdfs) == 1 else f"{first} +{len(bdfs) - 1}"


def root_cell(root: object) -> str:
    """The host: a cached simulated host as ``--sim NAME`` (its path is long and the same for
    every such host), any other root as its path."""
    from ttmesh.render import printable

    if not isinstance(root, str) or not root:
        return "-"
    from ttmesh.sim.roots import cache_root

    base = str(cache_root()) + "/"
    if root.startswith(base) and "/" not in root[len(base) :]:
        return f"--sim {printable(root[len(base) :])}"
    return printable(root)


def server_rows(record: dict[str, Any]) -> list[list[object]]:
    """A running server's row under its job: its state (starting, serving, unhealthy), then its
    URL and since when, as a fleet's replicas show theirs."""
    import time

    from ttmesh.render import printable

    server = record.get("server")
    if not isinstance(server, dict) or not server.get("url"):
        return []
    state = str(server.get("state") or "starting")
    what = [str(server.get("url"))]
    since = server.get("since")
    if isinstance(since, (int, float)) and state != "starting":
        what.append(f"{state} since {time.strftime('%H:%M:%S', time.localtime(since))}")
    ranks = record.get("ranks") or [{}]
    return [[f"{record['job']}/server", printable(state), ranks[0].get("pid"), "-", "-", "-",
             "-", printable(" · ".join(what))]]  # fmt: skip


def _one(job: str, only: str | None, as_json: bool) -> None:
    """``ps JOB``: the job's record in full (bad input when there is none)."""
    from ttmesh.errors import bad_input
    from ttmesh.paths import safe_name
    from ttmesh.runtime import jobs

    safe_name(job, "job id")
    record = next((r for r in jobs.every(only) if r.get("job") == job), None)
    if record is None:
        where = f" on {only}" if only else ""
        raise bad_input(
            f"no job '{job}' of yours{where} (running, or ended and kept)",
            "ttmesh ps --all lists your jobs",
        )
    record["stopped"] = jobs.stopped(record)
    record["state"] = (
        "ended" if record.get("ended") else "stopped" if record["stopped"] else "running"
    )
    if as_json:
        from ttmesh.render import emit_json

        emit_json({"schema": "ttmesh.ps/1", "jobs": [record]})
        return
    from ttmesh.cli.views import job_text

    click.echo(job_text(record))


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
                chips_cell(rep.get("chips") or []), "-", "-",
                printable(" · ".join(what)),
            ]
        )  # fmt: skip
    return rows
