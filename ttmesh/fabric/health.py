"""``ttmesh check``: is the host fit to run a job? Chips, holders, leases and Ethernet links.

A chip is healthy when its driver node exists, its heartbeat advances (polled up to ``timeout``,
about 1 s) and no process outside the ttmesh job that leases it holds it. A chip the topology
expects but the host lost is an error. Every expected link is up, down or unknown: down is an
error; unknown, and a chip pair with fewer links than its peers, are warnings (errors with
``strict``). Every problem carries one ``fix`` line a user can act on.

Expected links come from the simulated host's cluster descriptor or, on a real host, from
discovery merged with the last known-good topology (:mod:`ttmesh.fabric.known_good`).

:func:`check` is the full report; :func:`preflight` is the cheap subset ``ttmesh launch`` runs on
the chips it is about to use (sysfs and telemetry only, heartbeats of those chips only).
"""

from __future__ import annotations

import os
import stat
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ttmesh import procs
from ttmesh.dataclass import dataclass, field
from ttmesh.errors import bad_input
from ttmesh.fabric import domains, heartbeat, holders, known_good, links, syscheck, umdlocks
from ttmesh.fabric.devices import Chip, Inventory, LinkSpec, by_id_chip
from ttmesh.fabric.problem import ERROR, WARNING, Problem, chip_name, kill_fix
from ttmesh.host.base import Host
from ttmesh.host.boards import BDF_RE
from ttmesh.render import plural
from ttmesh.runtime import leases, leftdown
from ttmesh.vocab import ChipProcess, Role

SCHEMA = "ttmesh.check/1"
ASIC_HEX = 16


# --------------------------------------------------------------------------- data


@dataclass
class ChipHealth:
    """One chip's health, as ``check`` reports it."""

    asic_id: str
    bdf: str | None
    dev_index: int | None
    board_type: str | None
    present: bool  # the host lists it (False: the topology expects it, the host lost it)
    driver_node: bool  # /dev/tenstorrent/N (a remote chip: its partner's) exists
    heartbeat: str  # alive | frozen | unknown
    holders: list[ChipProcess] | None  # None: cannot be known (permissions)
    lease: dict[str, Any] | None  # {"job", "pid", "user", "uid", "verified"}
    healthy: bool = True

    def to_json(self) -> dict[str, Any]:
        return {
            "asic_id": self.asic_id,
            "bdf": self.bdf,
            "dev_index": self.dev_index,
            "board_type": self.board_type,
            "present": self.present,
            "driver_node": self.driver_node,
            "heartbeat": self.heartbeat,
            "holders": None
            if self.holders is None
            else [h.to_json(with_job=True) for h in self.holders],
            "lease": self.lease,
            "healthy": self.healthy,
        }


@dataclass
class HealthReport:
    """``check``'s answer: every chip and link looked at, and the problems found."""

    chips: list[ChipHealth]
    links: list[links.Observed]
    problems: list[Problem]
    topology: str = ""
    recorded: Path | None = None  # the known-good record written by this check, if any
    notes: list[str] = field(default_factory=list)  # facts worth knowing, not problems
    system: dict[str, Any] | None = None  # what system pre-flight read (fabric.syscheck)
    umd_locks: list[dict[str, Any]] | None = None  # tt-umd's lock files (fabric.umdlocks)

    @property
    def healthy(self) -> bool:
        return not any(p.severity == ERROR for p in self.problems)

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == ERROR]

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "healthy": self.healthy,
            "chips": [c.to_json() for c in self.chips],
            "links": [ls.to_json() for ls in self.links],
            "problems": [p.to_json() for p in self.problems],
            "notes": self.notes,
            "system": self.system,
            "umd_locks": self.umd_locks,
        }


@dataclass
class Expected:
    """What the host should have: links (merged), chips it lost, names of chips it lost."""

    links: list[LinkSpec]
    missing: list[str]
    names: dict[str, str] = field(default_factory=dict)  # lost chip -> its PCI address
    vouched: dict[frozenset, int] | None = None  # pair -> links a complete source confirms
    store: Path | None = None  # where known-good records go (None: not used)


# --------------------------------------------------------------------------- expected topology


