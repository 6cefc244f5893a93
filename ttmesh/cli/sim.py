"""``ttmesh sim``: build simulated hosts, inject faults, show and clear them."""

from __future__ import annotations

from typing import Any

import click

from ttmesh.cli.helpsections import SectionedCommand
from ttmesh.cli.params import CONTEXT, Number, host_options, seconds, whole
from ttmesh.render import escaped, plural


@click.group("sim", context_settings=CONTEXT)
def sim_group() -> None:
    """Simulated hosts: the same files and tt-smi as a real machine, with fault injection."""


@sim_group.command("systems", context_settings=CONTEXT)
def sim_systems() -> None:
    """List the stock systems a simulated host can be (a system of several hosts is built host
    by host: ttmesh sim create --system NAME --host N)."""
    from ttmesh.render import table
    from ttmesh.sim.system import ClusterModel, load_any, stock_names

    rows = []
    for name in stock_names():
        model = load_any(name)
        if isinstance(model, ClusterModel):
            chips = f"{len(model.hosts)} x {len(model.hosts[0].chips)}"
            rows.append([name, len(model.hosts), chips, model.arch, model.title])
        else:
            rows.append([name, 1, len(model.chips), model.arch, model.title])
    click.echo(table(["SYSTEM", "HOSTS", "CHIPS", "ARCH", "DESCRIPTION"], rows))


