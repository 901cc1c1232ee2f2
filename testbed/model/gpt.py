"""The workers' model: a small decoder-only transformer (GPT-style), after nanoGPT's layout.

Token and position embeddings, ``n_layers`` identical pre-norm blocks (causal self-attention and
an MLP), a final LayerNorm and a linear head over the byte vocabulary. A pipeline stage is a
contiguous slice of the block list; stage 0 also holds the embeddings and the last stage the final
norm and head (``stage_module``). Dropout is absent so that runs are deterministic.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from testbed.spec.model import ModelConfig, stage_layers


class Block(nn.Module):
    """One pre-norm transformer block: causal self-attention, then an MLP (d -> 4d -> d, GELU).

    ``forward``: (batch, seq, d_model) -> same shape, attending causally within the sequence.
    ``forward_cached`` runs the same layers with keys and values cached from earlier positions
    (inference, BubbleTea's prefill and decode)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.fc = nn.Linear(cfg.d_model, 4 * cfg.d_model)
        self.out = nn.Linear(4 * cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_cached(x, None)[0]

    def forward_cached(
        self, x: torch.Tensor, past: tuple[torch.Tensor, torch.Tensor] | None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """``x`` (batch, t, d_model) at positions p..p+t-1, where p is the length of ``past`` (keys
        and values of positions 0..p-1, each (batch, n_heads, p, head_dim); None: p = 0). Returns
        the block's output and the keys and values of positions 0..p+t-1 (``past`` extended)."""
        q, k, v = self.heads(x)
        y, kv = self.attend(q, k, v, past)
        return self.finish(x, y), kv

    @staticmethod
    def attend(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, past: tuple[torch.Tensor, torch.Tensor] | None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Causal attention of ``t`` new positions (``q``, ``k``, ``v``: (batch, n_heads, t,
        head_dim), at positions p..p+t-1) over ``past`` (keys and values of positions 0..p-1, or
        None) and themselves. Returns the output (batch, n_heads, t, head_dim) and the keys and
        values of positions 0..p+t-1."""
        if past is None or past[0].shape[2] == 0:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True), (k, v)
        k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        p, t = past[0].shape[2], q.shape[2]
        # query i sits at position p + i and sees the keys at positions 0..p + i
        mask = torch.arange(p + t)[None, :] <= torch.arange(p, p + t)[:, None]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask), (k, v)

    def heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys and values of ``x`` (batch, t, d_model), each (batch, n_heads, t, head_dim)."""
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2) for z in (q, k, v))
        return q, k, v

    def finish(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The block's output from its input ``x`` (batch, t, d_model) and the attention's output
        ``y`` (batch, n_heads, t, head_dim): projection and residual, then the MLP and residual."""
        b, t, d = x.shape
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """The whole model: (batch, seq) byte ids -> (batch, seq, vocab) logits."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return stage_forward(self, idx, first=True, last=True)


def stage_forward(m: nn.Module, x: torch.Tensor, first: bool, last: bool) -> torch.Tensor:
    if first:
        x = m.tok(x) + m.pos(torch.arange(x.shape[1]))
    for block in m.blocks:
        x = block(x)
    if last:
        x = m.head(m.ln_f(x))
    return x


class Stage(nn.Module):
    """One pipeline stage of a GPT: stage 0 (batch, seq) ids -> (batch, seq, d_model) activations;
    middle stages activations -> activations; the last stage activations -> logits."""

    def __init__(self, full: GPT, stage: int, n_stages: int) -> None:
        super().__init__()
        self.first, self.last = stage == 0, stage == n_stages - 1
        if self.first:
            self.tok, self.pos = full.tok, full.pos
        self.blocks = nn.ModuleList(full.blocks[i] for i in stage_layers(full.cfg.n_layers, n_stages, stage))
        if self.last:
            self.ln_f, self.head = full.ln_f, full.head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return stage_forward(self, x, self.first, self.last)


def build_model(cfg: ModelConfig, seed: int) -> GPT:
    """The full model with seeded initial weights: every worker builds it whole, then keeps its stage,
    so a pipeline starts from exactly the weights of a single-process run."""
    torch.manual_seed(seed)
    return GPT(cfg)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-byte cross-entropy over every token of the microbatch."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
