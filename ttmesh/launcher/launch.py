"""``ttmesh launch``: from a request to a running, supervised job, and back to an exit code.

:func:`prepare` is everything before anything starts (discovery, chip choice, pre-flight,
plan); it changes nothing, so ``--dry-run`` stops after it. :func:`execute` takes the plan,
holds the chips' leases for the job's life (restarts included) and runs the attempts.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ttmesh import paths
from ttmesh.errors import BAD_INPUT, TTMeshError, bad_input, refused
from ttmesh.fabric import heartbeat
from ttmesh.fabric.devices import Chip, Inventory, by_id_chip, discover
from ttmesh.host.base import Host
from ttmesh.host.boards import BDF_RE
from ttmesh.host.clusterdesc import ClusterDescriptor
from ttmesh.launcher import errorfile
from ttmesh.launcher.events import JobPhase, Observer
from ttmesh.launcher.plan import LaunchPlan, LaunchRequest, build, build_chipless, resolve_command
from ttmesh.launcher.supervisor import STOPPING, AttemptResult, Options, run_attempt, stop_reason
from ttmesh.mesh import healthy, memory
from ttmesh.mesh import select as meshselect
from ttmesh.render import note, plural
from ttmesh.runtime import jobs, leases
from ttmesh.vocab import MPI_LAYOUTS, Layout, Role, Source, StartMode

if TYPE_CHECKING:
    from ttmesh.launcher.failures import Diagnosis
    from ttmesh.launcher.meshhosts import MpiHosts


@dataclass
class Prepared:
    """A launch ready to run: its plan, the inventory and selection it came from."""

    plan: LaunchPlan
    inv: Inventory
    selection: meshselect.Selection | None  # None: a chipless server (no chips chosen)
    liveness: Liveness | None = None  # heartbeats still being read as the workers start
    mesh_hosts: MpiHosts | None = None  # how mpirun reaches the hosts of a mesh over several
    # A mesh over several hosts: links down between the job's chips, as each host reported
    # them: (host, what, the fix to run there). The start is refused unless --auto-reset.
    hosts_not_ready: list[tuple[str, str, str]] = field(default_factory=list)
    # No healthy mesh of the size on this host: the chips are the mesh a reset makes healthy,
    # and pre-flight refuses them with this (the reset that gives one), unless --auto-reset.
    unhealthy: TTMeshError | None = None
    # tt-metal's mock control plane asked about the ranks' own files (launcher.metalcheck),
    # under way while the launch goes on; or why it is not asked.
    metal: Any = None
    metal_skipped: str = ""
    # What the job needs of the host's system software (a server's profile: ``system:``);
    # None: ttmesh's defaults (fabric.syscheck). Its warnings are said once per launch.
    requires: Any = None
    warned: bool = False


def _parse_bdfs(text: str | None, inv: Inventory, flag: str) -> list[Chip]:
    if text is None:
        return []
    items = [t.strip().lower() for t in text.split(",") if t.strip()]
    if not items:
        raise bad_input(f"{flag} {text!r}: no chip named", f"e.g. {flag} 0000:01:00.0")
    by_bdf = inv.by_bdf()
    out: list[Chip] = []
    for item in items:
        if items.count(item) > 1:
            raise bad_input(f"{flag}: duplicate chip {item}", "name each chip once")
        named = by_id_chip(inv, item)
        if named is not None and named.bdf:
            item = named.bdf
        if not BDF_RE.match(item):
            raise bad_input(
                f"{flag} {item!r}: not a PCI address",
                "write it as DDDD:BB:DD.F, e.g. 0000:01:00.0, or give the chip's "
                "/dev/tenstorrent/by-id name (see ttmesh ls)",
            )
        if item not in by_bdf:
            raise bad_input(
                f"{flag} {item}: no such chip on this host",
                "chips here: " + ", ".join(sorted(by_bdf)),
            )
        chip = by_bdf[item]
        if chip in out:
            raise bad_input(f"{flag}: duplicate chip {item}", "name each chip once")
        out.extend(inv.board_peers(chip) if chip.bdf else [chip])
    return out


def _tcp_socket(family: int | None = None) -> Any:
    # The socket module's C core: the module itself builds its enums on import (milliseconds
    # on every launch, for one bind).
    import _socket

    return _socket.socket(_socket.AF_INET if family is None else family, _socket.SOCK_STREAM)


def free_port(addr: str = "127.0.0.1") -> int:
    s = _tcp_socket()
    try:
        s.bind((addr, 0))
        return int(s.getsockname()[1])
    finally:
        s.close()


def check_port(port: int, addr: str = "127.0.0.1") -> None:
    """torch.distributed's --master-port is free on ``addr`` (nothing has bound it)."""
    if not 0 < port < 65536:
        raise bad_input(f"--master-port {port}: not a TCP port", "use 1..65535, or omit it")
    s = _tcp_socket()
    try:
        s.bind((addr, port))
    except OSError:
        raise bad_input(
            f"--master-port {port} is already in use on {addr}",
            "pick another port, or omit --master-port to get a free one",
        )
    finally:
        s.close()


class PortTaken(TTMeshError):
    """A server's port is taken now (it may be free when the server starts: a dry run notes it)."""


def check_server_port(host: str, port: int) -> None:
    """The server can listen on ``host``:``port`` (its ``--host`` and ``--port``): bound here
    as the server will (SO_REUSEADDR, as uvicorn and asyncio do, so a closing connection of a
    server just stopped does not count), on every address ``host`` names. Taken, it is refused
    before the start, naming who listens there: otherwise whatever answers on it would look
    ready while the server fails, minutes later, with "address already in use"."""
    import _socket
    import errno

    try:
        found = _socket.getaddrinfo(host, port, 0, _socket.SOCK_STREAM)
    except OSError as exc:
        raise bad_input(
            f"--host {host}: not an address of this host ({exc})",
            "give an address or name of this host, e.g. --host 127.0.0.1",
        ) from None
    unusable: list[tuple[str, str]] = []  # (address, why): a name's other family may be absent
    for family, _kind, _proto, _name, sockaddr in found:
        addr = str(sockaddr[0])
        s = _tcp_socket(family)
        try:
            s.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
            s.bind(sockaddr)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise PortTaken(
                    f"--port {port} is already in use on {addr}{_listener_of(addr, port)}",
                    "stop what listens there, or give the server another --port",
                    BAD_INPUT,
                ) from None
            if exc.errno == errno.EACCES:
                raise bad_input(
                    f"--port {port}: only root may listen on a port below 1024",
                    "give the server a --port from 1024 to 65535",
                ) from None
            unusable.append((addr, exc.strerror or str(exc)))
        finally:
            s.close()
    if unusable and len(unusable) == len(found):  # "localhost" without IPv6 still has 127.0.0.1
        addr, why = unusable[0]
        raise bad_input(
            f"--host {host}: the server cannot listen on {addr} ({why})",
            "give an address of this host, e.g. --host 127.0.0.1",
        )


def _server_port(serving: Any, dry_run: bool) -> None:
    """The server's port is free (:func:`check_server_port`); in a dry run, a port taken now
    is a note of the plan (it may be free when the server starts, and a plan is not a start).
    A --host that is no address of this host, or a port it may not use, is refused in both."""
    try:
        check_server_port(serving.bind_host, serving.port)
    except PortTaken as exc:
        if not dry_run:
            raise
        serving.notes.append(f"{exc.message} (a launch now is refused)")


def _listener_of(addr: str, port: int) -> str:
    """``: pid P (user: cmd) listens there`` for a taken port, as far as ttmesh can see."""
    from ttmesh.launcher.serving import listeners

    for lst in listeners.listening(port):
        if listeners.reaches(lst, addr) or listeners.reaches(
            listeners.Listener(addr, port, 0, 0), lst.addr
        ):
            return f": {listeners.describe(lst)}"
    return ""


def unavailable_chips(
    inv: Inventory, repairable: bool = False
) -> tuple[dict[str, str], dict[str, str]]:
    """(asic -> why it can't be used, asic -> who has it) for dead, held and leased chips.

    ``repairable``: dead chips stay usable (``--auto-reset`` recovers them before the start)."""
    why, who = blocked_chips(inv)
    beats = heartbeat.poll(inv, [c for c in inv.chips if c.asic_id not in why])
    inv.beats = beats  # seen alive now: pre-flight need not poll these again
    return _with_dead(why, who, beats, repairable)


