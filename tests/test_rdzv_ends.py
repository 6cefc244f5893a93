"""How hosts agree on an attempt's end, in process: two agents' coordinators over one store.

The order of what an agent writes decides what another can see in between; a store that runs
the other agent's check at the worst moment (right after one write) makes that moment certain
instead of a matter of load."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ttmesh.launcher.hosts.rendezvous import PREFIX, Coordinator, Endpoint


class Store:
    """The part of torch's c10d store the coordinator uses, with a hook after each ``set``."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.counters: dict[str, int] = {}
        self.after_set: Callable[[str], None] = lambda key: None

    def set(self, key: str, value: str) -> None:
        self.data[key] = value.encode()
        self.after_set(key)

    def get(self, key: str) -> bytes:
        return self.data[key]

    def check(self, keys: list[str]) -> bool:
        return all(k in self.data for k in keys)

    def add(self, key: str, amount: int) -> int:
        self.counters[key] = self.counters.get(key, 0) + amount
        return self.counters[key]


def _agents(store: Store) -> list[Coordinator]:
    agents = []
    for node in (0, 1):
        c = Coordinator(Endpoint("127.0.0.1", 29400), "job", 2, node, "token")
        c.store = store
        agents.append(c)
    return agents


def test_a_host_that_sees_every_end_also_sees_the_failure_among_them() -> None:
    """Node 0's ranks succeeded; node 1's rank 1 exited 7. However the two reports interleave,
    node 0 learns the attempt failed: it checks the ends at the moment node 1's end becomes
    readable, and must find node 1's failure counted and published by then (it used to find
    every end, no failure yet, and exit 0 while node 1 exited 7)."""
    store = Store()
    node0, node1 = _agents(store)
    seen: dict[str, Any] = {}

    def node0_checks(key: str) -> None:
        if key == PREFIX + "end/0/1" and not seen:
            seen.update(node0.report_end(0, {"code": 0, "rank": None}))

    store.after_set = node0_checks
    first = node1.report_end(0, {"code": 7, "rank": 1, "reason": "rank 1 exited with code 7"})
    assert first["code"] == 7 and first["node"] == 1
    assert seen.get("code") == 7 and seen.get("node") == 1, seen
