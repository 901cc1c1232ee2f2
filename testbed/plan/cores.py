"""Independent simulations spread over this machine's cores: a pool of processes started by fork
where that is safe, the calling process alone elsewhere.

Safe where the caller is the main process and runs one thread. A fork copies only the calling
thread, so a lock another thread held stays held in the child (Dask's workers run their tasks in
threads); and inside a worker of a pool (a sweep's points, ``sim/sweep.py``) the cores are taken
already. The results are the same either way: each item is computed by the same function, and the
list keeps the items' order.

Pure apart from the worker processes, which end with the call, or with the caller if it is killed.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import TypeVar

from testbed.lifetime import die_with_parent

T = TypeVar("T")
R = TypeVar("R")


def usable_cores() -> int:
    """The cores this process may run on (its affinity: ``taskset`` narrows it), at least 1."""
    return len(os.sched_getaffinity(0)) or 1


def fork_is_safe() -> bool:
    """Whether a fork-started pool may serve this caller: the main process (no parent of this
    package's or a pool's making: ``multiprocessing.parent_process``), running one thread."""
    return multiprocessing.parent_process() is None and threading.active_count() == 1


def map_over_cores(fn: Callable[[T], R], items: Sequence[T], worth: bool = True) -> list[R]:
    """``[fn(x) for x in items]``, on up to ``usable_cores()`` processes where ``worth`` (the
    caller's judgement that the items take far longer than starting a pool: about 6 ms here,
    ``scripts/bench_sim.py``), there is more than one item and core, and a fork is safe
    (``fork_is_safe``); in this process otherwise. ``fn`` must be a module's function, its items
    and results picklable. An exception ``fn`` raises is raised here."""
    processes = min(len(items), usable_cores())
    if not worth or processes < 2 or not fork_is_safe():
        return [fn(x) for x in items]
    # a worker dies with this process, even one killed with -9: the pool's queue never tells it
    # (each worker holds both of the queue's ends from the fork)
    with ProcessPoolExecutor(
        processes,
        mp_context=multiprocessing.get_context("fork"),
        initializer=die_with_parent,
        initargs=(signal.SIGKILL, os.getpid()),
    ) as pool:
        return list(pool.map(fn, items))