def blocked_chips(inv: Inventory) -> tuple[dict[str, str], dict[str, str]]:
    """:func:`unavailable_chips` without the heartbeats: leased and held chips."""
    from ttmesh.fabric import holders as holdermod

    why: dict[str, str] = {}
    who: dict[str, str] = {}
    for asic, info in leases.probe(inv.host, [c.asic_id for c in inv.chips]).items():
        if info.role == Role.LEASE:
            why[asic] = "leased"
            who[asic] = info.holder
        else:  # a process holds its lease file, and it is no ttmesh lease
            why[asic] = "locked"
            who[asic] = (
                f"its lease file is held by {info.who}, not a ttmesh lease"
                if info.pid
                else "its lease file is held by a process ttmesh cannot see, not a ttmesh lease"
            )
    for chip in inv.chips:
        if chip.asic_id in why:
            continue
        hs = holdermod.holders(inv, chip)
        if hs:
            why[chip.asic_id] = "held"
            h = hs[0]
            who[chip.asic_id] = f"pid {h.pid} ({h.user}: {h.cmd})"
    return why, who


def _with_dead(
    why: dict[str, str], who: dict[str, str], beats: dict[str, str], repairable: bool
) -> tuple[dict[str, str], dict[str, str]]:
    why, who = dict(why), dict(who)
    for asic, state in beats.items():
        if state == heartbeat.FROZEN and not repairable:
            why[asic] = "dead"
            who[asic] = "its heartbeat is frozen"
    return why, who


def _unavailable_hint(inv: Inventory, why: dict[str, str]) -> str:
    """How to get the chips back: a reset for dead ones, patience for the others."""
    from ttmesh.fabric import health

    dead = [a for a, w in why.items() if w == "dead"]
    if dead:
        fix = health.reset_fix(inv, dead, inv.links) or "ttmesh reset"
        return f"recover them: {fix}, or add --auto-reset"
    if "locked" in why.values():
        return (
            "a process that is no ttmesh job holds its lease file: ask its user to end it, "
            "or pick other chips with --chips/--exclude (see ttmesh ls)"
        )
    return "wait for them, or see ttmesh ls and ttmesh ps"


def prepare(
    req: LaunchRequest,
    host: Host,
    chips_arg: str | None = None,
    exclude_arg: str | None = None,
    allow_mpi_layouts: bool = False,
    descriptor_only: bool = False,
    repairable: bool = False,
    defer_liveness: bool = False,
    dry_run: bool = False,
    ask_metal: bool = True,
) -> Prepared:
    """Everything before a launch, changing nothing. ``descriptor_only``: plan the mesh and its
    descriptors without a command, a port or availability checks (``ttmesh descriptor``).
    ``repairable``: chips a reset can recover are chosen too (``--auto-reset`` resets them).
    ``ask_metal``: start tt-metal's verdict on the plan (``launcher.metalcheck``) when a ttnn
    Python is configured (``check --active`` asks tt-metal itself).
    ``defer_liveness``: when the heartbeats cannot change the choice of chips, do not wait for
    them: ``Prepared.liveness`` reads them while the workers start (:class:`Liveness`).
    ``dry_run``: a server's port taken now is a note of the plan, not a refusal. A server
    that drives no Tenstorrent chip is planned without the host (:func:`chipless`)."""
    if req.profile is not None and req.profile.chipless:
        return chipless(req, host, chips_arg, exclude_arg, repairable, dry_run)
    inv = discover(host)
    if not inv.chips:
        raise bad_input("no Tenstorrent chips found on this host", "see ttmesh ls")
    if req.binding is not None:
        from ttmesh.launcher.adapters import ttrun

        if chips_arg or exclude_arg or req.mesh_shape:
            raise bad_input(
                "--rank-binding decides the chips", "drop --chips/--exclude/--mesh-shape"
            )
        req.binding_units = ttrun.rank_units(req.binding, inv, meshselect.units_of(inv))
        chips_arg = ",".join(u.bdf for units in req.binding_units for u in units)
        n = sum(u.size for units in req.binding_units for u in units)
        if req.tp_size not in (None, n):
            raise bad_input(
                f"--tp-size {req.tp_size} but {req.binding.path} gives its ranks "
                f"{plural(n, 'chip')}",
                "drop --tp-size with --rank-binding",
            )
        req.tp_size = n
    chosen = _parse_bdfs(chips_arg, inv, "--chips")
    excluded = _parse_bdfs(exclude_arg, inv, "--exclude")
    both = {c.asic_id for c in chosen} & {c.asic_id for c in excluded}
    if both:
        chip = inv.chip(sorted(both)[0])
        raise bad_input(f"chip {chip.label} is both chosen (--chips) and excluded (--exclude)")
    if req.profile is not None:  # a server: one process drives every chip
        req.layout, req.launcher, req.nproc = Layout.SINGLE_PROCESS, StartMode.DIRECT, None
    if req.launcher not in tuple(StartMode):
        raise bad_input(f"--launcher {req.launcher!r}: use direct or mpi")
    if req.layout in MPI_LAYOUTS and req.launcher != StartMode.MPI and not allow_mpi_layouts:
        raise bad_input(
            f"--mesh-layout {req.layout} forms one tt-metal world across processes, which only an "
            "MPI launcher can start (each process spawned alone sees a world of one)",
            "drop --launcher direct (mesh layouts start under mpirun), or use isolated/single-process",
        )
    if req.launcher == StartMode.MPI and not descriptor_only:
        from ttmesh.launcher import mpi

        req.mpirun = mpi.find_mpirun(req.mpirun or None)
        mpi.version(req.mpirun)  # read once here: each attempt's guardian (a fork) reuses it
    default_note = None
    if req.tp_size is None:
        req.tp_size, default_note = _default_tp(req, inv, chosen)
    if req.tp_size <= 0:
        raise bad_input(
            f"--tp-size {req.tp_size}: must be a positive number of chips", "e.g. --tp-size 4"
        )
    if chosen and len(chosen) != req.tp_size:
        raise bad_input(
            f"--chips names {plural(len(chosen), 'chip')} but --tp-size is {req.tp_size}",
            "give as many chips as --tp-size, or drop --tp-size",
        )
    if req.mesh_shape and req.mesh_shape[0] * req.mesh_shape[1] != req.tp_size:
        rows, cols = req.mesh_shape
        raise bad_input(
            f"--mesh-shape {rows}x{cols} has {plural(rows * cols, 'chip')} but --tp-size is "
            f"{req.tp_size}",
            "make ROWS x COLS equal the chip count",
        )
    if descriptor_only:
        blocked: tuple[dict[str, str], dict[str, str]] = ({}, {})
        watch = None
    else:
        blocked = blocked_chips(inv)
        watch = heartbeat.Watch(inv, [c for c in inv.chips if c.asic_id not in blocked[0]])
    # Healthy first: the links down between the host's chips, read once (cheap: link telemetry),
    # only when the choice is ttmesh's to make (chips named are the user's choice). A descriptor
    # reads them too: tt-metal is given the host as discovery finds it, links down left out,
    # and refuses a mesh over them (``ttmesh descriptor`` then refuses as the launch would).
    broken = [] if chosen else broken_pairs(inv)
    choose = functools.partial(_choose, broken=broken, repairable=repairable)

    def availability(
        beats: dict[str, str], repairable: bool = repairable
    ) -> tuple[dict[str, str], dict[str, str]]:
        """Why each chip can't be used (in this order: leased, held, dead, excluded), who."""
        why, who = _with_dead(*blocked, beats, repairable)
        for c in excluded:
            why.setdefault(c.asic_id, "excluded")
        return why, who

    sel = None
    seen: tuple[dict[str, str], dict[str, str]] = ({}, {})  # (why, who) the choice was made with
    unhealthy = None
    if watch is not None and defer_liveness and not repairable:
        # Choose as if every chip's heartbeat moved. When the verdict cannot change that choice
        # (chips named, or every usable chip taken), a frozen chip can only refuse the launch:
        # the workers start while the heartbeats are read (Liveness); otherwise, as always,
        # the heartbeats are read first.
        try:
            guess = choose(inv, req, chosen, *availability({}))
        except TTMeshError:
            guess = None  # the refusal might name a frozen chip: read the heartbeats first
        if guess is not None and _verdict_cannot_change(
            inv, req, guess, chosen, availability({}), choose, broken
        ):
            sel, seen = guess, availability({})
    if sel is None:
        beats = watch.wait() if watch is not None else {}
        inv.beats = beats  # seen alive now: pre-flight need not poll these again
        watch = None
        seen = availability(beats)
        if repairable and not chosen:  # healthy first: reset frozen chips only when needed
            sel = _alive_first(inv, req, choose, availability(beats, repairable=False), broken)
            seen = availability(beats, repairable=False) if sel is not None else seen
        try:
            sel = sel or choose(inv, req, chosen, *seen)
        except NoHealthy as exc:  # planned all the same: pre-flight refuses it (exit 3)
            sel, unhealthy = exc.selection, exc
    liveness = None
    if watch is not None:
        job_chips = [a for u in sel.units for a in u.chips]
        watch.only(job_chips)
        liveness = Liveness(
            watch, functools.partial(_frozen, inv, req, chosen, availability, job_chips, choose)
        )
    try:
        prepared = _plan(req, inv, sel, host, descriptor_only, dry_run)
    except TTMeshError as exc:
        raise (liveness.first(exc) if liveness is not None else exc) from None
    prepared.unhealthy = unhealthy
    if default_note:
        prepared.plan.notes.append(default_note)
    if not (descriptor_only or chosen):
        used = {a for u in sel.units for a in u.chips}
        # A mesh holding a broken pair is --auto-reset's to mend: its links are no reason.
        avoided = [b for b in broken if not set(b.chips) <= used]
        if len(avoided) == len(broken):
            prepared.plan.passed_over = healthy.passed_over(inv, used, *seen, broken)
        else:
            prepared.plan.passed_over = healthy.passed_over(inv, used, *seen, [])
    if liveness is not None and not _can_start_unverified(prepared.plan):
        refusal = liveness.wait()  # a job that opens the fabric at once waits, as it did
        if refusal is not None:
            raise refusal
        liveness = None
    if liveness is not None:
        inv.beats = liveness.known()
    prepared.liveness = liveness
    if ask_metal and not descriptor_only:  # (check --active asks tt-metal itself)
        from ttmesh.launcher import metalcheck

        try:
            prepared.metal, prepared.metal_skipped = metalcheck.check(prepared.plan)
        except TTMeshError as exc:
            raise (liveness.first(exc) if liveness is not None else exc) from None
    return prepared


