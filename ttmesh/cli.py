"""The ``ttmesh`` command line: parse, call one function, render its result.

Kept thin and light: importing this module pulls in click and nothing heavy (no torch, yaml or
rich), so ``ttmesh --help`` is instant. Every command takes ``--sim NAME`` (a cached simulated
host of a stock system) or ``--root DIR`` / ``TTMESH_ROOT`` (any root; default ``/``).
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any

import click

from ttmesh import __version__
from ttmesh.errors import BAD_INPUT, TTMeshError, bad_input

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def host_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--sim / --root, resolved into a ``host`` keyword argument."""

    @click.option(
        "--sim",
        "sim_name",
        metavar="NAME",
        help="Use a simulated host of stock system NAME (created once under ~/.cache/ttmesh/sim); "
        "see `ttmesh sim systems`.",
    )
    @click.option(
        "--root",
        "root",
        metavar="DIR",
        envvar="TTMESH_ROOT",
        help="Read the host under DIR (a simulated root, or / for this machine). Env: TTMESH_ROOT.",
    )
    @functools.wraps(fn)
    def wrapper(*args: Any, sim_name: str | None, root: str | None, **kwargs: Any) -> Any:
        return fn(*args, host=resolve_host(sim_name, root), **kwargs)

    return wrapper


def resolve_host(sim_name: str | None, root: str | None) -> Any:
    from ttmesh.fabric.host import Host

    if sim_name and root and not os.environ.get("TTMESH_ROOT") == root:
        raise bad_input("--sim and --root both given", "use one: --sim NAME or --root DIR")
    if sim_name:
        from ttmesh.sim.create import ensure_cached

        host = Host(ensure_cached(sim_name))
    else:
        host = Host(root or "/")
        if host.simulated:
            from ttmesh.sim.create import refresh_tools

            refresh_tools(host.root)
    if host.simulated:
        sys.stderr.write(f"simulated host: {host.root}\n")
    return host


@click.group(context_settings=CONTEXT)
@click.version_option(__version__, "-V", "--version", prog_name="ttmesh")
def main() -> None:
    """Launch and supervise multi-chip Tenstorrent jobs: one worker per chip.

    \b
    Try it without hardware, on a simulated QuietBox 2:
      ttmesh ls --sim quietbox2
    """


# --------------------------------------------------------------------------- ls


@main.command("ls", context_settings=CONTEXT)
@host_options
@click.option("--json", "as_json", is_flag=True, help="Print the ttmesh.ls/1 JSON document.")
def ls_cmd(host: Any, as_json: bool) -> None:
    """List the host's chips, who holds or leases them, and their Ethernet links.

    \b
    Chips are named by unique id (ASIC) and PCI address; /dev/tenstorrent/N numbers are shown
    as they are now (they change across resets). Remote chips (the right half of an n300) have
    no PCI address and are reached through their partner.
    """
    from ttmesh.fabric import listing

    data = listing.report(host)
    if as_json:
        from ttmesh.render import emit_json

        emit_json(data)
        return
    click.echo(_ls_text(data))


def _ls_text(data: dict) -> str:
    from ttmesh.render import table

    rows = []
    bdf_of = {c["asic_id"]: c["bdf"] for c in data["chips"]}
    for c in data["chips"]:
        if c["holders"] is None:
            held = "unknown"
        else:
            held = ",".join(str(h["pid"]) for h in c["holders"]) or "-"
        lease = c["lease"]
        rows.append(
            [
                "-" if c["dev_index"] is None else c["dev_index"],
                c["bdf"] or f"remote via {bdf_of.get(c['via'])}",
                c["asic_id"],
                c["board_type"],
                c["arch"],
                f"{c['dram_mb'] // 1024} GB",
                c["heartbeat"],
                held,
                f"{lease['job']}" if lease else "-",
            ]
        )
    out = [
        table(["DEV", "PCI", "ASIC", "BOARD", "ARCH", "DRAM", "HEARTBEAT", "HELD BY", "LEASE"], rows)
    ]
    states: dict[str, int] = {}
    for link in data["links"]:
        states[link["state"]] = states.get(link["state"], 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in sorted(states.items())) or "none known"
    out.append(f"\nEthernet links: {summary}")
    for link in data["links"]:
        if link["state"] != "up":
            a, b = link["a"], link["b"]
            out.append(f"  {link['state']}: {a['asic_id']} ch{a['chan']} <-> {b['asic_id']} ch{b['chan']}")
    for note in data["notes"]:
        out.append(f"note: {note}")
    for asic in data["missing"]:
        out.append(f"missing: chip {asic} is in the topology but not on the host")
    return "\n".join(out)


# --------------------------------------------------------------------------- sim


@main.group("sim", context_settings=CONTEXT)
def sim_group() -> None:
    """Simulated hosts: the same files and tt-smi as a real machine, with fault injection."""


@sim_group.command("systems", context_settings=CONTEXT)
def sim_systems() -> None:
    """List the stock systems a simulated host can be."""
    from ttmesh.render import table
    from ttmesh.sim.system import load, stock_names

    rows = []
    for name in stock_names():
        model = load(name)
        rows.append([name, len(model.chips), model.arch, model.title])
    click.echo(table(["SYSTEM", "CHIPS", "ARCH", "DESCRIPTION"], rows))


@sim_group.command("create", context_settings=CONTEXT)
@click.option("--system", "system", required=True, metavar="NAME|FILE",
              help="A stock system (ttmesh sim systems) or a system YAML file.")
@click.option("--root", "root", required=True, metavar="DIR", help="Where to build the host.")
@click.option("--force", is_flag=True, help="Recreate DIR if it already is a simulated host.")
def sim_create(system: str, root: str, force: bool) -> None:
    """Build a simulated host under DIR: driver files, cluster descriptor, tt-smi stand-in."""
    from pathlib import Path

    from ttmesh.sim.create import create
    from ttmesh.sim.system import load

    model = load(system)
    path = create(model, Path(root), force=force)
    click.echo(f"simulated {model.name} ({len(model.chips)} chips) at {path}")


# --------------------------------------------------------------------------- entry point


def run(args: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code instead of raising SystemExit."""
    try:
        code = main.main(args=args, prog_name="ttmesh", standalone_mode=False)
    except TTMeshError as exc:
        sys.stderr.write(f"ttmesh: {exc}\n")
        return exc.code
    except click.exceptions.NoArgsIsHelpError as exc:
        click.echo(exc.ctx.get_help() if exc.ctx else "", err=True)
        return BAD_INPUT
    except click.UsageError as exc:
        cmd = exc.ctx.command_path if exc.ctx else "ttmesh"
        sys.stderr.write(f"ttmesh: {exc.format_message()} (see: {cmd} --help)\n")
        return BAD_INPUT
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.Abort:
        sys.stderr.write("ttmesh: aborted\n")
        return 130
    except BrokenPipeError:
        return 1
    return code if isinstance(code, int) else 0


def entry() -> None:
    sys.exit(run())
