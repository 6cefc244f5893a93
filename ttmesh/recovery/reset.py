"""The safe reset: expand the chip set, refuse or stop holders, ``tt-smi -r``, verify, retry.

Three layers, kept apart so each can be tested alone:

* **planning** (pure: plain data in, plain data out): :func:`expand`, :func:`plan`,
  :func:`pci_targets`, :func:`smi_argv`, :func:`blockers`. Whole boards and every chip
  Ethernet-linked to the set, transitively, are reset together: resetting one end of a link
  leaves the other end failing to train. The tt-smi argv only ever names PCI addresses that
  exist right now, lower-case (tt-smi matches them exactly, and a target list that matches
  nothing makes it reset EVERY device).
* **processes** (signals and subprocesses): :func:`stop_processes`, :func:`wait_released`,
  :func:`find_tt_smi`, :func:`run_tt_smi`. Holders get SIGTERM, then SIGKILL, each only while the
  PID still has the start time it had when found; tt-smi runs from an argv list with stdin
  closed, its output captured and its whole process group killed at the timeout.
* **verification and the loop**: :func:`observe`, :func:`execute`, :func:`recover`. tt-smi's exit
  code says nothing, so after every attempt the host is discovered again (``/dev/tenstorrent``
  numbers may change: chips are followed by unique id and PCI address), and the set is
  recovered when every chip is back, its heartbeat advances and the links between its chips are
  up.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ttmesh import procs
from ttmesh.dataclass import dataclass, field
from ttmesh.errors import bad_input, failed, refused
from ttmesh.fabric import domains, health, heartbeat, links
from ttmesh.fabric.devices import Inventory, LinkSpec, discover
from ttmesh.fabric.problem import ERROR, WARNING, Problem, chip_name
from ttmesh.host.base import Host
from ttmesh.host.boards import BDF_RE
from ttmesh.recovery import holdstop
from ttmesh.render import plural
from ttmesh.runtime import leases, leftdown, resetmark
from ttmesh.states import RESET_MOVES, ResetStage, ResetStatus, move
from ttmesh.vocab import ChipProcess, Role

SCHEMA = "ttmesh.reset/1"
DEFAULT_TIMEOUT = 120.0  # seconds for one tt-smi run (a reset with Ethernet training)
DEFAULT_RETRIES = 2
DEFAULT_BACKOFF = 1.0  # seconds before the first retry, doubling, at most MAX_BACKOFF
MAX_BACKOFF = 30.0
STOP_GRACE = 5.0  # SIGTERM -> SIGKILL
MAX_TRAIN = 2592000.0  # seconds: --train-timeout at most (the house's 30 days)
RELEASE_TIMEOUT = 10.0  # until the driver lists no holder after they were stopped

Log = Callable[[str], None]

PROGRESS_EVERY = 0.25  # seconds: a progress callback hears at least this often
# What a chip that is not right after tt-smi waits for (a chip that is: DONE).
WAITING_FOR: dict[ResetStatus, ResetStage] = {
    ResetStatus.GONE: ResetStage.WAIT_PCI,
    ResetStatus.FROZEN: ResetStage.WAIT_HEARTBEAT,
    ResetStatus.LINKS_DOWN: ResetStage.WAIT_LINKS,
}


@dataclass(frozen=True)
class ChipProgress:
    """One chip's place in a reset, for a progress view (``ttmesh reset`` on a terminal)."""

    asic: str
    name: str  # how the plan names it: PCI address, or "remote <asic>"
    stage: ResetStage  # QUEUED ... DONE | FAILED, changed only by moved()
    attempt: int  # the tt-smi run it is in (1 first; 0 before any)
    detail: str = ""

    def moved(self, stage: ResetStage, attempt: int, detail: str) -> ChipProgress:
        """This chip in ``stage`` now, through the reset machine's door (states.move:
        IllegalTransition for a move RESET_MOVES does not allow)."""
        new = move(RESET_MOVES, f"the reset of {self.name}", self.stage, stage)
        return replace(self, stage=new, attempt=attempt, detail=detail)


# Every chip's progress, called when a stage changes and at least every PROGRESS_EVERY seconds
# while the reset runs (tt-smi on a Galaxy takes about 30 s), so a view can keep its clock.
Progress = Callable[[list[ChipProgress]], None]


# =========================================================================== planning (pure)


@dataclass(frozen=True)
class ResetPlan:
    requested: tuple[str, ...]  # asic ids asked for
    chips: tuple[str, ...]  # asic ids to reset (expanded), in the host's order
    why: dict[str, str]  # asic -> why it is in the set
    galaxy: bool  # tt-smi -glx_reset (every chip of the system)
    expanded: bool  # False with --no-expand
    links: tuple[LinkSpec, ...]  # expected links between chips of the set (verified after)
    outside: tuple[LinkSpec, ...]  # expected links from the set to chips outside it
    warnings: tuple[Problem, ...] = ()
    names: dict[str, str] = field(default_factory=dict)  # asic -> how to name it
    # links to another live job's chips neither job's mesh uses: left down, and recorded
    left_down: tuple[LinkSpec, ...] = ()
    beside: dict[str, str] = field(default_factory=dict)  # far end -> "job J of user U"

    def name(self, asic: str) -> str:
        return self.names.get(asic, asic)

    def describe(self) -> str:
        """``resetting 4 chips: A (asked), B (Ethernet-linked to A), ...``"""
        parts = [f"{self.name(a)} ({self.why[a]})" for a in self.chips]
        text = f"resetting {plural(len(self.chips), 'chip')}: " + ", ".join(parts)
        if self.left_down:
            jobs = ", ".join(dict.fromkeys(self.beside.values()))
            text += (
                f"; leaving {plural(len(self.left_down), 'link')} to {jobs} down (neither "
                "job's mesh uses them; recorded, so the next job that needs them resets both ends)"
            )
        return text

    def far_end(self, lk: LinkSpec) -> str:
        """The end of a left-down link outside the set."""
        return lk.b if lk.a in self.chips else lk.a


