"""Map this rank's mesh with tt-metal's control plane and say what it found.

Run it under ttmesh with a Python that has ttnn (the wheels are for Python 3.10 and 3.12):

    ttmesh launch --sim quietbox2 --tp-size 4 --mesh-layout mesh -- /path/to/py312/bin/python \\
        examples/ttnn_mesh_probe.py

On a simulated host ttmesh points tt-metal at a mock cluster descriptor per rank
(TT_METAL_MOCK_CLUSTER_DESC_PATH), so this stops at the control plane: no device is opened. On
hardware it also opens the rank's mesh with the fabric on and runs a tiny all-gather. It
prints one line, ``PROBE {json}``, with the rank, its host, its mesh ids and the global and
local mesh shapes, or tt-metal's refusal. A refused rank leaves with os._exit(1): in an MPI world a normal
exit would wait in MPI finalisation for peers that are blocked in a collective. A rank that
passes exits normally (os._exit(0) would make mpirun report a failure).
"""

from __future__ import annotations

import json
import os
import socket
import sys
from typing import Any

# Set by ttmesh's pre-flight (launcher.planning.metalcheck): say "PROBE-STAGE python" on
# starting and "PROBE-STAGE ttnn" once ttnn is imported, so a checker that never ran (a
# TTMESH_TTNN_PYTHON that is no Python) or a ttnn that crashed on import is not blamed on
# tt-metal's verdict on the mesh.
STAGES = "TTMESH_PROBE_STAGES"


def collective(ttnn, local: list) -> str:
    """On hardware: open the local mesh with the fabric on and all-gather a tiny tensor."""
    ttnn.set_fabric_config(ttnn.FabricConfig.FABRIC_1D)
    mesh = ttnn.open_mesh_device(ttnn.MeshShape(*local))
    try:
        n = mesh.get_num_devices()
        shape = ttnn.Shape([n, 1, 32, 32])
        tensor = ttnn.ones(shape, dtype=ttnn.bfloat16, layout=ttnn.TILE_LAYOUT, device=mesh)
        gathered = ttnn.all_gather(tensor, dim=0)
        ttnn.synchronize_device(mesh)
        return f"all_gather over {n} chips: {list(gathered.shape)}"
    finally:
        ttnn.close_mesh_device(mesh)


def main(extra: dict[str, Any] | None = None) -> int:
    """Probe and print; ``extra`` joins the printed report (a caller's own fields)."""
    out: dict[str, Any] = {
        "rank": int(os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))),
        "hostname": socket.gethostname(),  # where the rank ran (a mesh over several hosts)
        "mesh_id": os.environ.get("TT_MESH_ID"),
        "host_rank": os.environ.get("TT_MESH_HOST_RANK"),
        "visible": os.environ.get("TT_VISIBLE_DEVICES"),
        "mock": os.path.basename(os.environ.get("TT_METAL_MOCK_CLUSTER_DESC_PATH", "")) or None,
        **(extra or {}),
    }
    stages = bool(os.environ.get(STAGES))
    if stages:  # ttmesh's pre-flight: this interpreter runs the probe
        print("PROBE-STAGE python", flush=True)
    try:
        import ttnn
    except ImportError as exc:
        out["error"] = f"ttnn is not importable in {sys.executable}: {exc}"
        print("PROBE " + json.dumps(out), flush=True)
        os._exit(3)
    if stages:  # ... and imported ttnn: a crash from here on is tt-metal's
        print("PROBE-STAGE ttnn", flush=True)
    try:
        out["mesh_ids"] = sorted(int(m) for m in ttnn.get_all_fabric_mesh_ids())
        desc = ttnn._ttnn.multi_device.SystemMeshDescriptor()
        out["global"] = list(desc.shape())
        out["local"] = list(desc.local_shape())
        if not os.environ.get("TT_METAL_MOCK_CLUSTER_DESC_PATH"):
            out["collective"] = collective(ttnn, out["local"])
        ok = True
    except Exception as exc:  # tt-metal's refusal is the answer
        lines = [ln for ln in str(exc).splitlines() if ln.strip() and not ln.startswith(" ---")]
        out["error"] = " | ".join(lines)[:800]
        ok = False
    print("PROBE " + json.dumps(out), flush=True)
    if not ok:
        os._exit(1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