@sim_group.command("create", cls=SectionedCommand, context_settings=CONTEXT)
@click.option(
    "--system",
    "system",
    metavar="NAME|FILE",
    help="A stock system (ttmesh sim systems) or a system YAML file.",
)
@click.option(
    "--from-capture",
    "capture",
    metavar="FILE",
    help="An archive from ttmesh doctor --capture: the same chips, links and faults.",
)
@click.option("--root", "root", required=True, metavar="DIR", help="Where to build the host.")
@click.option(
    "--host",
    "host_index",
    type=whole(low=0, high=4096),
    metavar="N",
    help="Of a system of several hosts (dual-t3k, quad-galaxy, ...): build host N (0, 1, ...).",
)
@click.option("--force", is_flag=True, help="Recreate DIR if it already is a simulated host.")
@click.option(
    "--heartbeat-hz",
    type=Number(low=0, low_open=True, high=1e6, unit="a rate in Hz", example="10"),
    help="How fast live chips' heartbeats advance (default: the firmware's, 10 Hz; "
    "Blackhole reports it, Wormhole's is not published).",
)
@click.option(
    "--cables",
    "cables_dir",
    metavar="DIR",
    help="Several hosts: the directory the system's hosts share their cables in (default: beside "
    "--root, SYSTEM.cables).",
)
@click.option(
    "--cable-window",
    type=seconds(example="5"),
    help="How close together both ends of a cable must be reset for it to train (default 5 s).",
)
@click.option(
    "--cable-train-seconds",
    type=seconds(example="90"),
    help="How long a cable takes to train once both ends are reset (default: the boards': 90 s "
    "Wormhole, 60 s Blackhole).",
)
def sim_create(
    system: str | None,
    capture: str | None,
    root: str,
    host_index: int | None,
    force: bool,
    heartbeat_hz: float | None,
    cables_dir: str | None = None,
    cable_window: float | None = None,
    cable_train_seconds: float | None = None,
) -> None:
    """Build a simulated host under DIR: driver files, cluster descriptor, tt-smi stand-in.

    \b
    A system of several hosts is built one host per root: --host N builds host N, whose cluster
    descriptor has its own chips and, as tt-umd shows them on a real multi-host system, every
    cable to another host as a link to a remote device (the peer chip's unique id). The cables
    are one state every host of the system shares (--cables DIR): resetting one end downs a
    cable on both sides; it trains again only when both ends are reset within --cable-window
    seconds, --cable-train-seconds after the later reset.

    \b
    --from-capture rebuilds the host a field capture saw (ttmesh doctor --capture): its chips
    (unique ids, PCI addresses, /dev/tenstorrent numbers, cards, boards, harvesting), links,
    dead or lost chips and links down, hwmon values, by-id names, tt-umd's lock files (a
    held one as a dead owner's) and the container. What the simulator cannot express
    (processes holding chips or locks, leases, ...) is listed by ttmesh sim show.

    \b
    Examples:
      ttmesh sim create --system t3k --root /tmp/t3k
      ttmesh sim create --system dual-t3k --host 0 --root /tmp/t3k-a
      ttmesh sim create --system dual-t3k --host 1 --root /tmp/t3k-b
        (both share their cables in /tmp/dual-t3k.cables)
      ttmesh sim create --system t3k --heartbeat-hz 2 --root /tmp/t3k-slow
      ttmesh sim create --from-capture host.tar.gz --root /tmp/field
    """
    import os
    from pathlib import Path

    from ttmesh.errors import bad_input

    if (system is None) == (capture is None):
        raise bad_input(
            "give one of --system NAME and --from-capture FILE",
            "e.g. --system quietbox2 (see ttmesh sim systems)",
        )
    cable_flags = {
        "--cables": cables_dir,
        "--cable-window": cable_window,
        "--cable-train-seconds": cable_train_seconds,
    }
    if capture is not None:
        for flag, value in cable_flags.items():
            if value is not None:
                raise bad_input(f"{flag} goes with --system NAME --host N", f"drop {flag}")
        if host_index is not None:
            raise bad_input("--host goes with --system", "a capture is one host: drop --host")
        if heartbeat_hz is not None:
            raise bad_input(
                "--heartbeat-hz goes with --system",
                "set it after: ttmesh sim config --root DIR --heartbeat-hz N",
            )
        from ttmesh.sim.from_capture import recreate

        rec, path = recreate(Path(capture), Path(root), force=force)
        model = rec.model
        # Everything from the archive is someone else's text: escaped (render.escaped).
        click.echo(
            f"simulated {model.name} ({plural(len(model.chips), 'chip')}) at {path}: "
            + escaped(model.title)
        )
        for line in rec.reproduced:
            click.echo(f"  reproduced: {escaped(line)}")
        for line in rec.not_reproduced:
            click.echo(f"  not reproduced: {escaped(line)}")
        return
    from ttmesh.sim.create import create
    from ttmesh.sim.system import load_host

    assert system is not None
    model = load_host(system, host_index)
    if not model.system_cables:
        for flag, value in cable_flags.items():
            if value is not None:
                raise bad_input(
                    f"{flag} goes with a host of a system of several hosts",
                    f"drop {flag} ({model.name} has no cables between hosts)",
                )
    config: dict[str, float] = {}
    if heartbeat_hz is not None:
        config["heartbeat_hz"] = float(heartbeat_hz)
    if cable_window is not None:
        config["cable_window"] = float(cable_window)
    if cable_train_seconds is not None:
        config["cable_train_seconds"] = float(cable_train_seconds)
    shared = Path(cables_dir) if cables_dir is not None else None
    path = create(model, Path(root), force=force, config=config or None, cables=shared)
    which = "" if model.host is None else f" host {model.host} of {model.hosts}"
    click.echo(f"simulated {model.name}{which} ({plural(len(model.chips), 'chip')}) at {path}")
    if model.system_cables:
        from ttmesh.sim.create import default_cables_dir

        where = Path(os.path.abspath(shared or default_cables_dir(model, Path(root))))
        click.echo(
            f"cables to the other hosts: {where} (give every host of {model.name} the same "
            "--cables DIR)"
        )


@sim_group.group("fault", context_settings=CONTEXT)
@host_options
@click.pass_context
def sim_fault(ctx: click.Context, host: Any) -> None:
    """Inject a fault into a simulated host (see each KIND's --help).

    \b
    Examples:
      ttmesh sim fault --sim quietbox2 link-down 0000:01:00.0 0000:05:00.0
      ttmesh sim fault --root /tmp/t3k-a bad-cable 0000:ca:00.0 --channel 6
      ttmesh sim fault --root /tmp/qb2 chip-dead 0000:03:00.0 --permanent
      ttmesh sim fault --root /tmp/qb2 chip-gone 0000:05:00.0
      ttmesh sim fault --root /tmp/qb2 reset-fails --times 2
      ttmesh sim fault --root /tmp/qb2 fw-mismatch 0000:05:00.0 --version 18.6.0.0
      ttmesh sim fault --root /tmp/qb2 no-hugepages
      ttmesh sim fault --root /tmp/qb2 umd-lock 0000:01:00.0 --dead
      ttmesh sim fault --root /tmp/qb2 container 0000:03:00.0
    """
    ctx.obj = host  # each KIND refuses a root that is not simulated (so --help works anywhere)


