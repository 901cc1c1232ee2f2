"""Python's cyclic garbage collector held off while a simulation runs (``grant_sim.simulate``).

A simulation makes no reference cycles as it goes, but its live transfers (millions at the
paper's scale: named tuples, which the collector never stops tracking) made each collection long:
one atlas iteration at 8,192 GPUs took 6.88 s on one core with the collector and 3.82 s without
(``scripts/bench_sim.py``'s one-core figure just before and after the pause was added in e41dc67,
2026-12-07).

Process-wide state: while any thread's simulation runs, no thread's garbage is collected; the
collector comes back, as it was before the first, when the last ends.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_running = 0  # simulations inside collector_paused now
_was_enabled = False  # the collector's state when the first of them began


@contextmanager
def collector_paused() -> Iterator[None]:
    """The collector held off for the block (a decorator too), then as it was before the first
    such block still running began."""
    global _running, _was_enabled
    with _lock:
        if _running == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _running += 1
    try:
        yield
    finally:
        with _lock:
            _running -= 1
            if _running == 0 and _was_enabled:
                gc.enable()