is_galaxy = domains.is_galaxy


def plan(
    inv: Inventory,
    requested: Sequence[str] | None = None,
    *,
    no_expand: bool = False,
    link_specs: Sequence[LinkSpec] | None = None,
    usage: domains.Usage | None = None,
) -> ResetPlan:
    """The chips a reset of ``requested`` (asic ids; None = every chip) must take.

    Pure: plain data in and out, so a caller can plan one set's recovery alone (a serving
    fleet's replica): ``usage`` (:func:`ttmesh.fabric.domains.usage_from` over the host's
    leases) says which chips other live jobs lease and which links their meshes use; the set
    then stops at a link between it and another job's chip that neither mesh uses, leaving it
    down (``left_down``) instead of taking, and so being refused for, that job's chips.
    Without ``usage`` every link is followed, as before there were such records."""
    if no_expand and requested is None:
        raise bad_input(
            "--no-expand needs --chips",
            "name the chips to reset alone, e.g. --chips 0000:01:00.0 --no-expand",
        )
    if not inv.chips:
        raise bad_input("no Tenstorrent chips on this host to reset", "see ttmesh ls")
    exp = health.expected(inv)
    specs = list(exp.links if link_specs is None else link_specs)
    asked = [c.asic_id for c in inv.chips] if requested is None else list(requested)
    why, left = domains.expand(inv, asked, specs, follow_links=not no_expand, usage=usage)
    galaxy = is_galaxy(inv)
    warnings: list[Problem] = []
    if galaxy:
        for c in inv.chips:
            why.setdefault(c.asic_id, "Galaxy: tt-smi -glx_reset resets every chip of the system")
        order = {c.asic_id: i for i, c in enumerate(inv.chips)}
        why = dict(sorted(why.items(), key=lambda kv: order[kv[0]]))
    chips = tuple(why)
    inside = set(chips)
    between = tuple(lk for lk in specs if lk.a in inside and lk.b in inside)
    outside = tuple(lk for lk in specs if (lk.a in inside) != (lk.b in inside))
    names = {c.asic_id: chip_name(inv, c.asic_id) for c in inv.chips}
    if no_expand and not galaxy:
        peers = sorted(
            {lk.b if lk.a in inside else lk.a for lk in outside}, key=lambda a: names.get(a, a)
        )
        if peers:
            warnings.append(
                Problem(
                    WARNING,
                    f"--no-expand: not resetting the chips linked to this set "
                    f"({', '.join(names.get(a, a) for a in peers)}); the {plural(len(outside), 'link')} "
                    "to them will stay down until both ends are reset together",
                    "reset linked chips together: drop --no-expand",
                    "no-expand",
                )
            )
        else:
            warnings.append(
                Problem(
                    WARNING,
                    "--no-expand: resetting only the chips named",
                    "none needed: no other chip is linked to them",
                    "no-expand",
                )
            )
    lost = [a for a in exp.missing if any(a in (lk.a, lk.b) for lk in outside)] or (
        list(exp.missing) if requested is None else []
    )
    for asic in lost:  # an error: the reset cannot make the host whole (reset exits 1)
        warnings.append(
            Problem(
                ERROR,
                f"chip {chip_name(inv, asic, exp.names)} is missing from "
                "the host: a reset cannot reach it",
                "power-cycle the host to bring it back",
                "missing",
                (asic,),
            )
        )
    left = [] if galaxy else left
    beside = {}
    for lk in left:
        far = lk.b if lk.a in inside else lk.a
        beside[far] = usage.jobs.get(far, "another job") if usage else "another job"
    if left:
        warnings.append(_left_down_warning(inv, left, inside, beside, names))
    return ResetPlan(
        tuple(asked),
        chips,
        why,
        galaxy,
        not no_expand,
        between,
        outside,
        tuple(warnings),
        names,
        tuple(left),
        beside,
    )


def _left_down_warning(
    inv: Inventory,
    left: list[LinkSpec],
    inside: set[str],
    beside: dict[str, str],
    names: dict[str, str],
) -> Problem:
    """Links a plan leaves down beside another job: what, and the reset that brings them back."""
    ends = sorted({a for lk in left for a in (lk.a, lk.b)}, key=lambda a: names.get(a, a))
    bdfs = pci_targets(inv, ends)
    jobs = ", ".join(dict.fromkeys(beside.values()))
    return Problem(
        WARNING,
        f"leaving {plural(len(left), 'link')} down between the reset chips and the chips of "
        f"{jobs} (neither job's mesh uses "
        f"{'it' if len(left) == 1 else 'them'}): recorded for the next job that needs "
        f"{'it' if len(left) == 1 else 'them'}",
        f"after that job ends: ttmesh reset{health.root_flag(inv.host)} --chips "
        f"{','.join(bdfs)} (a launch with --auto-reset on those chips does it)",
        "left-down",
        tuple(ends),
    )


