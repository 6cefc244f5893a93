"""Real-host telemetry through tt-umd, with tt-umd replaced by a stand-in (no hardware here),
and the honest "unknown" answers without it."""

from __future__ import annotations

import json
import shutil
import sys
import types
from pathlib import Path

import pytest
from conftest import CAPTURES, run_cli

from ttmesh.cli.hosts import open_host as Host
from ttmesh.host import telemetry


class FakeProvider:
    def __init__(self, up: list[bool], beats: list[bool] | None, heartbeat: int) -> None:
        self.up, self.beats, self.heartbeat = up, beats, heartbeat

    def get_eth_link_status_per_core(self):
        return None if self.up is None else [((i, 0), v) for i, v in enumerate(self.up)]

    def get_eth_heartbeat_status_per_core(self):
        return None if self.beats is None else [((i, 0), v) for i, v in enumerate(self.beats)]

    def get_heartbeat(self) -> int:
        return self.heartbeat


def fake_umd(capture: Path, providers: dict[int, FakeProvider]) -> types.ModuleType:
    umd = types.ModuleType("tt_umd")

    class Options:
        class Action:
            IGNORE = "ignore"

    class CD:
        def serialize_to_file(self, dest: str) -> str:
            shutil.copy(capture, dest)
            return dest

        def get_chip_unique_ids(self) -> dict[int, int]:
            from ttmesh.host import clusterdesc

            return {c.id: c.unique_id for c in clusterdesc.load(capture).chips.values()}

    class Device:
        def __init__(self, p: FakeProvider) -> None:
            self.p = p

        def get_firmware_info_provider(self) -> FakeProvider:
            return self.p

    class Discovery:
        @staticmethod
        def create_cluster_descriptor(opts: object) -> CD:
            assert opts.eth_fw_heartbeat_failure == "ignore"
            return CD()

        @staticmethod
        def discover(opts: object) -> tuple[CD, dict[int, Device]]:
            return CD(), {chip: Device(p) for chip, p in providers.items()}

    umd.TopologyDiscoveryOptions = Options
    umd.TopologyDiscovery = Discovery
    return umd


def test_status_bits_fold_channels() -> None:
    p = FakeProvider([False, True, False, True], [True, True, False, False], 7)
    assert telemetry.status_bits(p) == (1 << 17) | (1 << 19) | 0b11
    assert telemetry.status_bits(FakeProvider(None, None, 0)) is None  # firmware < 19.9


def test_topology_and_status_through_tt_umd(monkeypatch: pytest.MonkeyPatch) -> None:
    capture = CAPTURES / "n300.yaml"
    up = [False] * 16
    up[8] = True  # one of the two on-board links up
    providers = {0: FakeProvider(up, [True] * 16, 41), 1: FakeProvider([False] * 16, None, 99)}
    monkeypatch.setitem(sys.modules, "tt_umd", fake_umd(capture, providers))
    cd, source, notes = telemetry.umd_topology(Host("/"))
    assert source == "tt_umd" and notes == [] and cd is not None
    assert {c.unique_id for c in cd.chips.values()} == {9956278468, 14251245764}
    asic0, asic1 = format(9956278468, "016x"), format(14251245764, "016x")
    status = telemetry.eth_live_status(Host("/"), [asic0, asic1, "ffff"])
    assert status[asic0] >> 24 & 1 == 1 and status[asic0] >> 25 & 1 == 0
    assert status[asic1] == 0 and status["ffff"] is None
    assert telemetry.remote_heartbeats(Host("/"), [asic1]) == {asic1: 99}


def test_without_tt_umd_everything_is_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tt_umd", None)
    cd, source, notes = telemetry.umd_topology(Host("/"))
    assert cd is None and source == "none" and notes == [telemetry.NO_UMD]
    assert telemetry.eth_live_status(Host("/"), ["a"]) == {"a": None}
    assert telemetry.remote_heartbeats(Host("/"), ["a"]) == {"a": None}


def test_a_root_that_is_not_simulated_reads_pci_devices_only(make_sim, tmp_path: Path) -> None:
    """A copy of a host's files without the simulator's marker is read as a real host would
    be: PCI devices from sysfs, and no topology claimed (tt-umd reads only this machine)."""
    sim = make_sim("n300")
    root = tmp_path / "plain"
    shutil.copytree(sim, root, symlinks=True)
    (root / ".ttmesh-sim").unlink()
    res = run_cli("ls", "--root", str(root), "--json")
    assert res.code == 0, res.err
    data = json.loads(res.out)
    assert data["host"]["simulated"] is False and data["topology"] == "none"
    assert [c["bdf"] for c in data["chips"]] == ["0000:41:00.0"]
    assert data["links"] == [] and data["notes"]
    assert "simulated host" not in res.err