def _store(inv: Inventory, known_good_dir: Path | bool | None) -> Path | None:
    if known_good_dir is None:  # automatic: hosts whose topology can lose links (real ones)
        return known_good.store_dir() if inv.host.records_known_good else None
    if known_good_dir is False or known_good_dir is True:
        return known_good.store_dir() if known_good_dir else None
    return Path(known_good_dir)


def _descriptor_bdfs(inv: Inventory) -> dict[str, str]:
    """PCI addresses the topology gives its chips (names for chips the host lost)."""
    cd = inv.descriptor
    if cd is None:
        return {}
    return {c.asic_id: c.bdf for c in cd.chips.values() if c.asic_id and c.bdf}


def expected(inv: Inventory, known_good_dir: Path | bool | None = None) -> Expected:
    """The links and chips ``inv``'s host should have.

    ``known_good_dir``: None picks automatically (records on real hosts, none on simulated
    ones), False disables records, a path uses records there.
    """
    store = _store(inv, known_good_dir)
    record = None
    if store is not None:
        record = known_good.find([c.asic_id for c in inv.chips] + list(inv.missing), store)
    merged, missing = known_good.merge(inv, record)
    names = {a: b for a, b in _descriptor_bdfs(inv).items() if a in missing} if missing else {}
    if record is not None:
        for asic in missing:
            bdf = record.chips.get(asic, {}).get("bdf")
            if bdf and asic not in names:
                names[asic] = bdf
    vouched: dict[frozenset, int] | None
    if inv.topology == "cluster-descriptor" and record is None:
        vouched = None  # the descriptor is the whole topology
    else:
        vouched = dict(record.pairs) if record is not None else {}
    return Expected(merged, missing, names, vouched, store)


# --------------------------------------------------------------------------- naming


def pci_lead(inv: Inventory, chip: Chip) -> Chip | None:
    """The PCI device a chip is reached through: itself, or a remote chip's partner."""
    return inv.lead(chip)


def root_flag(host: Host) -> str:
    """`` --sim NAME`` / `` --root DIR`` (or nothing for this machine), for fix lines."""
    return f" {host.flag}" if host.flag else ""


def expand(
    inv: Inventory,
    asics: Iterable[str],
    link_specs: Sequence[LinkSpec],
    *,
    follow_links: bool = True,
) -> dict[str, str]:
    """``asics`` plus their board peers and, transitively, every chip linked to the set.

    Board peers are the chips behind the same PCI device (an n300's remote chip); they are
    always reset with it. A p300's two chips are separate PCI devices: they join through their
    Ethernet links. Returns asic -> why, in the inventory's order: the reset-domain rule
    (:func:`ttmesh.fabric.domains.expand`) with no record of who uses which link, so it stops
    at none.
    """
    return domains.expand(inv, asics, link_specs, follow_links=follow_links)[0]


def reset_fix(inv: Inventory, asics: Iterable[str], link_specs: Sequence[LinkSpec]) -> str | None:
    """``ttmesh reset --chips A,B`` for the expanded set of ``asics`` (present chips only)."""
    present = {c.asic_id for c in inv.chips}
    wanted = [a for a in asics if a in present]
    if not wanted:
        return None
    chosen = expand(inv, wanted, link_specs)
    bdfs: list[str] = []
    for c in inv.chips:
        if c.asic_id in chosen:
            lead = pci_lead(inv, c)
            if lead is not None and lead.bdf and lead.bdf not in bdfs:
                bdfs.append(lead.bdf)
    return f"ttmesh reset{root_flag(inv.host)} --chips {','.join(bdfs)}" if bdfs else None


