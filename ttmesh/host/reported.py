"""A host known by what ttmesh on that host reported: another machine of a job over several hosts.

The launching ttmesh never reads another machine's files (it opens no connection to it); each
host's own ttmesh reports its chips, links and topology (``ttmesh _host-report``, started there
through mpirun), and the plan is made from the reports. This backend stands for such a host in
that plan: nothing is read through it (its root is a path on the other machine), and what a
plan asks of a host (the environment its ranks get, the cluster tt-metal maps in mock mode)
comes from the report.
"""

from __future__ import annotations

import json
from pathlib import Path

from ttmesh.host.base import Host
from ttmesh.host.clusterdesc import ClusterDescriptor


class ReportedHost(Host):
    def __init__(
        self,
        name: str,
        root: str,
        simulated: bool,
        rank_env: dict[str, str] | None = None,
        mock: ClusterDescriptor | None = None,
        descriptor: ClusterDescriptor | None = None,
    ) -> None:
        # No Host.__init__: the root is a directory of the other machine, not of this one.
        self.name = name
        self.root = Path(root)
        self.flag = f"(on host {name})"
        self.simulated = simulated
        self._rank_env = dict(rank_env or {})
        self._mock = mock
        self._descriptor = descriptor

    def __repr__(self) -> str:
        return f"ReportedHost({self.name!r}, {str(self.root)!r})"

    def read_text(self, rel: str) -> str | None:
        return None  # its files are on the other machine

    def dev_indexes(self) -> list[int]:
        return []

    def topology(self) -> tuple[ClusterDescriptor | None, str, list[str]]:
        return self._descriptor, "reported", []

    def mock_cluster(self) -> ClusterDescriptor | None:
        return self._mock

    def rank_env(self, job_chips: list[str]) -> dict[str, str]:
        env = dict(self._rank_env)
        if "TTMESH_JOB_CHIPS" in env:
            env["TTMESH_JOB_CHIPS"] = json.dumps(job_chips, separators=(",", ":"))
        return env
