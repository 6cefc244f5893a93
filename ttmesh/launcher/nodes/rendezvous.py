"""Multi-host jobs: one ttmesh agent per host, joined through torch's c10d rendezvous.

The engine is torch's own (``torch.distributed.elastic.rendezvous``: a ``DynamicRendezvousHandler``
over a ``C10dRendezvousBackend`` on a ``TCPStore``), imported only here and only in multi-host mode,
so a single-host launch never imports torch. ttmesh adds, on that store:

* **a job record** published by node 0 (the store's host) and **node claims**: every agent
  claims its node rank with an atomic compare-and-set, so a duplicate node rank is refused
  before it can take another's place; an agent first verifies the job record, so one with the
  wrong token is refused before it joins;
* **signed records**: every value an agent publishes carries an HMAC with the job's token
  (``--rdzv-token`` / ``TTMESH_RDZV_TOKEN``) over its key, the job and the run (:data:`FORMAT`),
  and readers ignore what does not verify, so a peer without the token can neither join nor
  change the plan, nor replay another job's or an earlier run's records. What is read is made
  printable before anything shows it. The store itself, like torchrun's, has no
  authentication: keep it on a trusted network. It listens only on the address given;
* **the plan's facts** (each host's address, ranks, pre-flight verdict; node 0's master port),
  **heartbeats**, and each attempt's **end** (the first failing rank, its host and code),
  so every agent tears down when any rank anywhere fails, and notices a host that disappears
  within ``--heartbeat-timeout``.

The store carries data, never a command line: each host runs only the command it was given.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import json
import os
import re
import socket
import threading
import time
import warnings
from datetime import timedelta
from typing import Any

from ttmesh import addresses
from ttmesh.dataclass import dataclass, field
from ttmesh.errors import TTMeshError, bad_input, refused
from ttmesh.render import note, printable

PREFIX = "ttmesh/"
BEAT_EVERY = 0.5  # seconds between heartbeats
# What a record's signature covers, in this order: the format, the job id, the run, the key and
# the value. The run is a digest of every agent's nonce of this start (each agent draws its own:
# a run no agent has seen before), so a record signed in an earlier run of the job, or in another
# job with the same token, verifies in no other: a process without the token that copies records
# from one store to another changes nothing. Only the records that make the run ("job", each
# "node/N") are bound to the job alone; every agent checks that the others' run is its own
# before anything else is read ("joined/N").
FORMAT = "ttmesh-rdzv/2"
NONCE = re.compile(r"[0-9a-f]{32}", re.ASCII)
SHOWN = 200  # characters of a value from the store a line shows at most


class _Unsigned(Exception):
    """A record that is not signed with this job's token (or not a record at all)."""


