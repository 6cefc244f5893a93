"""The simulated host as a host backend: what moves on hardware, computed from the sim's state.

A simulated root has the driver's files, so :class:`~ttmesh.host.base.Host` reads it like any
machine. This backend adds what real hardware provides by itself: heartbeats that advance and
holder lists (computed when read), Ethernet status and remote heartbeats (the firmware's
telemetry), the topology (the root's own cluster descriptor), its ``bin/tt-smi``, the mock
cluster tt-metal maps a job's mesh onto, and the job events a real driver sees on its own
(holders, fabric marks). Only the command line opens one (docs/architecture.md).
"""

from __future__ import annotations

import errno
import json
import os
import re
from collections.abc import Iterable
from dataclasses import replace
from functools import cached_property
from pathlib import Path

from ttmesh.errors import TTMeshError, bad_input, from_os_error
from ttmesh.host import clusterdesc
from ttmesh.host.base import Host, Marks
from ttmesh.sim.core import MARKER, SimCorrupt, SimRoot, recreate_command

_DEV_ATTR = re.compile(r"^sys/class/tenstorrent/tenstorrent!([0-9]+)/(tt_heartbeat)$")
_PIDS = re.compile(r"^proc/driver/tenstorrent/([0-9]+)/pids$")
DESCRIPTOR = "cluster_descriptor.yaml"
PARSED = "sim/cluster_descriptor.parsed.json"


def _why(message: str) -> str:
    """A reader's complaint, to follow a file's name."""
    if message.startswith(("is ", "holds ")):
        return message
    if message.startswith(("malformed cluster descriptor", "not a cluster descriptor")):
        return f"is {message.replace('malformed', 'a malformed', 1)}"
    return f"is not a cluster descriptor: {message}"


def is_simulated(root: str | os.PathLike[str]) -> bool:
    return (Path(root) / MARKER).is_file()


def sim_of(host: Host) -> SimRoot:
    """The simulator behind ``host``; bad input when it is not a simulated host."""
    if not isinstance(host, SimHost):
        raise bad_input(
            f"{host.root} is not a simulated host (no {MARKER} marker)",
            "create one with: ttmesh sim create --system quietbox2 --root DIR",
        )
    return host.sim


