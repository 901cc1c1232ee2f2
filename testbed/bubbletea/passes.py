"""What a worker's prefill keeps (BubbleTea, ``prefill.py``): a request being prefilled (``Job``)
and one forward pass over chunks of one or more of them (``Pass``)."""

from __future__ import annotations

import bisect
from dataclasses import dataclass

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


@dataclass
class Pass:
    """One forward pass over chunks of ``jobs`` (``tokens`` each), ``target_s`` padded seconds in
    all, run a block at a time by ``batch``; kept while stopped at a layer boundary (training's
    data arrived) until a later bubble resumes it."""

    batch: ChunkBatch
    jobs: list[Job]
    tokens: list[int]
    target_s: float
    #: the order passes were made in: ``stopped`` keeps the oldest first
    seq: int = 0


def keep_stopped(stopped: list[Pass], work: Pass) -> None:
    """Put ``work``, stopped at a layer boundary, among ``stopped`` for a later bubble: oldest
    first (by ``seq``), the order ``decisions.choose_work`` resumes them in."""
    bisect.insort(stopped, work, key=lambda p: p.seq)