@sim_fault.command("link-down", context_settings=CONTEXT)
@click.argument("chip_a", metavar="BDF_A")
@click.argument("chip_b", metavar="BDF_B")
@click.option(
    "--channel",
    type=whole(low=0, high=1023),
    metavar="C",
    help="Only the link on chip A's channel C.",
)
@click.pass_obj
def fault_link_down(host: Any, chip_a: str, chip_b: str, channel: int | None) -> None:
    """Take the Ethernet links between two linked chips down (all, or one channel)."""
    from ttmesh.sim import faults

    keys = faults.link_down(host, chip_a, chip_b, channel)
    click.echo(f"link-down: {plural(len(keys), 'link')} between {chip_a} and {chip_b}")


@sim_fault.command("bad-cable", context_settings=CONTEXT)
@click.argument("chip", metavar="BDF")
@click.option(
    "--channel",
    type=whole(low=0, high=1023),
    metavar="C",
    help="Only the cable on the chip's channel C (default: every cable of the chip).",
)
@click.pass_obj
def fault_bad_cable(host: Any, chip: str, channel: int | None) -> None:
    """A cable from this host's chip BDF to another host never trains again, whatever is reset
    (a bad cable, a dead port): both hosts see it down. ttmesh sim clear (on either host)
    mends it."""
    from ttmesh.sim import faults

    done = faults.bad_cable(host, chip, channel)
    for c in done:
        a, b = c["ends"]
        click.echo(
            f"bad-cable: host {a['host']} {a['asic']} ch{a['chan']} <-> host {b['host']} "
            f"{b['asic']} ch{b['chan']}"
        )


@sim_fault.command("chip-dead", context_settings=CONTEXT)
@click.argument("chip", metavar="BDF")
@click.option("--permanent", is_flag=True, help="A reset does not bring it back (chip gone).")
@click.pass_obj
def fault_chip_dead(host: Any, chip: str, permanent: bool) -> None:
    """Freeze a chip's heartbeat (its firmware hangs); its links go down."""
    from ttmesh.sim import faults

    faults.chip_dead(host, chip, permanent)
    click.echo(f"chip-dead: {chip}{' (permanent)' if permanent else ''}")


@sim_fault.command("chip-gone", context_settings=CONTEXT)
@click.argument("chip", metavar="BDF")
@click.pass_obj
def fault_chip_gone(host: Any, chip: str) -> None:
    """The chip falls off the PCI bus: the driver lists it no more (no /dev/tenstorrent node),
    and no reset brings it back (ttmesh sim clear stands for the power cycle)."""
    from ttmesh.sim import faults

    faults.chip_gone(host, chip)
    click.echo(f"chip-gone: {chip}")


@sim_fault.command("reset-fails", context_settings=CONTEXT)
@click.option(
    "--times",
    type=whole(low=1, example="2"),
    metavar="N",
    help="Fail the next N resets (default: until cleared).",
)
@click.pass_obj
def fault_reset_fails(host: Any, times: int | None) -> None:
    """Make tt-smi -r change nothing (while still exiting 0, as the real one does)."""
    from ttmesh.sim import faults

    faults.reset_fails(host, times)
    click.echo(
        f"reset-fails: {'until cleared' if times is None else 'next ' + plural(times, 'reset')}"
    )


@sim_fault.command("reset-renumbers", context_settings=CONTEXT)
@click.pass_obj
def fault_reset_renumbers(host: Any) -> None:
    """The next reset brings chips back under other /dev/tenstorrent numbers."""
    from ttmesh.sim import faults

    faults.reset_renumbers(host)
    click.echo("reset-renumbers: armed for the next reset")


