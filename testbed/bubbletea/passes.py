"""What a worker's prefill keeps of its work (BubbleTea, ``prefill.py``): a request being prefilled
(``Job``) and one forward pass over chunks of one or more of them (``Pass``). A request's KV
cache is in the prefill stream's process (``prefill_stream.py``); a pass's chunks go there with it."""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import torch

from testbed.bubbletea.inference import prompt_tokens_for, prompt_tokens_from
from testbed.trace import schema as T


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
        """What goes to the decode host with its finished KV cache (``kv_sender.py``; the prefill
        stream adds its first token, ``first_token``)."""
        return {
            "rid": self.rid,
            "arrival_ns": self.arrival_ns,
            "worker": worker,
            "prompt_tokens": self.pos,
            "output_tokens": self.output_tokens,
            "prefill_start_ns": self.first_start_ns,
            "prefill_end_ns": end_ns,
        }


@dataclass(eq=False)  # a pass is itself: compared by identity
class Pass:
    """One forward pass over chunks of ``jobs`` (``tokens`` each), ``target_s`` padded seconds of
    the emulated GPU in all. Its blocks are computed by the prefill stream (``prefill_stream.py``)
    in its ``slot``; the worker gives it GPU time in bubbles (``paid_s`` so far) and, when
    training's data arrives first, keeps it stopped until a later bubble resumes it."""

    slot: int
    jobs: list[Job]
    tokens: list[int]
    target_s: float
    #: the order passes were made in: ``stopped`` keeps the oldest first
    seq: int = 0
    #: the bubbles it has had GPU time in so far
    slices: int = 0
    #: emulated GPU seconds given to it so far (it is done at ``target_s``, once computed)
    paid_s: float = 0.0
    #: how much of its blocks' real compute (ns) slices have reported
    reported_real_ns: int = 0

    @property
    def left_s(self) -> float:
        """Emulated GPU seconds it still needs."""
        return max(0.0, self.target_s - self.paid_s)

    def end_slice(self, real_ns: int, done: bool) -> dict[str, int | str]:
        """Count a slice (one bubble's GPU time) as ended, the stream having computed ``real_ns`` of
        its blocks in all so far, ``done`` whether it completed the pass; returns the fields of the
        slice's ``T.PREFILL`` event that the pass knows: its real compute since the last slice, its
        first request's id and chunk start, its tokens (a pass's count once, on the slice that
        completes it) and its chunks (``rid:start:tokens``, ``;``-separated)."""
        first = self.jobs[0]
        fields: dict[str, int | str] = {
            "real_ns": real_ns - self.reported_real_ns,
            "rid": first.rid,
            "chunk_start": first.pos,
            "tokens": sum(self.tokens) if done else 0,
            T.CHUNKS: ";".join(f"{j.rid}:{j.pos}:{n}" for j, n in zip(self.jobs, self.tokens)),
        }
        self.reported_real_ns, self.slices = real_ns, self.slices + 1
        return fields


def keep_stopped(stopped: list[Pass], work: Pass) -> None:
    """Put ``work``, stopped at a layer boundary, among ``stopped`` for a later bubble: oldest
    first (by ``seq``), the order ``decisions.choose_work`` resumes them in."""
    bisect.insort(stopped, work, key=lambda p: p.seq)
