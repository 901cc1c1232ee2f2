"""A chunk's prefill run a block at a time, so that BubbleTea's prefill can stop at a layer
boundary when training's data arrives and resume later with nothing lost (``prefill.py``)."""

from __future__ import annotations

import torch

from testbed.bubbletea.inference import InferenceModel
from testbed.bubbletea.kv_cache import InferenceError, KVCache


class LayerwisePrefill:
    """One chunk's prefill run a block at a time, so that it can stop at a layer boundary and resume
    later with nothing lost (BubbleTea's yielding prefill: training's data arrived).

    ``tokens``: LongTensor (chunk,) at positions cache.length..; ``cache``: the request's cache
    before the chunk (None: the prompt's start). ``layers_done`` blocks have run; ``step()`` runs
    the next one; when ``done``, ``result()`` gives what ``prefill_chunk`` gives: the cache extended
    by the chunk and the logits (vocab,) at its last position, equal to a straight run. Raises
    ``InferenceError`` as ``InferenceModel`` does, and on ``result()`` before the last block.
    """

    def __init__(self, model: InferenceModel, tokens: torch.Tensor, cache: KVCache | None) -> None:
        self.model = model
        self.past = KVCache.empty(model.cfg) if cache is None else cache
        with torch.inference_mode():
            # the same checks and embedding as the straight run: an empty run of 0 blocks
            self._x = model.embed(tokens, self.past)
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []

    @property
    def layers_done(self) -> int:
        return len(self.keys)

    @property
    def done(self) -> bool:
        return self.layers_done == self.model.cfg.n_layers

    def step(self) -> None:
        """Run the next block (a no-op when done)."""
        if self.done:
            return
        i = self.layers_done
        with torch.inference_mode():
            blk = self.model.gpt.blocks[i]
            self._x, (k, v) = blk.forward_cached(self._x, (self.past.keys[i][None], self.past.values[i][None]))
        self.keys.append(k[0])
        self.values.append(v[0])

    def result(self) -> tuple[KVCache, torch.Tensor]:
        if not self.done:
            raise InferenceError(
                f"the chunk's prefill stopped after {self.layers_done} of {self.model.cfg.n_layers} blocks; "
                "run step() until done before taking its result"
            )
        with torch.inference_mode():
            logits = self.model.gpt.head(self.model.gpt.ln_f(self._x[0, -1]))
        return KVCache(tuple(self.keys), tuple(self.values)), logits