@sim_fault.command("reset-hangs", context_settings={**CONTEXT, "ignore_unknown_options": True})
@click.argument("seconds", type=seconds())
@click.pass_obj
def fault_reset_hangs(host: Any, seconds: float) -> None:
    """Make every reset take SECONDS (for timeout handling)."""
    from ttmesh.sim import faults

    faults.reset_hangs(host, seconds)
    click.echo(f"reset-hangs: resets take {seconds:g} s")


@sim_fault.command("hold", context_settings=CONTEXT)
@click.argument("chip", metavar="BDF")
@click.pass_obj
def fault_hold(host: Any, chip: str) -> None:
    """Start a detached process that holds the chip until killed or `sim clear`."""
    from ttmesh.sim import faults

    pid = faults.hold(host, chip)
    click.echo(f"hold: pid {pid} holds {chip}")


@sim_fault.command("umd-lock", context_settings=CONTEXT)
@click.argument("chip", metavar="BDF")
@click.option(
    "--kind",
    default="CHIP_IN_USE",
    show_default=True,
    metavar="KIND",
    help="Which of tt-umd's chip locks: ARC_MSG, REMOTE_ARC_MSG, NON_MMIO, MEM_BARRIER, "
    "CHIP_IN_USE, PCIE_DMA.",
)
@click.option("--dead", is_flag=True, help="The holder dies holding it (a stale, harmless lock).")
@click.pass_obj
def fault_umd_lock(host: Any, chip: str, kind: str, dead: bool) -> None:
    """Write tt-umd's lock file for the chip (ROOT/dev/shm/TT_UMD_LOCK.KIND_N_PCIe, laid out
    as tt-umd's RobustMutex lays it out), locked by a detached process that maps it until
    killed or `sim clear`, or with --dead left by one that died. `ttmesh check` names a live
    CHIP_IN_USE holder, and a launch refuses the chip; a dead owner's lock is a note."""
    from ttmesh.sim import faults

    pid = faults.umd_lock(host, chip, kind.strip().upper(), dead)
    state = "was left locked by dead" if dead else "is held by"
    click.echo(f"umd-lock: {kind.strip().upper()} of {chip} {state} pid {pid}")


@sim_fault.command("no-hugepages", context_settings=CONTEXT)
@click.pass_obj
def fault_no_hugepages(host: Any) -> None:
    """The kernel sets no 1 GiB hugepages aside: nr_hugepages is 0 in all and on every NUMA
    node (as before hugepages-setup.sh ran). tt-umd then cannot map a chip's host memory
    unless an IOMMU translates for it."""
    from ttmesh.sim import faults

    faults.no_hugepages(host)
    click.echo("no 1 GiB hugepages on any NUMA node")


@sim_fault.command("container", context_settings=CONTEXT)
@click.argument("chip", metavar="BDF", required=False)
@click.option(
    "--shm-size",
    "shm_mib",
    type=whole(low=1, high=1024 * 1024),
    default=64,
    show_default=True,
    metavar="MIB",
    help="The container's private /dev/shm (Docker's default: 64).",
)
@click.pass_obj
def fault_container(host: Any, chip: str | None, shm_mib: int) -> None:
    """ttmesh runs in a Docker container started before a reset re-created the chips' nodes:
    /.dockerenv, an overlay root and a private /dev/shm of --shm-size MiB in
    proc/self/mountinfo, and chip BDF's /dev/tenstorrent node gone (default: the first PCI
    chip). ttmesh sim clear ends it (docs/containers.md)."""
    from ttmesh.sim import faults

    node = faults.container(host, chip, shm_mib)
    click.echo(f"in a container: {node} is gone, /dev/shm is a private {shm_mib} MiB")


@sim_fault.command("fw-mismatch", context_settings=CONTEXT)
@click.argument("chip", metavar="BDF")
@click.option(
    "--version",
    "version",
    default="18.6.0.0",
    show_default=True,
    help="The firmware bundle the chip reports (tt_fw_bundle_ver).",
)
@click.pass_obj
def fault_fw_mismatch(host: Any, chip: str, version: str) -> None:
    """One chip runs another firmware bundle than the others (a board flashed apart)."""
    from ttmesh.sim import faults

    faults.fw_mismatch(host, chip, version)
    click.echo(f"{chip} reports firmware bundle {version}")


