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
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ttmesh import paths
from ttmesh.errors import TTMeshError, bad_input, refused
from ttmesh.fabric import heartbeat
from ttmesh.fabric.devices import Chip, Inventory, discover
from ttmesh.host.base import Host
from ttmesh.host.boards import BDF_RE
from ttmesh.host.clusterdesc import ClusterDescriptor
from ttmesh.launcher.plan import LaunchPlan, LaunchRequest, build, resolve_command
from ttmesh.launcher.supervisor import AttemptResult, Options, run_attempt
from ttmesh.mesh import memory
from ttmesh.mesh import select as meshselect
from ttmesh.render import note
from ttmesh.runtime import jobs, leases
from ttmesh.vocab import MPI_LAYOUTS, Layout, Source, StartMode

if TYPE_CHECKING:
    from ttmesh.launcher.failures import Diagnosis


@dataclass
class Prepared:
    plan: LaunchPlan
    inv: Inventory
    selection: meshselect.Selection


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
        if not BDF_RE.match(item):
            raise bad_input(
                f"{flag} {item!r}: not a PCI address", "write it as DDDD:BB:DD.F, e.g. 0000:01:00.0"
            )
        if item not in by_bdf:
            raise bad_input(
                f"{flag} {item}: no such chip on this host",
                "chips here: " + ", ".join(sorted(by_bdf)),
            )
        chip = by_bdf[item]
        out.extend(inv.board_peers(chip) if chip.bdf else [chip])
    return out


