"""Choosing the job's chips: the ones named, else the best healthy mesh of the free ones.

Healthy first: sets with no pair whose links are down, then sets holding one chip of each broken
pair; chips leased, held, dead or excluded are never chosen, and a refusal says who has them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

from ttmesh.dataclass import dataclass, field
from ttmesh.errors import TTMeshError, bad_input, refused
from ttmesh.fabric import heartbeat
from ttmesh.fabric.devices import Chip, Inventory, by_id_chip
from ttmesh.host.boards import BDF_RE
from ttmesh.launcher.planning.request import LaunchRequest
from ttmesh.mesh import healthy
from ttmesh.mesh import select as meshselect
from ttmesh.render import plural
from ttmesh.runtime import leases
from ttmesh.states import ChipUnavailable
from ttmesh.vocab import Layout, Role

if TYPE_CHECKING:
    from ttmesh.launcher.planning.liveness import Liveness


def parse_bdfs(text: str | None, inv: Inventory, flag: str) -> list[Chip]:
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


def unavailable_chips(
    inv: Inventory, repairable: bool = False
) -> tuple[dict[str, str], dict[str, str]]:
    """(asic -> why it can't be used, asic -> who has it) for dead, held and leased chips.

    ``repairable``: dead chips stay usable (``--auto-reset`` recovers them before the start)."""
    why, who, _beats = unavailable_and_beats(inv, repairable)
    return why, who


def unavailable_and_beats(
    inv: Inventory, repairable: bool = False
) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """:func:`unavailable_chips`, and the heartbeats it read (asic -> state) for whoever
    passes them on (a host's report: pre-flight there need not poll them again)."""
    why, who = blocked_chips(inv)
    beats = heartbeat.poll(inv, [c for c in inv.chips if c.asic_id not in why])
    why, who = with_dead(why, who, beats, repairable)
    return why, who, beats


def blocked_chips(inv: Inventory) -> tuple[dict[str, str], dict[str, str]]:
    """:func:`unavailable_chips` without the heartbeats: leased and held chips."""
    from ttmesh.fabric import holders as holdermod

    why: dict[str, str] = {}
    who: dict[str, str] = {}
    for asic, info in leases.probe(inv.host, [c.asic_id for c in inv.chips]).items():
        if info.role == Role.LEASE:
            why[asic] = ChipUnavailable.LEASED
            who[asic] = info.holder
        else:  # a process holds its lease file, and it is no ttmesh lease
            why[asic] = ChipUnavailable.LOCKED
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
            why[chip.asic_id] = ChipUnavailable.HELD
            h = hs[0]
            who[chip.asic_id] = f"pid {h.pid} ({h.user}: {h.cmd})"
    return why, who


def with_dead(
    why: dict[str, str], who: dict[str, str], beats: dict[str, str], repairable: bool
) -> tuple[dict[str, str], dict[str, str]]:
    why, who = dict(why), dict(who)
    for asic, state in beats.items():
        if state == heartbeat.FROZEN and not repairable:
            why[asic] = ChipUnavailable.DEAD
            who[asic] = "its heartbeat is frozen"
    return why, who


def _unavailable_hint(inv: Inventory, why: dict[str, str]) -> str:
    """How to get the chips back: a reset for dead ones, patience for the others."""
    from ttmesh.fabric import health

    dead = [a for a, w in why.items() if w == ChipUnavailable.DEAD]
    if dead:
        fix = health.reset_fix(inv, dead, inv.links) or "ttmesh reset"
        return f"recover them: {fix}, or add --auto-reset"
    if "locked" in why.values():
        return (
            "a process that is no ttmesh job holds its lease file: ask its user to end it, "
            "or pick other chips with --chips/--exclude (see ttmesh ls)"
        )
    return "wait for them, or see ttmesh ls and ttmesh ps"


def alive_first(
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


def default_tp(req: LaunchRequest, inv: Inventory, chosen: list[Chip]) -> tuple[int, str | None]:
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


def pick(
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
            if c.asic_id in why and why[c.asic_id] != ChipUnavailable.EXCLUDED:
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
        blocked = {a: w for a, w in why.items() if w != ChipUnavailable.EXCLUDED}
        if not blocked or getattr(exc, "code", None) != 2:
            raise
        # Would an idle host serve it? Then the chips in use are the reason: refuse (exit 3).
        try:
            meshselect.select(
                inv,
                req.tp_size,
                shape=req.mesh_shape,
                unavailable={a: w for a, w in why.items() if w == ChipUnavailable.EXCLUDED},
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


def verdict_cannot_change(
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
                inv,
                req,
                chosen,
                {**why, asic: ChipUnavailable.DEAD},
                {**who, asic: "its heartbeat is frozen"},
            )
        except TTMeshError:
            continue
        return False  # another mesh would serve without it: the heartbeats decide
    return True


def frozen_refusal(
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


# --------------------------------------------------------------------------- the choice


@dataclass(frozen=True)
class Choice:
    """The chips chosen, and what their choice knows of the host's chips."""

    sel: meshselect.Selection
    seen: tuple[dict[str, str], dict[str, str]]  # (why, who) each chip could not be used
    broken: list[healthy.Broken]  # the host's links down, read for the choice
    unhealthy: NoHealthy | None = None  # no healthy mesh: these chips, refused by pre-flight
    liveness: Liveness | None = None  # the heartbeats still being read as the workers start
    beats: dict[str, str] = field(default_factory=dict)  # heartbeats read for the choice


def choose_chips(
    req: LaunchRequest,
    inv: Inventory,
    chosen: list[Chip],
    excluded: list[Chip],
    *,
    descriptor_only: bool = False,
    repairable: bool = False,
    defer_liveness: bool = False,
) -> Choice:
    """The chips of the job, and when their heartbeats are read: first, as always, unless
    ``defer_liveness`` and the verdict cannot change the choice (chips named, or every usable
    chip taken): then a frozen chip can only refuse the launch, and the workers start while
    the heartbeats are read (:class:`~ttmesh.launcher.planning.liveness.Liveness`)."""
    from ttmesh.launcher.planning.liveness import Liveness

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
    choose = functools.partial(pick, broken=broken, repairable=repairable)

    def availability(
        beats: dict[str, str], repairable: bool = repairable
    ) -> tuple[dict[str, str], dict[str, str]]:
        """Why each chip can't be used (in this order: leased, held, dead, excluded), who."""
        why, who = with_dead(*blocked, beats, repairable)
        for c in excluded:
            why.setdefault(c.asic_id, "excluded")
        return why, who

    if watch is not None and defer_liveness and not repairable:
        # Choose as if every chip's heartbeat moved; keep it if the verdict cannot change it.
        try:
            guess = choose(inv, req, chosen, *availability({}))
        except TTMeshError:
            guess = None  # the refusal might name a frozen chip: read the heartbeats first
        if guess is not None and verdict_cannot_change(
            inv, req, guess, chosen, availability({}), choose, broken
        ):
            job_chips = [a for u in guess.units for a in u.chips]
            watch.only(job_chips)
            decide = functools.partial(
                frozen_refusal, inv, req, chosen, availability, job_chips, choose
            )
            return Choice(guess, availability({}), broken, liveness=Liveness(watch, decide))
    beats = watch.wait() if watch is not None else {}
    seen = availability(beats)
    sel = None
    if repairable and not chosen:  # healthy first: reset frozen chips only when needed
        sel = alive_first(inv, req, choose, availability(beats, repairable=False), broken)
        seen = availability(beats, repairable=False) if sel is not None else seen
    try:
        return Choice(sel or choose(inv, req, chosen, *seen), seen, broken, beats=beats)
    except NoHealthy as exc:  # planned all the same: pre-flight refuses it (exit 3)
        return Choice(exc.selection, seen, broken, unhealthy=exc, beats=beats)
