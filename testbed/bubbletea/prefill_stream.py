"""The emulated GPU's low-priority stream that prefill runs on (BubbleTea).

On a GPU, prefill launched on a stream of lower priority than training's yields to training's
kernels as soon as they are launched: "work in a higher priority stream may preempt work already
executing in a low priority stream" (CUDA C++ Programming Guide, section "Stream Priorities"; on
compute capability 3.5 and later, at thread-block granularity, microseconds). The emulator keeps
that split between what is computed and when:

- **what**: a ``PrefillStream`` thread computes the blocks of the worker's forward passes for real
  (``chunk_batch.ChunkBatch.step``), one block at a time, the pass the worker is paying for first,
  then any other pass not yet computed (a pass stopped in an earlier bubble goes on being computed
  while training runs: its results are only used once the pass has had all its GPU time);
- **when**: the worker's own thread gives a pass emulated GPU time only inside bubbles
  (``prefill.PrefillServer._run_pass``), and stops giving it the moment training's data arrives,
  wherever the pass is, as the high-priority stream's kernel would take the SMs. A pass is done
  when it has had its whole target time and its blocks are computed; a bubble that has given a pass
  its whole target time and still waits for the CPU to finish its blocks is an overrun, counted.

torch releases the GIL while an operation computes, so the worker's thread sees training's data
arrive within its poll interval while this thread computes.
"""

from __future__ import annotations

import os
import sys
import threading
import time

from testbed.bubbletea.passes import Pass

#: the stream thread's nice value, the lowest: the CPU's counterpart of a low-priority stream, so
#: that its real compute takes what training's leaves. On this 2-core machine (default experiment,
#: 4 requests/s, every bubble filled, `compare --repeat 5`, 2026-12-03) training's compute overran
#: its targets on 0-1.2% of operations at nice 19, 0.3-4.9% at nice 10
NICE = 19
#: how often (s) Python hands the interpreter between the worker's threads (default 5 ms): the
#: worker's own thread must see training's data within a fraction of a millisecond while the
#: stream's thread runs Python between torch operations
SWITCH_INTERVAL_S = 0.0005


class PrefillStream:
    """One worker's prefill stream: passes given with ``run`` are computed block by block, the one
    most recently given first. Errors of a block are raised again, in the worker's thread, by
    ``check`` (called after each slice of GPU time). ``close`` ends the thread."""

    def __init__(self) -> None:
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        self._cv = threading.Condition()
        self._pending: list[Pass] = []  # passes not yet computed, in the order given
        self._preferred: Pass | None = None
        self._closed = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="prefill-stream", daemon=True)
        self._thread.start()

    def run(self, work: Pass) -> None:
        """Compute ``work`` (if not computed yet), before any other pass."""
        with self._cv:
            if not work.computed.is_set() and work not in self._pending:
                self._pending.append(work)
            self._preferred = work
            self._cv.notify()

    def check(self) -> None:
        """Raise, in the caller's thread, what a block raised in the stream's."""
        if self._error is not None:
            raise self._error

    def _next(self) -> Pass | None:
        with self._cv:
            while not self._pending and not self._closed:
                self._cv.wait()
            if self._closed:
                return None
            if self._preferred in self._pending:
                return self._preferred
            return self._pending[0]

    def _loop(self) -> None:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)  # this thread only (Linux)
        while (work := self._next()) is not None:
            t = time.monotonic_ns()
            try:
                work.batch.step()
            except BaseException as e:  # noqa: BLE001 - handed to the worker's thread by check()
                self._error = e
                work.computed.set()  # wake a wait on it; check() raises
                with self._cv:
                    self._pending.remove(work)
                continue
            work.real_ns += time.monotonic_ns() - t
            if work.batch.done:
                with self._cv:
                    self._pending.remove(work)
                work.computed.set()

    def close(self, timeout_s: float = 5.0) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join(timeout_s)
