"""What a worker's prefill keeps (BubbleTea, ``prefill.py``): a request being prefilled (``Job``)
and one forward pass over chunks of one or more of them (``Pass``)."""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass, field

import torch

from testbed.bubbletea.chunk_batch import ChunkBatch
from testbed.bubbletea.inference import prompt_tokens_for, prompt_tokens_from
from testbed.bubbletea.kv_cache import KVCache


@dataclass
class Job:
    """One request being prefilled on this worker."""

    rid: int
    arrival_ns: int
    tokens: torch.Tensor
    output_tokens: int
    pos: int = 0
    #: the bytes of its whole prompt's KV cache, held against the memory budget once admitted
    kv_bytes: int = 0
    cache: KVCache | None = None
    logits: torch.Tensor | None = None
    first_start_ns: int | None = None

    @classmethod
    def of_request(cls, msg: dict, seed: int, corpus: torch.Tensor | None) -> Job:
        """The job of a request as the dispatcher sends it (``rid``, ``arrival_ns``, ``prompt`` and
        ``output`` lengths): its prompt real text of ``corpus`` (None: random byte ids, as a trace
        gives only lengths)."""
        rid, n = msg["rid"], msg["prompt"]
        tokens = prompt_tokens_for(rid, n, seed) if corpus is None else prompt_tokens_from(corpus, rid, n, seed)
        return cls(rid, msg["arrival_ns"], tokens, msg["output"])

    def handoff_header(self, worker: int, end_ns: int) -> dict:
        """What goes to the decode host with its finished KV cache (``kv_sender.py``)."""
        return {
            "rid": self.rid,
            "arrival_ns": self.arrival_ns,
            "worker": worker,
            "prompt_tokens": self.pos,
            "output_tokens": self.output_tokens,
            "first_token": int(torch.argmax(self.logits)) if self.logits is not None else None,
            "prefill_start_ns": self.first_start_ns,
            "prefill_end_ns": end_ns,
        }


@dataclass(eq=False)  # a pass is itself: compared by identity
class Pass:
    """One forward pass over chunks of ``jobs`` (``tokens`` each), ``target_s`` padded seconds of
    the emulated GPU in all. Its blocks are computed by the prefill stream (``prefill_stream.py``)
    into ``batch``; the worker gives it GPU time in bubbles (``paid_s`` so far) and, when training's
    data arrives first, keeps it stopped until a later bubble resumes it."""

    batch: ChunkBatch
    jobs: list[Job]
    tokens: list[int]
    target_s: float
    #: the order passes were made in: ``stopped`` keeps the oldest first
    seq: int = 0
    #: the bubbles it has had GPU time in so far
    slices: int = 0
    #: emulated GPU seconds given to it so far (it is done at ``target_s``, once computed)
    paid_s: float = 0.0
    #: real compute of its blocks so far (ns), and how much of it slices have reported
    real_ns: int = 0
    reported_real_ns: int = 0
    #: set by the prefill stream once every block is computed
    computed: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)

    @property
    def left_s(self) -> float:
        """Emulated GPU seconds it still needs."""
        return max(0.0, self.target_s - self.paid_s)


def keep_stopped(stopped: list[Pass], work: Pass) -> None:
    """Put ``work``, stopped at a layer boundary, among ``stopped`` for a later bubble: oldest
    first (by ``seq``), the order ``decisions.choose_work`` resumes them in."""
    bisect.insort(stopped, work, key=lambda p: p.seq)