@sim_fault.command("old-kmd", context_settings=CONTEXT)
@click.option(
    "--version",
    "version",
    default="1.34.0",
    show_default=True,
    help="The driver version sys/module/tenstorrent/version shows.",
)
@click.pass_obj
def fault_old_kmd(host: Any, version: str) -> None:
    """The tenstorrent driver (tt-kmd) is an old one: tt-umd needs 2.0.0 or later."""
    from ttmesh.sim import faults

    faults.old_kmd(host, version)
    click.echo(f"tenstorrent driver {version}")


@sim_group.command("standin", context_settings=CONTEXT)
def sim_standin() -> None:
    """Print the directory of ttmesh's stand-in server, to put on PYTHONPATH.

    \b
    With it there, the serving stacks' own commands run the stand-in (standard library only):
      python -m sglang.launch_server ...                  SGLang-TorchTPU (--device tpu), stock SGLang
      python -m sgl_jax.launch_server ...                 SGLang-JAX
      python -m vllm.entrypoints.openai.api_server ...    vLLM
    It prints its start as the stack's log does (engine, chips, weights, KV cache, compile, API
    server), opens the simulated chips, and serves /health, /generate and the OpenAI routes.

    \b
    Its environment:
      FAKE_PACE=S        its start's pace (1: about 15 s, the default; 10: minutes; 0: at once)
      FAKE_MODE=M        crash, crash-tree, hang, mute, unhealthy, child-dies, ignore-term,
                         fatal (a TT_THROW while it opens the chips, then it sits there),
                         fatal-late (the same line once ready, and it serves on),
                         slow-compile (FAKE_COMPILE seconds, an hour by default),
                         hung-healthy (after ready /health answers, generations hang)
      FAKE_HANG_AT=P     stop the start for good in phase P (engine, device, weights, kv,
                         compile, server)
      FAKE_FAIL_AFTER=S  seconds after ready its failure comes (0.5)
      FAKE_SAY=LINE      a line it prints on stderr as it starts; FAKE_FATAL=LINE the fatal one

    \b
    Example (serve on a simulated QuietBox 2):
      export PYTHONPATH=$(ttmesh sim standin)
      ttmesh launch --sim quietbox2 -- python -m sglang.launch_server --model-path Qwen/Qwen3-8B \\
        --device tpu --tp-size 4 --port 31000 --kv-cache-dtype bfloat16 --grammar-backend none
    """
    from pathlib import Path

    import ttmesh.sim

    click.echo(Path(ttmesh.sim.__file__).resolve().parent / "standin")


@sim_group.command("clear", context_settings=CONTEXT)
@host_options
def sim_clear(host: Any) -> None:
    """Remove every fault: chips alive, links up, fabric marks and fault holders gone."""
    from ttmesh.sim import faults

    done = faults.clear(host)
    stopped = plural(done["holders_killed"], "holder process", "holder processes")
    click.echo(f"cleared ({stopped} stopped)")