def parse_chips(
    inv: Inventory, text: str | None, flag: str = "--chips", extra: dict[str, str] | None = None
) -> list[str] | None:
    """``--chips``: PCI addresses (any case), unique ids or ``/dev/tenstorrent/by-id`` names
    (bare or as paths) -> asic ids.

    ``extra`` maps more names to asic ids (e.g. PCI addresses of chips the host lost).
    None when ``text`` is None; bad input (exit 2) for a malformed or unknown chip.
    """
    if text is None:
        return None
    by_name: dict[str, str] = {}
    for c in inv.chips:
        by_name[c.asic_id] = c.asic_id
        if c.bdf:
            by_name[c.bdf] = c.asic_id
    for name, asic in (extra or {}).items():
        by_name.setdefault(name.lower(), asic)
    out: list[str] = []
    items = [t.strip().lower() for t in text.split(",") if t.strip()]
    if not items:
        raise bad_input(f"{flag} {text!r}: no chip named", "e.g. --chips 0000:01:00.0")
    for item in items:
        named = by_id_chip(inv, item)
        if named is not None:
            item = named.asic_id
        is_asic = len(item) == ASIC_HEX and all(ch in "0123456789abcdef" for ch in item)
        if not BDF_RE.match(item) and not is_asic:
            raise bad_input(
                f"{flag} {item!r}: not a PCI address",
                "write it as DDDD:BB:DD.F, e.g. 0000:01:00.0 (or a chip's 16-digit unique id, or "
                "its /dev/tenstorrent/by-id name: see ttmesh ls)",
            )
        if item not in by_name:
            known = ", ".join(sorted(c.bdf for c in inv.chips if c.bdf)) or "none"
            raise bad_input(f"{flag} {item}: no such chip on this host", f"chips here: {known}")
        if by_name[item] in out:
            raise bad_input(f"{flag}: duplicate chip {item}", "name each chip once")
        out.append(by_name[item])
    return out


# --------------------------------------------------------------------------- processes and jobs


def lease_owners(host: Host, asics: list[str]) -> tuple[dict[str, ChipProcess], dict[int, str]]:
    """(asic -> its lease, or the lock on its lease file, for chips that have one; the pid of
    every process holding a verified lease -> its job) on this host. A lock that is no verified
    ttmesh lease owns no process: its record is never believed."""
    held = leases.probe(host, asics)
    owners: dict[int, str] = {}
    for info in held.values():
        if info.role == Role.LEASE and info.job is not None:
            for pid in {info.pid, *info.related}:
                if pid:
                    owners[pid] = info.job
    return held, owners


def lease_jobs(held: dict[str, ChipProcess], own: Iterable[int] = ()) -> dict[str, int]:
    """Job -> the user whose job it is, for every verified lease (not the ones ``own`` hold)."""
    mine = set(own)
    return {
        info.job: info.uid
        for info in held.values()
        if info.role == Role.LEASE
        and info.job is not None
        and info.uid is not None
        and not mine & {info.pid, *info.related}
    }


def held_by(
    inv: Inventory,
    chip: Chip,
    owners: dict[int, str],
    jobs: dict[str, int] | None = None,
) -> list[ChipProcess] | None:
    """Holders of ``chip``, each with the ttmesh job it works for: the job of a lease-holding
    ancestor or, with ``jobs`` (job -> its user, :func:`lease_jobs`), the job its environment
    names (``TTMESH_JOB_ID``, readable for one's own processes or as root) when it runs as that
    job's user (a worker that left its job's process tree)."""
    found = holders.holders(inv, chip)
    if found is None:
        return None
    out = []
    for h in found:
        owner = procs.owning(h.pid, owners) if h.pid else None
        job = owners.get(owner) if owner else None
        if job is None and jobs and h.pid:
            named = procs.environ_value(h.pid, "TTMESH_JOB_ID")
            if named in jobs and procs.uid_of(h.pid) == jobs[named]:
                job = named
        out.append(replace(h, job=job, role=Role.WORKER if job else Role.HOLDER))
    return out


# --------------------------------------------------------------------------- check


def _escalate(severity: str, strict: bool) -> str:
    return ERROR if strict and severity == WARNING else severity


def _left_down_problem(
    inv: Inventory, what: str, left: leftdown.LeftDown, a: str, b: str
) -> tuple[str, str]:
    """A link down that a reset left down on purpose (``runtime.leftdown``): why, and the
    reset of both its ends together that trains it again."""
    bdfs = [
        lead.bdf for x in (a, b) if (lead := pci_lead(inv, inv.chip(x))) is not None and lead.bdf
    ]
    fix = f"ttmesh reset{root_flag(inv.host)} --chips {','.join(dict.fromkeys(bdfs))}"
    return (
        f"{what}: left down by {left.why} (both ends must be reset together)",
        fix,
    )