class _Foreign(Exception):
    """A record signed with this job's token for another job or another run: a copy (or an
    agent given another --job-id, ``other_job``)."""

    def __init__(self, why: str, other_job: bool) -> None:
        super().__init__(why)
        self.other_job = other_job


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    def __str__(self) -> str:
        """``HOST:PORT``, an IPv6 address in brackets (``[::1]:29400``): as it is written on a
        command line, read back by :func:`parse_endpoint`."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_endpoint(
    text: str, default_port: int = 29400, where: str = "--rdzv-endpoint"
) -> Endpoint:
    """``HOST[:PORT]`` (torchrun's ``--rdzv-endpoint``; an IPv6 address in brackets), read by
    the rule of every host and port ttmesh is given (:func:`ttmesh.addresses.endpoint`)."""
    host, port = addresses.endpoint(
        text, where, default_port, example="--rdzv-endpoint node0:29400 or [fd00::1]:29400"
    )
    return Endpoint(host, port)


@dataclass
class Node:
    """What one agent tells the others about its host."""

    node: int
    hostname: str
    addr: str  # where ranks on other hosts reach this host's ranks
    nproc: int  # local ranks
    chips: list[str] = field(default_factory=list)  # PCI addresses, in local rank order
    root: str = ""
    pid: int = 0
    tp_size: int = 0  # the job's --tp-size this host was given (0: none)

    def to_json(self) -> dict[str, Any]:
        return self.__dict__.copy()


class Coordinator:
    """This agent's view of the job's store: signed records, claims, heartbeats, ends."""

    def __init__(
        self,
        endpoint: Endpoint,
        job: str,
        nnodes: int,
        node: int,
        token: str,
        *,
        timeout: float = 300.0,
        heartbeat_timeout: float = 5.0,
        local_addr: str | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.job = job
        self.nnodes = nnodes
        self.node = node
        # The token's bytes as given: a variable or argument that is not UTF-8 reaches Python
        # as surrogates, and every host that was given the same bytes must sign alike.
        self.key = token.encode("utf-8", "surrogateescape")
        self.timeout = timeout
        self.heartbeat_timeout = heartbeat_timeout
        self.local_addr = local_addr
        self.store: Any = None
        self.listener: socket.socket | None = None
        self.nodes: dict[int, Node] = {}
        self.agent_id = f"{socket.gethostname()}:{os.getpid()}:{os.urandom(4).hex()}"
        self.nonce = os.urandom(16).hex()  # this agent's part of the run (FORMAT)
        self.run = ""  # the run, once every agent's nonce is known (join)
        self._ignored: set[str] = set()  # keys whose copied record was said already
        self._beat_thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._left = False  # left torch's rendezvous already (leave)
        self.lost: str | None = None  # why a peer or the store is considered gone
        self.peer_end: dict[str, Any] | None = None  # the first failure another host reported
        self._on_peer: Any = None
        self._lock = threading.Lock()

    # -- signed records

    def _sign(self, key: str, data: str, job: str, run: str) -> str:
        message = json.dumps([FORMAT, job, run, key, data])  # unambiguous, whatever each holds
        return hmac.new(self.key, message.encode(), hashlib.sha256).hexdigest()

    def publish(self, key: str, value: Any) -> None:
        data = json.dumps(value, sort_keys=True)
        mac = self._sign(key, data, self.job, self.run)
        record = {"job": self.job, "run": self.run, "data": data, "mac": mac}
        with self._lock:
            self.store.set(PREFIX + key, json.dumps(record))

    def read(self, key: str) -> Any:
        """The value at ``key`` if it is there and signed with this job's token for this job and
        run, else None. A copy of another job's or run's record is said once (per key)."""
        with self._lock:
            if not self.store.check([PREFIX + key]):
                return None
            raw = self.store.get(PREFIX + key)
        try:
            return self._open(key, raw)
        except _Unsigned:
            return None
        except _Foreign as exc:
            with self._lock:
                first = key not in self._ignored
                self._ignored.add(key)
            if first:
                note(f"ignored {key} in the rendezvous store at {self.endpoint}: {exc} "
                     f"({COPIED})")  # fmt: skip
            return None

    def _open(self, key: str, raw: bytes) -> Any:
        """The value of the record ``raw`` read at ``key``, every string in it printable (it
        may be shown); :class:`_Unsigned` when it is not signed with this job's token,
        :class:`_Foreign` when it is, but for another job or run."""
        try:
            record = json.loads(raw)
            data, mac, job, run = (record[k] for k in ("data", "mac", "job", "run"))
            if not all(isinstance(v, str) for v in (data, mac, job, run)):
                raise _Unsigned
            signed = hmac.compare_digest(mac.encode(), self._sign(key, data, job, run).encode())
        except (ValueError, KeyError, TypeError, RecursionError):
            raise _Unsigned from None
        if not signed:
            raise _Unsigned
        if job != self.job:
            raise _Foreign(f"a record of job {_shown(job)}, not of {self.job}", other_job=True)
        if run != self.run:
            raise _Foreign("a record of another run of this job", other_job=False)
        try:
            return _printable(json.loads(data))
        except (ValueError, RecursionError):
            raise _Unsigned from None

    def wait_for(self, keys: list[str], what: str, timeout: float | None = None) -> dict[str, Any]:
        """Every key's verified value, waiting up to ``timeout``; refuses naming what is missing."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        found: dict[str, Any] = {}
        unsigned: set[str] = set()
        while True:
            if self.lost is not None:
                raise refused(f"{what}: {self.lost}")
            for key in keys:
                if key in found:
                    continue
                try:
                    with self._lock:
                        present = self.store.check([PREFIX + key])
                        raw = self.store.get(PREFIX + key) if present else None
                except (RuntimeError, OSError, TimeoutError) as exc:  # DistNetworkError & co
                    raise refused(
                        f"{what}: lost the rendezvous store at {self.endpoint} ({_first_line(exc)})",
                        "node 0 ended or is unreachable: see its output, then start every host again",
                    )
                if raw is None:
                    continue
                try:
                    found[key] = self._open(key, raw)
                    unsigned.discard(key)
                except _Unsigned:
                    unsigned.add(key)
                except _Foreign as exc:
                    # Refused at once, as an unsigned record is: a copy is not replaced by
                    # waiting, and nothing has started yet.
                    hint = f"{COPIED}; then start the job again"
                    if key == "job" and exc.other_job:
                        hint = "give every host the same --job-id (or none: the same endpoint)"
                    raise refused(f"{what}: {key} at {self.endpoint} is {exc}", hint)
            if unsigned:
                # Records are written once and never replaced: one signed with another token
                # will not become ours by waiting, so say so now rather than at the deadline.
                raise refused(
                    f"{what}: {', '.join(sorted(unsigned))} at {self.endpoint} is not signed "
                    "with this job's token",
                    "give every host the same --rdzv-token (or TTMESH_RDZV_TOKEN)",
                )
            if len(found) == len(keys):
                return found
            if time.monotonic() >= deadline:
                missing = [k for k in keys if k not in found]
                raise refused(
                    f"{what}: nothing from {', '.join(missing)} after {timeout or self.timeout:g} s",
                    f"start ttmesh on every host with the same --rdzv-endpoint {self.endpoint} and job id",
                )
            time.sleep(0.05)

    # -- joining

    def join(self, me: Node) -> None:
        """Connect (node 0 hosts the store), check the job and this node rank, then meet every
        other agent in torch's rendezvous and learn every host's facts."""
        self._connect()
        if self.node == 0:
            self.publish("job", {"job": self.job, "nnodes": self.nnodes, "host": me.hostname})
        job = self.wait_for(["job"], f"the job record of {self.job}")["job"]
        if job["nnodes"] != self.nnodes:
            raise bad_input(
                f"--nnodes {self.nnodes}, but node 0 ({job['host']}) started the job with {job['nnodes']}",
                "give every host the same --nnodes",
            )
        with self._lock:
            claimed = self.store.compare_set(PREFIX + f"claim/{self.node}", "", self.agent_id)
        claimed = claimed.decode(errors="replace") if isinstance(claimed, bytes) else str(claimed)
        if claimed != self.agent_id:
            # Written by whoever claimed first (anyone who reaches the store): shown, not trusted.
            holder = claimed.split(":")
            pid = holder[1] if len(holder) > 1 else "?"
            raise bad_input(
                f"--node-rank {self.node} is already taken in job {self.job} (by "
                f"{_shown(holder[0])}, pid {_shown(pid)})",
                f"give each host its own --node-rank, 0..{self.nnodes - 1}",
            )
        self._rendezvous()
        self.publish(f"node/{self.node}", {**me.to_json(), "nonce": self.nonce})
        found = self.wait_for([f"node/{n}" for n in range(self.nnodes)], "the other hosts")
        self.nodes = self._run_of(found)
        self.publish(f"joined/{self.node}", self.run)
        self.wait_for([f"joined/{n}" for n in range(self.nnodes)], "the other hosts' run")
        self._beat_thread = threading.Thread(
            target=self._beat, name="ttmesh-heartbeat", daemon=True
        )
        self._beat_thread.start()

    def _run_of(self, found: dict[str, Any]) -> dict[int, Node]:
        """Every host's facts, and this run (:data:`FORMAT`) from every agent's nonce. This
        agent's own record must be the one it wrote: a copy of an earlier one is refused."""
        nodes: dict[int, Node] = {}
        nonces = []
        for n in range(self.nnodes):
            facts = dict(found[f"node/{n}"]) if isinstance(found[f"node/{n}"], dict) else {}
            nonce = facts.pop("nonce", None)
            try:  # written by a token holder, but maybe another ttmesh version
                node = Node(**facts) if isinstance(nonce, str) and NONCE.fullmatch(nonce) else None
            except TypeError:
                node = None
            if node is None or not isinstance(nonce, str):
                raise refused(
                    f"the other hosts: node/{n} at {self.endpoint} is not a record this ttmesh "
                    "reads", "run the same ttmesh on every host",
                )  # fmt: skip
            nodes[n] = node
            nonces.append(nonce)
        if nonces[self.node] != self.nonce:
            raise refused(
                f"the other hosts: node/{self.node} at {self.endpoint} is not the record this "
                "agent wrote: a record of another run of this job",
                f"{COPIED}; then start the job again",
            )
        self.run = hashlib.sha256(" ".join(nonces).encode()).hexdigest()[:32]
        return nodes

    def _connect(self) -> None:
        TCPStore = _torch_store()

        wait = timedelta(seconds=self.timeout)
        if self.node == 0:
            self.listener = _listen(self.endpoint)  # bound to the address given, nothing else
            if self.listener is not None:
                self.store = TCPStore(
                    self.endpoint.host, self.endpoint.port, None, True, wait, False, True,
                    self.listener.fileno(),
                )  # fmt: skip
                return
            # Someone already listens there: as a client, this agent's claim will say who.
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                self.store = TCPStore(
                    self.endpoint.host, self.endpoint.port, None, False, timedelta(seconds=5)
                )
                return
            except (RuntimeError, TimeoutError) as exc:
                if time.monotonic() >= deadline:
                    raise refused(
                        f"no rendezvous at {self.endpoint} after {self.timeout:g} s ({_first_line(exc)})",
                        "start node 0 (--node-rank 0) on the endpoint's host first, or check the address",
                    )
                time.sleep(0.2)

    def _rendezvous(self) -> None:
        from torch.distributed import PrefixStore
        from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import (
            C10dRendezvousBackend,
        )
        from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
            DynamicRendezvousHandler,
            RendezvousTimeout,
        )

        store = PrefixStore(PREFIX + "rdzv/", self.store)
        backend = C10dRendezvousBackend(store, self.job)
        handler = DynamicRendezvousHandler.from_backend(
            self.job, store, backend, self.nnodes, self.nnodes, self.local_addr,
            RendezvousTimeout(join=timedelta(seconds=self.timeout), last_call=timedelta(seconds=1)),
        )  # fmt: skip
        from torch.distributed.elastic.rendezvous import RendezvousTimeoutError

        try:
            handler.next_rendezvous()
        except RendezvousTimeoutError:  # its message is empty: say what it means
            raise refused(
                f"the rendezvous at {self.endpoint}: not every one of the {self.nnodes} hosts "
                f"joined within {self.timeout:g} s",
                "start ttmesh on every host with the same --rdzv-endpoint and --rdzv-id, or give "
                "the late ones longer: --rdzv-timeout",
            ) from None
        except Exception as exc:  # torch's RendezvousError and friends
            raise refused(f"the rendezvous at {self.endpoint} failed: {_first_line(exc)}")
        self.handler = handler

    # -- during a job

    def _beat(self) -> None:
        """Publish this agent's heartbeat; notice peers whose heartbeats stop, or a lost store."""
        last: dict[int, tuple[Any, float]] = {}
        count = 0
        while not self._stop.wait(BEAT_EVERY):
            count += 1
            try:
                self.publish(f"alive/{self.node}", count)
                for n in self.nodes:
                    if n == self.node:
                        continue
                    value = self.read(f"alive/{n}")
                    now = time.monotonic()
                    if n not in last or last[n][0] != value:
                        last[n] = (value, now)
                    elif now - last[n][1] > self.heartbeat_timeout:
                        self._gone(f"host {self.nodes[n].hostname} (node {n}) stopped answering "
                                   f"for {self.heartbeat_timeout:g} s")  # fmt: skip
                        return
                self._check_ends()
            except (RuntimeError, OSError, TimeoutError) as exc:
                self._gone(f"the rendezvous store at {self.endpoint} is gone ({_first_line(exc)})")
                return

    def _gone(self, why: str) -> None:
        if self.lost is None:
            self.lost = why
            if self._on_peer is not None:
                self._on_peer()

    def watch(self, attempt: int, on_peer: Any) -> None:
        """Call ``on_peer()`` (once) when another host's rank fails or a host is lost."""
        self.attempt = attempt
        self.peer_end = None
        self._on_peer = on_peer

    def _check_ends(self) -> None:
        attempt = getattr(self, "attempt", None)
        if attempt is None or self.peer_end is not None:
            return
        first = self.read(f"first/{attempt}")
        if first is not None and first.get("node") != self.node and first.get("code", 0) != 0:
            self.peer_end = first
            if self._on_peer is not None:
                self._on_peer()

    def report_end(self, attempt: int, end: dict[str, Any]) -> dict[str, Any]:
        """Publish how this host's attempt ended; the attempt's first failure anywhere, if any
        (this one when it failed first)."""
        order = 0  # a failure's place among the attempt's failures (the store's atomic count)
        if end.get("code", 0) != 0:
            with self._lock:
                order = self.store.add(PREFIX + f"failures/{attempt}", 1)
        # Counted before it is said: whoever reads this end finds the failure counted.
        self.publish(f"end/{attempt}/{self.node}", {**end, "order": order})
        if order == 1:
            self.publish(f"first/{attempt}", {**end, "node": self.node})
        # The attempt is over when every host has said how it ended: a host whose ranks all
        # succeeded waits for the others (their ranks may still fail: then the job failed
        # and this host exits with that code too). A host that stops answering ends the wait
        # through the heartbeat (self.lost).
        while True:
            first = self.read(f"first/{attempt}")
            if first is not None:
                return first
            if self.lost is not None:
                return end
            said = [self.read(f"end/{attempt}/{n}") for n in range(self.nnodes)]
            if all(isinstance(e, dict) for e in said):
                failed = sorted((e.get("order", 0), n) for n, e in enumerate(said) if e.get("code"))
                if not failed:
                    return end
                # Every host has ended and one failed, but no first failure was published:
                # the count is anyone's to add to (another user can take its first place).
                # The failure counted first is the first, the same for every host.
                n = failed[0][1]
                return {k: v for k, v in said[n].items() if k != "order"} | {"node": n}
            time.sleep(0.05)

    def leave(self, attempt: int) -> None:
        """A host that does not hold the store is done with it: it leaves torch's rendezvous and
        says so, so that node 0 keeps the store until nobody reads it any more."""
        self._left = True
        with contextlib.suppress(Exception):
            self.handler.shutdown()
        with contextlib.suppress(Exception):
            self.publish(f"left/{attempt}/{self.node}", True)

    def wait_ends(self, attempt: int, timeout: float) -> None:
        """Node 0 hosts the store: it stays until every host has said how its attempt ended and
        has left (a host still reading the others' ends would find the store gone)."""
        keys = [f"end/{attempt}/{n}" for n in range(self.nnodes)]
        keys += [f"left/{attempt}/{n}" for n in range(1, self.nnodes)]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.lost is None:
            if all(self.read(k) is not None for k in keys):
                return
            time.sleep(0.1)

    def barrier(self, name: str, value: Any, timeout: float) -> dict[int, Any]:
        """Publish ``value`` under ``name`` and wait for every host's."""
        self.publish(f"{name}/{self.node}", value)
        found = self.wait_for([f"{name}/{n}" for n in range(self.nnodes)], name, timeout)
        return {n: found[f"{name}/{n}"] for n in range(self.nnodes)}

    def close(self) -> None:
        self._stop.set()
        if self._beat_thread is not None:
            self._beat_thread.join(timeout=2)
        if not self._left:
            with contextlib.suppress(Exception):
                self.handler.shutdown()
        if self.listener is not None:
            with contextlib.suppress(OSError):
                self.listener.close()