def pci_targets(inv: Inventory, chips: Iterable[str]) -> list[str]:
    """PCI addresses (as the driver lists them now) of the devices behind ``chips``."""
    wanted = set(chips)
    out: list[str] = []
    for c in inv.chips:
        if c.asic_id not in wanted:
            continue
        lead = health.pci_lead(inv, c)  # a remote chip is reset through its PCI partner
        if lead is not None and lead.bdf and lead.bdf not in out:
            out.append(lead.bdf)
    return out


def smi_argv(
    tool: str,
    bdfs: Sequence[str],
    present: Iterable[str],
    *,
    galaxy: bool = False,
    no_reinit: bool = False,
) -> list[str]:
    """``tt-smi -r A,B`` naming only existing, lower-case PCI addresses (ValueError otherwise).

    tt-smi resets EVERY device when none of its targets match (an unknown or upper-case
    address, an empty list), so this refuses to build such a command. ``no_reinit``: tt-smi
    then skips its re-initialization after the reset (tt-smi's ``tt_smi.py`` runs
    ``detect_chips_with_callback``, which opens every chip of the host: a live job's beside
    the set too); ttmesh verifies the chips itself either way.
    """
    if galaxy:
        return [tool, "-glx_reset"]
    existing = set(present)
    chosen = list(dict.fromkeys(bdfs))
    if not chosen:
        raise ValueError(
            "no PCI device of the set exists now (tt-smi -r without a match resets every device)"
        )
    for bdf in chosen:
        if not BDF_RE.fullmatch(bdf):
            raise ValueError(f"{bdf!r} is not a lower-case PCI address tt-smi would match")
        if bdf not in existing:
            raise ValueError(f"{bdf} does not exist now; tt-smi would skip it")
    return [tool, "-r", ",".join(chosen), *(["--no_reinit"] if no_reinit else [])]


def blockers(
    inv: Inventory, chips: Iterable[str], *, own_pids: Iterable[int] | None = None
) -> list[ChipProcess]:
    """Why chips of the set may not be reset now: other jobs' verified leases, locks on lease
    files that are no lease (``Role.LOCK``), and holders, each named with whose it is.

    ``own_pids`` (default: this process) are ours: their leases don't block, and processes
    descending from them count as plain holders (``--force`` may stop them), not as another
    job's workers. A holder is another job's worker when it descends from that job's verified
    lease holder, or its environment names the job and it runs as the job's user.
    """
    own = {os.getpid()} if own_pids is None else set(own_pids)
    wanted = list(dict.fromkeys(chips))
    leased, owners = health.lease_owners(inv.host, [c.asic_id for c in inv.chips])
    jobs = health.lease_jobs(leased, own)

    def ours(b: ChipProcess) -> bool:
        return b.role == Role.LEASE and bool(own & {b.pid, *b.related})

    # Our leases' processes (the launcher and its guardian) are ours too.
    mine = own.union(*({b.pid, *b.related} for b in leased.values() if ours(b)))
    others = {pid: job for pid, job in owners.items() if pid not in mine}

    out: list[ChipProcess] = [leased[a] for a in wanted if a in leased and not ours(leased[a])]
    seen: set[tuple[int, str]] = set()
    by_asic = {c.asic_id: c for c in inv.chips}
    for asic in wanted:
        chip = by_asic.get(asic)
        lead = health.pci_lead(inv, chip) if chip is not None else None
        if lead is None:
            continue
        found = health.held_by(inv, lead, others, jobs)
        if found is None:
            if (-1, lead.asic_id) not in seen:
                seen.add((-1, lead.asic_id))
                out.append(ChipProcess(None, asic=lead.asic_id, role=Role.UNKNOWN))
            continue
        for h in found:
            if (h.pid or -1, lead.asic_id) not in seen:
                seen.add((h.pid or -1, lead.asic_id))
                out.append(replace(h, asic=lead.asic_id))
    return out


# =========================================================================== processes


def stop_processes(
    targets: Sequence[ChipProcess], grace: float = STOP_GRACE, log: Log | None = None
) -> list[str]:
    """SIGTERM each holder, SIGKILL what is left after ``grace``; what could not be stopped.

    Before every signal the PID must still have the start time it had when found, so a PID
    reused by another process is never signalled.
    """
    say = log or (lambda _m: None)
    pending: dict[int, ChipProcess] = {}
    problems: list[str] = []
    for b in targets:
        if b.pid is None or b.pid in pending:
            continue
        if b.start is None:
            problems.append(f"pid {b.pid}: its start time is unknown, not signalling it")
            continue
        pending[b.pid] = b

    def alive() -> dict[int, ChipProcess]:
        return {p: b for p, b in pending.items() if procs.alive(p, b.start)}

    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        pending = alive()
        for pid, b in pending.items():
            say(f"stopping {b.who} with {sig.name}")
            try:
                procs.signal_if_same(pid, b.start, sig)
            except PermissionError:
                problems.append(f"{b.who}: not allowed to signal it")
        deadline = time.monotonic() + wait
        while alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        if not alive():
            return problems
    problems.extend(f"{b.who} survived SIGKILL" for b in alive().values())
    return problems


def wait_released(
    inv: Inventory, chips: Iterable[str], timeout: float = RELEASE_TIMEOUT
) -> list[str]:
    """Poll until the driver lists no holder of ``chips``; names of chips still held."""
    wanted = set(chips)
    leads = []
    for c in inv.chips:
        if c.asic_id in wanted:
            lead = health.pci_lead(inv, c)
            if lead is not None and lead not in leads:
                leads.append(lead)
    deadline = time.monotonic() + timeout
    while True:
        held = [
            lead.bdf or lead.asic_id
            for lead in leads
            if lead.dev_index is not None and inv.host.holder_pids(lead.dev_index)
        ]
        if not held or time.monotonic() >= deadline:
            return held
        time.sleep(0.01)