def _recorded(inv: Inventory, states: list[links.Observed]) -> dict[frozenset, Any]:
    """The links recorded as left down, read only when a link is down."""
    if not any(s.state == links.DOWN for s in states):
        return {}
    return {e.pair: e for e in leftdown.read(inv.host)}


def _link_problems(
    inv: Inventory,
    states: list[links.Observed],
    exp: Expected,
    strict: bool,
    recorded: dict[frozenset, Any] | None = None,
) -> list[Problem]:
    out: list[Problem] = []
    by_pair: dict[frozenset, list[links.Observed]] = {}
    for st in states:
        by_pair.setdefault(frozenset({st.spec.a, st.spec.b}), []).append(st)
    known = {c.asic_id: c for c in inv.chips}
    for pair, group in by_pair.items():
        if all(s.state == links.UP for s in group):
            continue  # nothing to say: naming the chips (a walk over every chip) is skipped
        a, b = sorted(pair, key=lambda x: chip_name(inv, x, exp.names))
        na, nb = chip_name(inv, a, exp.names), chip_name(inv, b, exp.names)
        for state in (links.DOWN, links.UNKNOWN):
            bad = [s for s in group if s.state == state]
            if not bad:
                continue
            chans = ", ".join(
                f"ch{s.spec.chan_a if s.spec.a == a else s.spec.chan_b}"
                f"<->ch{s.spec.chan_b if s.spec.a == a else s.spec.chan_a}"
                for s in bad
            )
            what = (
                f"{len(bad)} of {plural(len(group), 'link')} between {na} and {nb} "
                f"{'are' if len(bad) > 1 else 'is'} {state} ({chans})"
            )
            lost = [x for x in (a, b) if x not in known]
            if state == links.DOWN:
                if lost:
                    fix = f"power-cycle the host: the driver lost {chip_name(inv, lost[0], exp.names)}"
                else:
                    fix = reset_fix(inv, [a, b], exp.links) or "ttmesh reset"
                left = (recorded or {}).get(pair)
                if left is not None and not lost:
                    what, fix = _left_down_problem(inv, what, left, a, b)
                out.append(Problem(ERROR, what, fix, "link-down", (a, b)))
            else:
                fix = _unknown_fix(inv, [known[x] for x in (a, b) if x in known])
                out.append(Problem(_escalate(WARNING, strict), what, fix, "link-unknown", (a, b)))
    out.extend(_pair_count_problems(inv, exp, states, strict))
    return out


def _unknown_fix(inv: Inventory, chips: list[Chip]) -> str:
    for c in chips:
        lead = pci_lead(inv, c)
        fw = (
            inv.host.attr(lead.dev_index, "tt_fw_bundle_ver")
            if lead and lead.dev_index is not None
            else None
        )
        if c.arch == "blackhole" and fw and not links._fw_reports_links(fw, c.arch):
            return f"update the firmware of {c.label} to 19.9 or later (it is {fw}; older Blackhole firmware cannot report link state)"
    return "install the hardware extra to read link telemetry: pip install 'ttmesh[hw]'"


def _pair_count_problems(
    inv: Inventory, exp: Expected, states: list[links.Observed], strict: bool
) -> list[Problem]:
    """Pairs with fewer links than most pairs of their architecture, no complete source vouching."""
    if exp.vouched is None:
        return []
    counts = links.pair_counts([s.spec for s in states])
    arch = {c.asic_id: c.arch for c in inv.chips}
    by_arch: dict[str, Counter] = {}
    for pair, n in counts.items():
        by_arch.setdefault(arch.get(pair[0], "?"), Counter())[n] += 1
    norm = {a: max(c.items(), key=lambda kv: (kv[1], kv[0]))[0] for a, c in by_arch.items() if c}
    out = []
    for pair, n in sorted(counts.items()):
        want = norm.get(arch.get(pair[0], "?"), n)
        if n >= want or exp.vouched.get(frozenset(pair)) == n:
            continue  # as many as its peers, or as many as when the host was last healthy
        na, nb = sorted(chip_name(inv, x, exp.names) for x in pair)
        fix = reset_fix(inv, list(pair), exp.links) or "ttmesh reset"
        out.append(
            Problem(
                _escalate(WARNING, strict),
                f"{na} and {nb} have {plural(n, 'link')} between them; most chip pairs here have "
                f"{want}",
                f"check the cable between them, then {fix}",
                "link-count",
                tuple(pair),
            )
        )
    return out


