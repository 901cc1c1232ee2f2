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
import signal
import time
import traceback
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import torch

from testbed.bubbletea.chunk_batch import ChunkBatch
from testbed.bubbletea.inference import InferenceModel
from testbed.bubbletea.kv_cache import KVCache
from testbed.bubbletea.kv_sender import KVSender
from testbed.lifetime import die_with_parent

#: the stream process's scheduling class: SCHED_IDLE, the CPU's counterpart of a low-priority
#: stream. A waking thread of any other class preempts a SCHED_IDLE one at once (the kernel's
#: wake-up preemption, kernel/sched/fair.c), so the worker's thread takes the CPU back the moment
#: training's data arrives; at nice 19 the fair scheduler may let the stream finish its slice
#: first (EEVDF's run-to-parity). On four_dc at 4 requests/s (16 iterations, two interleaved
#: pairs, 2026-12-04, the stream then a thread), against nice 19: iteration time 1.069-1.078 ->
#: 1.060-1.062 s, operations started over 1 ms after their input 93-97 -> 80-85 of 672, prefill
#: slices overrunning 3.3-4.0% -> 0.9-2.2%. The KV sender's thread keeps the normal class.
SCHED_POLICY = os.SCHED_IDLE
#: passes a worker may have in the stream at once (stopped ones included): the shared counters'
#: places; a worker with none free starts no new pass until one is done (``add`` gives None)
SLOTS = 256
#: the shared counters: an error flag, the KV cache bytes handed off so far, then per slot
#: (the pass the process has taken up there, its blocks computed, its real compute ns)
_ERROR, _RELEASED, _FIRST_SLOT, _PER_SLOT = 0, 1, 2, 3


def _at(slot: int) -> int:
    """Where ``slot``'s counters begin in the shared array."""
    return _FIRST_SLOT + _PER_SLOT * slot


@dataclass(frozen=True)
class Part:
    """One request's chunk in a pass: its tokens (int64 bytes) at positions ``start``.. of
    request ``rid``."""

    rid: int
    start: int
    tokens: bytes


class PrefillStream:
    """One worker's prefill stream of ``model``, a process forked from the worker: passes given with ``add``
    are computed block by block, the one most recently ``run`` first. Errors of the process are
    raised again, in the worker's thread, by ``check`` (called after each slice of GPU time).
    Finished requests go to the decode host at ``decode_addr`` (``finish``; None: dropped), their
    bytes added to ``released_bytes`` once handed off. ``close`` sends what is finished and ends
    the process."""

    def __init__(self, model: InferenceModel, decode_addr: str | None) -> None:
        ctx = mp.get_context("fork")  # the worker's model and imports, shared copy-on-write
        self.n_layers = model.cfg.n_layers
        self._shared = ctx.RawArray(ctypes.c_int64, _at(SLOTS))
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=_serve,
            args=(child, self._shared, model, decode_addr, os.getpid()),
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
        i = _at(slot)
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
        return self._shared[_RELEASED]

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
        if self._shared[_ERROR] and self._conn.poll():
            try:
                _, error = self._conn.recv()
            except EOFError:  # the process has ended: nothing more to hand over
                return
            finally:
                self._shared[_ERROR] = 0
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


