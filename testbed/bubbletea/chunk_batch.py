"""Several requests' chunks in one forward pass, run a block at a time (BubbleTea).

A worker's prefill batches the chunks of several queued prompts into one forward pass where they
fit a bubble, and stops at a layer boundary when training's data arrives, to resume later with
nothing lost (``prefill.py``). A decode host steps every request of its batch one token at a time
the same way (continuous batching, ``decode.py``). The layers' matrix products run once over all
the chunks' tokens (1, sum of chunk lengths, d_model); each chunk's queries attend, causally, to
its own request's cache and to its own earlier tokens only (``model.gpt.Block.attend``).
"""

from __future__ import annotations

import torch

from testbed.bubbletea.inference import InferenceModel
from testbed.bubbletea.kv_cache import InferenceError, KVCache


class ChunkBatch:
    """One forward pass over ``parts``: (tokens LongTensor (chunk,) at positions cache.length..,
    the request's cache before the chunk, None at the prompt's start) for each request, run a
    block at a time. ``layers_done`` blocks have run; ``step()`` runs the next one; when ``done``,
    ``result()`` gives, per part, what ``inference.prefill_chunk`` gives for it alone (the cache
    extended by the chunk, the logits (vocab,) at its last position), up to float rounding.
    Raises ``InferenceError`` for no parts, as ``InferenceModel`` does for a part, and on
    ``result()`` before the last block."""

    def __init__(self, model: InferenceModel, parts: list[tuple[torch.Tensor, KVCache | None]]) -> None:
        if not parts:
            raise InferenceError("a chunk batch needs at least one (tokens, cache) part")
        self.model = model
        self.past = [KVCache.empty(model.cfg) if c is None else c for _, c in parts]
        with torch.inference_mode():
            # the same checks and embedding as a straight run of each part
            embedded = [model.embed(t, c) for (t, _), c in zip(parts, self.past)]
        self.lengths = [e.shape[1] for e in embedded]
        self._x = torch.cat(embedded, dim=1)
        self.keys: list[list[torch.Tensor]] = [[] for _ in parts]
        self.values: list[list[torch.Tensor]] = [[] for _ in parts]

    @property
    def layers_done(self) -> int:
        return len(self.keys[0])

    @property
    def done(self) -> bool:
        return self.layers_done == self.model.cfg.n_layers

    def step(self) -> None:
        """Run the next block over every part (a no-op when done)."""
        if self.done:
            return
        i = self.layers_done
        blk = self.model.gpt.blocks[i]
        with torch.inference_mode():
            q, k, v = blk.heads(self._x)
            ys, start = [], 0
            for p, (past, n) in enumerate(zip(self.past, self.lengths)):
                own = slice(start, start + n)
                y, (kp, vp) = blk.attend(
                    q[:, :, own], k[:, :, own], v[:, :, own], (past.keys[i][None], past.values[i][None])
                )
                ys.append(y)
                self.keys[p].append(kp[0])
                self.values[p].append(vp[0])
                start += n
            self._x = blk.finish(self._x, torch.cat(ys, dim=2))

    def result(self) -> list[tuple[KVCache, torch.Tensor]]:
        if not self.done:
            raise InferenceError(
                f"the chunk batch stopped after {self.layers_done} of {self.model.cfg.n_layers} blocks; "
                "run step() until done before taking its result"
            )
        ends = torch.tensor(self.lengths).cumsum(0) - 1  # each part's last position in the batch
        with torch.inference_mode():
            logits = self.model.gpt.head(self.model.gpt.ln_f(self._x[0, ends]))
        return [(KVCache(tuple(k), tuple(v)), lg) for k, v, lg in zip(self.keys, self.values, logits)]


def decode_batch(model: InferenceModel, tokens: list[int], caches: list[KVCache]) -> tuple[list[KVCache], torch.Tensor]:
    """One decode step of several requests at once (continuous batching on a decode host): each
    ``tokens[b]`` fed at position ``caches[b].length``, one ``ChunkBatch`` of one-token parts.
    Returns (the caches one position longer, logits (B, vocab)); request b's row equals
    ``inference.decode_step(model, tokens[b], caches[b])`` up to float rounding. Raises
    ``InferenceError`` for an empty batch, lists of different lengths, or a request as
    ``decode_step`` would."""
    if not tokens or len(tokens) != len(caches):
        raise InferenceError(
            f"decode_batch: {len(tokens)} tokens and {len(caches)} caches; give one token per cache (at least one)"
        )
    batch = ChunkBatch(model, [(torch.tensor([t], dtype=torch.long), c) for t, c in zip(tokens, caches)])
    while not batch.done:
        batch.step()
    out = batch.result()
    return [c for c, _ in out], torch.stack([lg for _, lg in out])
