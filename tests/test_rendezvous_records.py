"""The records agents of a job over several hosts exchange through their store (issue 33).

The store (torch's TCPStore, as under torchrun) has no authentication: anyone who reaches it can
read every record and write any bytes. Records are signed with the job's token, and the
signature covers the job and the run, so a record copied from another job's store (same token,
even the same job id: the default is derived from the endpoint) or from an earlier run never
counts: it is said in one line and ignored, or refuses a start. Whatever is read from the store
reaches ttmesh's lines printable.

In-process, over a store in memory that answers the calls the coordinator makes as torch's
TCPStore does (tests/test_trust.py copies records between two real stores, as another user);
torch's own rendezvous between the agents is torch's, not under test here.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from ttmesh.errors import TTMeshError
from ttmesh.launcher.nodes.rendezvous import PREFIX, Coordinator, Endpoint, Node

JOB = "rdzv-127.0.0.1-29400"  # the default job id of every job at that endpoint
TOKEN = "the-jobs-token"
HOSTILE = "\x1b]0;owned\x07evil\x1b[2J\nttmesh: every rank succeeded\r"


class MemoryStore:
    """One job's store: the TCPStore calls a coordinator makes, on a dict. ``pinned`` keys keep
    their value whatever is set (someone who writes again after every write)."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.pinned: dict[str, bytes] = {}
        self.lock = threading.Lock()

    def set(self, key: str, value: str | bytes) -> None:
        with self.lock:
            raw = value.encode() if isinstance(value, str) else value
            self.data[key] = self.pinned.get(key, raw)

    def get(self, key: str) -> bytes:
        with self.lock:
            return self.data[key]

    def check(self, keys: list[str]) -> bool:
        with self.lock:
            return all(k in self.data for k in keys)

    def compare_set(self, key: str, expected: str, desired: str) -> bytes:
        with self.lock:
            current = self.data.get(key)
            if (current is None and expected == "") or current == expected.encode():
                self.data[key] = desired.encode()
            return self.data[key]

    def add(self, key: str, amount: int) -> int:
        with self.lock:
            value = int(self.data.get(key, b"0")) + amount
            self.data[key] = str(value).encode()
            return value


@pytest.fixture(autouse=True)
def _no_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The agents share a MemoryStore instead of connecting to node 0's, and skip torch's
    rendezvous (torch's, between the same agents)."""
    monkeypatch.setattr(Coordinator, "_connect", lambda self: None)
    monkeypatch.setattr(Coordinator, "_rendezvous", lambda self: None)


def _agents(store: MemoryStore, job: str = JOB, timeout: float = 30.0) -> list[Coordinator]:
    coords = []
    for n in range(2):
        c = Coordinator(Endpoint("127.0.0.1", 29400), job, 2, n, TOKEN, timeout=timeout)
        c.store = store
        coords.append(c)
    return coords


def _each(
    coords: list[Coordinator], do: Callable[[Coordinator], Any], deadline: float = 60
) -> list[Any]:
    """``do(c)`` for every agent at once (each waits for the others), results or errors (None
    for an agent still waiting at ``deadline``: a hang fails the test, not the suite)."""
    out: list[Any] = [None] * len(coords)

    def one(i: int) -> None:
        try:
            out[i] = do(coords[i])
        except Exception as exc:  # a refusal is a result
            out[i] = exc

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(coords))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(deadline)
    return out


def _join(
    store: MemoryStore, job: str = JOB, names: tuple[str, ...] = ("h0", "h1")
) -> list[Coordinator]:
    coords = _agents(store, job)
    done = _each(coords, lambda c: c.join(Node(c.node, names[c.node], "127.0.0.1", 1)))
    assert done == [None, None], done
    return coords


def _close(*jobs: list[Coordinator]) -> None:
    for coords in jobs:
        for c in coords:
            c.close()


def _end(code: int) -> dict[str, Any]:
    rank = 1 if code else None
    reason = "rank 1 exited with code 7" if code else "every rank succeeded"
    return {"interrupted": False, "code": code, "rank": rank, "host": "h1", "reason": reason}


def _ttmesh_lines(err: str) -> list[str]:
    lines = err.splitlines()
    assert all(ln.startswith("ttmesh: ") and ln.isprintable() for ln in lines), err
    return lines