# One builder per kind of problem, shared by ``check`` (the whole report) and ``preflight`` (the
# chips a launch is about to use), so both say the same thing with the same fix.

NODE_FIX = "reload the driver (sudo modprobe -r tenstorrent && sudo modprobe tenstorrent)"
HW_FIX = "install the hardware extra to read firmware telemetry: pip install 'ttmesh[hw]'"


def node_problem(inv: Inventory, chip: Chip, lead: Chip | None) -> Problem:
    """A chip the driver lists whose /dev/tenstorrent node is absent: in a container, most
    likely one a reset re-created on the host after the container started."""
    from ttmesh.fabric import (
        containercheck,  # (containers' signs: read only when a node is missing)
    )

    node = f"{inv.host.path('dev/tenstorrent')}/{lead.dev_index if lead else '?'}"
    box = containercheck.detect(inv)
    fix = (
        f"{NODE_FIX} or check /dev permissions"
        if box is None
        else containercheck.node_fix(inv, lead, box)
    )
    where = "" if box is None else " in this container"
    return Problem(
        ERROR,
        f"{chip_name(inv, chip.asic_id)} has no driver node{where} ({node} is missing)",
        fix,
        "driver-node",
        (chip.asic_id,),
    )


def heartbeat_problem(
    inv: Inventory, asic: str, state: str, exp: Expected, strict: bool
) -> Problem | None:
    """A frozen heartbeat is an error (a reset revives the firmware); an unreadable one a
    warning (an error with ``strict``)."""
    name = chip_name(inv, asic)
    if state == heartbeat.FROZEN:
        fix = reset_fix(inv, [asic], exp.links) or "ttmesh reset"
        return Problem(ERROR, f"{name}: heartbeat frozen (its firmware is not running)", fix,
                       "heartbeat", (asic,))  # fmt: skip
    if state == heartbeat.UNKNOWN:
        return Problem(_escalate(WARNING, strict), f"{name}: heartbeat cannot be read", HW_FIX,
                       "heartbeat-unknown", (asic,))  # fmt: skip
    return None


def holder_problem(inv: Inventory, asic: str, h: ChipProcess, lease: ChipProcess | None) -> Problem:
    name = chip_name(inv, asic)
    if h.job is not None:
        what = f"{name} is held by {h.who}, a worker of ttmesh job {h.job}, which does not lease it"
        fix = f"ttmesh stop {h.job} (see ttmesh ps)"
    elif lease is not None and lease.role == Role.LEASE:
        what = f"{name} is leased by job {lease.job} of user {lease.user} but held by {h.who} outside it"
        fix = kill_fix(h)
    else:
        what, fix = f"{name} is held by {h.who}", kill_fix(h)
    return Problem(ERROR, what, fix, "holder", (asic,))


def lease_problem(inv: Inventory, asic: str, info: ChipProcess) -> Problem:
    """A chip another job leases (or whose lease file a process that is no job holds)."""
    if info.role == Role.LEASE:
        return Problem(
            ERROR,
            f"{chip_name(inv, asic)} is leased by {info.holder}",
            "wait for that job to end (see ttmesh ls), or choose other chips",
            "lease",
            (asic,),
        )
    return lock_problem(inv, asic, info)


def lock_problem(inv: Inventory, asic: str, info: ChipProcess) -> Problem:
    """A process that is no ttmesh job holds a chip's lease file: no job can lease the chip."""
    fix = (
        f"kill {info.pid} ({info.user}: {info.cmd}): no ttmesh job can lease the chip meanwhile"
        if info.pid
        else "run ttmesh check as root to see the process that holds it"
    )
    return Problem(
        ERROR, f"{chip_name(inv, asic)}'s lease file is {info.holder}", fix, "lock", (asic,)
    )


WORLD_OPEN_NOTE = (
    "the chips' device nodes ({nodes}) are world-openable (mode {mode:04o}, as tt-kmd's udev "
    "rule makes them): any local user can open, and so hold, any chip; ttmesh's leases keep "
    "ttmesh jobs apart, not other programs"
)


