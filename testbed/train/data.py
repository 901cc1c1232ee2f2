"""Training data as tensors: the corpus (``corpus.py``) tokenised at the byte level (token = byte
value, vocab 256). The first 90% of the corpus trains, the rest validates. Batches are drawn at
seeded random offsets, one generator per iteration, so every worker and the single-process
reference agree.
"""

from __future__ import annotations

from pathlib import Path

import torch

from testbed.train.corpus import (
    DEFAULT_MAX_BYTES,
    TRAIN_FRACTION,
    DataError,
    corpus_bytes,
    corpus_sha256,
    train_split_bytes,
)

__all__ = ["TRAIN_FRACTION", "batch", "load_corpus", "split"]


def load_corpus(path: Path | None = None, max_bytes: int = DEFAULT_MAX_BYTES) -> tuple[torch.Tensor, str]:
    """(uint8 tensor of the corpus bytes, sha256 of them). Raises DataError if empty."""
    blob = corpus_bytes(path, max_bytes)
    return torch.frombuffer(bytearray(blob), dtype=torch.uint8), corpus_sha256(blob)


def split(corpus: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    cut = train_split_bytes(len(corpus))
    return corpus[:cut], corpus[cut:]


def batch(
    tokens: torch.Tensor, n_seqs: int, seq_len: int, seed: int, iteration: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of one iteration: (n_seqs, seq_len) inputs and next-byte targets (int64)."""
    if len(tokens) <= seq_len:
        raise DataError(f"the corpus has {len(tokens)} bytes, fewer than seq_len + 1 = {seq_len + 1}")
    g = torch.Generator().manual_seed(seed * 1_000_003 + iteration)
    starts = torch.randint(0, len(tokens) - seq_len, (n_seqs,), generator=g)
    x = torch.stack([tokens[s : s + seq_len] for s in starts.tolist()]).long()
    y = torch.stack([tokens[s + 1 : s + 1 + seq_len] for s in starts.tolist()]).long()
    return x, y
