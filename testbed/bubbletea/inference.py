"""Inference for BubbleTea: chunked prefill with a KV cache, greedy decode, and their FLOPs.

A training worker keeps a small inference model beside its stage (``InferenceModel``: the GPT of
``testbed.model.gpt`` with seeded weights, run block by block with a KV cache). In a bubble it prefills
one chunk of a prompt (``prefill_chunk``): a real forward pass over the chunk's tokens that attends
causally to the keys cached from earlier chunks and to its own. When the last chunk is done the
cache goes to a decode host as bytes (``KVCache.to_bytes``, ``KVCache.from_bytes``), which generates
the output one token at a time (``decode_step``, ``greedy_decode``). Their FLOPs
(``spec.model.prefill_flops``, ``decode_flops``) feed the emulated-GPU time model.

Context length: the model has ``cfg.seq_len`` learned positions, so a prompt plus its generated
tokens may use at most ``cfg.seq_len`` positions. Longer requests are rejected with an
``InferenceError`` (a ``ValueError``) naming the limit, never clipped silently; callers that want
clipping keep the last ``model.max_context`` tokens themselves. For BubbleTea build the inference
model with a large ``seq_len`` (e.g. 2048).

One request per cache; ``decode_batch`` runs one decode step of several requests together.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from testbed.errors import TestbedError
from testbed.model.gpt import build_model
from testbed.spec.model import ModelConfig

# Wire format of a KV cache: magic, then little-endian uint32 n_layers, n_heads, length, head_dim,
# then float32 little-endian values: layer 0 keys, layer 0 values, layer 1 keys, ... each
# (n_heads, length, head_dim) in C order.
KV_MAGIC = b"KVC1"
_KV_HEADER = struct.Struct("<4sIIII")
KV_HEADER_BYTES = _KV_HEADER.size


class InferenceError(TestbedError, ValueError):
    """A prefill or decode request is invalid (tokens, context length, cache shape or bytes)."""


def _int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InferenceError(f"{name}: {value!r} is not an integer >= {minimum}")
    return value


# ---- the cache ---------------------------------------------------------------------------------


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

    def to_bytes(self) -> bytes:
        """The cache as ``KV_HEADER_BYTES + nbytes()`` bytes for a plain socket (format above)."""
        head = _KV_HEADER.pack(KV_MAGIC, self.n_layers, self.n_heads, self.length, self.head_dim)
        flat = torch.cat([t.reshape(-1) for pair in zip(self.keys, self.values) for t in pair])
        return head + flat.numpy().astype("<f4", copy=False).tobytes()

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


# ---- the model ---------------------------------------------------------------------------------


class InferenceModel(nn.Module):
    """The GPT of ``testbed.model.gpt`` (``build_model(cfg, seed)``: same weights as training would start
    from) run with a KV cache. ``forward(tokens, cache)``: tokens LongTensor (chunk,) at positions
    cache.length.. -> (new cache, final hidden states (chunk, d_model) before ``ln_f``).

    ``max_context`` = ``cfg.seq_len`` positions (the position-embedding table). Raises
    ``InferenceError`` for tokens outside 0..vocab-1, an empty chunk, a cache shaped for another
    model, or a request that would pass ``max_context``.
    """

    def __init__(self, cfg: ModelConfig, seed: int) -> None:
        super().__init__()
        if cfg.d_model % cfg.n_heads:
            raise InferenceError(f"ModelConfig: d_model {cfg.d_model} is not a multiple of n_heads {cfg.n_heads}")
        self.cfg = cfg
        self.gpt = build_model(cfg, seed).eval()

    @property
    def max_context(self) -> int:
        return self.cfg.seq_len

    def check_context(self, positions: int) -> None:
        """Raise ``InferenceError`` if a request needs more than ``max_context`` positions."""
        if positions > self.max_context:
            raise InferenceError(
                f"the request needs {positions} positions but the inference model's context is "
                f"seq_len={self.max_context}; build the inference model with ModelConfig(seq_len >= {positions}) "
                f"or clip the prompt to its last {self.max_context} tokens"
            )

    def embed(self, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """The chunk's input to the first block, (1, chunk, d_model), after checking the tokens, the
        cache's shape and the context (``InferenceError``)."""
        cfg = self.cfg
        if tokens.dim() != 1 or tokens.numel() == 0 or tokens.dtype != torch.long:
            raise InferenceError(
                f"tokens: shape {tuple(tokens.shape)} dtype {tokens.dtype}; "
                "give a non-empty 1-D LongTensor of token ids"
            )
        if int(tokens.min()) < 0 or int(tokens.max()) >= cfg.vocab:
            raise InferenceError(f"tokens: ids outside 0..{cfg.vocab - 1}")
        if (cache.n_layers, cache.n_heads, cache.head_dim) != (cfg.n_layers, cfg.n_heads, cfg.d_model // cfg.n_heads):
            raise InferenceError(
                f"cache: (n_layers, n_heads, head_dim) = {(cache.n_layers, cache.n_heads, cache.head_dim)}, "
                f"this model has {(cfg.n_layers, cfg.n_heads, cfg.d_model // cfg.n_heads)}"
            )
        past, t = cache.length, tokens.numel()
        self.check_context(past + t)
        return (self.gpt.tok(tokens) + self.gpt.pos(torch.arange(past, past + t)))[None]

    def forward(self, tokens: torch.Tensor, cache: KVCache | None) -> tuple[KVCache, torch.Tensor]:
        cache = KVCache.empty(self.cfg) if cache is None else cache
        x = self.embed(tokens, cache)
        keys, values = [], []
        for i, blk in enumerate(self.gpt.blocks):
            x, (k, v) = blk.forward_cached(x, (cache.keys[i][None], cache.values[i][None]))
            keys.append(k[0])
            values.append(v[0])
        x = x[0]
        return KVCache(tuple(keys), tuple(values)), x


def prefill_chunk(model: InferenceModel, tokens: torch.Tensor, cache: KVCache | None) -> tuple[KVCache, torch.Tensor]:
    """Prefill one chunk of a prompt.

    tokens: LongTensor (chunk,) of ids in 0..vocab-1, at positions cache.length..cache.length+chunk-1
    (cache None: the prompt's first chunk, from position 0). Returns the cache extended by the chunk
    and the logits (vocab,) at the chunk's last position (the next-token distribution when this is
    the prompt's last chunk). Runs under ``torch.inference_mode``. Raises ``InferenceError`` as
    ``InferenceModel`` does, e.g. when cache.length + chunk > cfg.seq_len.
    """
    with torch.inference_mode():
        cache, x = model(tokens, cache)
        return cache, model.gpt.head(model.gpt.ln_f(x[-1]))


def decode_step(model: InferenceModel, token: int, cache: KVCache) -> tuple[KVCache, torch.Tensor]:
    """Feed one token at position cache.length: returns (cache one position longer, logits (vocab,)
    for the next token). Raises ``InferenceError`` past the context or for a bad token id."""
    return prefill_chunk(model, torch.tensor([token], dtype=torch.long), cache)


def decode_batch(model: InferenceModel, tokens: list[int], caches: list[KVCache]) -> tuple[list[KVCache], torch.Tensor]:
    """One decode step of several requests at once (continuous batching on a decode host).

    ``tokens[b]`` is fed at position ``caches[b].length``; the caches may differ in length. The
    layers' matrix products run once over the batch (B, 1, d_model); each request's query attends
    to its own cache only. Returns (the caches one position longer, logits (B, vocab)); request b's
    row equals ``decode_step(model, tokens[b], caches[b])`` up to float rounding. Runs under
    ``torch.inference_mode``. Raises ``InferenceError`` for an empty batch, lists of different
    lengths, or a request as ``decode_step`` would.
    """
    if not tokens or len(tokens) != len(caches):
        raise InferenceError(
            f"decode_batch: {len(tokens)} tokens and {len(caches)} caches; give one token per cache (at least one)"
        )
    with torch.inference_mode():
        x = torch.cat([model.embed(torch.tensor([t], dtype=torch.long), c) for t, c in zip(tokens, caches)])
        keys: list[list[torch.Tensor]] = [[] for _ in caches]
        values: list[list[torch.Tensor]] = [[] for _ in caches]
        for i, blk in enumerate(model.gpt.blocks):
            q, k, v = blk.heads(x)
            ys = []
            for b, c in enumerate(caches):
                kb, vb = torch.cat([c.keys[i], k[b]], dim=1), torch.cat([c.values[i], v[b]], dim=1)
                keys[b].append(kb)
                values[b].append(vb)
                ys.append(F.scaled_dot_product_attention(q[b : b + 1], kb[None], vb[None]))
            x = blk.finish(x, torch.cat(ys))
        logits = model.gpt.head(model.gpt.ln_f(x[:, -1]))
    return [KVCache(tuple(k), tuple(v)) for k, v in zip(keys, values)], logits


def greedy_decode(model: InferenceModel, cache: KVCache, first_logits: torch.Tensor, n_tokens: int) -> list[int]:
    """Generate ``n_tokens`` token ids greedily (argmax) after a prefilled prompt.

    first_logits: (vocab,) from the prompt's last ``prefill_chunk``; the first token is its argmax,
    each later one comes from a ``decode_step`` on the previous (n_tokens - 1 steps in all). Raises
    ``InferenceError`` up front if cache.length + n_tokens - 1 positions exceed cfg.seq_len.
    """
    _int("n_tokens", n_tokens, 0)
    if n_tokens == 0:
        return []
    model.check_context(cache.length + n_tokens - 1)
    out = [int(first_logits.argmax())]
    for _ in range(n_tokens - 1):
        cache, logits = decode_step(model, out[-1], cache)
        out.append(int(logits.argmax()))
    return out


# ---- chunking and request prompts ---------------------------------------------------------------


def chunk_bounds(prompt_tokens: int, max_chunk: int) -> list[tuple[int, int]]:
    """Split a prompt of ``prompt_tokens`` tokens into chunks of at most ``max_chunk`` tokens.

    Returns half-open (start, end) token ranges in order, covering 0..prompt_tokens; all full-size
    but the last, which may be shorter. Raises ``InferenceError`` unless both are integers >= 1.
    """
    _int("prompt_tokens", prompt_tokens, 1)
    _int("max_chunk", max_chunk, 1)
    return [(s, min(s + max_chunk, prompt_tokens)) for s in range(0, prompt_tokens, max_chunk)]


def prompt_tokens_for(rid: int, n: int, seed: int) -> torch.Tensor:
    """Synthetic prompt of request ``rid``: LongTensor (n,) of byte ids 0..255, the same for the
    same (rid, n, seed) on every host (a trace gives a prompt's length, not its text).

    A prefix of a longer prompt of the same request equals the shorter prompt. Drawn by numpy's
    PCG64 seeded with the pair (seed, rid) (``numpy.random.default_rng``), which keeps every bit of
    both (torch's CPU generator would keep only the low 32 bits of one combined seed). Raises
    ``InferenceError`` unless n >= 1 and rid, seed >= 0.
    """
    _int("n", n, 1)
    rng = np.random.default_rng([_int("seed", seed, 0), _int("rid", rid, 0)])
    return torch.from_numpy(rng.integers(0, 256, n, dtype=np.int64))


def prompt_tokens_from(corpus: torch.Tensor, rid: int, n: int, seed: int) -> torch.Tensor:
    """The prompt of request ``rid`` as real text: LongTensor (n,) of the byte ids of ``n``
    consecutive bytes of ``corpus`` (the run's training text, which every worker holds the same),
    from an offset drawn as ``prompt_tokens_for`` draws its ids (PCG64 seeded with (seed, rid)), so
    the same on every host; a corpus shorter than ``n`` is repeated. Raises ``InferenceError``
    unless n >= 1, rid, seed >= 0 and the corpus is not empty."""
    _int("n", n, 1)
    if corpus.numel() == 0:
        raise InferenceError("the corpus is empty: there is no text to take prompts from")
    rng = np.random.default_rng([_int("seed", seed, 0), _int("rid", rid, 0)])
    start = int(rng.integers(0, corpus.numel()))
    idx = (start + torch.arange(n)) % corpus.numel()
    return corpus[idx].to(torch.int64)