class _Stream:
    """The process's side: the KV caches of the worker's requests, and its passes."""

    def __init__(self, conn: Connection, shared: Any, model: InferenceModel, sender: KVSender) -> None:
        self.conn, self.shared, self.model, self.sender = conn, shared, model, sender
        self.caches: dict[int, KVCache] = {}
        self.logits: dict[int, torch.Tensor] = {}
        self.passes: dict[int, tuple[ChunkBatch, list[Part]]] = {}  # by slot, in the order given
        self.computed: dict[int, tuple[ChunkBatch, list[Part]]] = {}  # by slot, until done or dropped
        self.preferred: int | None = None
        self.taking: int | None = None

    def handle(self, msg: tuple) -> bool:
        """One message from the worker; False for ``close``."""
        kind = msg[0]
        if kind == "pass":
            _, slot, pass_id, parts = msg
            i = _at(slot)
            self.shared[i + 1] = self.shared[i + 2] = 0
            self.shared[i] = pass_id  # taken up: its counters are the worker's to read
            self.taking = slot  # a pass the model refuses: ``fail`` ends the worker's wait on it
            self.passes[slot] = (ChunkBatch(self.model, [self._part(p) for p in parts]), parts)
            self.taking = None
        elif kind == "run":
            self.preferred = msg[1]
        elif kind == "done":
            batch, parts = self.computed.pop(msg[1])
            for p, (cache, logits) in zip(parts, batch.result()):
                self.caches[p.rid], self.logits[p.rid] = cache, logits
        elif kind == "drop":
            self.passes.pop(msg[1], None)
            self.computed.pop(msg[1], None)
        elif kind == "finish":
            _, rid, header, held = msg
            logits = self.logits.pop(rid, None)
            header["first_token"] = int(torch.argmax(logits)) if logits is not None else None
            self.sender.put(header, self.caches.pop(rid, None), held)
        elif kind == "result":
            rid = msg[1]
            self.conn.send(("result", self.caches[rid].to_bytes(), self.logits[rid].numpy().tobytes()))
        elif kind == "close":
            self.sender.close(msg[1])
            return False
        return True

    def _part(self, p: Part) -> tuple[torch.Tensor, KVCache | None]:
        """A part's tokens and its request's cache so far, which must end where the chunk starts."""
        cache = self.caches.get(p.rid)
        held = cache.length if cache is not None else 0
        if held != p.start:
            raise RuntimeError(
                f"request {p.rid}: its chunk starts at position {p.start} but its KV cache holds {held} "
                "positions (a pass's results applied twice or not at all: a bug of the testbed)"
            )
        return torch.frombuffer(bytearray(p.tokens), dtype=torch.int64), cache

    def step(self) -> None:
        """Compute the next block of the preferred pass (or of the oldest not computed)."""
        slot = self.preferred if self.preferred in self.passes else next(iter(self.passes))
        batch, parts = self.passes[slot]
        t = time.monotonic_ns()
        batch.step()
        i = _at(slot)
        self.shared[i + 2] += time.monotonic_ns() - t
        if batch.done:  # its results are taken when the worker says it is done (its GPU time had)
            self.computed[slot] = self.passes.pop(slot)
        self.shared[i + 1] = batch.layers_done

    def serve(self) -> None:
        """Handle messages and compute blocks until ``close`` or the worker is gone."""
        while True:
            try:
                if not self.passes or self.conn.poll(0):
                    if not self.handle(self.conn.recv()):
                        return
                    continue
                self.step()
            except (EOFError, OSError):  # the worker is gone
                return
            except Exception as e:  # noqa: BLE001 - handed to the worker's thread by check()
                self.fail(e)

    def fail(self, e: Exception) -> None:
        """Hand ``e`` to the worker (``PrefillStream.check``); every pass not computed (and one the
        model refused) counts as computed, so that a wait on it ends."""
        try:
            self.conn.send(("error", e))
        except Exception:  # noqa: BLE001 - not picklable: its text instead
            self.conn.send(("error", RuntimeError("".join(traceback.format_exception(e)))))
        self.shared[_ERROR] = 1  # before any wait on a pass ends: the waiter's check() then raises
        for slot in [*self.passes, *([self.taking] if self.taking is not None else [])]:
            self.shared[_at(slot) + 1] = self.model.cfg.n_layers
        self.passes.clear()
        self.taking = None


def _serve(conn: Connection, shared: Any, model: InferenceModel, decode_addr: str | None, worker_pid: int) -> None:
    """The stream process's body."""
    die_with_parent(signal.SIGKILL, worker_pid)
    torch.set_num_threads(1)

    def release(n: int) -> None:
        shared[_RELEASED] += n  # only the sender's thread writes it

    sender = KVSender(decode_addr, release)  # its thread is made before this one turns SCHED_IDLE
    stream = _Stream(conn, shared, model, sender)
    os.sched_setscheduler(0, SCHED_POLICY, os.sched_param(0))  # this (main) thread only
    stream.serve()
