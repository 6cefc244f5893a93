"""One job over several hosts: this host's agent, its place in the global plan, and the rules
every host follows together (start together, stop together, restart together).

Each host runs ``ttmesh launch --nnodes N --node-rank R --rdzv-endpoint HOST:PORT ...`` (by
hand, under Slurm, or started by ``ttmesh launch --hosts`` through mpirun). The agent plans its
own chips exactly as a single-host launch does, joins the others (:mod:`.rendezvous`), then:

* its ranks take their global place: node-major global ranks, ``WORLD_SIZE`` of the whole job,
  ``GROUP_RANK`` = the node rank, ``MASTER_ADDR``/``MASTER_PORT`` on node 0;
* every host's pre-flight (and ``--auto-reset``) runs on that host; the job starts only when
  every host is ready, else every host exits 3 naming the host that is not;
* the first rank to fail anywhere stops every host; each exits with that rank's code and the
  summary names its host; a host that stops answering stops the others within
  ``--heartbeat-timeout``;
* ``--max-restarts``: the hosts restart together, once every one has recovered its chips.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
from typing import Any

from ttmesh.dataclass import dataclass
from ttmesh.errors import TTMeshError, bad_input, refused
from ttmesh.launcher.attempt.record import AttemptResult
from ttmesh.launcher.nodes.rendezvous import Coordinator, Endpoint, Node
from ttmesh.launcher.planning import rankenv
from ttmesh.launcher.planning.plan import LaunchPlan
from ttmesh.launcher.planning.rankenv import TpuSlice
from ttmesh.render import note
from ttmesh.states import AttemptEnd
from ttmesh.vocab import Source


@dataclass
class MultiHost:
    """How this agent joins the job (torchrun's flags, or Slurm's environment)."""

    nnodes: int
    node_rank: int
    endpoint: Endpoint
    token: str
    local_addr: str | None = None
    join_timeout: float = 300.0
    heartbeat_timeout: float = 5.0
    tp_size: int = 0  # the job's --tp-size as this host was given it (0: not given)


def route_addr(endpoint: Endpoint) -> str:
    """The address of this host that reaches ``endpoint`` (what its ranks are reached at)."""
    try:
        family = socket.getaddrinfo(endpoint.host, endpoint.port)[0][0]
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((endpoint.host, endpoint.port))
            return str(s.getsockname()[0])
    except OSError:
        return endpoint.host


class Peers:
    """The other hosts, as the job's attempts see them."""

    def __init__(self, mh: MultiHost, job: str) -> None:
        self.mh = mh
        addr = mh.local_addr or (mh.endpoint.host if mh.node_rank == 0 else route_addr(mh.endpoint))
        self.addr = addr
        self.coord = Coordinator(
            mh.endpoint, job, mh.nnodes, mh.node_rank, mh.token,
            timeout=mh.join_timeout, heartbeat_timeout=mh.heartbeat_timeout,
            local_addr=addr,
        )  # fmt: skip
        self.guardian: int | None = None
        self.stopped_for_peer = False
        self.offset = 0  # this host's first global rank

    # -- the global plan

    def join(self, plan: LaunchPlan) -> LaunchPlan:
        """Meet the other hosts; this host's plan with its ranks in their global places."""
        me = Node(
            node=self.mh.node_rank,
            hostname=socket.gethostname(),
            addr=self.addr,
            nproc=len(plan.ranks),
            chips=[",".join(r.bdfs) for r in plan.ranks],
            root=plan.root,
            pid=os.getpid(),
            tp_size=self.mh.tp_size,
        )
        self.coord.join(me)
        problem = tp_problem(self.coord.nodes, self.mh.node_rank)
        if problem is not None:
            self._refuse_together(problem)
        if self.mh.node_rank == 0:
            self.coord.publish("master", {"addr": self.addr, "port": _free_port(self.addr)})
        master = self.coord.wait_for(["master"], "node 0's master address")["master"]
        self.offset = sum(n.nproc for k, n in self.coord.nodes.items() if k < self.mh.node_rank)
        return global_plan(
            plan, self.coord.nodes, self.mh.node_rank, master["addr"], master["port"],
            self._torch_tpu(plan),
        )  # fmt: skip

    def _torch_tpu(self, plan: LaunchPlan) -> TpuSlice | None:
        """A torch-tpu job's slice over every host: each host publishes the ports it chose
        (and holds) for its processes and its handshake port; all read every host's."""
        program = plan.program
        if program is None or program.tpu is None:
            return None
        me = self.mh.node_rank
        ports = [int(a.rsplit(":", 1)[1]) for a in program.tpu.addresses]
        self.coord.publish(
            f"torch-tpu/{me}", {"ports": ports, "handshake": program.tpu.handshake_port}
        )
        keys = [f"torch-tpu/{n}" for n in range(self.mh.nnodes)]
        parts = self.coord.wait_for(keys, "every host's torch_tpu ports")
        hosts = [
            (
                self.coord.nodes[n].addr,
                [int(p) for p in parts[k]["ports"]],
                int(parts[k]["handshake"]),
            )
            for n, k in enumerate(keys)
        ]
        return rankenv.slice_over_hosts(program.tpu, hosts)

    def _refuse_together(self, exc: TTMeshError) -> None:
        """Every host found ``exc`` in the records they all read: each says so; node 0, whose
        store the others read from, first waits (a heartbeat timeout at most) until each other
        host has read what it needs, so none is left with a store gone instead of the reason."""
        me = self.mh.node_rank
        try:
            if me == 0:
                others = [f"refusing/{n}" for n in range(1, self.mh.nnodes)]
                self.coord.wait_for(others, "the other hosts", self.mh.heartbeat_timeout)
            else:
                self.coord.publish(f"refusing/{me}", {"problem": str(exc)})
        except (TTMeshError, RuntimeError, OSError, TimeoutError):
            pass  # the refusal is this host's all the same
        raise exc

    def agree(self, name: str, problem: str | None) -> None:
        """Every host says whether it can go on; one that can't stops them all (exit 3)."""
        verdicts = self.coord.barrier(name, {"problem": problem}, self.mh.join_timeout)
        for n in sorted(verdicts):
            said = verdicts[n]["problem"]
            if said and n != self.mh.node_rank:
                host = self.coord.nodes[n].hostname
                raise refused(
                    f"host {host} (node {n}) is not ready: {said}",
                    "fix it there; nothing started anywhere",
                )

    # -- recovery after a failed attempt, every host together

    def recover(
        self,
        name: str,
        host: Any,
        chips: list[str],
        *,
        always: bool,
        timeout: float,
        retries: int,
        tt_smi: str | None,
        train_timeout: float | None,
        own_pids: tuple[int, ...] = (),
    ) -> str | None:
        """This host's part in recovering the job's chips with every other host, through the
        store (``name``: this recovery's, unique in the job): each host checks its chips and
        reads its cable ends, all publish; each takes the same decision from the same records
        (``recovery.together``), resets its chips at the agreed moment, waits for its cables to
        train, and publishes every end; each then judges every cable from both its ends. The
        first problem anywhere (every host finds the same), else None: no host restarts alone."""
        from dataclasses import asdict

        from ttmesh.launcher.nodes import hostrecovery
        from ttmesh.recovery import afterjob, together

        mine = afterjob.check_host(host, chips, peers=None, always=always,
                                   train_timeout=train_timeout)  # fmt: skip
        wait = self.mh.heartbeat_timeout + 30.0  # every host checks at once, in seconds
        try:
            said = self.coord.barrier(f"{name}/check", asdict(mine), wait)
        except TTMeshError as exc:
            return str(exc)
        labels = self._labels()
        try:  # signed with the job's token, but maybe another ttmesh version's
            checks = {labels[n]: afterjob.HostCheck(**said[n]) for n in sorted(said)}
            every = {a for c in checks.values() for a in c.chips}
            for c in checks.values():  # the cables between the job's chips, all now known
                c.ends = [e for e in c.ends if e["peer"] in every]
            decision = together.decide(checks, always=always)
        except (TypeError, ValueError, KeyError) as exc:
            return f"a host's check could not be read ({exc}): run the same ttmesh on every host"
        if not decision.needed:
            return None
        at = max(c.clock for c in checks.values()) + hostrecovery.LEAD_MIN
        train = max(c.train_timeout for c in checks.values())
        me = labels[self.mh.node_rank]
        note(f"resetting together with the other hosts ({decision.why.get(me, 'verifying')})")
        outcome = afterjob.reset_together(
            host, sorted(every), decision.resets[me], at=at, train_timeout=train,
            timeout=timeout, retries=retries, tt_smi=tt_smi,
            log=lambda m: note(f"reset: {m}"), own_pids=own_pids,
        )  # fmt: skip
        budget = timeout * (retries + 1) + train + wait
        try:
            after = self.coord.barrier(f"{name}/verify", asdict(outcome), budget)
        except TTMeshError as exc:
            return str(exc)
        try:
            outcomes = {labels[n]: (afterjob.HostRecovery(**after[n]), "") for n in sorted(after)}
            return hostrecovery.verified(outcomes, decision, note, own=me)
        except (TypeError, ValueError, KeyError) as exc:
            return f"a host's reset could not be read ({exc}): run the same ttmesh on every host"

    def _labels(self) -> dict[int, str]:
        """How to name each node's host: its hostname (with its node rank when two agents
        share a machine)."""
        names = {n: node.hostname for n, node in self.coord.nodes.items()}
        shared = {h for h in names.values() if list(names.values()).count(h) > 1}
        return {n: f"{h} (node {n})" if h in shared else h for n, h in names.items()}

    # -- during an attempt

    def watch(self, attempt: int) -> None:
        self.stopped_for_peer = False
        self.guardian = None
        self.coord.watch(attempt, self._peer_failed)

    def started(self, guardian: int) -> None:
        self.guardian = guardian
        if self.coord.peer_end is not None or self.coord.lost is not None:
            self._peer_failed()

    def _peer_failed(self) -> None:
        """Another host's rank failed, or a host is gone: stop this host's ranks (gracefully)."""
        if self.guardian is not None and not self.stopped_for_peer:
            self.stopped_for_peer = True
            why = self.coord.lost or _said(self.coord.peer_end)
            note(f"stopping this host's ranks: {why}")
            from ttmesh.launcher.attempt.signals import PEER_STOP

            try:
                os.kill(self.guardian, PEER_STOP)
            except ProcessLookupError:
                pass

    def ended(self, attempt: int, result: AttemptResult) -> AttemptResult:
        """Tell the others how this host's attempt ended; the job's verdict for the attempt."""
        self.coord.watch(attempt, None)
        self.guardian = None
        if self.coord.lost is not None and result.code != 0 and self.stopped_for_peer:
            return dataclasses.replace(result, code=1, source=Source.TTMESH, rank=None,
                                       reason=self.coord.lost, end=AttemptEnd.FAILED)  # fmt: skip
        rank = None if result.rank is None else self.offset + result.rank
        how = next((e.how for e in result.exits if e.rank == result.rank), None)
        mine = {
            "interrupted": result.end.interrupted and not self.stopped_for_peer,
            "code": result.code,
            "rank": rank,
            "host": socket.gethostname(),
            "reason": f"rank {rank} {how}" if rank is not None and how else result.reason,
            "stopped": self.stopped_for_peer,
        }
        if self.stopped_for_peer:
            mine["code"] = 0 if result.code == 128 + signal.SIGTERM else result.code
        try:
            first = self.coord.report_end(attempt, mine)
        except (RuntimeError, OSError, TimeoutError) as exc:
            return dataclasses.replace(
                result,
                code=result.code or 1,
                reason=f"{result.reason}; the rendezvous store is gone ({exc})",
                end=AttemptEnd.FAILED if result.end is AttemptEnd.COMPLETED else result.end,
            )
        own = first.get("node", self.mh.node_rank) == self.mh.node_rank
        if own or not first.get("code") or first.get("interrupted") or mine["interrupted"]:
            return result  # ours, a success, or a user's stop (each host says its own)
        host = first.get("host", "?")
        return dataclasses.replace(
            result,
            code=int(first["code"]),
            source=Source.WORKER if first.get("rank") is not None else Source.TTMESH,
            rank=first.get("rank"),
            reason=f"{_said(first)}",
            end=AttemptEnd.FAILED,
            host=host,
        )

    def close(self, attempt: int) -> None:
        if self.mh.node_rank == 0:  # the store's host stays until every host has ended
            self.coord.wait_ends(attempt, self.mh.heartbeat_timeout + 30)
        else:
            self.coord.leave(attempt)
        self.coord.close()


