"""Training data: real text, tokenised at the byte level (token = byte value, vocab 256).

Default corpus: the Python standard library's own ``.py`` sources on this machine, read at run
time (never downloaded, never shipped), in sorted path order so that every worker sees the same
bytes. ``path`` may be any text file or folder (all regular files below it, sorted). The first
90% of the corpus trains, the rest validates. Batches are drawn at seeded random offsets, one
generator per iteration, so every worker and the single-process reference agree.
"""
from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path

import torch

from .errors import TestbedError

DEFAULT_MAX_BYTES = 32 * 2**20
TRAIN_FRACTION = 0.9


class DataError(TestbedError):
    """The corpus is missing, empty or too small for the sequence length."""


def default_corpus_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def corpus_files(path: Path | None) -> list[Path]:
    if path is None:
        root = default_corpus_dir()
        return sorted(p for p in root.glob("*.py") if p.is_file())
    path = Path(path)
    if path.is_file():
        return [path]
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.is_file())
    raise DataError(f"--data {path}: no such file or folder; give a text file or a folder of text files")


def corpus_bytes(path: Path | None = None, max_bytes: int = DEFAULT_MAX_BYTES) -> bytes:
    """The corpus: the first ``max_bytes`` of its files in name order. Raises DataError if empty."""
    chunks, total = [], 0
    for f in corpus_files(path):
        data = f.read_bytes()[: max_bytes - total]
        chunks.append(data)
        total += len(data)
        if total >= max_bytes:
            break
    blob = b"".join(chunks)
    if not blob:
        raise DataError(f"the corpus at {path or default_corpus_dir()} is empty")
    return blob


def load_corpus(path: Path | None = None, max_bytes: int = DEFAULT_MAX_BYTES) -> tuple[torch.Tensor, str]:
    """(uint8 tensor of the corpus bytes, sha256 of them). Raises DataError if empty."""
    blob = corpus_bytes(path, max_bytes)
    return torch.frombuffer(bytearray(blob), dtype=torch.uint8), hashlib.sha256(blob).hexdigest()


def split(corpus: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    cut = int(len(corpus) * TRAIN_FRACTION)
    return corpus[:cut], corpus[cut:]


def batch(tokens: torch.Tensor, n_seqs: int, seq_len: int, seed: int, iteration: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of one iteration: (n_seqs, seq_len) inputs and next-byte targets (int64)."""
    if len(tokens) <= seq_len:
        raise DataError(f"the corpus has {len(tokens)} bytes, fewer than seq_len + 1 = {seq_len + 1}")
    g = torch.Generator().manual_seed(seed * 1_000_003 + iteration)
    starts = torch.randint(0, len(tokens) - seq_len, (n_seqs,), generator=g)
    x = torch.stack([tokens[s: s + seq_len] for s in starts.tolist()]).long()
    y = torch.stack([tokens[s + 1: s + 1 + seq_len] for s in starts.tolist()]).long()
    return x, y