def find_tt_smi(host: Host, explicit: str | None = None) -> str:
    """``--tt-smi PATH``, ``$TTMESH_TT_SMI``, or the host's own (a simulated root's
    ``bin/tt-smi``; PATH for this machine's root only: a real tt-smi resets this machine's
    chips, whatever root ttmesh was pointed at)."""
    hint = "install it: pip install tt-smi (or give --tt-smi PATH)"
    for source, value in (
        ("--tt-smi", explicit),
        ("TTMESH_TT_SMI", os.environ.get("TTMESH_TT_SMI")),
    ):
        if value:
            path = Path(value)
            if not (path.is_file() and os.access(path, os.X_OK)):
                raise bad_input(
                    f"tt-smi not found: {source} {value} is not an executable file", hint
                )
            if path.resolve().is_relative_to(host.root) and host.root != Path("/"):
                host.check_trusted(path)
            return str(path)
    return host.default_tt_smi()


@dataclass
class SmiRun:
    argv: list[str]
    code: int | None  # None: it did not finish (timed out, or could not start)
    timed_out: bool
    seconds: float
    output: str


def run_tt_smi(
    argv: Sequence[str],
    timeout: float,
    *,
    env_changes: dict[str, str | None] | None = None,
    waiting: Callable[[], None] | None = None,
) -> SmiRun:
    """Run tt-smi (argv list, stdin closed, output captured in a file) in its own process group.

    At ``timeout`` the whole group is killed and the process reaped: no zombie, no orphan.
    ``waiting`` is called every PROGRESS_EVERY seconds while tt-smi runs.
    """
    env = dict(os.environ)
    env["TT_LOGGER_LEVEL"] = "error"
    for key, value in (env_changes or {}).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    t0 = time.monotonic()
    # Its output goes to a file with no name (O_TMPFILE: no path to plant, gone when closed),
    # never a pipe: a tt-smi whose reader dies (ttmesh killed with SIGKILL mid-reset) must not
    # die of SIGPIPE printing its progress and leave the chips half reset.
    import tempfile

    with tempfile.TemporaryFile(prefix="ttmesh-tt-smi-") as out_file:
        try:
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out_file,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            return SmiRun(list(argv), None, False, 0.0, f"cannot run {argv[0]}: {exc.strerror}")
        timed_out = False
        try:
            _wait(proc, t0 + timeout, waiting)
        except subprocess.TimeoutExpired:
            timed_out = True
            procs.signal_groups([proc.pid], signal.SIGKILL)
            proc.wait()
        except BaseException:
            procs.signal_groups([proc.pid], signal.SIGKILL)
            proc.wait()
            raise
        seconds = time.monotonic() - t0
        size = os.fstat(out_file.fileno()).st_size
        out = os.pread(out_file.fileno(), MAX_SMI_OUTPUT, max(0, size - MAX_SMI_OUTPUT))
    text = out.decode(errors="replace")
    return SmiRun(list(argv), None if timed_out else proc.returncode, timed_out, seconds, text)


MAX_SMI_OUTPUT = 16 << 20  # bytes of tt-smi's output kept (its last): its verdict is at the end


def _wait(proc: subprocess.Popen, deadline: float, waiting: Callable[[], None] | None) -> None:
    """``proc.wait`` until ``deadline`` (TimeoutExpired then), calling ``waiting`` between
    short waits."""
    while True:
        left = deadline - time.monotonic()
        step = left if waiting is None else min(left, PROGRESS_EVERY)
        try:
            proc.wait(timeout=max(step, 0.0))
            return
        except subprocess.TimeoutExpired:
            if time.monotonic() >= deadline:
                raise
        if waiting is not None:
            waiting()


# =========================================================================== verification


@dataclass
class ChipState:
    asic: str
    bdf: str | None
    dev: int | None
    status: ResetStatus  # OK, UNKNOWN, LINKS_DOWN, FROZEN or GONE
    detail: str = ""