def _listen(endpoint: Endpoint) -> socket.socket | None:
    """A listening socket bound to exactly the endpoint's address (not every interface); None
    when the port is taken already (another node 0, or the job's own store)."""
    try:
        infos = socket.getaddrinfo(endpoint.host, endpoint.port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise bad_input(
            f"--rdzv-endpoint {endpoint}: {exc.strerror or exc}", "give an address of this host"
        )
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            return None
        raise bad_input(
            f"node 0 cannot listen on --rdzv-endpoint {endpoint}: {exc.strerror}",
            "run node 0 on the endpoint's host, or pick a free port",
        )
    sock.listen(128)
    return sock


def _torch_store() -> Any:
    """torch's TCPStore, imported quietly: torch's C++ logs every retry of a client connecting
    (with a C++ stack) unless told not to; ttmesh says what went wrong in one line itself.

    This is where an agent imports torch (the store and torch's rendezvous are all it uses).
    torch warns at import when NumPy is missing ("Failed to initialize NumPy", from
    torch/_subclasses/functional_tensor.py): NumPy is not a dependency of torch, and neither
    the store nor the rendezvous uses it, so on every host of every job the warning would say
    nothing the user can act on. It is filtered here, for this import alone; a rank's own torch
    still warns in the rank's output, where NumPy may matter."""
    previous = os.environ.get("TORCH_CPP_LOG_LEVEL")
    os.environ["TORCH_CPP_LOG_LEVEL"] = previous or "FATAL"
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Failed to initialize NumPy", UserWarning)
            from torch.distributed import TCPStore
    finally:
        if previous is None:
            del os.environ["TORCH_CPP_LOG_LEVEL"]
    return TCPStore


def _first_line(exc: BaseException) -> str:
    """The first line of an exception's message, or its type when it has none (torch's
    rendezvous timeout has an empty message)."""
    lines = str(exc).splitlines()
    return _shown(lines[0]) if lines else type(exc).__name__


# Why a record of another job or run is in the store, and what to do.
COPIED = (
    "copied from another job's store: the store has no authentication, keep its port "
    "reachable only by the job's hosts"
)


def _shown(text: str) -> str:
    """A string from the store (or torch's message about it) as a line may show it: printable,
    at most :data:`SHOWN` characters."""
    text = printable(text)
    return text if len(text) <= SHOWN else text[: SHOWN - 1] + "…"


def _printable(value: Any) -> Any:
    """``value`` (decoded JSON) with every string in it printable: hosts' names, reasons and
    problems from the store reach ttmesh's lines, and must not carry escapes or newlines."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, list):
        return [_printable(v) for v in value]
    if isinstance(value, dict):
        return {printable(str(k)): _printable(v) for k, v in value.items()}
    return value


def token_of(given: str | None) -> str:
    return given if given is not None else os.environ.get("TTMESH_RDZV_TOKEN", "")


class PeerFailure(TTMeshError):
    pass