def device_notes(inv: Inventory) -> list[str]:
    """What ``check`` says about the host beside its problems: device nodes every user can
    open (tt-kmd's udev rule gives them mode 0666)."""
    open_to_all = []
    mode = 0
    for c in inv.chips:
        if c.dev_index is None:
            continue
        try:
            st = os.stat(inv.host.dev_node(c.dev_index))
        except OSError:
            continue
        if st.st_mode & 0o006:
            open_to_all.append(c.dev_index)
            mode = stat.S_IMODE(st.st_mode)
    if not open_to_all:
        return []
    where = inv.host.path("dev/tenstorrent") if inv.host.simulated else Path("/dev/tenstorrent")
    return [WORLD_OPEN_NOTE.format(nodes=f"{where}/*", mode=mode)]


def missing_problem(inv: Inventory, asic: str, exp: Expected) -> Problem:
    name = chip_name(inv, asic, exp.names)
    return Problem(
        ERROR,
        f"chip {name} is in the topology but the host lost it",
        f"power-cycle the host: the driver lost {name}, and a reset cannot reach a device that is gone",
        "missing",
        (asic,),
    )


def check(
    inv: Inventory,
    chips: Iterable[str] | None = None,
    strict: bool = False,
    timeout: float = 1.0,
    *,
    known_good_dir: Path | bool | None = None,
    requires: Any = None,
) -> HealthReport:
    """Health of ``inv``'s host (or of ``chips``, asic ids, and the links touching them).

    On a real host (or with ``known_good_dir``) a full check that finds every chip present and
    every expected link up records the topology as known good.
    """
    exp = expected(inv, known_good_dir)
    selected = None if chips is None else set(chips)
    present = [c for c in inv.chips if selected is None or c.asic_id in selected]
    missing = [a for a in exp.missing if selected is None or a in selected]
    specs = [lk for lk in exp.links if selected is None or lk.a in selected or lk.b in selected]
    leased, owners = lease_owners(inv.host, [c.asic_id for c in inv.chips])
    jobs = lease_jobs(leased)
    beats = heartbeat.poll(inv, present, timeout=timeout) if present else {}
    problems: list[Problem] = []
    report_chips: list[ChipHealth] = []
    seen_holders: set[tuple[int, str]] = set()
    for c in present:
        holding = held_by(inv, c, owners, jobs)
        lease = leased.get(c.asic_id)
        ch, found = _present_chip(inv, c, exp, strict, beats, lease, holding, seen_holders)
        problems.extend(found)
        report_chips.append(ch)
    for asic in missing:
        report_chips.append(_missing_chip(asic, exp))
        problems.append(missing_problem(inv, asic, exp))
    states = links.observe(inv, specs)
    problems.extend(_link_problems(inv, states, exp, strict, _recorded(inv, states)))
    if not specs and inv.topology == "none" and exp.vouched is not None and not exp.links:
        problems.append(_no_topology_problem(inv, strict))
    sys_found, sys_notes, sys_read = syscheck.problems(inv, selected, requires or syscheck.DEFAULT)
    problems.extend(replace(p, severity=_escalate(p.severity, strict)) for p in sys_found)
    from ttmesh.fabric import (
        containercheck,  # (ttmesh check only: a launch's pre-flight has no use)
    )

    box_found, box_notes = containercheck.problems(inv, selected)
    problems.extend(replace(p, severity=_escalate(p.severity, strict)) for p in box_found)
    lock_found, lock_notes, locks = umdlocks.problems(inv, selected, _leasing_job(leased, owners))
    problems.extend(lock_found)
    _mark_locked(report_chips, lock_found)
    problems.sort(key=lambda p: p.severity != ERROR)
    report = HealthReport(
        report_chips,
        states,
        problems,
        inv.topology,
        notes=device_notes(inv) + sys_notes + box_notes + lock_notes,
        system=sys_read.to_json(),
        umd_locks=[lk.to_json() for lk in locks],
    )
    if exp.store is not None and selected is None and _all_good(inv, missing, states, problems):
        report.recorded = known_good.save(inv, exp.links, exp.store)
    return report