def observe(
    host: Host,
    chips: Sequence[str],
    link_specs: Sequence[LinkSpec],
    *,
    bdfs: dict[str, str | None] | None = None,
    timeout: float = 1.0,
    names: dict[str, str] | None = None,
) -> tuple[Inventory, dict[str, ChipState], list[str], list[str]]:
    """Discover again and judge ``chips``: (inventory, state per chip, what is wrong, notes).

    ``bdfs`` are the PCI addresses the chips had before: each must be back, holding the same
    chip. Heartbeats and links that cannot be read are notes, not failures.
    """
    inv = discover(host)
    by_asic = {c.asic_id: c for c in inv.chips}
    names = dict(names or {})
    present = [by_asic[a] for a in chips if a in by_asic]
    beats = heartbeat.poll(inv, present, timeout=timeout) if present else {}
    states = links.observe(inv, list(link_specs))
    down: dict[str, int] = {}
    unknown_links = 0
    wrong: list[str] = []
    notes: list[str] = []
    pairs: dict[frozenset, list[links.Observed]] = {}
    for st in states:
        pairs.setdefault(frozenset({st.spec.a, st.spec.b}), []).append(st)
        if st.state == links.DOWN:
            for end in (st.spec.a, st.spec.b):
                down[end] = down.get(end, 0) + 1
        elif st.state == links.UNKNOWN:
            unknown_links += 1
    result: dict[str, ChipState] = {}
    for asic in chips:
        name = names.get(asic) or chip_name(inv, asic)
        chip = by_asic.get(asic)
        want_bdf = (bdfs or {}).get(asic)
        if chip is None or (want_bdf and chip.bdf != want_bdf):
            result[asic] = ChipState(
                asic, want_bdf, None, ResetStatus.GONE, "not listed by the driver"
            )
            wrong.append(f"{name} did not come back (the driver does not list it)")
            continue
        beat = beats.get(asic, heartbeat.UNKNOWN)
        if beat == heartbeat.FROZEN:
            result[asic] = ChipState(
                asic, chip.bdf, chip.dev_index, ResetStatus.FROZEN, "heartbeat frozen"
            )
            wrong.append(f"{name}: heartbeat frozen")
        elif down.get(asic):
            result[asic] = ChipState(
                asic,
                chip.bdf,
                chip.dev_index,
                ResetStatus.LINKS_DOWN,
                f"{plural(down[asic], 'link')} down",
            )
        elif beat == heartbeat.UNKNOWN:
            result[asic] = ChipState(
                asic, chip.bdf, chip.dev_index, ResetStatus.UNKNOWN, "heartbeat unknown"
            )
            notes.append(f"{name}: heartbeat cannot be read, not verified")
        else:
            result[asic] = ChipState(asic, chip.bdf, chip.dev_index, ResetStatus.OK)
    for pair, group in pairs.items():
        bad = [s for s in group if s.state == links.DOWN]
        if bad:
            a, b = sorted(pair, key=lambda x: names.get(x) or chip_name(inv, x))
            na = names.get(a) or chip_name(inv, a)
            nb = names.get(b) or chip_name(inv, b)
            wrong.append(f"{len(bad)} of {plural(len(group), 'link')} between {na} and {nb} down")
    if unknown_links:
        notes.append(
            f"{plural(unknown_links, 'link')} of the set "
            + ("reports" if unknown_links == 1 else "report")
            + " no state, not verified"
        )
    return inv, result, wrong, notes


# =========================================================================== the loop


@dataclass
class Attempt:
    number: int
    argv: list[str]
    exit_code: int | None
    timed_out: bool
    seconds: float
    verified: bool
    still_wrong: list[str]
    output: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "attempt": self.number,
            "argv": self.argv,
            "exit_code": self.exit_code,
            "timed_out": self.timed_out,
            "seconds": round(self.seconds, 3),
            "verified": self.verified,
            "still_wrong": self.still_wrong,
        }


@dataclass
class ResetOutcome:
    plan: ResetPlan
    recovered: bool
    chips: list[dict[str, Any]]
    attempts: list[Attempt]
    problems: list[Problem]
    seconds: float = 0.0
    stopped: list[int] = field(default_factory=list)  # holder PIDs stopped (--force)

    @property
    def missing(self) -> list[Problem]:
        """Chips the reset would take that the host lost: the chips there may be reset and
        verified (``recovered``), yet the host is not whole."""
        return [p for p in self.problems if p.kind == "missing"]

    @property
    def code(self) -> int:
        """``ttmesh reset``'s exit: 0 only when every chip it takes is back and verified."""
        return 0 if self.recovered and not self.missing else 1

    @property
    def unreached(self) -> tuple[str, ...]:
        """Chips asked for that the host had lost before the reset (no PCI device to reset):
        never reset nor verified, whatever ``recovered`` says of the others."""
        return tuple(a for a in self.plan.requested if a not in self.plan.chips)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "recovered": self.code == 0,
            "chips": self.chips,
            "attempts": [a.to_json() for a in self.attempts],
            "problems": [p.to_json() for p in self.problems],
        }


def check_blockers(
    inv: Inventory,
    p: ResetPlan,
    *,
    force: bool,
    own_pids: Iterable[int] | None = None,
) -> list[ChipProcess]:
    """Refuse (exit 3) for another job's lease or worker, or for holders without ``force``.

    Returns the holders ``force`` may stop.
    """
    found = blockers(inv, p.chips, own_pids=own_pids)

    def said(b: ChipProcess) -> str:
        return b.describe(chip_name(inv, b.asic))

    hard = [b for b in found if b.role in (Role.LEASE, Role.WORKER)]
    if hard:
        leased = [b for b in hard if b.role == Role.LEASE]
        jobs: dict[str, int] = {}
        for b in leased:
            key = f"job {b.job} of user {b.user}"
            jobs[key] = jobs.get(key, 0) + 1
        more = ""
        if leased:
            by = ", ".join(f"{n} by {job}" for job, n in jobs.items())
            more = (
                f"; {len(leased)} of the {plural(len(p.chips), 'chip')} to reset "
                f"{'is' if len(leased) == 1 else 'are'} leased ({by})"
            )
        workers = len(hard) - len(leased)
        if workers:
            more += f"; {workers} held by another job's workers"
        raise refused(
            said(hard[0]) + more,
            "ttmesh reset never touches another job's chips, even with --force: wait for it "
            "to end (see ttmesh ls)",
        )
    soft = [b for b in found if b.role in (Role.HOLDER, Role.UNKNOWN, Role.LOCK)]
    if soft and not force:
        more = f" (and {len(soft) - 1} more)" if len(soft) > 1 else ""
        first = soft[0]
        if first.role == Role.HOLDER:
            hint = f"kill {first.pid} ({first.user}: {first.cmd}), or add --force to stop it (SIGTERM, then SIGKILL)"
        elif first.role == Role.LOCK:
            hint = (
                "it is no ttmesh job: add --force to reset anyway (ttmesh signals only the "
                "chips' holders, never the process holding the lease file)"
            )
        else:
            hint = "run as root to see the holders, or add --force to reset anyway"
        raise refused(said(first) + more, hint)
    # A lock on a lease file that is no lease does not hold the chip: it is not stopped.
    return [b for b in soft if b.role == Role.HOLDER]


