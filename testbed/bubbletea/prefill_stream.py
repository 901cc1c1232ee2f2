"""The emulated GPU's low-priority stream that prefill runs on (BubbleTea).

On a GPU, prefill launched on a stream of lower priority than training's yields to training's
kernels as soon as they are launched: "work in a higher priority stream may preempt work already
executing in a low priority stream" (CUDA C++ Programming Guide, section "Stream Priorities"; on
compute capability 3.5 and later, at thread-block granularity, microseconds). The emulator keeps
that split between what is computed and when:

- **what**: a ``PrefillStream`` thread (``SCHED_IDLE``) computes the blocks of the worker's
  forward passes for real (``chunk_batch.ChunkBatch.step``), one block at a time, the pass the
  worker is paying for first, then any other pass not yet computed (a pass stopped in an earlier
  bubble goes on being computed while training runs: its results are only used once the pass has
  had all its GPU time);
- **when**: the worker's own thread gives a pass emulated GPU time only inside bubbles
  (``prefill.PrefillServer._run_pass``), and stops giving it the moment training's data arrives,
  wherever the pass is, as the high-priority stream's kernel would take the SMs. A pass is done
  when it has had its whole target time and its blocks are computed; a bubble that has given a pass
  its whole target time and still waits for the CPU to finish its blocks is an overrun, counted.

torch releases the GIL while an operation computes, so the worker's thread, woken by the thread
that sees training's data arrive (``train/arrival.py``), runs while this thread computes.
"""

from __future__ import annotations

import os
import sys
import threading
import time

from testbed.bubbletea.passes import Pass

#: the stream thread's scheduling class: SCHED_IDLE, the CPU's counterpart of a low-priority
#: stream. A waking thread of any other class preempts a SCHED_IDLE one at once (the kernel's
#: wake-up preemption, kernel/sched/fair.c), so the worker's thread takes the CPU back the moment
#: training's data arrives; at nice 19 the fair scheduler may let the stream finish its slice
#: first (EEVDF's run-to-parity). On four_dc at 4 requests/s (16 iterations, two interleaved
#: pairs, 2026-12-04), against nice 19: iteration time 1.069-1.078 -> 1.060-1.062 s, operations
#: started over 1 ms after their input 93-97 -> 80-85 of 672, prefill slices overrunning
#: 3.3-4.0% -> 0.9-2.2% (at nice 10, on the default experiment, training's own compute overran)
SCHED_POLICY = os.SCHED_IDLE
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
        os.sched_setscheduler(threading.get_native_id(), SCHED_POLICY, os.sched_param(0))  # this thread only
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
