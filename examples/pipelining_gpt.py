"""A pipeline-parallel job with torch's own pipelining library (``torch.distributed.pipelining``):
a small GPT split into stages, run by ``Schedule1F1B`` over gloo, each stage replicated ``--dp``
times with the gradients averaged inside the stage (data parallelism) after every step. A plain
torch.distributed job: it knows nothing of the testbed, except that it marks its iterations and
times its forward and backward passes with the testbed's helper where that is importable
(``testbed.trace.job``; without it, or outside ``testbed launch``, the marks do nothing).

    sudo .venv/bin/testbed launch three_dc --mesh pp=3,dp=2 -- examples/pipelining_gpt.py

The ranks form the mesh as ``testbed launch`` numbers them, rank = stage x dp + replica: the
stages across the DCs, the replicas of a stage inside one. Every rank of the last stage prints its
loss at each step (the mean over its microbatches); the last stage's replica 0 prints the final
loss. The data is a fixed, learnable token sequence (a random walk over the vocabulary with
small steps), the same on every machine; each replica takes its own part of it.
"""

from __future__ import annotations

import argparse
import time
from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B
from torch.nn import functional as F

try:  # the testbed's event lines: timeline, bubbles, iteration time, and Atlas's planned sharing
    from testbed.trace.job import JobTrace
except ImportError:  # run without the testbed on the path: no marks
    JobTrace = None


class Block(nn.Module):
    """A pre-norm transformer block: causal self-attention, then an MLP (d -> 4d -> d)."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x))


class Stage(nn.Module):
    """One pipeline stage: a slice of the blocks; the first stage also embeds the tokens, the last
    one normalizes and maps to the vocabulary."""

    def __init__(self, args: argparse.Namespace, stage: int, stages: int) -> None:
        super().__init__()
        first, last = stage == 0, stage == stages - 1
        self.embed = nn.Embedding(args.vocab, args.d_model) if first else None
        self.pos = nn.Parameter(torch.zeros(args.seq_len, args.d_model)) if first else None
        per = args.layers // stages
        self.blocks = nn.ModuleList(Block(args.d_model, args.heads) for _ in range(per))
        self.norm = nn.LayerNorm(args.d_model) if last else None
        self.head = nn.Linear(args.d_model, args.vocab) if last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x) + self.pos
        for block in self.blocks:
            x = block(x)
        if self.head is not None:
            x = self.head(self.norm(x))
        return x


def token_stream(n: int, vocab: int) -> torch.Tensor:
    """``n`` tokens of a random walk over the vocabulary (steps of -2..2, modulo ``vocab``): a
    sequence a small model learns to predict well."""
    steps = torch.randint(-2, 3, (n,), generator=torch.Generator().manual_seed(1234))
    return torch.cumsum(steps, 0) % vocab


def batch(tokens: torch.Tensor, step: int, replica: int, args: argparse.Namespace) -> tuple[torch.Tensor, torch.Tensor]:
    """The inputs and next-token targets of ``replica`` at ``step``: (batch, seq_len) each."""
    rows = args.microbatches * args.microbatch_size
    g = torch.Generator().manual_seed(step * 1000 + replica)
    starts = torch.randint(0, len(tokens) - args.seq_len - 1, (rows,), generator=g)
    idx = starts[:, None] + torch.arange(args.seq_len + 1)
    seqs = tokens[idx]
    return seqs[:, :-1], seqs[:, 1:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dp", type=int, default=2, help="replicas per stage (the mesh's dp)")
    ap.add_argument("--steps", type=int, default=6, help="training steps (iterations)")
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--microbatch-size", type=int, default=2)
    ap.add_argument("--layers", type=int, default=6, help="transformer blocks (a multiple of the stages)")
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--lr", type=float, default=1e-3)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    stages = world // args.dp
    stage, replica = divmod(rank, args.dp)
    if world % args.dp or args.layers % stages:
        raise SystemExit(
            f"world {world} is not stages x --dp {args.dp}, or --layers {args.layers} not a multiple of the stages"
        )
    # every rank makes every group, in the same order (torch.distributed's rule)
    pipeline = [dist.new_group([s * args.dp + r for s in range(stages)]) for r in range(args.dp)][replica]
    data_parallel = [dist.new_group([s * args.dp + r for r in range(args.dp)]) for s in range(stages)][stage]

    torch.manual_seed(stage)  # every replica of a stage starts from the same weights
    module = Stage(args, stage, stages)
    pipe = PipelineStage(module, stage, stages, torch.device("cpu"), group=pipeline)
    loss_fn = lambda logits, target: F.cross_entropy(logits.reshape(-1, args.vocab), target.reshape(-1))  # noqa: E731
    schedule = Schedule1F1B(pipe, args.microbatches, loss_fn=loss_fn)
    opt = torch.optim.AdamW(module.parameters(), lr=args.lr)
    trace = JobTrace() if JobTrace is not None else None
    if trace is not None:
        trace.watch(module)  # each forward and backward pass, as the built-in worker's events
    op = trace.op if trace is not None else lambda kind, step: nullcontext()
    tokens = token_stream(100_000, args.vocab)
    first, last = stage == 0, stage == stages - 1
    t_start = time.monotonic()
    for step in range(args.steps):
        if trace is not None:
            trace.iteration(step)
        x, y = batch(tokens, step, replica, args)
        opt.zero_grad()
        losses: list[torch.Tensor] = []
        if first:
            schedule.step(x)
        elif last:
            schedule.step(target=y, losses=losses)
        else:
            schedule.step()
        with op("allreduce", step):
            for p in module.parameters():
                dist.all_reduce(p.grad, group=data_parallel)
                p.grad /= args.dp
        with op("optimizer", step):
            opt.step()
        if last:
            loss = torch.stack(losses).mean().item()
            print(f"step {step}: loss {loss:.6f}", flush=True)
    if last and replica == 0:
        print(f"final loss {loss:.6f} after {args.steps} steps in {time.monotonic() - t_start:.2f} s", flush=True)
    if trace is not None:
        trace.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