@sim_group.command("show", context_settings=CONTEXT)
@host_options
@click.option("--json", "as_json", is_flag=True, help="Print the state as JSON.")
def sim_show(host: Any, as_json: bool) -> None:
    """Show a simulated host's state: chips, links down, armed faults, fabric marks."""
    from ttmesh.render import emit_json, table
    from ttmesh.sim import faults

    view = faults.show(host)
    if as_json:
        emit_json(view)
        return
    rows = [
        [
            c["dev_index"],
            c["bdf"] or "remote",
            c["asic_id"],
            "alive" if c["alive"] else "dead",
            "yes" if c["present"] else "GONE",
            ",".join(map(str, c["holders"])) or "-",
        ]
        for c in view["chips"]
    ]
    click.echo(f"{view['system']} at {view['root']}")
    click.echo(table(["DEV", "PCI", "ASIC", "FIRMWARE", "PRESENT", "HOLDERS"], rows))
    click.echo(f"links down: {len(view['links_down'])}")
    for link in view["links_down"]:
        a, b = link["a"], link["b"]
        click.echo(
            f"  {a['asic_id']} ch{a['chan']} <-> {b['asic_id']} ch{b['chan']} ({link['why']})"
        )
    f = view["faults"]
    armed = []
    if f["reset_fails"]:
        times = f["reset_fails"].get("times")
        armed.append(f"reset-fails ({'until cleared' if times is None else f'{times} more'})")
    if f["reset_renumbers"]:
        armed.append("reset-renumbers")
    if f["reset_hangs"]:
        armed.append(f"reset-hangs {f['reset_hangs']:g}s")
    if f.get("no_hugepages"):
        armed.append("no-hugepages")
    for asic, version in sorted((f.get("fw_mismatch") or {}).items()):
        armed.append(f"fw-mismatch {asic} ({version})")
    if f.get("old_kmd"):
        armed.append(f"old-kmd ({f['old_kmd']})")
    if view.get("container"):
        armed.append("container")
    if f["permanent"]:
        armed.append("permanently dead: " + ", ".join(f["permanent"]))
    click.echo("armed: " + (", ".join(armed) or "none"))
    shared = view.get("cables")
    if shared is not None:
        rows = shared["cables"]
        up = sum(1 for c in rows if c["state"] == "up")
        click.echo(
            f"cables to other hosts: {up} of {len(rows)} up (shared in {shared['dir']}; "
            f"window {shared['config']['cable_window']:g} s, training "
            f"{shared['config']['cable_train_seconds']:g} s)"
        )
        for c in rows:
            if c["state"] == "up":
                continue
            a, b = c["local"], c["remote"]
            click.echo(
                f"  host {a['host']} {a['bdf'] or a['asic']} ch{a['chan']} <-> host {b['host']} "
                f"{b['asic']} ch{b['chan']}: {c['state']}" + (f" ({c['why']})" if c["why"] else "")
            )
    for m in view["fabric_marks"]:
        status = "open" if m["alive"] else "ABANDONED (links down)"
        click.echo(f"fabric mark: pid {m['pid']} {status}: {', '.join(m['chips'])}")
    capture = view.get("capture")
    if capture:
        host = capture.get("host") if isinstance(capture.get("host"), dict) else {}
        click.echo(  # what a capture said is someone else's text: escaped (render.escaped)
            escaped(
                f"recreated from {capture.get('archive')} (captured {capture.get('captured')} "
                f"on {host.get('hostname', '?')}, root {host.get('root', '?')})"
            )
        )
        for line in capture.get("reproduced") or []:
            click.echo(f"  reproduced: {escaped(str(line))}")
        for line in capture.get("not_reproduced") or []:
            click.echo(f"  not reproduced: {escaped(str(line))}")


@sim_group.command("config", context_settings=CONTEXT)
@host_options
@click.option(
    "--heartbeat-hz",
    type=Number(low=0, low_open=True, high=1e6, unit="a rate in Hz", example="2"),
    help="How fast live chips' heartbeats advance.",
)
@click.option(
    "--reset-seconds", type=seconds(example="0.5"), help="How long a simulated reset takes."
)
@click.option(
    "--cable-window",
    type=seconds(example="5"),
    help="How close together both ends of a cable must be reset for it to train (shared by "
    "every host of the system).",
)
@click.option(
    "--cable-train-seconds",
    type=seconds(example="90"),
    help="How long a cable takes to train once both ends are reset (default: the boards': 90 s "
    "Wormhole, 60 s Blackhole).",
)
def sim_config(
    host: Any,
    heartbeat_hz: float | None,
    reset_seconds: float | None,
    cable_window: float | None = None,
    cable_train_seconds: float | None = None,
) -> None:
    """Show or change a simulated host's timing (and its system's cables')."""
    from ttmesh.sim import faults

    cable = {"cable_window": cable_window, "cable_train_seconds": cable_train_seconds}
    config = faults.set_config(host, heartbeat_hz, reset_seconds, cable)
    click.echo(", ".join(f"{k}={v:g}" for k, v in sorted(config.items())))