class SimHost(Host):
    simulated = True

    def train_timeout(self, archs: Iterable[str]) -> float:
        """None to wait for: the simulator's links train when its tt-smi returns (both ends
        reset together), so a reset that did not work fails at once instead of after the
        boards' 60 s (``ttmesh reset --train-timeout`` still waits when asked)."""
        return 0.0

    @cached_property
    def sim(self) -> SimRoot:
        """The simulator's mechanics behind the root (its 'firmware')."""
        return SimRoot(str(self.root))

    # -- values that move on hardware, computed when read

    def _dynamic(self, rel: str) -> str | None:
        match = _DEV_ATTR.match(rel)
        if match:
            asic = self.attr(int(match.group(1)), "tt_asic_id")
            if asic is None:
                return None
            state = self.sim.state_now()
            return f"{self.sim.heartbeat(state, asic)}\n" if asic in state["chips"] else None
        match = _PIDS.match(rel)
        if match and os.path.exists(self._join(rel)):
            asic = self.attr(int(match.group(1)), "tt_asic_id")
            if asic is None:
                return ""
            pids = self.sim.holders(self.sim.state_now(), asic)
            return "".join(f"{p}\n" for p in pids)
        return None

    def eth_live_status(self, asics: list[str]) -> dict[str, int | None]:
        state = self.sim.state_now()
        known = self.sim.eth_live_statuses(state, [a for a in asics if a in state["chips"]])
        return {a: known.get(a) for a in asics}

    def remote_heartbeats(self, asics: list[str]) -> dict[str, int | None]:
        state = self.sim.state_now()
        return {a: (self.sim.heartbeat(state, a) if a in state["chips"] else None) for a in asics}

    def heartbeat_intervals(self, chips: list[tuple[str, int | None]]) -> dict[str, float | None]:
        # The simulated firmware's telemetry: Blackhole's UPDATE_TELEM_SPEED (ms), as the
        # tt-smi stand-in reports it too; Wormhole's firmware has no such tag.
        state = self.sim.state_now()
        out: dict[str, float | None] = {}
        for asic, _dev in chips:
            ms = self.sim.update_interval_ms(state, asic) if asic in state["chips"] else None
            out[asic] = None if ms is None else ms / 1000.0
        return out

    # -- topology

    def descriptor(self) -> clusterdesc.ClusterDescriptor:
        """The root's cluster descriptor, as tt-umd would have written it (parsed once)."""
        path = self.path(DESCRIPTOR)
        try:
            return clusterdesc.load_cached(path, self.path(PARSED), self._root)
        except (FileNotFoundError, NotADirectoryError):
            raise SimCorrupt(self._root, str(path), "is missing") from None
        except clusterdesc.DescriptorError as exc:
            raise SimCorrupt(self._root, str(path), _why(str(exc))) from None

    def topology(self) -> tuple[clusterdesc.ClusterDescriptor | None, str, list[str]]:
        if not os.path.lexists(self.path(DESCRIPTOR)):
            return None, "none", [f"the simulated host has no {DESCRIPTOR}"]
        return self.descriptor(), "cluster-descriptor", []

    def mock_cluster(self) -> clusterdesc.ClusterDescriptor:
        """The descriptor as discovery would find it now: links the sim has down left out."""
        cd = self.descriptor()
        state = self.sim.state_now()
        marks = self.sim.dead_marked_chips(state)
        ids = {c.id: c.asic_id or "" for c in cd.chips.values()}
        links = [
            lk
            for lk in cd.links
            if self.sim.link_up(
                state, (ids[lk.chip_a], lk.chan_a, ids[lk.chip_b], lk.chan_b), marks
            )
        ]
        return replace(cd, links=links)

    def repair_hint(self) -> str:
        return f"recreate it: {recreate_command(self._root)}"

    def corrupt(self, path: str, why: str) -> TTMeshError:
        return bad_input(f"the simulated host's {path} {why}", self.repair_hint())

    # -- tools

    def default_tt_smi(self) -> str:
        path = self.path("bin/tt-smi")
        if not path.is_file():
            raise bad_input(
                f"tt-smi not found: the simulated host has no {path}",
                "install it: pip install tt-smi (or give --tt-smi PATH)",
            )
        self.check_trusted(path)
        return str(path)

    def tt_smi_env(self) -> dict[str, str | None]:
        return {"TTMESH_SIM_ROOT": str(self.root)}

    # -- a job's events: what a real driver and firmware would see by themselves

    def rank_env(self, job_chips: list[str]) -> dict[str, str]:
        # ttmesh.worker.wait_fabric blocks on the sim's links, as a real bring-up hangs.
        return {
            "TTMESH_SIM_ROOT": str(self.root),
            "TTMESH_JOB_CHIPS": json.dumps(job_chips, separators=(",", ":")),
        }

    def workers_started(self, holders: Marks) -> None:
        if holders:
            self.sim.add_holders(holders)

    def fabric_opened(self, marks: Marks, owner: str, supervisor: int) -> None:
        if marks:
            self.sim.mark_fabric_many(marks, owner=owner, supervisor=supervisor)

    def worker_ended(self, pid: int, clean: bool) -> None:
        if clean:
            self.sim.clear_fabric(pid)
        else:
            self.sim.abandon_fabric(pid)

    def check_changeable(self) -> None:
        state_dir, lock = self.path("sim"), self.path("sim/state.lock")
        if not os.access(state_dir, os.W_OK | os.X_OK) or (
            lock.exists() and not os.access(lock, os.W_OK)
        ):
            denied = PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(lock))
            raise from_os_error(denied, "change the simulated host")
        self.sim.state_now()  # a state that cannot be read is refused before anything starts
