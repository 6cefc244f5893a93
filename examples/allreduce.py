"""A 4-chip hello world: each rank prints its rank and chip, then all-reduces with gloo.

Run it on the simulated QuietBox 2 (no hardware needed):

    ttmesh launch --sim quietbox2 --tp-size 4 examples/allreduce.py

It is a plain torch.distributed script (init_process_group with env://), so it runs unchanged
under torchrun too. Under ttmesh it also reports readiness and, when asked with --fabric, says it
brought the chips' Ethernet fabric up (what a tt-metal or libtt program does on hardware).
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist

try:  # optional: ttmesh's standard-library helper for readiness and fabric state
    from ttmesh import worker
except ImportError:  # plain torchrun: no readiness protocol
    worker = None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fabric", action="store_true", help="bring the fabric up first")
    args = parser.parse_args()
    if worker is not None and args.fabric:
        worker.wait_fabric(timeout=None)  # on a simulated host: blocks while a link is down
        worker.fabric_up()
    dist.init_process_group("gloo")  # env://: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank, world = dist.get_rank(), dist.get_world_size()
    if worker is not None:
        worker.ready()
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)  # sum of 1..world
    expected = world * (world + 1) / 2
    chip = os.environ.get("TT_VISIBLE_DEVICES", "?")
    status = "ok" if value.item() == expected else f"WRONG (expected {expected})"
    print(f"rank {rank}/{world} chip {chip}: all_reduce = {value.item():g} {status}", flush=True)
    dist.barrier()  # rank 0 hosts the rendezvous store: nobody leaves before everyone is done
    dist.destroy_process_group()
    if value.item() != expected:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
