"""Joining a run's process group, and leaving the run together: the workers check out through
the process group's store."""

from __future__ import annotations

import time
from datetime import timedelta

import torch.distributed as dist

from testbed.plan.placement import rank_of
from testbed.plan.worker_config import WorkerConfig
from testbed.train.striping import one_connection_per_pair


def join(cfg: WorkerConfig, rank: int) -> dist.ProcessGroup:
    """Join the run's gloo process group as worker ``rank`` and make the data-parallel group of
    every pipeline stage (every worker makes every group, as torch.distributed requires, one
    connection per pair of workers: ``striping.one_connection_per_pair``); returns the group of
    ``rank``'s own stage. Raises what ``init_process_group`` raises, after ``cfg.timeout_s``."""
    exp = cfg.training
    dist.init_process_group(
        "gloo",
        init_method=cfg.init_method,
        rank=rank,
        world_size=len(cfg.workers),
        timeout=timedelta(seconds=cfg.timeout_s),
    )
    replicas = range(exp.replicas)
    with one_connection_per_pair():
        groups = [dist.new_group([rank_of(s, r, exp.replicas) for r in replicas]) for s in range(exp.stages)]
    return groups[cfg.worker(rank).stage]


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