def free_port(addr: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def check_port(port: int, addr: str = "127.0.0.1") -> None:
    if not 0 < port < 65536:
        raise bad_input(f"--master-port {port}: not a TCP port", "use 1..65535, or omit it")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((addr, port))
        except OSError:
            raise bad_input(
                f"--master-port {port} is already in use on {addr}",
                "pick another port, or omit --master-port to get a free one",
            )


def unavailable_chips(
    inv: Inventory, repairable: bool = False
) -> tuple[dict[str, str], dict[str, str]]:
    """(asic -> why it can't be used, asic -> who has it) for dead, held and leased chips.

    ``repairable``: dead chips stay usable (``--auto-reset`` recovers them before the start)."""
    from ttmesh.fabric import holders as holdermod

    why: dict[str, str] = {}
    who: dict[str, str] = {}
    for asic, info in leases.probe(inv.host, [c.asic_id for c in inv.chips]).items():
        why[asic] = "leased"
        who[asic] = f"job {info.job or '?'} (pid {info.pid}: {info.cmd or '?'})"
    for chip in inv.chips:
        if chip.asic_id in why:
            continue
        hs = holdermod.holders(inv, chip)
        if hs:
            why[chip.asic_id] = "held"
            h = hs[0]
            who[chip.asic_id] = f"pid {h.pid} ({h.user}: {h.cmd})"
    beats = heartbeat.poll(inv, [c for c in inv.chips if c.asic_id not in why])
    inv.beats = beats  # seen alive now: pre-flight need not poll these again
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
    return "wait for them, or see ttmesh ls and ttmesh ps"


def prepare(
    req: LaunchRequest,
    host: Host,
    chips_arg: str | None = None,
    exclude_arg: str | None = None,
    allow_mpi_layouts: bool = False,
    descriptor_only: bool = False,
    repairable: bool = False,
) -> Prepared:
    """Everything before a launch, changing nothing. ``descriptor_only``: plan the mesh and its
    descriptors without a command, a port or availability checks (``ttmesh descriptor``).
    ``repairable``: chips a reset can recover are chosen too (``--auto-reset`` resets them)."""
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
                f"--tp-size {req.tp_size} but {req.binding.path} gives its ranks {n} chips",
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
    if req.tp_size is None:
        if chosen:
            req.tp_size = len(chosen)
        elif req.nproc and req.layout == Layout.ISOLATED:
            req.tp_size = req.nproc * max(len(u.chips) for u in meshselect.units_of(inv))
        elif req.nproc or req.profile is not None:  # the host's whole mesh
            req.tp_size = len(inv.chips)
        else:
            req.tp_size = 0
    if req.tp_size <= 0:
        raise bad_input(
            f"--tp-size {req.tp_size}: must be a positive number of chips", "e.g. --tp-size 4"
        )
    if chosen and len(chosen) != req.tp_size:
        raise bad_input(
            f"--chips names {len(chosen)} chip(s) but --tp-size is {req.tp_size}",
            "give as many chips as --tp-size, or drop --tp-size",
        )
    if req.mesh_shape and req.mesh_shape[0] * req.mesh_shape[1] != req.tp_size:
        rows, cols = req.mesh_shape
        raise bad_input(
            f"--mesh-shape {rows}x{cols} has {rows * cols} chips but --tp-size is {req.tp_size}",
            "make ROWS x COLS equal the chip count",
        )
    why, who = ({}, {}) if descriptor_only else unavailable_chips(inv, repairable)
    for c in excluded:
        why.setdefault(c.asic_id, "excluded")
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
            sel = meshselect.as_given(inv, [c.asic_id for c in chosen])
        elif gap:
            raise bad_input(f"--chips are not connected: {gap}", "choose chips linked by Ethernet")
        else:
            sel = meshselect.select(
                inv, req.tp_size, shape=req.mesh_shape, chips=[c.asic_id for c in chosen]
            )
    else:
        try:
            sel = meshselect.select(inv, req.tp_size, shape=req.mesh_shape, unavailable=why)
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
                    f" (and {len(blocked) - 1} more chip(s) unavailable)"
                    if len(blocked) > 1
                    else ""
                ),
                _unavailable_hint(inv, blocked),
            )
    req.symmetric_dram_mb = memory.plan(
        req.symmetric_dram_mb, [inv.chip(a).dram_mb for a in sel.chips]
    )
    if req.profile is not None:
        req.serving = _serving(req, inv, sel)
    if descriptor_only:
        argv: list[str] = []
    else:
        argv = resolve_command(req)
        if req.master_port:
            check_port(req.master_port, req.master_addr)
        else:
            req.master_port = free_port(req.master_addr)
    if not req.job:
        req.job = jobs.new_job_id()
    paths.safe_name(req.job, "--job-id")
    if not req.run_dir:
        req.run_dir = str(jobs.runs_dir() / req.job)
    if not req.cwd:
        req.cwd = os.getcwd()
    cluster = None if descriptor_only else host.mock_cluster()
    if cluster is not None:
        req.mocks = mock_clusters(cluster, sel, req)
    plan = build(req, inv, sel, argv)
    return Prepared(plan, inv, sel)


