"""The emulated GPU's low-priority stream that prefill runs on (BubbleTea): a process of its own.

On a GPU, prefill launched on a stream of lower priority than training's yields to training's
kernels as soon as they are launched: "work in a higher priority stream may preempt work already
executing in a low priority stream" (CUDA C++ Programming Guide, section "Stream Priorities"; on
compute capability 3.5 and later, at thread-block granularity, microseconds). The emulator keeps
that split between what is computed and when:

- **what**: the worker's ``PrefillStream`` process (``SCHED_IDLE``) computes the blocks of the
  worker's forward passes for real (``chunk_batch.ChunkBatch.step``), one block at a time, the
  pass the worker is paying for first, then any other pass not yet computed (a pass stopped in an
  earlier bubble goes on being computed while training runs: its results are only used once the
  pass has had all its GPU time). It holds the requests' KV caches (their tokens come with each
  pass, chunk by chunk), and hands each finished cache to the decode host (``kv_sender.py``);
- **when**: a thread of the worker gives a pass emulated GPU time only inside bubbles
  (``prefill.PrefillServer._run_pass``, from ``prefill.Fill``), and stops giving it the moment
  training's data arrives (its GPU time ending at the arrival),
  wherever the pass is, as the high-priority stream's kernel would take the SMs. A pass is done
  when it has had its whole target time and its blocks are computed; a bubble that has given a pass
  its whole target time and still waits for the CPU to finish its blocks is an overrun, counted.

A process rather than a thread of the worker: a thread would share the worker's interpreter lock,
which it holds between its many small torch operations, so that the worker's thread, woken by
training's data, waited for it (and a ``SCHED_IDLE`` thread set aside by the kernel while holding
the lock held training back until the kernel ran it again). The worker's side only sends
messages (a pipe) and reads counters the process writes (shared memory): each pass's blocks
computed and real compute time, and the bytes of KV caches handed off. A pass's counters sit in
a slot; the process writes, first, which pass it has taken up there, so that the worker never
reads a slot's earlier pass's counters as its new pass's.
"""

from __future__ import annotations

import ctypes
import itertools
import multiprocessing as mp
import os
from collections import deque
from typing import Any

import torch

from testbed.bubbletea.inference import InferenceModel
from testbed.bubbletea.kv_cache import KVCache
from testbed.bubbletea.stream_process import ERROR, RELEASED, SLOTS, Part, serve_stream, slot_at


class PrefillStream:
    """One worker's prefill stream of ``model``, a process forked from the worker: passes given with ``add``
    are computed block by block, the one most recently ``run`` first. Errors of the process are
    raised again, in the worker's thread, by ``check`` (called after each slice of GPU time).
    Finished requests go to the decode host at ``decode_addr`` (``finish``; None: dropped), their
    bytes added to ``released_bytes`` once handed off. ``close`` sends what is finished and ends
    the process."""

    def __init__(self, model: InferenceModel, decode_addr: str | None, name: str = "prefill-stream") -> None:
        ctx = mp.get_context("fork")  # the worker's model and imports, shared copy-on-write
        self.n_layers = model.cfg.n_layers
        self._shared = ctx.RawArray(ctypes.c_int64, slot_at(SLOTS))
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=serve_stream,
            args=(child, self._shared, model, decode_addr, os.getpid(), name),
            name="prefill-stream",
            daemon=True,
        )
        self._proc.start()
        child.close()
        self._free = deque(range(SLOTS))  # the longest free first
        self._owner = [0] * SLOTS  # the pass (its id, from 1) each slot was last given
        self._ids = itertools.count(1)

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    # ------------------------------------------------------------------ passes
    def add(self, parts: list[Part]) -> int | None:
        """Give the stream a new pass over ``parts``; returns its slot (None: no slot free)."""
        if not self._free:
            return None
        slot = self._free.popleft()
        self._owner[slot] = pass_id = next(self._ids)
        self._conn.send(("pass", slot, pass_id, parts))
        return slot

    def run(self, slot: int) -> None:
        """Compute the pass in ``slot`` (if not computed yet) before any other."""
        self._conn.send(("run", slot))

    def layers_done(self, slot: int) -> int:
        return self._counters(slot)[0]

    def computed(self, slot: int) -> bool:
        return self.layers_done(slot) == self.n_layers

    def real_ns(self, slot: int) -> int:
        """Real compute of the pass's blocks so far (ns)."""
        return self._counters(slot)[1]

    def _counters(self, slot: int) -> tuple[int, int]:
        """(blocks computed, real ns) of the pass in ``slot``: none before the process has taken it up."""
        i = slot_at(slot)
        if self._shared[i] != self._owner[slot]:
            return 0, 0
        return self._shared[i + 1], self._shared[i + 2]

    def done(self, slot: int) -> None:
        """The pass in ``slot`` has had its GPU time and its blocks: its requests' caches and
        logits become its results, and the slot is free again."""
        self._conn.send(("done", slot))
        self._free.append(slot)

    def drop(self, slot: int) -> None:
        """Forget the pass in ``slot``, done or not (its results are not kept): the slot is free."""
        self._conn.send(("drop", slot))
        self._free.append(slot)

    # ------------------------------------------------------------------ requests
    def finish(self, rid: int, header: dict[str, Any], held_bytes: int) -> None:
        """Request ``rid`` is prefilled: send its KV cache with ``header`` (its first token added)
        to the decode host, then count ``held_bytes`` in ``released_bytes``."""
        self._conn.send(("finish", rid, header, held_bytes))

    def released_bytes(self) -> int:
        """KV cache bytes handed to the decode host (or given up) so far."""
        return self._shared[RELEASED]

    def result(self, rid: int, timeout_s: float = 30.0) -> tuple[KVCache, torch.Tensor]:
        """Request ``rid``'s KV cache and last logits (vocab,) so far, for inspection (tests), from
        the thread that gives passes GPU time and never while it does. Raises what the process
        raised, or TimeoutError."""
        self._conn.send(("result", rid))
        if not self._conn.poll(timeout_s):
            raise TimeoutError(f"the prefill stream did not answer for request {rid} within {timeout_s} s")
        reply = self._conn.recv()
        if reply[0] == "error":
            raise reply[1]
        _, cache, logits = reply
        return KVCache.from_bytes(cache), torch.frombuffer(bytearray(logits), dtype=torch.float32)

    def check(self) -> None:
        """Raise, in the caller's thread, what the stream's process raised (each error once)."""
        if self._shared[ERROR] and self._conn.poll():
            try:
                _, error = self._conn.recv()
            except EOFError:  # the process has ended: nothing more to hand over
                return
            finally:
                self._shared[ERROR] = 0
            raise error

    def close(self, timeout_s: float = 30.0) -> None:
        """Send the finished KV caches (within ``timeout_s``), then end the process. Raises what
        it raised meanwhile."""
        if self._proc.is_alive():
            try:
                self._conn.send(("close", timeout_s))
            except OSError:
                pass
            self._proc.join(timeout_s + 5)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()
        try:
            self.check()
        finally:
            self._conn.close()
