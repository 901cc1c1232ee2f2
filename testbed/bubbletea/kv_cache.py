"""The KV cache of one request (BubbleTea): keys and values of every layer, and its wire format
for a plain socket (``KVCache.to_bytes``, ``KVCache.from_bytes``) from a training worker to a
decode host. ``InferenceError`` (``testbed.errors``) is the error of every invalid prefill or
decode request."""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np
import torch

from testbed.errors import InferenceError
from testbed.spec.model import ModelConfig

# Wire format of a KV cache: magic, then little-endian uint32 n_layers, n_heads, length, head_dim,
# then float32 little-endian values: layer 0 keys, layer 0 values, layer 1 keys, ... each
# (n_heads, length, head_dim) in C order.
KV_MAGIC = b"KVC1"
_KV_HEADER = struct.Struct("<4sIIII")
KV_HEADER_BYTES = _KV_HEADER.size


def check_int(name: str, value: object, minimum: int) -> int:
    """``value`` if it is an integer >= ``minimum``; ``InferenceError`` naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InferenceError(f"{name}: {value!r} is not an integer >= {minimum}")
    return value


@dataclass(frozen=True)
class KVCache:
    """Keys and values of every layer for one request (batch 1).

    ``keys[i]`` and ``values[i]``: float32 tensors of shape (n_heads, length, head_dim) for layer i,
    positions 0..length-1. Immutable: ``prefill_chunk`` and ``decode_step`` return a new cache.
    Raises ``InferenceError`` if the tensors disagree in shape or are not float32.
    """

    keys: tuple[torch.Tensor, ...]
    values: tuple[torch.Tensor, ...]

    def __post_init__(self) -> None:
        if not self.keys or len(self.keys) != len(self.values):
            raise InferenceError(
                f"KVCache: {len(self.keys)} key and {len(self.values)} value tensors; "
                "give one of each per layer (at least one layer)"
            )
        shape = self.keys[0].shape
        for t in (*self.keys, *self.values):
            if t.dim() != 3 or t.shape != shape or t.dtype != torch.float32:
                raise InferenceError(
                    f"KVCache: tensor of shape {tuple(t.shape)} and dtype {t.dtype}; every "
                    f"tensor must be float32 of shape {tuple(shape)} (n_heads, length, head_dim)"
                )

    @classmethod
    def empty(cls, cfg: ModelConfig) -> KVCache:
        """A cache holding no positions, shaped for ``cfg``."""
        z = torch.zeros(cfg.n_heads, 0, cfg.d_model // cfg.n_heads)
        return cls(tuple(z for _ in range(cfg.n_layers)), tuple(z for _ in range(cfg.n_layers)))

    @property
    def length(self) -> int:
        """Positions cached (prompt tokens prefilled plus tokens decoded so far)."""
        return self.keys[0].shape[1]

    @property
    def n_layers(self) -> int:
        return len(self.keys)

    @property
    def n_heads(self) -> int:
        return self.keys[0].shape[0]

    @property
    def head_dim(self) -> int:
        return self.keys[0].shape[2]

    def nbytes(self) -> int:
        """Bytes of all key and value tensors: what the cache costs on the network (the wire format
        adds a ``KV_HEADER_BYTES`` header): 2 x n_layers x n_heads x length x head_dim x 4."""
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))

    def buffers(self) -> list[memoryview]:
        """The cache in the wire format (``to_bytes``) as buffers, the header first, then one over
        each tensor's own memory (the tensors are float32; one that is not contiguous is copied
        first): a socket sends them without a copy in Python, so a sending thread holds the
        interpreter lock only briefly and the thread computing beside it is not kept waiting."""
        head = _KV_HEADER.pack(KV_MAGIC, self.n_layers, self.n_heads, self.length, self.head_dim)
        parts = [np.asarray(t.contiguous().numpy(), dtype="<f4") for pair in zip(self.keys, self.values) for t in pair]
        return [memoryview(head), *(memoryview(a.reshape(-1)).cast("B") for a in parts)]

    def to_bytes(self) -> bytes:
        """The cache as ``KV_HEADER_BYTES + nbytes()`` bytes for a plain socket (format above)."""
        return b"".join(self.buffers())

    @classmethod
    def from_bytes(cls, data: bytes) -> KVCache:
        """Rebuild a cache from ``to_bytes`` output, bit for bit. No pickle: only numbers are read.
        Raises ``InferenceError`` on a bad magic or a size that disagrees with the header."""
        if len(data) < KV_HEADER_BYTES:
            raise InferenceError(f"KV cache bytes: {len(data)} bytes, fewer than the {KV_HEADER_BYTES}-byte header")
        magic, n_layers, n_heads, length, head_dim = _KV_HEADER.unpack_from(data)
        if magic != KV_MAGIC:
            raise InferenceError(
                f"KV cache bytes: magic {magic!r}, expected {KV_MAGIC!r}; the sender must use KVCache.to_bytes"
            )
        per = n_heads * length * head_dim
        want = KV_HEADER_BYTES + 2 * n_layers * per * 4
        if len(data) != want or n_layers < 1:
            raise InferenceError(
                f"KV cache bytes: {len(data)} bytes, header (n_layers={n_layers}, n_heads={n_heads}, "
                f"length={length}, head_dim={head_dim}) needs {want}; the transfer was cut or corrupted"
            )
        flat = torch.from_numpy(np.frombuffer(data, dtype="<f4", offset=KV_HEADER_BYTES).astype(np.float32))
        parts = flat.split(per) if per else [flat] * (2 * n_layers)
        parts = [p.view(n_heads, length, head_dim) for p in parts]
        return cls(tuple(parts[0::2]), tuple(parts[1::2]))