class _Tracker:
    """Each chip's stage for a progress callback: said on every change, and at least every
    PROGRESS_EVERY seconds when asked to ``tick``."""

    def __init__(self, p: ResetPlan, progress: Progress | None) -> None:
        self.progress = progress
        self.chips = {a: ChipProgress(a, p.name(a), ResetStage.QUEUED, 0) for a in p.chips}
        self.told = 0.0

    def set(self, asics: Iterable[str], stage: ResetStage, attempt: int, detail: str = "") -> None:
        """Each of ``asics`` of the plan in ``stage`` now (ChipProgress.moved: a move the
        reset machine does not make is ttmesh's bug, IllegalTransition)."""
        for a in asics:
            if a in self.chips:
                self.chips[a] = self.chips[a].moved(stage, attempt, detail)

    def observed(self, states: dict[str, ChipState], attempt: int) -> None:
        """After tt-smi: what each chip waits for, or done."""
        for a, st in states.items():
            stage = WAITING_FOR.get(st.status, ResetStage.DONE)
            ok = stage == ResetStage.DONE and st.status == ResetStatus.OK
            self.set([a], stage, attempt, "" if ok else st.detail)

    def tell(self) -> None:
        if self.progress is not None:
            self.told = time.monotonic()
            self.progress(list(self.chips.values()))

    def tick(self) -> None:
        if self.progress is not None and time.monotonic() - self.told >= PROGRESS_EVERY:
            self.tell()

    def sleep(self, seconds: float) -> None:
        """``time.sleep``, telling the progress on the way."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            time.sleep(min(left, PROGRESS_EVERY) if self.progress is not None else left)
            self.tick()


def execute(
    host: Host,
    inv: Inventory,
    p: ResetPlan,
    tool: str,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    retries: int = DEFAULT_RETRIES,
    force: bool = False,
    log: Log | None = None,
    backoff: float = DEFAULT_BACKOFF,
    settle: float | None = None,
    stop_grace: float = STOP_GRACE,
    heartbeat_timeout: float = 1.0,
    own_pids: Iterable[int] | None = None,
    progress: Progress | None = None,
) -> ResetOutcome:
    """Steps 2-4 for a plan: refuse or stop holders, reset, verify, retry; never raises for
    a reset that did not work (that is ``recovered=False``), only for refusals (exit 3).

    ``progress`` hears every chip's stage (:class:`ChipProgress`) as the reset goes; with it,
    the per-chip "waiting for" lines are its to show, not ``log``'s."""
    say = log or (lambda _m: None)
    track = _Tracker(p, progress)
    t0 = time.monotonic()
    host.check_changeable()
    to_stop = check_blockers(inv, p, force=force, own_pids=own_pids)
    track.tell()
    stopped = _stop_holders(inv, p, to_stop, stop_grace, say, track) if to_stop else []
    if settle is None:  # the boards' training bound, polled (a healthy reset returns at once)
        settle = host.train_timeout({inv.chip(a).arch for a in p.chips if _listed(inv, a)})
    bdf_before = {a: inv.chip(a).bdf for a in p.chips}
    say("reading the chips' state before the reset")
    _, before, _, _ = observe(
        host, p.chips, p.links, bdfs=bdf_before, timeout=heartbeat_timeout, names=p.names
    )
    current = inv
    attempts: list[Attempt] = []
    after = before
    notes: list[str] = []
    # While tt-smi resets, pollers pause (ttmesh metrics: tt-smi#172).
    with resetmark.marked(host):
        for number in range(1, retries + 2):
            present = {b for b in (host.bdf_of(n) for n in host.dev_indexes()) if b}
            targets = [b for b in pci_targets(current, p.chips) if b in present]
            try:
                # Beside another live job, tt-smi must not open its chips after the reset.
                argv = smi_argv(
                    tool, targets, present, galaxy=p.galaxy, no_reinit=bool(p.left_down)
                )
            except ValueError as exc:
                attempts.append(Attempt(number, [], None, False, 0.0, False, [str(exc)]))
                break
            say(f"attempt {number} of {retries + 1}: {' '.join(argv)}")
            track.set(p.chips, ResetStage.RESETTING, number, f"tt-smi {argv[1]}")
            track.tell()
            waiting = _bus_watch(host, p, current, track, number)
            # A stop now waits for this attempt's end: a reset cut short loses the chips.
            with holdstop.held(f"the reset ({argv[1]}) and its check") as stop:
                run = run_tt_smi(argv, timeout, env_changes=host.tt_smi_env(), waiting=waiting)
                if run.timed_out:
                    say(f"tt-smi timed out after {timeout:g} s; killed it")
                deadline = time.monotonic() + (0.0 if run.timed_out or stop.sig else settle)
                current, after, wrong, notes = _settle(
                    host, p, bdf_before, heartbeat_timeout, deadline, number, track, say
                )
                wrong = _run_failures(run, timeout) + wrong
                attempts.append(
                    Attempt(
                        number, argv, run.code, run.timed_out, run.seconds, not wrong, wrong,
                        run.output,
                    )
                )  # fmt: skip
            if not wrong:
                say(f"verified after attempt {number}")
                break
            if number <= retries:
                _back_off(number, backoff, wrong, say, track)
    recovered = bool(attempts) and attempts[-1].verified
    chips = _chip_rows(p, bdf_before, before, after, attempts, recovered)
    _tell_end(track, chips, len(attempts))
    problems = _problems(host, p, current, attempts, after, notes, timeout)
    if any(a.exit_code is not None for a in attempts):  # tt-smi ran: the links changed
        trouble = _record_left_down(host, p)
        if trouble:
            say(f"warning: {trouble}")
            problems.append(
                Problem(WARNING, trouble, "none needed: pre-flight still checks the links")
            )
    return ResetOutcome(p, recovered, chips, attempts, problems, time.monotonic() - t0, stopped)


