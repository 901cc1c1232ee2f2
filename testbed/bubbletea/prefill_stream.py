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
  pass has had all its GPU time). It holds the requests' prompts and KV caches, and hands each
  finished cache to the decode host (``kv_sender.py``);
- **when**: the worker's own thread gives a pass emulated GPU time only inside bubbles
  (``prefill.PrefillServer._run_pass``), and stops giving it the moment training's data arrives,
  wherever the pass is, as the high-priority stream's kernel would take the SMs. A pass is done
  when it has had its whole target time and its blocks are computed; a bubble that has given a pass
  its whole target time and still waits for the CPU to finish its blocks is an overrun, counted.

A process rather than a thread of the worker: a thread would share the worker's interpreter lock,
which it holds between its many small torch operations, so that the worker's thread, woken by
training's data, waited for it (and a ``SCHED_IDLE`` thread set aside by the kernel while holding
the lock held training back until the kernel ran it again). The worker's side only sends
messages (a pipe) and reads counters the process writes (shared memory): each pass's blocks
computed and real compute time, and the bytes of KV caches handed off.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import torch

from testbed.bubbletea.chunk_batch import ChunkBatch
from testbed.bubbletea.inference import InferenceModel
from testbed.bubbletea.kv_cache import KVCache
from testbed.bubbletea.kv_sender import KVSender

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
#: places; a worker with none free starts no new pass until one is done
SLOTS = 256
#: the shared counters: an error flag, the KV cache bytes handed off so far, then per slot
#: (blocks computed, real compute ns)
_ERROR, _RELEASED, _FIRST_SLOT = 0, 1, 2
#: Linux's prctl(PR_SET_PDEATHSIG): the stream ends with the worker, even one killed with -9
PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class Part:
    """One request's chunk in a pass: ``n`` tokens of request ``rid`` from position ``start``;
    ``prompt`` (int64 bytes) with a request's first chunk, which the stream has not seen yet."""

    rid: int
    start: int
    n: int
    prompt: bytes | None = None


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
        self._shared = ctx.RawArray(ctypes.c_int64, _FIRST_SLOT + 2 * SLOTS)
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=_serve, args=(child, self._shared, model, decode_addr), name="prefill-stream", daemon=True
        )
        self._proc.start()
        child.close()
        self._free = list(range(SLOTS - 1, -1, -1))

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    # ------------------------------------------------------------------ passes
    def add(self, parts: list[Part]) -> int | None:
        """Give the stream a new pass over ``parts``; returns its slot (None: no slot free)."""
        if not self._free:
            return None
        slot = self._free.pop()
        self._shared[_FIRST_SLOT + 2 * slot] = self._shared[_FIRST_SLOT + 2 * slot + 1] = 0
        self._conn.send(("pass", slot, parts))
        return slot

    def run(self, slot: int) -> None:
        """Compute the pass in ``slot`` (if not computed yet) before any other."""
        self._conn.send(("run", slot))

    def layers_done(self, slot: int) -> int:
        return self._shared[_FIRST_SLOT + 2 * slot]

    def computed(self, slot: int) -> bool:
        return self.layers_done(slot) == self.n_layers

    def real_ns(self, slot: int) -> int:
        """Real compute of the pass's blocks so far (ns)."""
        return self._shared[_FIRST_SLOT + 2 * slot + 1]

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
        """Request ``rid``'s KV cache and last logits (vocab,) so far (for tests). Raises what
        the process raised, or TimeoutError."""
        self._conn.send(("result", rid))
        if not self._conn.poll(timeout_s):
            raise TimeoutError(f"the prefill stream did not answer for request {rid} within {timeout_s} s")
        reply = self._conn.recv()
        if reply[0] == "error":
            raise reply[1]
        _, cache, logits = reply
        return KVCache.from_bytes(cache), torch.frombuffer(bytearray(logits), dtype=torch.float32)

    def check(self) -> None:
        """Raise, in the caller's thread, what the stream's process raised."""
        if self._shared[_ERROR] and self._conn.poll():
            _, error = self._conn.recv()
            raise error

    def close(self, timeout_s: float = 30.0) -> None:
        """Send the finished KV caches (within ``timeout_s``), then end the process."""
        if self._proc.is_alive():
            try:
                self._conn.send(("close", timeout_s))
            except OSError:
                pass
            self._proc.join(timeout_s + 5)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()
        self._conn.close()


class _Stream:
    """The process's side: the prompts and caches of the worker's requests, its passes."""

    def __init__(self, conn: Connection, shared: Any, model: InferenceModel, sender: KVSender) -> None:
        self.conn, self.shared, self.model, self.sender = conn, shared, model, sender
        self.prompts: dict[int, torch.Tensor] = {}
        self.caches: dict[int, KVCache] = {}
        self.logits: dict[int, torch.Tensor] = {}
        self.passes: dict[int, tuple[ChunkBatch, list[Part]]] = {}  # by slot, in the order given
        self.computed: dict[int, tuple[ChunkBatch, list[Part]]] = {}  # by slot, until done or dropped
        self.preferred: int | None = None

    def handle(self, msg: tuple) -> bool:
        """One message from the worker; False for ``close``."""
        kind = msg[0]
        if kind == "pass":
            _, slot, parts = msg
            for p in parts:
                if p.prompt is not None:
                    self.prompts[p.rid] = torch.frombuffer(bytearray(p.prompt), dtype=torch.int64)
            self.passes[slot] = (
                ChunkBatch(
                    self.model, [(self.prompts[p.rid][p.start : p.start + p.n], self.caches.get(p.rid)) for p in parts]
                ),
                parts,
            )
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
            self.prompts.pop(rid, None)
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

    def step(self) -> None:
        """Compute the next block of the preferred pass (or of the oldest not computed)."""
        slot = self.preferred if self.preferred in self.passes else next(iter(self.passes))
        batch, parts = self.passes[slot]
        t = time.monotonic_ns()
        batch.step()
        i = _FIRST_SLOT + 2 * slot
        self.shared[i + 1] += time.monotonic_ns() - t
        if batch.done:  # its results are taken when the worker says it is done (its GPU time had)
            self.computed[slot] = self.passes.pop(slot)
        self.shared[i] = batch.layers_done

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
        """Hand ``e`` to the worker (``PrefillStream.check``); its pass counts as computed, so that
        a wait on it ends."""
        try:
            self.conn.send(("error", e))
        except Exception:  # noqa: BLE001 - not picklable: its text instead
            self.conn.send(("error", RuntimeError(traceback.format_exc())))
        self.shared[_ERROR] = 1
        for slot in list(self.passes):
            self.shared[_FIRST_SLOT + 2 * slot] = self.model.cfg.n_layers
        self.passes.clear()


def _serve(conn: Connection, shared: Any, model: InferenceModel, decode_addr: str | None) -> None:
    """The stream process's body."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:  # the worker died before the line above
        sys.exit(0)
    torch.set_num_threads(1)

    def release(n: int) -> None:
        shared[_RELEASED] += n  # only the sender's thread writes it

    sender = KVSender(decode_addr, release)  # its thread is made before this one turns SCHED_IDLE
    stream = _Stream(conn, shared, model, sender)
    os.sched_setscheduler(0, SCHED_POLICY, os.sched_param(0))  # this (main) thread only
    stream.serve()