def tp_problem(nodes: dict[int, Node], me: int) -> TTMeshError | None:
    """Every host must be given the job's --tp-size (the chips over every host): a host told
    another takes another share. Each host reads every record, so each finds this alike."""

    def given(tp: int) -> str:
        return f"--tp-size {tp}" if tp else "no --tp-size"

    mine = nodes[me].tp_size
    for n, node in sorted(nodes.items()):
        if node.tp_size != mine:
            return bad_input(
                f"the hosts were given different --tp-size: {given(mine)} here (node {me}), "
                f"{given(node.tp_size)} on {node.hostname} (node {n})",
                "give every host the same --tp-size: the job's chips over every host",
            )
    return None


def _said(end: dict[str, Any] | None) -> str:
    if not end:
        return "a rank on another host failed"
    rank = end.get("rank")
    who = f"rank {rank}" if rank is not None else "the job"
    reason = str(end.get("reason", ""))
    how = reason.split(f"rank {rank} ", 1)[-1] if rank is not None else reason
    return f"{who} on host {end.get('host', '?')} {how}".strip()


def _free_port(addr: str) -> int:
    try:
        family = socket.getaddrinfo(addr, 0)[0][0]
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.bind((addr, 0))
            return int(s.getsockname()[1])
    except OSError as exc:
        raise bad_input(
            f"cannot pick a master port on {addr}: {exc.strerror or exc}", "give --local-addr"
        )