def _record_left_down(host: Host, p: ResetPlan) -> str | None:
    """Record the links the plan left down beside other jobs, and forget those whose both
    ends were just reset (``runtime.leftdown``); why it could not, or None."""
    by_pair: dict[frozenset[str], list[LinkSpec]] = {}
    for lk in p.left_down:
        by_pair.setdefault(frozenset((lk.a, lk.b)), []).append(lk)
    now = time.time()
    add = []
    for group in by_pair.values():
        a, b = group[0].a, group[0].b
        chans = tuple(
            (lk.chan_a, lk.chan_b) if lk.a == a else (lk.chan_b, lk.chan_a) for lk in group
        )
        far = p.far_end(group[0])
        why = f"a reset of {p.name(a if far == b else b)} beside {p.beside.get(far, 'another job')}"
        add.append(leftdown.LeftDown(a, b, chans, now, why))
    return leftdown.update(host, add, p.chips)


def _listed(inv: Inventory, asic: str) -> bool:
    return any(c.asic_id == asic for c in inv.chips)


def _stop_holders(
    inv: Inventory,
    p: ResetPlan,
    to_stop: list[ChipProcess],
    stop_grace: float,
    say: Log,
    track: _Tracker,
) -> list[int]:
    """Stop the chips' holders (``--force``) and wait until the driver lists none: the PIDs
    stopped; :func:`failed` when one cannot be stopped or a chip stays held."""
    track.set({b.asic for b in to_stop if b.asic}, ResetStage.STOPPING, 0)
    track.tell()
    trouble = stop_processes(to_stop, stop_grace, say)
    if trouble:
        raise failed("could not stop the holders: " + "; ".join(trouble), "stop them by hand")
    stopped = sorted({b.pid for b in to_stop if b.pid is not None})
    say("waiting until the driver lists no holder")
    still = wait_released(inv, p.chips)
    if still:
        raise failed(f"{', '.join(still)} still held after stopping its holders")
    return stopped


def _bus_watch(
    host: Host, p: ResetPlan, current: Inventory, track: _Tracker, number: int
) -> Callable[[], None]:
    """What runs while tt-smi does: which chips' PCI devices are off the bus, for the
    progress view (each chip followed through the PCI device it is reset through)."""
    leads = {a: next(iter(pci_targets(current, [a])), None) for a in p.chips}

    def waiting() -> None:
        if track.progress is None:
            return
        listed = {b for b in (host.bdf_of(n) for n in host.dev_indexes()) if b}
        for a in p.chips:
            lead = leads[a]
            stage = ResetStage.RESETTING if lead is None or lead in listed else ResetStage.WAIT_PCI
            if track.chips[a].stage != stage:
                track.set([a], stage, number, track.chips[a].detail)
                track.told = 0.0
        track.tick()

    return waiting


def _settle(
    host: Host,
    p: ResetPlan,
    bdf_before: dict[str, str | None],
    heartbeat_timeout: float,
    deadline: float,
    number: int,
    track: _Tracker,
    say: Log,
) -> tuple[Inventory, dict[str, ChipState], list[str], list[str]]:
    """After tt-smi: the chips observed again until all are right or ``deadline`` passes (the
    boards' training bound, ``Host.train_timeout``, or ``--train-timeout``: chips come back and
    train their links a while after tt-smi exits; polled, so a healthy reset returns at once)."""
    while True:
        current, after, wrong, notes = observe(
            host, p.chips, p.links, bdfs=bdf_before, timeout=heartbeat_timeout, names=p.names
        )
        track.observed(after, number)
        track.tell()
        if not wrong or time.monotonic() >= deadline:
            return current, after, wrong, notes
        if track.progress is None:
            say("waiting for: " + "; ".join(wrong))
        track.sleep(0.25)


def _run_failures(run: SmiRun, timeout: float) -> list[str]:
    """What makes an attempt fail whatever the chips look like: tt-smi never ran to its end."""
    if run.timed_out:
        return [f"tt-smi timed out after {timeout:g} s (killed)"]
    if run.code is None:
        return [run.output.strip() or "tt-smi did not run"]
    return []


def _back_off(number: int, backoff: float, wrong: list[str], say: Log, track: _Tracker) -> None:
    """Wait before the next attempt: ``backoff`` doubling per attempt, at most MAX_BACKOFF."""
    wait = min(backoff * 2 ** (number - 1), MAX_BACKOFF)
    say(f"attempt {number} did not recover the set ({'; '.join(wrong)}); retrying in {wait:g} s")
    left = [a for a, c in track.chips.items() if c.stage != ResetStage.DONE]
    track.set(left, ResetStage.RETRYING, number, f"in {wait:g} s")
    track.tell()
    track.sleep(wait)


