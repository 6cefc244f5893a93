"""One rank of a tt-metal mesh over emulated hosts: ttmesh's own probe
(ttmesh/probes/ttnn_mesh_probe.py: ``PROBE {json}`` with the rank's hostname and what ttnn's
control plane, in mock mode, made of the mesh), with the rank's simulated root added.

``host_probe.py [HOST_RANKS]``: HOST_RANKS (e.g. ``1,0,2,3``) replaces the TT_MESH_HOST_RANK
ttmesh gave rank N by the Nth entry, to see tt-metal refuse host ranks swapped against the wiring.
Runs under ttnn's Python, which has no ttmesh: the probe is loaded from its file.
"""

import os
import sys
from pathlib import Path

rank = int(os.environ.get("RANK", "-1"))
if len(sys.argv) > 1:
    os.environ["TT_MESH_HOST_RANK"] = sys.argv[1].split(",")[rank]
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "ttmesh" / "probes"))
from ttnn_mesh_probe import main  # noqa: E402

sys.exit(main({"root": os.environ.get("TTMESH_ROOT")}))