def global_plan(
    plan: LaunchPlan,
    nodes: dict[int, Node],
    node_rank: int,
    master_addr: str,
    master_port: int,
    tpu: TpuSlice | None = None,
) -> LaunchPlan:
    """``plan`` (this host's ranks 0..n-1) with every rank in its global, node-major place (a
    torch-tpu job's: ``tpu``, its slice over every host)."""
    offset = sum(nodes[n].nproc for n in nodes if n < node_rank)
    world = sum(n.nproc for n in nodes.values())
    ranks = []
    for r in plan.ranks:
        env = dict(r.env)
        if "RANK" in env:  # the torchrun contract (a server runs its own processes)
            global_rank = offset + r.rank
            env.update(
                RANK=str(global_rank),
                WORLD_SIZE=str(world),
                GROUP_RANK=str(node_rank),
                GROUP_WORLD_SIZE=str(len(nodes)),
                ROLE_RANK=str(global_rank),
                ROLE_WORLD_SIZE=str(world),
                MASTER_ADDR=master_addr,
                MASTER_PORT=str(master_port),
            )
        env["TTMESH_NODE_RANK"] = str(node_rank)
        env["TTMESH_NNODES"] = str(len(nodes))
        if tpu is not None:
            env.update(rankenv.torch_tpu_env(tpu, len(plan.ranks), node_rank))
        ranks.append(dataclasses.replace(r, env=env))
    program = plan.program
    if tpu is not None and program is not None:
        program = dataclasses.replace(program, tpu=tpu)
    return dataclasses.replace(
        plan, ranks=ranks, master_addr=master_addr, master_port=master_port, rank_offset=offset,
        program=program,
    )  # fmt: skip


def check(mh: MultiHost) -> None:
    if mh.nnodes < 2:
        raise bad_input(
            f"--nnodes {mh.nnodes}: a multi-host job has 2 or more", "drop --nnodes for one host"
        )
    if not 0 <= mh.node_rank < mh.nnodes:
        raise bad_input(
            f"--node-rank {mh.node_rank}: must be 0..{mh.nnodes - 1}",
            "give each host its own node rank",
        )
    if not mh.token:
        note(
            "no --rdzv-token: any process that reaches the rendezvous store can join this job "
            "(set TTMESH_RDZV_TOKEN on every host)"
        )


__all__ = ["MultiHost", "Peers", "TTMeshError", "check", "global_plan"]