def _chip_rows(
    p: ResetPlan,
    bdf_before: dict[str, str | None],
    before: dict[str, ChipState],
    after: dict[str, ChipState],
    attempts: list[Attempt],
    recovered: bool,
) -> list[dict[str, Any]]:
    """Each chip of the plan before and after, as the report lists it."""
    # A chip that looks fine after a reset that never ran to its end was not reset at all:
    # say so instead of "ok" beside "not recovered".
    unfinished = not recovered and (not attempts or attempts[-1].exit_code is None)

    def after_status(a: str) -> str:
        status = after[a].status if a in after else ResetStatus.GONE
        return ResetStatus.NOT_RESET if unfinished and status == ResetStatus.OK else status

    return [
        {
            "bdf": bdf_before.get(a) or (before[a].bdf if a in before else None),
            "asic_id": a,
            "before": before[a].status if a in before else ResetStatus.GONE,
            "after": after_status(a),
            "dev_before": before[a].dev if a in before else None,
            "dev_after": after[a].dev if a in after else None,
        }
        for a in p.chips
    ]


def _tell_end(track: _Tracker, chips: list[dict[str, Any]], attempts: int) -> None:
    """The progress view's last word: each chip done or failed (and why)."""
    for c in chips:
        ok = c["after"] in (ResetStatus.OK, ResetStatus.UNKNOWN)
        why = "" if c["after"] == ResetStatus.OK else str(c["after"])
        track.set([str(c["asic_id"])], ResetStage.DONE if ok else ResetStage.FAILED, attempts, why)
    track.tell()


def _problems(
    host: Host,
    p: ResetPlan,
    inv: Inventory,
    attempts: list[Attempt],
    after: dict[str, ChipState],
    notes: list[str],
    timeout: float,
) -> list[Problem]:
    out = list(p.warnings)
    last = attempts[-1] if attempts else None
    again = f"ttmesh reset{health.root_flag(host)} --chips " + ",".join(
        pci_targets(inv, p.chips) or [p.name(a) for a in p.chips]
    )
    if last is not None and not last.verified:
        for what in last.still_wrong:
            if "timed out" in what:
                fix = f"give tt-smi longer: --timeout {max(timeout * 2, 60):g}"
            elif "did not come back" in what:
                fix = "power-cycle the host: a reset cannot bring back a device the driver lost"
            elif "tt-smi" in what or not last.argv:
                fix = "check tt-smi by hand: tt-smi -ls"
            else:
                fix = f"{again} --retries 4, and power-cycle the host if it persists"
            out.append(Problem(ERROR, what, fix, "reset"))
    for note in notes:
        out.append(Problem(WARNING, note, "install the hardware extra: pip install 'ttmesh[hw]'"))
    present = {c.asic_id for c in inv.chips}
    meant = set(p.left_down)  # left down on purpose: said in the plan's warning
    reachable = [lk for lk in p.outside if lk.a in present and lk.b in present and lk not in meant]
    if reachable and last is not None:
        states = links.observe(inv, reachable)
        n = sum(1 for s in states if s.state == links.DOWN)
        if n:
            out.append(
                Problem(
                    WARNING,
                    f"{plural(n, 'link')} from the reset chips to chips outside the set "
                    f"{'is' if n == 1 else 'are'} down",
                    f"ttmesh reset{health.root_flag(host)} (without --no-expand)",
                    "link-down",
                )
            )
    out.sort(key=lambda pr: pr.severity != ERROR)
    return out


def recover(
    host: Host,
    asics: Sequence[str] | None,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    retries: int = DEFAULT_RETRIES,
    force: bool = False,
    log: Log | None = None,
    expand_set: bool = True,
    tt_smi: str | None = None,
    backoff: float = DEFAULT_BACKOFF,
    settle: float | None = None,
    own_pids: Iterable[int] = (),
    inv: Inventory | None = None,
    announce: Log | None = None,
    progress: Progress | None = None,
) -> ResetOutcome:
    """Reset ``asics`` (None: every chip) safely and verify them (``ttmesh reset``, and the
    launcher after a crash).

    ``own_pids``: more processes (besides this one) whose leases are the caller's own.
    ``inv``: the host as just discovered. ``announce`` (default ``log``) hears the chip set
    and its warnings before anything happens; ``log`` hears the progress; ``progress`` each
    chip's stage (:class:`ChipProgress`), as a view draws it.

    Expands the set, refuses (TTMeshError, exit code 3) when another job leases or works on a
    chip of it or, without ``force``, when a process holds one; leases and workers of this
    process are ours and do not block. Raises TTMeshError (exit 2) when tt-smi is missing.
    Returns the outcome: ``recovered`` is True only when verified.
    """
    if not timeout > 0:  # nan too
        raise bad_input(f"timeout {timeout}: must be positive")
    if retries < 0:
        raise bad_input(f"retries {retries}: cannot be negative")
    if settle is not None and not 0 <= settle <= MAX_TRAIN:  # nan too
        raise bad_input(
            f"train timeout {settle}: not a number of seconds from 0 to {MAX_TRAIN:g}",
            "e.g. --train-timeout 60",
        )
    inv = inv or discover(host)
    own = {os.getpid(), *own_pids}
    usage = None
    if expand_set:
        usage = domains.usage_from(leases.probe(host, [c.asic_id for c in inv.chips]), own)
    p = plan(inv, asics, no_expand=not expand_set, usage=usage)
    tool = find_tt_smi(host, tt_smi)
    say = announce or log
    if say is not None:
        say(p.describe())
        for warning in p.warnings:
            say(f"warning: {warning.what}")
    return execute(
        host,
        inv,
        p,
        tool,
        timeout=timeout,
        retries=retries,
        force=force,
        log=log,
        backoff=backoff,
        settle=settle,
        own_pids=own,
        progress=progress,
    )
