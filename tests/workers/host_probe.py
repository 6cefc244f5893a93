"""One rank of a tt-metal mesh over emulated hosts: which host it ran on, and what ttnn's control
plane (mock mode) made of the mesh. Prints ``PROBE {json}``; a refused rank leaves with
os._exit(1) (a normal exit would wait in MPI finalisation for peers blocked in a collective).

``host_probe.py [HOST_RANKS]``: HOST_RANKS (e.g. ``1,0,2,3``) replaces the TT_MESH_HOST_RANK
ttmesh gave rank N by the Nth entry, to see tt-metal refuse host ranks swapped against the wiring.
"""

import json
import os
import socket
import sys

rank = int(os.environ.get("RANK", "-1"))
if len(sys.argv) > 1:
    os.environ["TT_MESH_HOST_RANK"] = sys.argv[1].split(",")[rank]
out = {
    "rank": rank,
    "hostname": socket.gethostname(),
    "root": os.environ.get("TTMESH_ROOT"),
    "host_rank": os.environ.get("TT_MESH_HOST_RANK"),
}
try:
    import ttnn

    out["mesh_ids"] = sorted(int(m) for m in ttnn.get_all_fabric_mesh_ids())
    desc = ttnn._ttnn.multi_device.SystemMeshDescriptor()
    out["global"], out["local"] = list(desc.shape()), list(desc.local_shape())
    ok = True
except Exception as exc:  # tt-metal's refusal is the answer
    lines = [ln for ln in str(exc).splitlines() if ln.strip() and not ln.startswith(" ---")]
    out["error"] = " | ".join(lines)[:800]
    ok = False
print("PROBE " + json.dumps(out), flush=True)
if not ok:
    os._exit(1)