def _present_chip(
    inv: Inventory,
    c: Chip,
    exp: Expected,
    strict: bool,
    beats: dict[str, str],
    lease: ChipProcess | None,
    holding: list[ChipProcess] | None,
    seen_holders: set[tuple[int, str]],
) -> tuple[ChipHealth, list[Problem]]:
    """A chip the host lists: its health, and its problems (driver node, tt-umd lock lease,
    heartbeat, holders). ``seen_holders`` names each holder of a device once across chips."""
    lead = pci_lead(inv, c)
    node = bool(lead and lead.dev_index is not None and inv.host.dev_node(lead.dev_index).exists())
    ch = ChipHealth(
        c.asic_id,
        c.bdf,
        c.dev_index,
        c.board_type,
        True,
        node,
        beats.get(c.asic_id, heartbeat.UNKNOWN),
        holding,
        None if lease is None else lease.lease_json(),
    )
    name = chip_name(inv, c.asic_id)
    found = [] if node else [node_problem(inv, c, lead)]
    if lease is not None and lease.role == Role.LOCK:
        found.append(lock_problem(inv, c.asic_id, lease))
    beat = heartbeat_problem(inv, c.asic_id, ch.heartbeat, exp, strict)
    found += [beat] if beat is not None else []
    if holding is None:
        found.append(
            Problem(
                _escalate(WARNING, strict),
                f"{name}: cannot tell which processes hold it",
                "run ttmesh check as root (or use driver >= 2.5, which lists them in /proc/driver/tenstorrent)",
                "holders-unknown",
                (c.asic_id,),
            )
        )
    for h in holding or []:
        if lease is not None and h.job is not None and h.job == lease.job:
            continue  # a worker of the job that leases the chip
        ch.healthy = False
        key = (h.pid or -1, lead.asic_id if lead else c.asic_id)
        if key not in seen_holders:  # an n300's two chips share one device: name it once
            seen_holders.add(key)
            found.append(holder_problem(inv, c.asic_id, h, lease))
    ch.healthy = ch.healthy and all(p.severity != ERROR for p in found)
    return ch, found


def _missing_chip(asic: str, exp: Expected) -> ChipHealth:
    """A chip the topology expects and the host lost: not present, never healthy."""
    return ChipHealth(
        asic, exp.names.get(asic), None, None, False, False, heartbeat.UNKNOWN, None, None, False
    )


def _no_topology_problem(inv: Inventory, strict: bool) -> Problem:
    """No link was checked because nothing says which links the host has."""
    return Problem(
        _escalate(WARNING, strict),
        "Ethernet links not checked: no topology for this host ("
        + "; ".join(inv.notes or ["no discovery"])
        + ")",
        "install the hardware extra for tt-umd's discovery: pip install 'ttmesh[hw]'",
        "no-topology",
    )


def _leasing_job(
    leased: dict[str, ChipProcess], owners: dict[int, str]
) -> Callable[[int, list[str]], bool]:
    """tt-umd's lock holders a check lets be: a worker of the job that leases all their chips."""

    def leasing_job(pid: int, asics: list[str]) -> bool:
        owner = procs.owning(pid, owners)
        job = owners.get(owner) if owner else None
        return job is not None and all(
            (lease := leased.get(a)) is not None and lease.job == job for a in asics
        )

    return leasing_job


def _mark_locked(report_chips: list[ChipHealth], lock_found: list[Problem]) -> None:
    """A chip whose tt-umd lock a stranger holds is not healthy."""
    for p in lock_found:
        for ch in report_chips:
            if ch.asic_id in p.chips:
                ch.healthy = False


def _all_good(
    inv: Inventory, missing: list[str], states: list[links.Observed], problems: list[Problem]
) -> bool:
    """Every chip present and every expected link up, at the count its peers have: a topology
    worth recording as known good."""
    return (
        not missing
        and bool(inv.chips)
        and all(s.state == links.UP for s in states)
        and not any(p.kind == "link-count" for p in problems)
    )


