"""Single-process training of the same model on the same global batches: the correctness
reference for pipeline- and data-parallel runs (same seed, data, model, global batch)."""

from __future__ import annotations

from pathlib import Path

import torch

from testbed.model.gpt import build_model, lm_loss
from testbed.spec.experiment import Experiment
from testbed.train.data import batch, load_corpus, split


def reference_losses(exp: Experiment, iterations: int | None = None) -> list[float]:
    """Losses of the first ``iterations`` iterations of one process training the whole model on
    each iteration's whole global batch (mean next-byte cross-entropy over all its tokens)."""
    torch.set_num_threads(1)
    model = build_model(exp.model, exp.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=exp.lr, weight_decay=0.0)
    train, _ = split(load_corpus(Path(exp.data) if exp.data else None)[0])
    out = []
    for it in range(iterations or exp.iterations):
        x, y = batch(train, exp.global_batch, exp.model.seq_len, exp.seed, it)
        loss = lm_loss(model(x), y)
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out
