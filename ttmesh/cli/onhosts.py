"""``--hosts`` for the commands that read a host (``ls``, ``check``, ``reset``): the same command
on every host, through one mpirun, shown host by host (:mod:`ttmesh.launcher.nodes.fanout`)."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import Any

import click
from click.core import ParameterSource

from ttmesh.errors import bad_input

OWN = {"hosts", "launch_agent", "sim_name", "root", "cables_line"}
CABLES = ("ls", "check")  # the commands that show the cables between the hosts
SCHEMA = "ttmesh.hosts/1"
CABLES_META = "ttmesh.cables"  # where ls and check leave this host's cable ends (ctx.meta)


def hosts_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--hosts / --launch-agent: run the command on every host instead of this one. Goes above
    :func:`~ttmesh.cli.params.host_options` (with --hosts, this host is not opened)."""

    @click.option(
        "--hosts",
        "hosts",
        metavar="HOST,...",
        help="Run this command on every one of these hosts (through mpirun, as a job) and show them "
        "host by host. Exit: the worst host's.",
    )
    @click.option(
        "--launch-agent",
        "launch_agent",
        metavar="CMD",
        help="With --hosts: how mpirun reaches the hosts instead of ssh.",
    )
    @click.option("--cables-line", "cables_line", is_flag=True, hidden=True)
    @functools.wraps(fn)
    def wrapper(
        *args: Any,
        hosts: str | None,
        launch_agent: str | None,
        cables_line: bool = False,
        **kwargs: Any,
    ) -> Any:
        if hosts is None:
            if launch_agent is not None:
                raise bad_input("--launch-agent is for --hosts", "add --hosts, or drop it")
            code = fn(*args, **kwargs)
            if cables_line:  # run for --hosts: this host's cable ends, for the launcher to join
                from ttmesh.launcher.nodes.fanout import CABLES_MARK

                ends = click.get_current_context().meta.get(CABLES_META, [])
                sys.stdout.write(CABLES_MARK + json.dumps(ends, separators=(",", ":")) + "\n")
                sys.stdout.flush()
            return code
        ctx = click.get_current_context()
        for name, flag in (("sim_name", "--sim"), ("root", "--root")):
            if ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE:
                raise bad_input(
                    f"{flag} names a host on this machine; with --hosts each host reads its own",
                    f"drop {flag} (a host's root there: TTMESH_ROOT, else /)",
                )
        return fan_out(ctx, hosts, launch_agent, bool(kwargs.get("as_json")))

    return wrapper


def forwarded(ctx: click.Context) -> list[str]:
    """The options the user gave this command, spelled for the same command on another host."""
    args = [ctx.info_name or ""]
    assert isinstance(ctx.command, click.Command)
    for param in ctx.command.params:
        if not isinstance(param, click.Option) or param.name in OWN or param.name is None:
            continue
        if ctx.get_parameter_source(param.name) is not ParameterSource.COMMANDLINE:
            continue
        value = ctx.params[param.name]
        if param.is_flag:
            spelled = param.opts[0] if value else next(iter(param.secondary_opts), None)
            if spelled:
                args.append(spelled)
        elif value is not None:
            args += [param.opts[0], str(value)]
    return args


def fan_out(ctx: click.Context, hosts: str, agent: str | None, as_json: bool) -> int:
    from ttmesh.launcher.nodes import fanout, meshhosts

    names = meshhosts.parse_hosts(hosts)
    mh = meshhosts.setup(names, agent=agent)
    args = forwarded(ctx)
    joins = ctx.info_name in CABLES
    runs = fanout.run(mh, [*args, "--cables-line"] if joins else args,
                      timeout=meshhosts.REPORT_TIMEOUT + 600)  # fmt: skip
    cables = fanout.join_cables(runs) if joins else []
    if as_json:
        from ttmesh.render import emit_json

        doc: dict[str, Any] = {
            "schema": SCHEMA,
            "command": ctx.info_name,
            "hosts": [_entry(r) for r in runs],
        }
        if joins:
            doc["cables"] = cables
        emit_json(doc)
    else:
        for i, r in enumerate(runs):
            head = f"== {r.host}" + ("" if r.code == 0 else f" (exit {_code(r)})") + " =="
            sys.stdout.write(("\n" if i else "") + head + "\n" + r.stdout)
            sys.stdout.flush()
            for line in r.stderr.splitlines():
                sys.stderr.write(f"[{r.host}] {line}\n")
        if cables:
            up = sum(1 for c in cables if c["state"] == "up")
            sys.stdout.write(f"\n== cables between the hosts: {up} of {len(cables)} up ==\n")
            for c in cables:
                sys.stdout.write(f"{fanout.cable_text(c)}: {c['state']}\n")
            sys.stdout.flush()
    failed = [r for r in runs if r.code != 0]
    for r in failed:
        sys.stderr.write(f"ttmesh: host {r.host}: exit {_code(r)}: {r.why()}\n")
    worst = fanout.worst(runs)
    down = [c for c in cables if c["state"] != "up"]
    if ctx.info_name == "check" and down:
        sys.stderr.write(f"ttmesh: {_cables_down(down, names, agent)}\n")
        worst = max(worst, 1)
    return worst


def _cables_down(down: list[dict[str, Any]], names: list[str], agent: str | None) -> str:
    """One line: which cables are down (both ends) and the exact command that brings them back:
    a reset of both hosts' chips at those ends together (one mpirun, so both ends come out of
    reset within the cables' window), then the wait for training."""
    import shlex

    from ttmesh.launcher.nodes import fanout

    hosts = sorted(
        {e["host"] for c in down for e in (c["a"], c["b"]) if e["host"]}, key=names.index
    )
    first = down[0]
    more = f" (and {len(down) - 1} more)" if len(down) > 1 else ""
    state = "down" if first["state"] == "down" else "not known to be up"
    reach = f" --launch-agent {shlex.quote(agent)}" if agent else ""
    return (
        f"unhealthy: cable {fanout.cable_text(first)} is {state}{more} (reset both hosts' chips "
        f"at those ends together: ttmesh reset --hosts {','.join(hosts or names)}{reach}; "
        f"then wait for the cables to train and check again: ttmesh check --hosts "
        f"{','.join(names)}{reach})"
    )


def _code(run: Any) -> str:
    return "?" if run.code is None else str(run.code)


def _entry(run: Any) -> dict[str, Any]:
    try:
        result = json.loads(run.stdout) if run.stdout.strip() else None
    except ValueError:
        result = None
    return {
        "host": run.host,
        "code": run.code,
        "result": result,
        "error": None if run.code == 0 else run.why(),
    }