def chipless(
    req: LaunchRequest,
    host: Host,
    chips_arg: str | None = None,
    exclude_arg: str | None = None,
    repairable: bool = False,
    dry_run: bool = False,
) -> Prepared:
    """A server that drives no Tenstorrent chip (stock SGLang on ``--device cpu`` or ``cuda``:
    a profile with ``chips: none``): no discovery, no chips chosen or leased, no pre-flight,
    no recovery, so it runs on a host without the Tenstorrent driver. What ttmesh adds is the
    server's own: readiness, the bounded stop, the watch on its processes, the clean-up. The
    server's ``--tp-size`` counts its own processes; ttmesh's, and every flag that chooses or
    recovers chips, has nothing to act on and is refused (one line, exit 2)."""
    profile = req.profile
    from ttmesh.launcher.serving import spec

    what = spec.ServingSpec(profile, req.server_args).chipless_what
    for flag, given in (
        ("--tp-size", req.tp_size is not None),
        ("--chips", chips_arg is not None),
        ("--exclude", exclude_arg is not None),
        ("--mesh-shape", req.mesh_shape is not None),
        ("--auto-reset", repairable),
    ):
        if given:
            fix = (
                f"drop it: the server's own {profile.tp_flag} (after the command) sets its ranks"
                if flag == "--tp-size" and profile.tp_flag
                else "drop it"
            )
            raise bad_input(f"{flag}: {what}", fix)
    req.layout, req.launcher, req.nproc = Layout.SINGLE_PROCESS, StartMode.DIRECT, None
    tp, findings = spec.server_tp(profile, req.server_args, None)
    req.server_findings = [*req.server_findings, *findings]
    req.serving = _serving(req, tp or 1, None)
    argv = resolve_command(req)
    _server_port(req.serving, dry_run)
    if not req.job:
        req.job = jobs.new_job_id()
    paths.safe_name(req.job, "--job-id")
    if not req.run_dir:
        req.run_dir = str(jobs.runs_dir() / req.job)
        req.segment_dir = jobs.segment_dir(req.run_dir)
    if not req.cwd:
        req.cwd = os.getcwd()
    unused = f"; {host.flag} is not read" if host.flag else ""
    req.serving.notes.append(f"{what}: none is chosen, leased, checked or recovered{unused}")
    inv = Inventory(host=host, driver="", chips=[], links=[], topology="none")
    return Prepared(build_chipless(req, argv), inv, None)


def _alive_first(
    inv: Inventory,
    req: LaunchRequest,
    choose: Callable[..., meshselect.Selection],
    alive: tuple[dict[str, str], dict[str, str]],
    broken: list[healthy.Broken],
) -> meshselect.Selection | None:
    """With --auto-reset: a healthy mesh without the frozen chips, if one exists (nothing to
    reset); None when only a reset of some chip can give the mesh."""
    try:
        sel = choose(inv, req, [], *alive)
    except TTMeshError:
        return None
    used = {a for u in sel.units for a in u.chips}
    return None if any(set(b.chips) <= used for b in broken) else sel


def _default_tp(req: LaunchRequest, inv: Inventory, chosen: list[Chip]) -> tuple[int, str | None]:
    """The chips a launch without --tp-size takes, and what --dry-run says about it: the chips
    named; --nproc-per-node units; the host's whole mesh (a server, --nproc-per-node with a
    mesh layout); and with neither --tp-size nor --nproc-per-node one worker per chip of the
    host (per board on n300 systems), as --help promises (torchrun starts one)."""
    units = meshselect.units_of(inv)
    if chosen:
        return len(chosen), None
    if req.nproc and req.layout == Layout.ISOLATED:
        return req.nproc * max(len(u.chips) for u in units), None
    if req.nproc or req.profile is not None or req.binding is not None:
        return len(inv.chips), None
    per = "board" if any(u.size > 1 for u in units) else "chip"
    return len(inv.chips), (
        f"no --tp-size or --nproc-per-node: one worker per {per} of this host "
        f"({plural(len(units), per)}"
        + (f", {plural(len(inv.chips), 'chip')}" if per == "board" else "")
        + "); torchrun starts one (--nproc-per-node 1)"
    )


def _choose(
    inv: Inventory,
    req: LaunchRequest,
    chosen: list[Chip],
    why: dict[str, str],
    who: dict[str, str],
    broken: list[healthy.Broken] | None = None,
    repairable: bool = False,
) -> meshselect.Selection:
    """The chips of the job: the ones named (refused when one can't be used), else the best
    healthy mesh of the free ones (:mod:`ttmesh.mesh.healthy`: no pair whose links are down;
    refused, exit 3, when chips in use or broken links are why there is none; with
    ``repairable`` a broken mesh is taken when no healthy one exists, for --auto-reset)."""
    labels = {c.asic_id: c.label for c in inv.chips}
    if chosen:
        for c in chosen:
            if c.asic_id in why and why[c.asic_id] != "excluded":
                raise refused(
                    f"chip {c.label} is {why[c.asic_id]}: {who[c.asic_id]}",
                    _unavailable_hint(inv, {c.asic_id: why[c.asic_id]}),
                )
        gap = meshselect.check_connected(inv, chosen)
        if req.binding is not None:
            return meshselect.as_given(inv, [c.asic_id for c in chosen])
        if gap:
            raise bad_input(f"--chips are not connected: {gap}", "choose chips linked by Ethernet")
        return meshselect.select(
            inv, req.tp_size, shape=req.mesh_shape, chips=[c.asic_id for c in chosen]
        )
    try:
        return healthy.select(
            inv, req.tp_size, shape=req.mesh_shape, unavailable=why, broken=broken or []
        )
    except healthy.Unhealthy as exc:
        if repairable:
            return exc.selection  # --auto-reset: pre-flight resets its broken pairs first
        raise NoHealthy(exc, _no_healthy(inv, req.tp_size, exc)) from None
    except Exception as exc:
        blocked = {a: w for a, w in why.items() if w != "excluded"}
        if not blocked or getattr(exc, "code", None) != 2:
            raise
        # Would an idle host serve it? Then the chips in use are the reason: refuse (exit 3).
        try:
            meshselect.select(
                inv,
                req.tp_size,
                shape=req.mesh_shape,
                unavailable={a: w for a, w in why.items() if w == "excluded"},
            )
        except Exception:
            raise exc from None
        first = sorted(blocked)[0]
        raise refused(
            f"tp-size {req.tp_size}: not enough free chips; {labels[first]} is "
            f"{blocked[first]}: {who[first]}"
            + (
                f" (and {plural(len(blocked) - 1, 'more chip')} unavailable)"
                if len(blocked) > 1
                else ""
            ),
            _unavailable_hint(inv, blocked),
        )


