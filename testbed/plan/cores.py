"""Independent simulations spread over this machine's cores: a pool of processes started by fork,
where the program allows it and a fork is safe, the calling process alone elsewhere.

Allowed: only inside ``processes_allowed()``, which an entry point opens (``testbed sim``,
``testbed plan``, the benchmarks): ``plan/`` starts no process of its own accord, so a program that
embeds it (the runner, which plans with the network up; a sweep's workers, whose points already
take every core) computes in its own process unless it says otherwise.
Safe: the caller is the main process and runs one thread. A fork copies only the calling thread,
so a lock another thread held stays held in the child (Dask's workers run their tasks in
threads); and inside a worker of a pool the cores are taken already.
The results are the same either way: each item is computed by the same function, and the list
keeps the items' order.

Pure apart from the worker processes, which end with the call, or with the caller if it is killed;
an interrupted caller's workers end without a word (the caller reports the interruption).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from typing import TypeVar

from testbed.lifetime import die_with_parent

T = TypeVar("T")
R = TypeVar("R")

_allowed = False


@contextmanager
def processes_allowed() -> Iterator[None]:
    """Let ``map_over_cores`` start worker processes inside the block (a decorator too), then as
    before."""
    global _allowed
    before, _allowed = _allowed, True
    try:
        yield
    finally:
        _allowed = before


def usable_cores() -> int:
    """The cores this process may run on (its affinity: ``taskset`` narrows it)."""
    return len(os.sched_getaffinity(0))


def fork_is_safe() -> bool:
    """Whether a fork-started pool may serve this caller: the main process (no parent of this
    package's or a pool's making: ``multiprocessing.parent_process``), running one thread."""
    return multiprocessing.parent_process() is None and threading.active_count() == 1


def map_over_cores(fn: Callable[[T], R], items: Sequence[T], parallel: bool = True) -> list[R]:
    """``[fn(x) for x in items]``, on up to ``usable_cores()`` processes where ``parallel`` (the
    caller's judgement that the items take far longer than starting a pool: 5-11 ms on this 2-core
    VM, ``scripts/bench_sim.py``), inside ``processes_allowed()``, with more than one item and core,
    and where a fork is safe (``fork_is_safe``); in this process otherwise. ``fn`` must be a
    module's function (or a partial of one), its items and results picklable. An exception ``fn``
    raises in a worker is raised here where it survives pickling (an exception class whose
    ``__init__`` takes other arguments than its ``args`` comes back as ``BrokenProcessPool``)."""
    processes = min(len(items), usable_cores())
    if not parallel or not _allowed or processes < 2 or not fork_is_safe():
        return [fn(x) for x in items]
    with ProcessPoolExecutor(
        processes,
        mp_context=multiprocessing.get_context("fork"),
        initializer=_worker_starts,
        initargs=(os.getpid(),),
    ) as pool:
        return list(pool.map(fn, items))


def _worker_starts(parent_pid: int) -> None:
    """A pool worker's start: it dies with its caller, even one killed with -9 (the pool's queue
    never tells it: each worker holds both of the queue's ends from the fork), and a Ctrl-C, which
    the terminal sends to the caller too, ends it without a traceback."""
    signal.signal(signal.SIGINT, lambda *_: os._exit(128 + signal.SIGINT))
    die_with_parent(signal.SIGKILL, parent_pid)
