"""The prefill stream's process (BubbleTea, ``prefill_stream.py``): what the worker sends it
(``Part``s of passes, over a pipe), the counters it writes for the worker (shared memory, a slot
per pass), and its body: it computes the passes' blocks in ``SCHED_IDLE``, keeps the requests'
KV caches, and hands finished ones to the decode host (``kv_sender.py``)."""

from __future__ import annotations

import os
import signal
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
from testbed.lifetime import die_with_parent
from testbed.thread_slice import DEFAULT_SLICE_NS, slice_or_report
from testbed.trace.task_names import KV_SUFFIX, name_this_thread

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
ERROR, RELEASED, _FIRST_SLOT, _PER_SLOT = 0, 1, 2, 3


def slot_at(slot: int) -> int:
    """Where ``slot``'s counters begin in the shared array."""
    return _FIRST_SLOT + _PER_SLOT * slot


@dataclass(frozen=True)
class Part:
    """One request's chunk in a pass: its tokens (int64 bytes) at positions ``start``.. of
    request ``rid``."""

    rid: int
    start: int
    tokens: bytes


class StreamProcess:
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
            i = slot_at(slot)
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
        i = slot_at(slot)
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
        self.shared[ERROR] = 1  # before any wait on a pass ends: the waiter's check() then raises
        for slot in [*self.passes, *([self.taking] if self.taking is not None else [])]:
            self.shared[slot_at(slot) + 1] = self.model.cfg.n_layers
        self.passes.clear()
        self.taking = None


def serve_stream(
    conn: Connection, shared: Any, model: InferenceModel, decode_addr: str | None, worker_pid: int, name: str
) -> None:
    """The stream process's body; ``name``: the process's (``trace.task_names.STREAM``; its KV
    sender's thread: ``task_names.KV_SENDER``)."""
    die_with_parent(signal.SIGKILL, worker_pid)
    name_this_thread(name)
    slice_or_report(DEFAULT_SLICE_NS)  # and this: not the training worker's shorter slice (``thread_slice.py``)
    torch.set_num_threads(1)

    def release(n: int) -> None:
        shared[RELEASED] += n  # only the sender's thread writes it

    # its thread is made before this one turns SCHED_IDLE, and named apart (``task_names.KV_SENDER``)
    sender = KVSender(decode_addr, release, name + KV_SUFFIX)
    stream = StreamProcess(conn, shared, model, sender)
    os.sched_setscheduler(0, SCHED_POLICY, os.sched_param(0))  # this (main) thread only
    stream.serve()