def broken_pairs(inv: Inventory) -> list[healthy.Broken]:
    """The host's chip pairs whose links are down, as pre-flight words them (and its fix)."""
    from ttmesh.fabric import health

    return [
        healthy.Broken((p.chips[0], p.chips[1]), p.what, p.fix)
        for p in health.links_down(inv)
        if len(p.chips) == 2
    ]


class NoHealthy(TTMeshError):
    """No healthy mesh of the size: pre-flight's refusal of ``selection``, the mesh a reset of
    its broken pairs makes healthy (a launch still plans it: over several hosts every host
    hears the refusal when they agree to start)."""

    def __init__(self, exc: healthy.Unhealthy, refusal: TTMeshError) -> None:
        super().__init__(refusal.message, refusal.hint, refusal.code)
        self.selection = exc.selection


def _no_healthy(inv: Inventory, n: int, exc: healthy.Unhealthy) -> TTMeshError:
    """No healthy mesh of ``n`` chips: pre-flight's words for what breaks the one a reset would
    make healthy, and that reset (pre-flight's fix for its links), exit 3."""
    from ttmesh.fabric import health

    first = exc.broken[0]
    more = (
        f" (and {plural(len(exc.broken) - 1, 'more broken pair')})" if len(exc.broken) > 1 else ""
    )
    chips = [a for b in exc.broken for a in b.chips]
    fix = health.reset_fix(inv, chips, health.expected(inv).links) or first.fix
    return refused(
        f"pre-flight: {first.what}{more}: no healthy {n}-chip mesh on this host",
        f"{fix}, or add --auto-reset to recover the chips first",
    )


# A damaged host's choice is asked again per chip (could another replace it if frozen?) only
# for meshes up to this size: beyond it, reading the heartbeats first costs less.
SURE_CHIPS = 16


def _verdict_cannot_change(
    inv: Inventory,
    req: LaunchRequest,
    sel: meshselect.Selection,
    chosen: list[Chip],
    seen: tuple[dict[str, str], dict[str, str]],
    choose: Callable[..., meshselect.Selection],
    broken: list[healthy.Broken],
) -> bool:
    """Whatever the heartbeats say, the job gets these chips or none: the user named them, or
    they are every chip that could be used (a frozen one leaves too few: a refusal), or the
    only ones left out were passed over for their links and none of them could replace a
    chip of the mesh found frozen (asked, on small meshes)."""
    if chosen:
        return True
    why, who = seen
    used = {a for u in sel.units for a in u.chips}
    unused = {c.asic_id for c in inv.chips if c.asic_id not in why and c.asic_id not in used}
    if not unused:
        return True
    if not unused <= {a for b in broken for a in b.chips} or len(used) > SURE_CHIPS:
        return False
    for asic in sorted(used):
        try:
            choose(
                inv, req, chosen, {**why, asic: "dead"}, {**who, asic: "its heartbeat is frozen"}
            )
        except TTMeshError:
            continue
        return False  # another mesh would serve without it: the heartbeats decide
    return True


def _can_start_unverified(plan: LaunchPlan) -> bool:
    """Workers may start before their chips' heartbeats are known when stopping them leaves
    the chips as they were: one process per chip of its own, started directly. A job that
    brings the fabric up at its start (meshes, boards of two chips, a server) would leave the
    links down if stopped for a frozen chip: it waits for the verdict, as every job did."""
    return plan.launcher == StartMode.DIRECT and plan.serving is None and not plan.fabric_at_start


def _frozen(
    inv: Inventory,
    req: LaunchRequest,
    chosen: list[Chip],
    availability: Callable[[dict[str, str]], tuple[dict[str, str], dict[str, str]]],
    job_chips: list[str],
    choose: Callable[..., meshselect.Selection],
    beats: dict[str, str],
) -> TTMeshError | None:
    """The refusal the heartbeats ``beats`` give the job: what choosing the chips would have
    said had they been read first (the same message and code), or None when none is frozen."""
    if not any(beats.get(a) == heartbeat.FROZEN for a in job_chips):
        return None
    try:
        choose(inv, req, chosen, *availability(beats))
    except TTMeshError as exc:
        return exc
    # Other chips would have served (the choice was thought to leave none): refuse all the same.
    from ttmesh.fabric import health

    dead = [a for a in job_chips if beats.get(a) == heartbeat.FROZEN]
    problem = health.heartbeat_problem(inv, dead[0], heartbeat.FROZEN, health.expected(inv), False)
    assert problem is not None
    return refused(
        f"pre-flight: {problem.what}",
        f"{problem.fix}, or add --auto-reset to recover the chips first",
    )


class Liveness:
    """The heartbeats of a job's chips, still being read when its workers start.

    A chip is alive when its heartbeat counter moves: at two ticks a second that takes up to
    half a second, which every launch would otherwise wait before starting anything. Used only
    when the verdict cannot change which chips the job gets, only refuse it: the guardian asks
    :meth:`step` as it supervises (it is the one process that can stop every worker), stops
    the job when a chip is frozen and does not end the attempt before the verdict; the launcher
    then refuses with what it said when it read the heartbeats first (exit 3). Anything else that
    would stop the launch before its start waits for the verdict too (:meth:`first`)."""

    def __init__(
        self, watch: heartbeat.Watch, decide: Callable[[dict[str, str]], TTMeshError | None]
    ) -> None:
        self.watch = watch
        self.decide = decide
        self.decided = False
        self.refusal: TTMeshError | None = None

    def step(self) -> float | None:
        """Read the heartbeats if due; seconds until the next reading, None once decided."""
        wait = self.watch.step()
        if wait is None and not self.decided:
            self.decided = True
            self.refusal = self.decide(self.watch.states)
        return wait

    def wait(self) -> TTMeshError | None:
        """The verdict (waiting for it): the refusal, or None."""
        while (wait := self.step()) is not None:
            time.sleep(wait)
        return self.refusal

    def first(self, exc: TTMeshError) -> TTMeshError:
        """What stops the launch before its start: a frozen chip's refusal if there is one (it
        came first when the heartbeats were read before anything else), else ``exc``."""
        return self.wait() or exc

    def known(self) -> dict[str, str]:
        return self.watch.known()


def _plan(
    req: LaunchRequest,
    inv: Inventory,
    sel: meshselect.Selection,
    host: Host,
    descriptor_only: bool,
    dry_run: bool = False,
) -> Prepared:
    """The rest of :func:`prepare` once the chips are chosen: memory, server, command, port,
    job id, mock clusters and the plan."""
    req.symmetric_dram_mb = memory.plan(
        req.symmetric_dram_mb, [inv.chip(a).dram_mb for a in sel.chips]
    )
    if req.profile is not None:
        # The job's tensor-parallel degree: every host's chips (this host has its share).
        tp = len(sel.chips) * req.tp_hosts
        req.serving = _serving(req, tp, min(inv.chip(a).dram_mb for a in sel.chips))
    if descriptor_only:
        argv: list[str] = []
    else:
        argv = resolve_command(req)
        if req.serving is not None:
            _server_port(req.serving, dry_run)
        if req.master_port:
            check_port(req.master_port, req.master_addr)
        else:
            req.master_port = free_port(req.master_addr)
    if not req.job:
        req.job = jobs.new_job_id()
    paths.safe_name(req.job, "--job-id")
    if not req.run_dir:
        req.run_dir = str(jobs.runs_dir() / req.job)
        req.segment_dir = jobs.segment_dir(req.run_dir)
    if not req.cwd:
        req.cwd = os.getcwd()
    cluster = None if descriptor_only else host.mock_cluster()
    if cluster is not None:
        req.mocks = mock_clusters(cluster, sel, req)
    plan = build(req, inv, sel, argv)
    requires = req.profile.system if req.profile is not None else None
    return Prepared(plan, inv, sel, requires=requires)


