"""The worker's side of BubbleTea: prefill chunks run inside its pipeline bubbles.

A ``PrefillServer`` lives in each training worker beside its stage. The dispatcher sends it
requests over a Unix datagram socket (outside the emulated network); the worker calls ``fill``
at every bubble it knows of: after it has posted the receive that the next schedule action waits
for, it runs chunks of queued prompts (real forward passes of its inference model with a KV cache,
padded to the emulated GPU's time) for as long as each chunk is predicted to end ``guard`` before
the bubble does, and polls the receive while it pads. A finished prompt's KV cache goes, from a
background thread, over the emulated network (TCP) to the decode host of the worker's DC.

Wire format to the decode host: 8 bytes (header length, payload length; big-endian uint32 each),
a JSON header, then ``KVCache.to_bytes()``.
"""
from __future__ import annotations

import json
import queue
import socket
import struct
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

import torch

from . import trace as T
from .bubbletea import SlotPredictor, chunk_that_fits, may_start, prefill_seconds
from .inference import InferenceModel, KVCache, prefill_chunk, prompt_tokens_for
from .model import ModelConfig

DECODE_PORT = 29600
FRAME = struct.Struct(">II")
POLL_S = 0.00025  # how often a padding chunk looks whether the training input has arrived


@dataclass
class Job:
    """One request being prefilled on this worker."""

    rid: int
    arrival_ns: int
    tokens: torch.Tensor
    output_tokens: int
    pos: int = 0
    cache: KVCache | None = None
    logits: torch.Tensor | None = None
    first_start_ns: int | None = None


class PrefillServer:
    def __init__(self, spec: dict, s_per_flop: float, seed: int, rank: int, ev: T.EventWriter, inbox: str,
                 dispatcher: str, decode_addr: str | None, padded: bool) -> None:
        self.cfg = ModelConfig(**spec["model"])
        self.model = InferenceModel(self.cfg, seed)
        self.s_per_flop, self.seed, self.rank, self.ev, self.padded = s_per_flop, seed, rank, ev, padded
        self.guard_s = spec["guard_ms"] / 1000
        self.max_chunk = spec["max_chunk_tokens"]
        self.predictor = SlotPredictor(spec["profile_iterations"])
        self.jobs: deque[Job] = deque()
        self.inbox = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.inbox.bind(inbox)
        self.inbox.setblocking(False)
        self.dispatcher = dispatcher
        self.out = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.out.setblocking(False)
        self._kv: queue.Queue = queue.Queue()
        self._sender = threading.Thread(target=self._send_loop, args=(decode_addr,), daemon=True)
        self._sender.start()
        self.iteration = 0

    # --------------------------------------------------------------- requests in
    def poll_inbox(self) -> None:
        while True:
            try:
                msg = json.loads(self.inbox.recv(512))
            except BlockingIOError:
                return
            self.jobs.append(Job(msg["rid"], msg["arrival_ns"], prompt_tokens_for(msg["rid"], msg["prompt"], self.seed),
                                 msg["output"]))

    # --------------------------------------------------------------- the bubbles
    def fill(self, slot: str, prev_end_ns: int, arrived: Callable[[], bool]) -> int | None:
        """Run prefill chunks in the bubble before ``slot``, which began at ``prev_end_ns`` (the end
        of this worker's previous compute). Returns when the training input arrived if it did while
        a chunk ran (else None: the caller's wait measures it)."""
        self.poll_inbox()
        predicted = self.predictor.predict(slot)
        ready_ns = None
        while self.jobs and predicted is not None and not arrived():
            job = self.jobs[0]
            elapsed = (T.now_ns() - prev_end_ns) / 1e9
            room = predicted - elapsed - self.guard_s
            n = chunk_that_fits(self.cfg, job.pos, job.tokens.numel() - job.pos, self.max_chunk, room, self.s_per_flop)
            if n == 0:
                break
            target_s = prefill_seconds(self.cfg, job.pos, n, self.s_per_flop)
            if not may_start(predicted, elapsed, target_s, self.guard_s):
                break
            ready_ns = self._run_chunk(job, n, target_s, arrived)
            if job.pos == job.tokens.numel():
                self.jobs.popleft()
                self._finish(job)
            if ready_ns is not None:
                break
        return ready_ns

    def _run_chunk(self, job: Job, n: int, target_s: float, arrived: Callable[[], bool]) -> int | None:
        t0 = T.now_ns()
        job.first_start_ns = job.first_start_ns or t0
        job.cache, job.logits = prefill_chunk(self.model, job.tokens[job.pos:job.pos + n], job.cache)
        real = T.now_ns() - t0
        ready_ns = None
        if self.padded:
            end = t0 + int(target_s * 1e9)
            while (left := end - T.now_ns()) > 0:
                if ready_ns is None and arrived():
                    ready_ns = T.now_ns()
                time.sleep(min(left / 1e9, POLL_S))
        if ready_ns is None and arrived():
            ready_ns = T.now_ns()
        t1 = T.now_ns()
        self.ev.write(T.PREFILL, t0, t1, **{T.ITERATION: self.iteration, T.MICROBATCH: -1}, real_ns=real,
                      padded_ns=t1 - t0, rid=job.rid, chunk_start=job.pos, tokens=n)
        job.pos += n
        return ready_ns

    def observe(self, slot: str, bubble_s: float) -> None:
        self.predictor.observe(slot, bubble_s)

    def backlog_s(self) -> float:
        return sum(prefill_seconds(self.cfg, j.pos, j.tokens.numel() - j.pos, self.s_per_flop) for j in self.jobs)

    def report(self, iteration: int, iteration_s: float) -> None:
        """Tell the dispatcher this worker's predicted bubbles and queued prefill (after each iteration)."""
        self.iteration = iteration + 1
        msg = {"ev": "profile", "rank": self.rank, "it": iteration, "bubble_s": self.predictor.per_iteration_s(),
               "largest_s": self.predictor.largest_s(), "iteration_s": iteration_s, "backlog_s": self.backlog_s()}
        try:
            self.out.sendto(json.dumps(msg).encode(), self.dispatcher)
        except OSError:
            pass

    # --------------------------------------------------------------- KV cache out
    def _finish(self, job: Job) -> None:
        header = {"rid": job.rid, "arrival_ns": job.arrival_ns, "worker": self.rank, "prompt_tokens": job.pos,
                  "output_tokens": job.output_tokens, "first_token": int(torch.argmax(job.logits)),
                  "prefill_start_ns": job.first_start_ns, "prefill_end_ns": T.now_ns()}
        self._kv.put((header, job.cache))

    def _send_loop(self, addr: str | None) -> None:
        sock = None
        while True:
            item = self._kv.get()
            if item is None:
                break
            if addr is None:
                continue
            header, cache = item
            payload = cache.to_bytes()
            header = {**header, "kv_bytes": len(payload), "sent_ns": T.now_ns()}
            data = json.dumps(header).encode()
            for _ in range(2):  # one reconnect if the decode host dropped the connection
                try:
                    if sock is None:
                        sock = socket.create_connection((addr, DECODE_PORT), timeout=30)
                    sock.sendall(FRAME.pack(len(data), len(payload)) + data + payload)
                    break
                except OSError:
                    if sock is not None:
                        sock.close()
                    sock = None
        if sock is not None:
            sock.close()

    def close(self, timeout_s: float = 30.0) -> None:
        """Send what is finished, then stop (requests still queued are dropped: never completed)."""
        self._kv.put(None)
        self._sender.join(timeout=timeout_s)
        self.inbox.close()
        self.out.close()
