"""The training text, as bytes (no torch: the runner reads and fingerprints it too).

Default corpus: the Python standard library's own ``.py`` sources on this machine, read at run
time (never downloaded, never shipped), in sorted path order so that every worker sees the same
bytes. ``path`` may be any text file or folder (all regular files below it, sorted).
"""

from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path

from testbed.errors import TestbedError

DEFAULT_MAX_BYTES = 32 * 2**20
#: the share of the corpus that trains; the rest validates
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


def corpus_sha256(blob: bytes) -> str:
    """The corpus's fingerprint, recorded in env.json."""
    return hashlib.sha256(blob).hexdigest()


def train_split_bytes(corpus_len: int) -> int:
    """Bytes of a ``corpus_len``-byte corpus that train (its first ``TRAIN_FRACTION``)."""
    return int(corpus_len * TRAIN_FRACTION)