def _serving(req: LaunchRequest, tp: int, chip_mb: int | None) -> Any:
    """The server's spec for ``tp`` chips (a chipless server: its own ``--tp-size``, and no
    chip memory); its rules' errors refuse the launch (exit 2)."""
    from ttmesh.launcher.serving import spec

    serving = spec.build(
        req.profile,
        req.server_args,
        tp=tp,
        environ=req.environ,
        user_env=dict(req.env),
        symmetric_mb=req.symmetric_dram_mb,
        chip_mb=chip_mb,
        cwd=req.cwd or os.getcwd(),
        findings=req.server_findings,
    )
    serving.health_interval = req.health_interval
    serving.health_failures = req.health_failures
    if req.ready_timeout is None:
        req.ready_timeout = serving.ready_timeout
    serving.ready_timeout = req.ready_timeout
    errors = serving.errors(req.strict)
    if errors:
        for extra in [f for f in serving.findings if f not in errors[:1]]:
            note(f"{extra.severity}: {extra.message} (fix: {extra.fix})")
        first = errors[0]
        more = f" ({len(errors) - 1} more above)" if len(errors) > 1 else ""
        raise bad_input(
            f"{req.profile.name}: {first.message}{more}",
            f"fix: {first.fix}"
            + ("; --strict makes warnings errors" if first.severity == "warning" else ""),
        )
    return serving


def mock_clusters(
    cluster: ClusterDescriptor, sel: meshselect.Selection, req: LaunchRequest
) -> dict[int, str]:
    """tt-metal's view of a mock cluster per rank (TT_METAL_MOCK_CLUSTER_DESC_PATH)."""
    from ttmesh.mesh import layout, mock

    if req.layout == Layout.SINGLE_PROCESS and req.binding is None:
        return {0: mock.whole_view(cluster, f"ttmesh job {req.job}")}
    views = mock.ChipViews(cluster)
    if req.binding is not None:
        return {
            i: views.of([a for u in units for a in u.chips], f"ttmesh job {req.job}, rank {i}")
            for i, units in enumerate(req.binding_units)
        }
    sp = layout.split(sel, req.layout, req.nproc)
    return {
        b.rank: views.of(list(b.chips), f"ttmesh job {req.job}, rank {b.rank}") for b in sp.blocks
    }


def write_files(plan: LaunchPlan) -> None:
    """The plan's files, inside its run directory (which ``execute`` created) and nowhere else."""
    run_dir = Path(plan.run_dir).resolve()
    for sub in ("mesh", "errors", "ready", "fabric", "mock", "mpi", "shm"):
        (run_dir / sub).mkdir(exist_ok=True, mode=0o700)
    for path, text in plan.files.items():
        target = Path(path).resolve()
        if not target.is_relative_to(run_dir):
            raise bad_input(f"refusing to write {path}: outside the run directory {run_dir}")
        target.write_text(text)


def _clear_attempt_files(plan: LaunchPlan) -> None:
    for sub in ("errors", "ready", "fabric", "shm"):  # shm: the last attempt's MPI segments
        directory = Path(plan.run_dir, sub)
        for entry in directory.iterdir() if directory.is_dir() else ():
            with contextlib.suppress(OSError):
                entry.unlink()


@dataclass
class Recovery:
    """What to do about the chips before and after attempts (ttmesh launch's health options)."""

    auto_reset: bool = False  # pre-flight found a problem: reset, re-check, then start
    reset_on_failure: bool = False  # reset after any abnormal end, links down or not
    timeout: float = 120.0
    retries: int = 2
    tt_smi: str | None = None
    preflight: bool = True
    own_pids: tuple[int, ...] = ()  # more processes whose leases and holders are the job's own


def _preflight(prepared: Prepared, recovery: Recovery, observer: Observer | None = None) -> None:
    """Refuse (exit 3) to start on chips that are unhealthy, unless --auto-reset fixes them."""
    from ttmesh.fabric import health

    if observer is not None:
        observer.phase(JobPhase.CHECKING)
    from ttmesh.fabric import syscheck

    plan = prepared.plan
    inv = prepared.inv
    found = health.preflight(
        inv,
        plan.all_chips(),
        recovery.own_pids,
        beats=inv.beats,
        heartbeats=prepared.liveness is None,  # else read while the workers start
        requires=prepared.requires,
    )
    problems = [p for p in found if p.severity == "error"]
    if not prepared.warned:  # a restart's pre-flight says them no more
        prepared.warned = True
        for p in found:
            if p.severity != "error" and p.kind in syscheck.KINDS:
                note(f"pre-flight: warning: {p.what} (fix: {p.fix})")
    fixed_by_reset = ("lease", "lock", "umd-lock", *syscheck.KINDS)  # no reset helps
    if problems and recovery.auto_reset and all(p.kind not in fixed_by_reset for p in problems):
        note(f"pre-flight: {problems[0].what}; resetting the chips first (--auto-reset)")
        outcome = _reset(prepared, recovery, plan.all_chips(), observer, JobPhase.RESETTING)
        if outcome is not None and outcome.recovered:
            fresh = discover(inv.host)
            prepared.inv = fresh
            problems = [
                p
                for p in health.preflight(
                    fresh, plan.all_chips(), recovery.own_pids, requires=prepared.requires
                )
                if p.severity == "error"
            ]
    if problems and prepared.liveness is not None:
        refusal = prepared.liveness.wait()  # a frozen chip is what reading them first found
        if refusal is not None:
            raise refusal
    if problems:
        if prepared.unhealthy is not None and not recovery.auto_reset:
            raise prepared.unhealthy  # no healthy mesh of the size here: the reset giving one
        raise _preflight_refusal(problems, recovery.auto_reset)


AUTO_RESET_HINT = ", or add --auto-reset to recover the chips first"


def _preflight_refusal(problems: list[Any], auto_reset: bool) -> TTMeshError:
    """Pre-flight's errors as the launch refuses them: the others said first, the first as
    the one line (exit 3), its fix, and --auto-reset when a reset would fix it."""
    from ttmesh.fabric import health

    for p in problems[1:]:
        note(f"pre-flight: {p.what}" + (f" (fix: {p.fix})" if p.fix else ""))
    first = problems[0]
    fix = first.fix or "see ttmesh check"
    if first.kind in health.RESETTABLE and not auto_reset:
        fix += AUTO_RESET_HINT
    return refused(f"pre-flight: {first.what}", fix)


def descriptor_checks(prepared: Prepared) -> None:
    """What ``ttmesh descriptor`` refuses as the launch would (exit 3): a mesh over links that
    are down. tt-metal is given the host as discovery finds it (a mock cluster leaves them
    out) and refuses such a mesh; the chips named with --chips included."""
    from ttmesh.fabric import health

    unhealthy = prepared.unhealthy  # no healthy mesh of the size: the reset that gives one
    if unhealthy is not None:  # (the descriptor command has no --auto-reset to offer)
        raise refused(unhealthy.message, (unhealthy.hint or "").replace(AUTO_RESET_HINT, ""))
    if prepared.plan.hosts:
        return  # each host's links are read in its own ranks
    chips = set(prepared.plan.all_chips())
    down = [p for p in health.links_down(prepared.inv) if p.chips and set(p.chips) <= chips]
    if down:
        raise _preflight_refusal(down, auto_reset=True)


