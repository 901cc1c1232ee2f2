"""What the worker launcher (``launcher.py``) does once per run, before the workers' ranks are
known, and forks every worker from: torch warmed up, the seeded full model built and the
training split of the corpus loaded."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from testbed.model.gpt import GPT, build_model
from testbed.plan.worker_config import WorkerConfig
from testbed.train.data import load_corpus, split


@dataclass
class Preloaded:
    """What every worker of a run needs before its rank is known: the seeded full model (each
    worker keeps its stage of it) and the training split of the corpus. The launcher
    (``launcher.py``) makes it once and forks the workers from it."""

    full_model: GPT
    train_tokens: torch.Tensor


def warm_up() -> None:
    """Pay, once, what a worker's first step would: the optimizer's first construction imports about
    a second of modules, and the first forward and backward initialise their kernels."""
    torch.set_num_threads(1)
    scratch = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(scratch.parameters(), lr=1e-3, weight_decay=0.0)
    scratch(torch.zeros(1, 2)).sum().backward()
    opt.step()


def preload(cfg: WorkerConfig) -> Preloaded:
    """Load and build, once per run, what does not depend on the rank."""
    exp = cfg.training
    torch.set_num_threads(1)
    corpus, _ = load_corpus(Path(exp.data) if exp.data else None)
    train, _ = split(corpus)
    return Preloaded(build_model(exp.model, exp.seed), train)
