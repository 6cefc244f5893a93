"""The symmetric DRAM reservation for collectives (``LIBTT_SYMMETRIC_DRAM_MB``).

TT-NN collectives write to their peers at the address of their own buffer, and separate
processes do not allocate in the same order, so every rank reserves the same region of each
chip's DRAM when it starts. The value must therefore be equal on every rank, and it must leave
room for the job itself: at least 1 GiB of the smallest selected chip's DRAM stays free.
"""

from __future__ import annotations

from ttmesh.errors import bad_input

DEFAULT_MB = 2048
KEEP_FREE_MB = 1024


def plan(requested_mb: int | None, dram_mb: list[int]) -> int:
    """The reservation for a job on chips with ``dram_mb`` each; bad input raises exit 2."""
    mb = DEFAULT_MB if requested_mb is None else requested_mb
    if isinstance(mb, bool) or not isinstance(mb, int) or mb <= 0:
        raise bad_input(
            f"--symmetric-dram-mb {requested_mb}: must be a positive whole number of MB",
            f"the default is {DEFAULT_MB}",
        )
    smallest = min(dram_mb) if dram_mb else 0
    if smallest and mb > smallest - KEEP_FREE_MB:
        raise bad_input(
            f"--symmetric-dram-mb {mb}: the smallest selected chip has {smallest} MB of DRAM and "
            f"at least {KEEP_FREE_MB} MB must stay free",
            f"use at most {smallest - KEEP_FREE_MB}",
        )
    return mb