def dry_run_checks(prepared: Prepared, auto_reset: bool = False, rendezvous: bool = False) -> None:
    """What a launch checks before anything starts, checked now and changing nothing (the plan's
    ``checks``): pre-flight on the job's chips (one host), refusing as the launch would (exit 3);
    with ``--auto-reset`` its errors are what the launch would reset first. What a dry run
    cannot check is said, with why: a mesh over several hosts' own pre-flight, the rendezvous."""
    from ttmesh.fabric import health

    plan = prepared.plan
    checks: list[dict[str, str]] = []
    if plan.hosts:  # a tt-metal mesh over several hosts: each host checks its chips in its ranks
        down = prepared.hosts_not_ready
        if down and not auto_reset:
            name, what, fix = down[0]
            raise refused(
                f"host {name} is not ready: pre-flight: {what}",
                f"on {name}: {fix}, or add --auto-reset to recover the chips first; "
                "nothing started anywhere",
            )
        said = f"links down on {down[0][0]}, reset first: {down[0][1]}" if down else "none"
        checks.append(_check("pre-flight", "skipped", "each host runs its own in the job's ranks "
                             f"there, before the command starts (links down in the hosts' "
                             f"reports: {said})"))  # fmt: skip
    else:
        inv = prepared.inv
        try:
            inv.host.check_changeable()
        except TTMeshError as exc:  # reading is anyone's: the plan is shown, the refusal said
            checks.append(_check("host", "failed", f"{exc}: a launch by this user refuses "
                                 f"before anything starts (exit {exc.code})"))  # fmt: skip
        chips = plan.all_chips()
        found = health.preflight(inv, chips, beats=inv.beats, requires=prepared.requires)
        errors = [p for p in found if p.severity == "error"]
        if errors and not auto_reset:
            raise prepared.unhealthy or _preflight_refusal(errors, auto_reset)
        kept = [p for p in errors if p.kind not in health.RESETTABLE]  # what a reset leaves
        if kept:
            raise _preflight_refusal(kept, auto_reset)
        if errors:
            checks.append(_check("pre-flight", "failed", f"{errors[0].what}: the launch resets "
                                 f"the chips first (--auto-reset: {errors[0].fix}); a dry run "
                                 "resets nothing"))  # fmt: skip
        else:
            warned = "".join(f"; warning: {p.what}" for p in found if p.severity != "error")
            checks.append(_check("pre-flight", "passed", f"{plural(len(chips), 'chip')}: driver "
                                 "nodes, leases, holders, heartbeats and the links between "
                                 f"them{warned}"))  # fmt: skip
    from ttmesh.launcher import metalcheck

    if prepared.metal is not None:
        pending, prepared.metal = prepared.metal, None
        checks.append(_check(metalcheck.NAME, "passed", pending.wait()))
    else:
        checks.append(_check(metalcheck.NAME, "skipped", prepared.metal_skipped
                             or metalcheck.skip_reason(plan) or "not asked"))  # fmt: skip
    if rendezvous:
        checks.append(_check("rendezvous", "skipped", "a dry run meets no other host: the "
                             "hosts' plans, their pre-flight and one --tp-size are checked "
                             "when the job starts"))  # fmt: skip
    plan.checks = checks


def _check(name: str, result: str, detail: str) -> dict[str, str]:
    return {"check": name, "result": result, "detail": detail}


def _reset(
    prepared: Prepared,
    recovery: Recovery,
    asics: list[str],
    observer: Observer | None = None,
    phase: JobPhase = JobPhase.RECOVERING,
):
    from ttmesh.errors import TTMeshError
    from ttmesh.recovery import reset

    progress = None
    if observer is not None:
        observer.phase(phase, "resetting the chips")

        def progress(chips: list[reset.ChipProgress]) -> None:
            observer.phase(phase, _reset_detail(chips))

    try:
        outcome = reset.recover(
            prepared.inv.host,
            asics,
            timeout=recovery.timeout,
            retries=recovery.retries,
            force=False,
            log=lambda m: note(f"reset: {m}"),
            tt_smi=recovery.tt_smi,
            own_pids=recovery.own_pids,
            progress=progress,
        )
    except TTMeshError as exc:
        note(f"reset refused: {exc}")
        return None
    if outcome.recovered:
        note(f"reset: chips recovered and verified ({outcome.seconds:.1f} s)")
    else:
        for p in outcome.problems[:3]:
            note(f"reset: still wrong: {p.what}")
    return outcome


def _reset_detail(chips: list[Any]) -> str:
    """``3 of 4 chips done, 1 waiting for links``: a reset's progress in a few words."""
    from ttmesh.recovery.reset import DONE

    counts: dict[str, int] = {}
    for c in chips:
        counts[c.stage] = counts.get(c.stage, 0) + 1
    done = counts.pop(DONE, 0)
    rest = ", ".join(f"{n} {stage}" for stage, n in counts.items())
    return f"{done} of {plural(len(chips), 'chip')} done" + (f", {rest}" if rest else "")


def _after_crash(
    prepared: Prepared,
    recovery: Recovery,
    result: AttemptResult,
    always: bool = False,
    observer: Observer | None = None,
) -> str | None:
    """A job that brought the fabric up and ended abnormally may have left links down.

    ``always``: check the chips whatever the plan says (ttmesh itself was killed mid-job, so
    nobody knows which ranks brought the fabric up). Over several hosts: what is still wrong
    on a host after every host recovered (a restart then does not happen), else None."""
    plan = prepared.plan
    if result.code == 0 or plan.chipless:
        return None  # a chipless server leaves no chip to check
    joined = plan.fabric_at_start or result.fabric_ranks or recovery.reset_on_failure
    if not (joined or always):
        return None
    if plan.hosts:  # over several hosts: each host recovers its own chips
        if observer is not None:
            observer.phase(JobPhase.RECOVERING, "checking the chips on every host")
        return _recover_hosts(prepared, recovery, always=recovery.reset_on_failure)
    from ttmesh.fabric import health

    if observer is not None:
        observer.phase(JobPhase.RECOVERING, "checking the job's chips")
    inv = discover(prepared.inv.host)
    prepared.inv = inv
    down = [
        p
        for p in health.preflight(inv, plan.all_chips(), recovery.own_pids, system=False)
        if p.severity == "error"
    ]
    if not down and not recovery.reset_on_failure:
        return None
    why = down[0].what if down else "--reset-on-failure"
    note(f"the job ended ({why}): resetting its chips")
    _reset(prepared, recovery, plan.all_chips(), observer)
    return None


def _rank_refused(result: AttemptResult) -> str | None:
    """A rank of a mesh over several hosts was refused on its host before its command ran
    (pre-flight there, or the wrong host): its line, a refusal as on one host, not a crash."""
    from ttmesh.launcher.rankshim import refused_before_start

    return refused_before_start(result.code, result.stderr_tail)


def _recover_hosts(
    prepared: Prepared, recovery: Recovery, always: bool, before_start: bool = False
) -> str | None:
    """Every host of a mesh over several hosts checks its chips of the job and resets them
    where needed (ttmesh.launcher.hostrecovery); the first host's remaining problem, else None.
    After an attempt each host first lets the job's processes still there end; before the
    start, mpirun failing to reach the hosts is bad input (exit 2)."""
    from ttmesh.launcher import hostrecovery, mpi

    plan = prepared.plan
    assert prepared.mesh_hosts is not None, "a mesh over several hosts has its MpiHosts"
    by_host = {name: mpi.host_chips(plan, node) for node, name in enumerate(plan.hosts)}
    return hostrecovery.recover(
        prepared.mesh_hosts,
        by_host,
        always=always,
        timeout=recovery.timeout,
        retries=recovery.retries,
        tt_smi=recovery.tt_smi,
        note=note,
        job=None if before_start else plan.job,
        grace=plan.grace,
        reachable=before_start,
    )


LAUNCHER_KILLED = "launcher killed"
SUPERVISOR_KILLED = "supervisor killed"


class Stopped(BaseException):
    """SIGTERM or SIGHUP reached the launcher outside an attempt (pre-flight, recovery after
    a crash, a restart's wait), where no guardian is there to handle it."""

    def __init__(self, sig: int) -> None:
        super().__init__(sig)
        self.sig = sig


def _raise_stopped(sig: int, _frame: object) -> None:
    raise Stopped(sig)


