"""Leaving a run together: the workers check out through the process group's store."""

from __future__ import annotations

import time

import torch.distributed as dist


def leave_together(rank: int, world: int, timeout_s: float) -> None:
    """Check out of the run through the process group's store (hosted by rank 0): every worker has
    finished its last operation, so no gloo traffic is needed (with gloo's lazy connections, a
    collective barrier would open pairs that never talked, through a store that rank 0 may
    already be tearing down). Rank 0 stays until every worker has checked out. Raises
    TimeoutError when ``timeout_s`` passes first."""
    store = dist.distributed_c10d._get_default_store()
    store.add("testbed/checked_out", 1)
    if rank != 0:
        return
    deadline = time.monotonic() + timeout_s
    while store.add("testbed/checked_out", 0) < world:
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {store.add('testbed/checked_out', 0)} of {world} workers checked out")
        time.sleep(0.01)
