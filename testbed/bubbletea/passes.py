"""What a worker's prefill keeps (BubbleTea, ``prefill.py``): a request being prefilled (``Job``)
and one forward pass over chunks of one or more of them (``Pass``)."""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass, field

import torch

from testbed.bubbletea.chunk_batch import ChunkBatch
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