class JobRun:
    """One job from its leases to its end: attempts, recovery, and the finish.

    The finish (job record closed, summary written, leases released, run directory removed) is
    done by whichever ttmesh process survives: normally the launcher; the guardian when the
    launcher was killed while workers ran (it was forked from the launcher, so it holds the same
    leases, run directory lock and plan)."""

    def __init__(
        self,
        prepared: Prepared,
        options: Options,
        summary_json: str | None,
        recovery: Recovery,
        restart_backoff: float,
        peers: Any = None,
    ) -> None:
        self.prepared = prepared
        self.peers = peers  # launcher.multihost.Peers in a job over several hosts
        self.plan = prepared.plan
        self.options = options
        self.summary_json = summary_json
        self.recovery = recovery
        self.restart_backoff = restart_backoff
        # The launcher's leases are the job's own, also for a guardian finishing in its place.
        self.recovery.own_pids = (*recovery.own_pids, os.getpid())
        self.observer = options.observer  # the front's view of the job (None: plain lines)
        self.results: list[AttemptResult] = []
        self.stop: AttemptResult | None = None  # a stop signal between attempts ended the job
        self.held: leases.LeaseSet | None = None
        self.run_dir: paths.RunDir | None = None
        self.status: str | None = None  # how the job ended, when it ends before its finish
        # Refused for a frozen chip: no job record stays behind (reading the heartbeats first,
        # the launch never got as far as writing one).
        self.unrecorded = False

    def run(self) -> int:
        try:
            return self._run()
        finally:
            if self.prepared.metal is not None:  # refused or stopped before it answered
                self.prepared.metal.close()
                self.prepared.metal = None

    def _metal(self) -> None:
        """tt-metal's verdict on the ranks' files, before any rank starts (a refusal: exit 3)."""
        pending, self.prepared.metal = self.prepared.metal, None
        if pending is not None:
            pending.wait()  # passed: quietly, as pre-flight is

    def _run(self) -> int:
        plan = self.plan
        if plan.chipless:
            # A server that drives no Tenstorrent chip: nothing to lease or check before the
            # start (nor to recover after it: _after_crash); the host is never read.
            self.recovery.preflight = False
        elif plan.hosts:
            # A mesh over several hosts: each host's duties (leases, pre-flight) run on that
            # host, in the rank's own ttmesh (``ttmesh _rank``), never through this one.
            self.recovery.preflight = False
        else:
            try:
                self.prepared.inv.host.check_changeable()
                self.held = leases.acquire(
                    self.prepared.inv.host,
                    plan.all_chips(),
                    plan.job,
                    cmd=" ".join(plan.ranks[0].argv),
                    symmetric_dram_mb=plan.symmetric_dram_mb,
                    labels={c.asic_id: c.label for c in self.prepared.inv.chips},
                )
            except TTMeshError as exc:
                raise self._frozen_first(exc) from None
        try:
            self.run_dir = jobs.create_run_dir(plan.job)
            if str(self.run_dir.path) != plan.run_dir:
                raise bad_input(
                    f"the plan's run directory {plan.run_dir} is not {self.run_dir.path}"
                )
        except BaseException as exc:
            self._release()
            if isinstance(exc, TTMeshError):
                raise self._frozen_first(exc) from None
            raise
        ok = False
        # A stop signal between attempts stops the job as one during an attempt does (an
        # attempt forwards it to its guardian): Ctrl-C raises KeyboardInterrupt, these Stopped.
        previous = {sig: signal.signal(sig, _raise_stopped) for sig in STOPPING}
        try:
            try:
                self._record()
                if self.recovery.preflight or self.peers is not None:
                    try:
                        if self.recovery.preflight:
                            self._agree(
                                "start",
                                lambda: _preflight(self.prepared, self.recovery, self.observer),
                            )
                        else:
                            self._agree("start", lambda: None)
                        self._metal()
                    except TTMeshError as exc:
                        raise self._refuse(self._frozen_first(exc, summary=False)) from None
                if plan.hosts:
                    self._hosts_ready()
                write_files(plan)
                self._attempts()
            except (KeyboardInterrupt, Stopped) as exc:
                self._stopped(exc.sig if isinstance(exc, Stopped) else signal.SIGINT)
            ok = True
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if not ok:
                self._release(self.status or "ttmesh failed before the job ended", None)
        return self.finish()

    def _hosts_ready(self) -> None:
        """A mesh over several hosts, before anything starts anywhere: links down between the
        job's chips on a host (its report says so) refuse the start in one line naming the
        host; with --auto-reset every host checks its chips of the job and resets them where
        needed, and a host whose chips stay wrong refuses."""
        if not self.recovery.auto_reset:
            if self.prepared.hosts_not_ready:
                name, what, fix = self.prepared.hosts_not_ready[0]
                raise self._refuse(
                    refused(
                        f"host {name} is not ready: pre-flight: {what}",
                        f"on {name}: {fix}, or add --auto-reset to recover the chips first; "
                        "nothing started anywhere",
                    )
                )
            return
        if self.observer is not None:
            self.observer.phase(JobPhase.CHECKING, "checking the chips on every host")
        left = _recover_hosts(self.prepared, self.recovery, always=False, before_start=True)
        if left is not None:
            raise self._refuse(
                refused(
                    f"pre-flight: {left}",
                    "see ttmesh check --hosts, then ttmesh reset --hosts; nothing started anywhere",
                )
            )

    def _stopped(self, sig: int) -> None:
        """A stop signal outside an attempt ends the job there, and says how it ended (it is
        not an attempt: the attempts that ran stay as they ended)."""
        reason = stop_reason(sig)
        note(f"{reason}: stopping the job")
        self.stop = AttemptResult(
            len(self.results), 128 + sig, Source.TTMESH, None, reason, interrupted=True
        )

    def _frozen_first(self, exc: TTMeshError, summary: bool = True) -> TTMeshError:
        """What stops the launch before its start, once the heartbeats still being read are in:
        a frozen chip's refusal came first when they were read before anything else (and left
        the outcome for scripts: ``summary``), so it still does."""
        liveness, self.prepared.liveness = self.prepared.liveness, None
        if liveness is None:
            return exc
        refusal = liveness.wait()
        if refusal is None:
            return exc
        self.unrecorded = True
        if summary and self.summary_json:
            write_refusal(self.summary_json, refusal)
        return refusal

    def _refuse(self, exc: TTMeshError) -> TTMeshError:
        """Nothing runs: the job record says why, and so does --summary-json."""
        self.status = f"refused: {exc}"
        if self.summary_json:
            write_refusal(self.summary_json, exc)
        return exc

    def _record(self) -> None:
        plan = self.plan
        with contextlib.suppress(OSError, TTMeshError):
            jobs.write(
                {
                    "job": plan.job,
                    "pid": os.getpid(),
                    "guardian": None,
                    "root": plan.root,
                    "layout": plan.layout,
                    "attempt": 0,
                    "started": time.time(),
                    "command": list(plan.ranks[0].argv) if plan.ranks else [],
                    "ranks": [
                        {"rank": r.rank, "pid": None, "bdfs": list(r.bdfs), "chips": list(r.chips)}
                        for r in plan.ranks
                    ],
                    "symmetric_dram_mb": plan.symmetric_dram_mb,
                }
            )

    def _attempts(self) -> None:
        plan, recovery = self.plan, self.recovery
        base_env = dict(os.environ)
        for attempt in range(plan.max_restarts + 1):
            _clear_attempt_files(plan)
            if self.peers is not None:
                self.peers.watch(attempt)
            liveness, self.prepared.liveness = self.prepared.liveness, None
            result = run_attempt(
                plan, attempt, self.options, base_env, self._orphaned, self.prepared.inv.host,
                on_start=self._guardian_started, pending=liveness,
            )  # fmt: skip
            if result.refusal is not None:
                # A chip's heartbeat was frozen: the guardian stopped the workers. Leave the
                # chips as a stopped job does, then refuse as the heartbeats read first did.
                _after_crash(self.prepared, recovery, result)
                code, message, hint = result.refusal
                self.unrecorded = True
                raise self._refuse(TTMeshError(message, hint, code))
            if result.unstarted is not None:
                # A rank's program never ran (not found, not executable): nothing to restart,
                # one line as a shell gives, exit 127 or 126. Ranks started before it were
                # stopped: their chips are checked as after any crash.
                message, hint = result.unstarted
                if any(e.pid > 0 for e in result.exits):
                    _after_crash(self.prepared, recovery, result, observer=self.observer)
                if attempt == 0:
                    raise self._refuse(TTMeshError(message, hint, result.code))
                note(f"not restarting: {message}")
                self.results.append(result)
                break
            why = _rank_refused(result) if plan.hosts else None
            if why is not None:
                # A rank's ttmesh stopped before its command ran (pre-flight there, a lease, the
                # wrong host): a refusal, as on one host. Ranks that had started on the other
                # hosts were stopped: their hosts check (and recover) their chips first.
                _recover_hosts(self.prepared, recovery, always=False)
                if attempt == 0:
                    raise self._refuse(TTMeshError(why, None, result.code))
                note(f"not restarting: {why}")
                break
            if self.peers is not None:
                result = self.peers.ended(attempt, result)
            self.results.append(result)
            if result.code == 0:
                break
            # A server's processes may have held the chips to the end (SGLang SIGKILLs its
            # schedulers, which never close the chips): check them whatever the layout.
            always = result.supervisor_lost or plan.serving is not None
            left = _after_crash(
                self.prepared, recovery, result, always=always, observer=self.observer
            )
            if result.interrupted or result.supervisor_lost:
                break
            if attempt < plan.max_restarts and left is not None:
                note(f"not restarting: {left}")
                break
            if attempt < plan.max_restarts:
                wait = min(self.restart_backoff * (2**attempt), 10.0)
                note(
                    f"attempt {attempt + 1} of {plan.max_restarts + 1} failed ({result.reason}); "
                    f"restarting every rank in {wait:.1f} s"
                )
                self._wait(wait, attempt + 2)
                again = Recovery(**{**recovery.__dict__, "auto_reset": True})
                try:
                    self._agree(
                        f"restart{attempt + 1}",
                        functools.partial(_preflight, self.prepared, again, self.observer)
                        if recovery.preflight
                        else (lambda: None),
                    )
                except TTMeshError as exc:
                    note(f"not restarting: {exc}")
                    break

    def _guardian_started(self, pid: int) -> None:
        """In the front, right after an attempt's guardian is forked: the guardian shares the
        leases (their records name it, so they stay this job's if the front is killed)."""
        if self.held is not None:
            self.held.add_guardian(pid)
        if self.peers is not None:
            self.peers.started(pid)

    def _wait(self, seconds: float, next_attempt: int) -> None:
        """The pause before a restart (a view keeps its clock running meanwhile)."""
        if self.observer is None:
            time.sleep(seconds)
            return
        total = self.plan.max_restarts + 1
        self.observer.phase(JobPhase.RESTARTING, f"attempt {next_attempt} of {total}")
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            time.sleep(min(left, 0.1))
            self.observer.tick()

    def _agree(self, name: str, check: Any) -> None:
        """Run this host's ``check`` (it raises to refuse); with peers, every host must agree."""
        try:
            check()
        except TTMeshError as exc:
            if self.peers is not None:
                self.peers.agree(name, str(exc))
            raise
        if self.peers is not None:
            self.peers.agree(name, None)

    def _orphaned(self, result: AttemptResult) -> int:
        """In the guardian, once its workers are down: the launcher was killed, finish here."""
        result.reason = f"{LAUNCHER_KILLED} ({result.reason})"
        self.results.append(result)
        self.observer = None  # the view was the launcher's (the front's), and it is gone
        note("the launcher was killed: its guardian stopped the workers and finishes the job")
        with contextlib.suppress(Exception):
            _after_crash(self.prepared, self.recovery, result, always=True)
        return self.finish(LAUNCHER_KILLED)

    def _release(self, status: str | None = None, code: int | None = None) -> None:
        if self.unrecorded:
            with contextlib.suppress(OSError, TTMeshError):
                jobs.remove(self.plan.job)
        elif status is not None:
            with contextlib.suppress(OSError, TTMeshError):
                jobs.close(self.plan.job, status, code)
        if self.held is not None:
            self.held.release()
        if self.run_dir is not None:
            self.run_dir.remove()

    def finish(self, status: str | None = None) -> int:
        final = self.stop or self.results[-1]
        if self.peers is not None:
            if self.results:
                self.peers.close(len(self.results) - 1)
            else:  # stopped before this host's first attempt: no end to wait for
                self.peers.coord.close()
        if status is None:
            status = SUPERVISOR_KILLED if final.supervisor_lost else final.reason
        unwritten_error = errorfile.write(final, self.plan)  # the ranks' files go next
        self._release(status, final.code)
        if self.observer is not None:  # the final frame, above the summary
            self.observer.phase(JobPhase.DONE, f"exit {final.code}")
        diagnosis = _explain(self.prepared, final)
        code = final.code
        if self.summary_json:
            unwritten = _write_summary(self.summary_json, final, self.results, diagnosis)
            if unwritten is not None:
                # Said, never silent; a job that failed keeps its code (the worker's is what
                # matters), one that succeeded ends 2: a script must not take 0 for a summary.
                note(unwritten)
                code = code or BAD_INPUT
        if unwritten_error is not None:
            note(unwritten_error)
        _summarize(self.prepared, self.results, diagnosis, final)  # its exit line comes last
        return code