@pytest.mark.parametrize("later_job", [JOB, "another-job"], ids=["same-job-id", "other-job-id"])
def test_a_failure_copied_from_an_earlier_job_is_ignored(
    later_job: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """An earlier job (same token) ended with rank 1's code 7; its ``first/0`` record, copied
    byte for byte into a later job's store (what a process without the token can do), neither
    stops the later job's ranks nor becomes its exit code: each agent says once that it ignored
    it, and the attempt ends as its own ranks did (it made node 0 exit 7 with every rank
    healthy)."""
    earlier, later = MemoryStore(), MemoryStore()
    first = _join(earlier)
    ends = _each(first, lambda c: c.report_end(0, _end(7 if c.node == 1 else 0)))
    assert [e["code"] for e in ends] == [7, 7]  # the earlier job failed, on every host
    second = _join(later, later_job)
    try:
        later.set(PREFIX + "first/0", earlier.get(PREFIX + "first/0"))  # the copy
        stopped: list[int] = []
        for c in second:
            c.watch(0, lambda: stopped.append(1))
            c._check_ends()  # what each agent's heartbeat does while its ranks run
        assert stopped == [] and all(c.peer_end is None for c in second)
        ends = _each(second, lambda c: c.report_end(0, _end(0)))
        assert [e["code"] for e in ends] == [0, 0], ends
    finally:
        _close(first, second)
    lines = _ttmesh_lines(capsys.readouterr().err)
    assert len(lines) == 2, lines  # one line per agent, however often its heartbeat reads it
    what = "another run of this job" if later_job == JOB else f"job {JOB}, not of another-job"
    for line in lines:
        assert line.startswith("ttmesh: ignored first/0 in the rendezvous store at 127.0.0.1:29400: "
                               f"a record of {what} (copied from another job's store"), line  # fmt: skip


def test_a_record_copied_into_a_barrier_refuses_the_start(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Node 0's master address copied from an earlier run: the agent waiting for it refuses
    at once, exit 3, one line (an unsigned record is refused alike), before any rank starts."""
    earlier, later = MemoryStore(), MemoryStore()
    first, second = _join(earlier), _join(later)
    try:
        first[0].publish("master", {"addr": "10.9.9.9", "port": 1234})
        later.set(PREFIX + "master", earlier.get(PREFIX + "master"))
        with pytest.raises(TTMeshError) as refused:
            second[1].wait_for(["master"], "node 0's master address")
    finally:
        _close(first, second)
    assert refused.value.code == 3
    assert str(refused.value).startswith(
        "node 0's master address: master at 127.0.0.1:29400 is a record of another run of this "
        "job (copied from another job's store: the store has no authentication, keep its port "
        "reachable only by the job's hosts; then start the job again)"
    ), str(refused.value)
    assert capsys.readouterr().err == ""


def test_an_agents_own_record_replaced_by_an_earlier_one_refuses_the_join() -> None:
    """A copy of an earlier run's ``node/1`` written over node 1's own (again after each
    write): node 1 finds its record is not the one it wrote and refuses, one line, exit 3;
    node 0, which took the copy, never agrees on the run with node 1 (it refuses at its
    deadline), so neither starts a rank on the copied facts."""
    earlier, later = MemoryStore(), MemoryStore()
    first = _join(earlier)
    _close(first)
    later.pinned[PREFIX + "node/1"] = earlier.get(PREFIX + "node/1")
    second = _agents(later, timeout=1.0)
    try:
        outcome = _each(second, lambda c: c.join(Node(c.node, f"h{c.node}", "127.0.0.1", 1)))
    finally:
        _close(second)
    assert all(isinstance(o, TTMeshError) and o.code == 3 for o in outcome), outcome
    assert str(outcome[1]).startswith(
        "the other hosts: node/1 at 127.0.0.1:29400 is not the record this agent wrote: a "
        "record of another run of this job ("
    ), outcome[1]
    assert "joined/1" in str(outcome[0]), outcome[0]


def test_what_the_store_holds_is_shown_printable() -> None:
    """A claim planted by anyone, and names signed by a host of the job, reach ttmesh's lines
    as ``render.printable`` shows another program's text: escape sequences dropped, line breaks
    spaces, never raw."""
    store = MemoryStore()
    store.set(PREFIX + "claim/1", HOSTILE + ":" + HOSTILE)  # not an agent's id: anyone's bytes
    node0, node1 = _agents(store)
    node0.publish("job", {"job": JOB, "nnodes": 2, "host": "h0"})
    with pytest.raises(TTMeshError) as taken:
        node1.join(Node(1, "h1", "127.0.0.1", 1))
    line = str(taken.value)
    assert line.startswith("--node-rank 1 is already taken in job rdzv-127.0.0.1-29400 (by ")
    assert line.isprintable() and "(by evil ttmesh, pid every rank succeeded)" in line, line
    coords = _join(MemoryStore(), names=("h0", HOSTILE))
    try:
        seen = coords[0].nodes[1].hostname
        ends = _each(coords, lambda c: c.report_end(0, {**_end(7), "host": HOSTILE}))
    finally:
        _close(coords)
    assert seen == "evil ttmesh: every rank succeeded", seen  # escapes dropped, breaks spaces
    assert all(e["host"] == seen for e in ends), ends


def test_a_failure_whose_count_another_took_still_ends_the_attempt() -> None:
    """The failures' count is the store's, anyone's to add to: with its first place taken
    before rank 1 fails, no host publishes the first failure. Every host still ends the
    attempt with that failure, read from the hosts' signed ends (each waited for a first
    failure that never came, until a host stopped answering)."""
    store = MemoryStore()
    coords = _join(store)
    try:
        store.add(PREFIX + "failures/0", 1)  # someone without the token, before the failure
        ends = _each(coords, lambda c: c.report_end(0, _end(7 if c.node == 1 else 0)), 20)
    finally:
        _close(coords)
    assert [e["code"] for e in ends] == [7, 7], ends
    assert [e["node"] for e in ends] == [1, 1] and not store.check([PREFIX + "first/0"])


def test_records_of_the_same_run_still_count() -> None:
    """The binding refuses copies only: an attempt's own failure still stops the other host
    and becomes every host's code, as before."""
    coords = _join(MemoryStore())
    try:
        stopped: list[int] = []
        coords[0].watch(0, lambda: stopped.append(0))
        coords[1].report_end(0, _end(7))
        coords[0]._check_ends()
        assert stopped == [0] and coords[0].peer_end is not None
        assert coords[0].report_end(0, _end(0))["code"] == 7
    finally:
        _close(coords)


def test_a_token_that_is_not_utf8_signs_as_its_bytes() -> None:
    """TTMESH_RDZV_TOKEN of bytes that are not UTF-8 reaches Python as surrogates; it was an
    internal error (exit 1). Its bytes are the key: the same bytes sign alike, others do not."""
    store = MemoryStore()
    mine = Coordinator(Endpoint("127.0.0.1", 29400), JOB, 2, 0, "\udcff\udcfe")
    mine.store = store
    mine.publish("job", {"job": JOB, "nnodes": 2, "host": "h0"})
    same = Coordinator(
        Endpoint("127.0.0.1", 29400), JOB, 2, 1, b"\xff\xfe".decode(errors="surrogateescape")
    )
    other = Coordinator(Endpoint("127.0.0.1", 29400), JOB, 2, 1, "\udcff")
    same.store = other.store = store
    assert same.read("job") == {"job": JOB, "nnodes": 2, "host": "h0"}
    assert other.read("job") is None


def test_a_host_that_sees_every_end_also_sees_the_failure_among_them() -> None:
    """Node 0's ranks succeeded; node 1's rank 1 exited 7. Node 0 checks the ends at the worst
    moment, as node 1's end becomes readable, and must learn the attempt failed (it used to find
    every end and no failure counted yet, and exit 0 while node 1 exited 7)."""
    seen: dict[str, Any] = {}

    class Hooked(MemoryStore):
        def set(self, key: str, value: str | bytes) -> None:
            super().set(key, value)
            if key == PREFIX + "end/0/1" and not seen:
                seen.update(node0.report_end(0, {"code": 0, "rank": None}))

    node0, node1 = _agents(Hooked())
    first = node1.report_end(0, {"code": 7, "rank": 1, "reason": "rank 1 exited with code 7"})
    assert (first["code"], first["node"]) == (7, 1)
    assert (seen.get("code"), seen.get("node")) == (7, 1), seen