def _serving(req: LaunchRequest, inv: Inventory, sel: meshselect.Selection) -> Any:
    """The server's spec for the chips chosen; its rules' errors refuse the launch (exit 2)."""
    from ttmesh.launcher.serving import spec

    serving = spec.build(
        req.profile,
        req.server_args,
        tp=len(sel.chips),
        environ=req.environ,
        user_env=dict(req.env),
        symmetric_mb=req.symmetric_dram_mb,
        chip_mb=min(inv.chip(a).dram_mb for a in sel.chips),
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

    if req.binding is not None:
        return {
            i: mock.chips_view(
                cluster, [a for u in units for a in u.chips], f"ttmesh job {req.job}, rank {i}"
            )
            for i, units in enumerate(req.binding_units)
        }
    if req.layout == Layout.SINGLE_PROCESS:
        return {0: mock.whole_view(cluster, f"ttmesh job {req.job}")}
    sp = layout.split(sel, req.layout, req.nproc)
    return {
        b.rank: mock.chips_view(cluster, list(b.chips), f"ttmesh job {req.job}, rank {b.rank}")
        for b in sp.blocks
    }


def write_files(plan: LaunchPlan) -> None:
    """The plan's files, inside its run directory (which ``execute`` created) and nowhere else."""
    run_dir = Path(plan.run_dir).resolve()
    for sub in ("mesh", "errors", "ready", "fabric", "mock", "mpi"):
        (run_dir / sub).mkdir(exist_ok=True, mode=0o700)
    for path, text in plan.files.items():
        target = Path(path).resolve()
        if not target.is_relative_to(run_dir):
            raise bad_input(f"refusing to write {path}: outside the run directory {run_dir}")
        target.write_text(text)


def _clear_attempt_files(plan: LaunchPlan) -> None:
    for sub in ("errors", "ready", "fabric"):
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


def _preflight(prepared: Prepared, recovery: Recovery) -> None:
    """Refuse (exit 3) to start on chips that are unhealthy, unless --auto-reset fixes them."""
    from ttmesh.errors import refused as refuse
    from ttmesh.fabric import health

    plan = prepared.plan
    inv = prepared.inv
    problems = [
        p
        for p in health.preflight(inv, plan.all_chips(), recovery.own_pids, beats=inv.beats)
        if p.severity == "error"
    ]
    if problems and recovery.auto_reset and all(p.kind != "lease" for p in problems):
        note(f"pre-flight: {problems[0].what}; resetting the chips first (--auto-reset)")
        outcome = _reset(prepared, recovery, plan.all_chips())
        if outcome is not None and outcome.recovered:
            fresh = discover(inv.host)
            prepared.inv = fresh
            problems = [
                p
                for p in health.preflight(fresh, plan.all_chips(), recovery.own_pids)
                if p.severity == "error"
            ]
    if problems:
        for p in problems[1:]:
            note(f"pre-flight: {p.what}" + (f" (fix: {p.fix})" if p.fix else ""))
        first = problems[0]
        fix = first.fix or "see ttmesh check"
        if first.kind in RESETTABLE and not recovery.auto_reset:
            fix += ", or add --auto-reset to recover the chips first"
        raise refuse(f"pre-flight: {first.what}", fix)


# Pre-flight problems a reset can fix (--auto-reset): not holders, leases or lost chips.
RESETTABLE = ("link-down", "heartbeat")


def _reset(prepared: Prepared, recovery: Recovery, asics: list[str]):
    from ttmesh.errors import TTMeshError
    from ttmesh.recovery import reset

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


def _after_crash(
    prepared: Prepared, recovery: Recovery, result: AttemptResult, always: bool = False
) -> None:
    """A job that brought the fabric up and ended abnormally may have left links down.

    ``always``: check the chips whatever the plan says (ttmesh itself was killed mid-job, so
    nobody knows which ranks brought the fabric up)."""
    plan = prepared.plan
    if result.code == 0 or plan.hosts:  # over several hosts: each host recovers its own chips
        return
    joined = plan.fabric_at_start or result.fabric_ranks or recovery.reset_on_failure
    if not (joined or always):
        return
    from ttmesh.fabric import health

    inv = discover(prepared.inv.host)
    prepared.inv = inv
    down = [
        p
        for p in health.preflight(inv, plan.all_chips(), recovery.own_pids)
        if p.severity == "error"
    ]
    if not down and not recovery.reset_on_failure:
        return
    why = down[0].what if down else "--reset-on-failure"
    note(f"the job ended ({why}): resetting its chips")
    _reset(prepared, recovery, plan.all_chips())


LAUNCHER_KILLED = "launcher killed"
SUPERVISOR_KILLED = "supervisor killed"


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
        self.results: list[AttemptResult] = []
        self.held: leases.LeaseSet | None = None
        self.run_dir: paths.RunDir | None = None

    def run(self) -> int:
        plan = self.plan
        if plan.hosts:
            # A mesh over several hosts: each host's duties (leases, pre-flight) run on that
            # host, in the rank's own ttmesh (``ttmesh _rank``), never through this one.
            self.recovery.preflight = False
        else:
            self.prepared.inv.host.check_changeable()
            self.held = leases.acquire(
                self.prepared.inv.host,
                plan.all_chips(),
                plan.job,
                cmd=" ".join(plan.ranks[0].argv),
                symmetric_dram_mb=plan.symmetric_dram_mb,
                labels={c.asic_id: c.label for c in self.prepared.inv.chips},
            )
        try:
            self.run_dir = jobs.create_run_dir(plan.job)
            if str(self.run_dir.path) != plan.run_dir:
                raise bad_input(
                    f"the plan's run directory {plan.run_dir} is not {self.run_dir.path}"
                )
        except BaseException:
            self._release()
            raise
        status, ok = None, False
        try:
            self._record()
            if self.recovery.preflight or self.peers is not None:
                try:
                    if self.recovery.preflight:
                        self._agree("start", lambda: _preflight(self.prepared, self.recovery))
                    else:
                        self._agree("start", lambda: None)
                except TTMeshError as exc:
                    status = f"refused: {exc}"
                    if self.summary_json:
                        write_refusal(self.summary_json, exc)
                    raise
            write_files(plan)
            self._attempts()
            ok = True
        finally:
            if not ok:
                self._release(status or "ttmesh failed before the job ended", None)
        return self.finish()

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
            result = run_attempt(
                plan, attempt, self.options, base_env, self._orphaned, self.prepared.inv.host,
                on_start=self.peers.started if self.peers is not None else None,
            )  # fmt: skip
            if self.peers is not None:
                result = self.peers.ended(attempt, result)
            self.results.append(result)
            if result.code == 0:
                break
            # A server's processes may have held the chips to the end (SGLang SIGKILLs its
            # schedulers, which never close the chips): check them whatever the layout.
            always = result.supervisor_lost or plan.serving is not None
            _after_crash(self.prepared, recovery, result, always=always)
            if result.interrupted or result.supervisor_lost:
                break
            if attempt < plan.max_restarts:
                wait = min(self.restart_backoff * (2**attempt), 10.0)
                note(
                    f"attempt {attempt + 1} of {plan.max_restarts + 1} failed ({result.reason}); "
                    f"restarting every rank in {wait:.1f} s"
                )
                time.sleep(wait)
                again = Recovery(**{**recovery.__dict__, "auto_reset": True})
                try:
                    self._agree(
                        f"restart{attempt + 1}",
                        functools.partial(_preflight, self.prepared, again)
                        if recovery.preflight
                        else (lambda: None),
                    )
                except TTMeshError as exc:
                    note(f"not restarting: {exc}")
                    break

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
        note("the launcher was killed: its guardian stopped the workers and finishes the job")
        with contextlib.suppress(Exception):
            _after_crash(self.prepared, self.recovery, result, always=True)
        return self.finish(LAUNCHER_KILLED)

    def _release(self, status: str | None = None, code: int | None = None) -> None:
        if status is not None:
            with contextlib.suppress(OSError, TTMeshError):
                jobs.close(self.plan.job, status, code)
        if self.held is not None:
            self.held.release()
        if self.run_dir is not None:
            self.run_dir.remove()

    def finish(self, status: str | None = None) -> int:
        final = self.results[-1]
        if self.peers is not None:
            self.peers.close(len(self.results) - 1)
        if status is None:
            status = SUPERVISOR_KILLED if final.supervisor_lost else final.reason
        self._release(status, final.code)
        diagnosis = _explain(self.prepared, final)
        _summarize(self.prepared, self.results, diagnosis)
        if self.summary_json:
            with contextlib.suppress(OSError):
                _write_summary(self.summary_json, final, self.results, diagnosis)
        return final.code


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
    prepared: Prepared, results: list[AttemptResult], diagnosis: Diagnosis | None = None
) -> None:
    final = results[-1]
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
        note(
            f"rank {shown} ({', '.join(rank.bdfs)}) {how}"
            + (f"; stopped {len(others)} other rank(s)" if others else "")
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
    with contextlib.suppress(OSError):
        Path(path).write_text(json.dumps(data, indent=2) + "\n")


def _write_summary(
    path: str,
    final: AttemptResult,
    results: list[AttemptResult],
    diagnosis: Diagnosis | None = None,
) -> None:
    data = {
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
    Path(path).write_text(json.dumps(data, indent=2) + "\n")