def execute(
    prepared: Prepared,
    options: Options,
    summary_json: str | None = None,
    restart_backoff: float = 0.2,
    recovery: Recovery | None = None,
    peers: Any = None,
) -> int:
    """Lease the plan's chips, run its attempts (with recovery and restarts), return the code.

    ``peers`` (launcher.multihost.Peers): the other hosts of a job over several hosts."""
    return JobRun(
        prepared, options, summary_json, recovery or Recovery(), restart_backoff, peers
    ).run()


def _explain(prepared: Prepared, final: AttemptResult) -> Diagnosis | None:
    """The known failure the guardian found in the output, its fix filled in for this job."""
    if final.code == 0 or not final.diagnosis:
        return None
    from ttmesh.launcher import failures

    try:
        return failures.explain(final.diagnosis, prepared.inv, prepared.plan.all_chips())
    except Exception as exc:  # the job's end is still reported, without the explanation
        note(f"could not explain the failure ({type(exc).__name__}: {exc})")
        return None


def _summarize(
    prepared: Prepared,
    results: list[AttemptResult],
    diagnosis: Diagnosis | None = None,
    final: AttemptResult | None = None,
) -> None:
    """The end of a job, on stderr. ``final``: how it ended, when not its last attempt (a stop
    signal between attempts)."""
    final = final if final is not None else results[-1]
    plan = prepared.plan
    if final.code == 0 and len(results) == 1:
        return
    if len(results) > 1:
        for r in results:
            known = f"; known failure: {r.diagnosis['id']}" if r.diagnosis else ""
            note(f"attempt {r.attempt + 1}: {r.reason} (exit {r.code}, {r.duration:.1f} s){known}")
    if final.host is not None and final.code != 0:  # a rank on another host failed first
        note(f"{final.reason}; stopped this host's ranks")
        who = f"rank {final.rank}'s exit code" if final.rank is not None else final.reason
        note(f"exit {final.code}: {who} (on host {final.host})")
    elif final.source == Source.WORKER and final.rank is not None:
        rank = plan.ranks[final.rank]
        shown = final.rank + plan.rank_offset  # the global rank, in a job over several hosts
        others = [e for e in final.exits if e.rank != final.rank and e.stopped]
        how = next((e.how for e in final.exits if e.rank == final.rank), final.reason)
        chips = f" ({', '.join(rank.bdfs)})" if rank.bdfs else ""  # a chipless server: none
        note(
            f"rank {shown}{chips} {how}"
            + (f"; stopped {plural(len(others), 'other rank')}" if others else "")
        )
        if final.error_message:
            note(f"rank {shown} raised {final.error_message}")
        if final.stderr_tail:
            note(f"last lines of rank {shown}'s stderr:")
            for line in final.stderr_tail[-5:]:
                note(f"  {line}")
        for line in diagnosis.lines() if diagnosis else ():
            note(line)
        note(f"exit {final.code}: rank {shown}'s exit code")
    elif final.code != 0:
        for line in diagnosis.lines() if diagnosis else ():
            note(line)
        note(f"exit {final.code}: {final.reason}")


def write_refusal(path: str, exc: TTMeshError) -> None:
    """--summary-json when nothing started: ttmesh decided the code (2 or 3) and says why."""
    data: dict[str, object] = {
        "source": Source.TTMESH,
        "rank": None,
        "code": exc.code,
        "reason": str(exc),
        "attempts": [],
        "diagnosis": None,
    }
    unwritten = _write_json(path, data)
    if unwritten is not None:
        note(unwritten)  # the refusal, with its code, follows


def _write_json(path: str, data: dict[str, object]) -> str | None:
    """Write the summary the user named (``paths.write_text``: never through a link another
    user planted); the line saying why it could not be, or None."""
    try:
        paths.write_text(path, json.dumps(data, indent=2) + "\n", "--summary-json")
    except TTMeshError as err:
        return str(err)
    return None


def _write_summary(
    path: str,
    final: AttemptResult,
    results: list[AttemptResult],
    diagnosis: Diagnosis | None = None,
) -> str | None:
    """Write ``--summary-json``; the line saying why it could not be, or None."""
    data: dict[str, object] = {
        "source": final.source,
        "rank": final.rank,
        "code": final.code,
        "reason": final.reason,
        "attempts": [
            {"attempt": r.attempt, "code": r.code, "rank": r.rank, "reason": r.reason}
            for r in results
        ],
        "diagnosis": diagnosis.to_json() if diagnosis else None,
    }
    return _write_json(path, data)
