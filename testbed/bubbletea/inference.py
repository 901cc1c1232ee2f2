"""Inference for BubbleTea: chunked prefill with a KV cache, greedy decode, and their FLOPs.

A training worker keeps a small inference model beside its stage (``InferenceModel``: the GPT of
``testbed.model.gpt`` with seeded weights, run block by block with a KV cache). In a bubble it prefills
one chunk of a prompt (``prefill_chunk``): a real forward pass over the chunk's tokens that attends
causally to the keys cached from earlier chunks and to its own. When the last chunk is done the
cache goes to a decode host as bytes (``KVCache.to_bytes``, ``KVCache.from_bytes``), which generates
the output a token a step for a batch of requests (``chunk_batch.decode_batch``; one request alone:
``decode_step``, ``greedy_decode``). Their FLOPs
(``spec.model.prefill_flops``, ``decode_flops``) feed the emulated-GPU time model.

Context length: the model has ``cfg.seq_len`` learned positions, so a prompt plus its generated
tokens may use at most ``cfg.seq_len`` positions. Longer requests are rejected with an
``InferenceError`` (a ``ValueError``) naming the limit, never clipped silently; callers that want
clipping keep the last ``model.max_context`` tokens themselves. BubbleTea's served model holds the
longest prompt and its output (``spec.bubbletea.served_model``). The cache and its bytes are
``kv_cache.py``'s.

One request per cache; ``chunk_batch.py`` runs several requests' chunks, or decode steps, in one
forward pass.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from testbed.bubbletea.kv_cache import InferenceError, KVCache, check_int
from testbed.model.gpt import build_model
from testbed.spec.model import ModelConfig


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


def greedy_decode(model: InferenceModel, cache: KVCache, first_logits: torch.Tensor, n_tokens: int) -> list[int]:
    """Generate ``n_tokens`` token ids greedily (argmax) after a prefilled prompt.

    first_logits: (vocab,) from the prompt's last ``prefill_chunk``; the first token is its argmax,
    each later one comes from a ``decode_step`` on the previous (n_tokens - 1 steps in all). Raises
    ``InferenceError`` up front if cache.length + n_tokens - 1 positions exceed cfg.seq_len.
    """
    check_int("n_tokens", n_tokens, 0)
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
    check_int("prompt_tokens", prompt_tokens, 1)
    check_int("max_chunk", max_chunk, 1)
    return [(s, min(s + max_chunk, prompt_tokens)) for s in range(0, prompt_tokens, max_chunk)]


def prompt_tokens_for(rid: int, n: int, seed: int) -> torch.Tensor:
    """Synthetic prompt of request ``rid``: LongTensor (n,) of byte ids 0..255, the same for the
    same (rid, n, seed) on every host (a trace gives a prompt's length, not its text).

    A prefix of a longer prompt of the same request equals the shorter prompt. Drawn by numpy's
    PCG64 seeded with the pair (seed, rid) (``numpy.random.default_rng``), which keeps every bit of
    both (torch's CPU generator would keep only the low 32 bits of one combined seed). Raises
    ``InferenceError`` unless n >= 1 and rid, seed >= 0.
    """
    check_int("n", n, 1)
    rng = np.random.default_rng([check_int("seed", seed, 0), check_int("rid", rid, 0)])
    return torch.from_numpy(rng.integers(0, 256, n, dtype=np.int64))


def prompt_tokens_from(corpus: torch.Tensor, rid: int, n: int, seed: int) -> torch.Tensor:
    """The prompt of request ``rid`` as real text: LongTensor (n,) of the byte ids of ``n``
    consecutive bytes of ``corpus`` (the run's training text, which every worker holds the same),
    from an offset drawn as ``prompt_tokens_for`` draws its ids (PCG64 seeded with (seed, rid)), so
    the same on every host; a corpus shorter than ``n`` is repeated. Raises ``InferenceError``
    unless n >= 1, rid, seed >= 0 and the corpus is not empty."""
    check_int("n", n, 1)
    if corpus.numel() == 0:
        raise InferenceError("the corpus is empty: there is no text to take prompts from")
    rng = np.random.default_rng([check_int("seed", seed, 0), check_int("rid", rid, 0)])
    start = int(rng.integers(0, corpus.numel()))
    idx = (start + torch.arange(n)) % corpus.numel()
    return corpus[idx].to(torch.int64)