def links_down(inv: Inventory) -> list[Problem]:
    """Pre-flight's "links down" errors between every two chips the host has, read once from
    the chips' link telemetry (what choosing chips avoids: pre-flight refuses a job holding
    both chips of such a pair). A link to a chip the host lost is the lost chip's problem."""
    present = {c.asic_id for c in inv.chips}
    exp = expected(inv)
    specs = [lk for lk in exp.links if lk.a in present and lk.b in present and lk.a != lk.b]
    if not specs:
        return []
    states = links.observe(inv, specs)
    return [p for p in _link_problems(inv, states, exp, strict=False) if p.kind == "link-down"]


# --------------------------------------------------------------------------- preflight


# Pre-flight problems a reset can fix (--auto-reset): not holders, leases or lost chips.
RESETTABLE = ("link-down", "heartbeat")


def preflight(
    inv: Inventory,
    asics: Sequence[str],
    allow_holders_pids: Iterable[int] = (),
    *,
    timeout: float = 1.0,
    beats: Mapping[str, str] | None = None,
    heartbeats: bool = True,
    requires: Any = None,
    system: bool = True,
) -> list[Problem]:
    """What stands between ``asics`` and a launch on them; errors mean "refuse".

    Reads sysfs and telemetry only (no tt-smi); polls heartbeats of ``asics`` only, and checks
    only the links between them. A holder or lease is allowed when its PID, or an ancestor of
    it, is in ``allow_holders_pids`` or is this process (the launcher's own workers and leases).
    Takes a few tens of milliseconds on a simulated host with 100 Hz heartbeats. ``beats``:
    heartbeat states just polled by the caller; chips already seen alive are not polled again.
    ``heartbeats`` False: chips without a state in ``beats`` are not polled at all (the caller
    watches them while the job starts: :class:`ttmesh.fabric.heartbeat.Watch`).
    ``system``: also the system software's problems (:mod:`ttmesh.fabric.syscheck`, against
    ``requires``, a profile's; None: the defaults); False after a crash, where only what a
    reset can fix is asked.
    """
    allowed = {int(p) for p in allow_holders_pids} | {os.getpid()}
    wanted = list(dict.fromkeys(asics))
    exp = expected(inv)
    by_asic = {c.asic_id: c for c in inv.chips}
    chips = [by_asic[a] for a in wanted if a in by_asic]
    problems = [missing_problem(inv, a, exp) for a in wanted if a not in by_asic]
    for asic, info in leases.probe(inv.host, [c.asic_id for c in chips]).items():
        ours = info.role == Role.LEASE and any(
            procs.owning(pid, allowed) is not None for pid in {info.pid, *info.related} if pid
        )
        if not ours:
            problems.append(lease_problem(inv, asic, info))
    seen: set[tuple[int, str]] = set()
    for c in chips:
        lead = pci_lead(inv, c)
        if lead is None or lead.dev_index is None or not inv.host.dev_node(lead.dev_index).exists():
            problems.append(node_problem(inv, c, lead))
            continue
        for h in holders.holders(inv, c) or []:
            pid = h.pid or -1
            if procs.owning(pid, allowed) is None and (pid, lead.asic_id) not in seen:
                seen.add((pid, lead.asic_id))
                problems.append(holder_problem(inv, c.asic_id, h, None))
    known = dict(beats or {})
    todo = [c for c in chips if known.get(c.asic_id) != heartbeat.ALIVE and heartbeats]
    known.update(heartbeat.poll(inv, todo, timeout=timeout) if todo else {})
    for c in chips:
        beat = heartbeat_problem(inv, c.asic_id, known.get(c.asic_id, heartbeat.ALIVE), exp, False)
        problems += [beat] if beat is not None else []
    inside = set(wanted)
    specs = [lk for lk in exp.links if lk.a in inside and lk.b in inside]
    if specs:
        states = [s for s in links.observe(inv, specs)]
        for p in _link_problems(inv, states, exp, strict=False, recorded=_recorded(inv, states)):
            if p.kind in ("link-down", "link-unknown"):
                problems.append(p)

    def job_own(pid: int, _asics: list[str]) -> bool:
        return procs.owning(pid, allowed) is not None

    problems.extend(umdlocks.problems(inv, wanted, job_own)[0])
    if system:
        problems.extend(syscheck.problems(inv, wanted, requires or syscheck.DEFAULT)[0])
    problems.sort(key=lambda p: p.severity != ERROR)
    return problems
