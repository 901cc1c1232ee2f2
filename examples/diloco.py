"""A data-parallel job with infrequent all-reduce across DCs, in the style of DiLoCo (Douillard et
al. 2023, "DiLoCo: Distributed Low-Communication Training of Language Models"): each DC trains its
own copy of a small model, averaging gradients inside the DC every step; every ``--inner`` steps
the DCs average their models' change since the last outer step across the WAN and apply it with
an outer Nesterov momentum. A plain torch.distributed job over gloo: it knows nothing of the
testbed.

    sudo .venv/bin/testbed launch three_dc --mesh pp=3,dp=2 -- examples/diloco.py

The mesh's first dimension is the DCs here (its ranks are placed one DC per index of it), the
second the replicas inside each: rank = dc x dp + replica, as ``testbed launch`` numbers them.
Each rank prints its loss at every outer step; rank 0 prints the averaged model's loss at the end.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dp", type=int, default=2, help="ranks per DC (the mesh's dp)")
    ap.add_argument("--outer", type=int, default=4, help="outer steps (all-reduces across DCs)")
    ap.add_argument("--inner", type=int, default=8, help="inner steps between two outer steps")
    ap.add_argument("--width", type=int, default=256)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dcs = world // args.dp
    dc, replica = divmod(rank, args.dp)
    # every rank makes every group, in the same order (torch.distributed's rule)
    in_dc = [dist.new_group([d * args.dp + r for r in range(args.dp)]) for d in range(dcs)][dc]
    across = [dist.new_group([d * args.dp + r for d in range(dcs)]) for r in range(args.dp)][replica]

    torch.manual_seed(0)  # the same model everywhere, and the same target function
    model = torch.nn.Sequential(torch.nn.Linear(32, args.width), torch.nn.GELU(), torch.nn.Linear(args.width, 1))
    target = torch.nn.Linear(32, 1)
    inner_opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    outer_lr, outer_momentum = 0.7, 0.9
    anchor = [p.detach().clone() for p in model.parameters()]
    velocity = [torch.zeros_like(p) for p in model.parameters()]
    data = torch.Generator().manual_seed(1000 + rank)  # each rank its own shard
    loss = torch.tensor(0.0)
    for outer in range(args.outer):
        for _ in range(args.inner):
            x = torch.randn(64, 32, generator=data)
            with torch.no_grad():
                y = target(x)
            loss = torch.nn.functional.mse_loss(model(x), y)
            inner_opt.zero_grad()
            loss.backward()
            for p in model.parameters():  # data parallelism inside the DC
                dist.all_reduce(p.grad, group=in_dc)
                p.grad /= args.dp
            inner_opt.step()
        # the outer step: the DCs' average change since the last one, across the WAN
        with torch.no_grad():
            for p, a, v in zip(model.parameters(), anchor, velocity):
                delta = a - p
                dist.all_reduce(delta, group=across)
                delta /= dcs
                v.mul_(outer_momentum).add_(delta)
                a.sub_(outer_lr * (delta + outer_momentum * v))  # Nesterov
                p.copy_(a)
        print(f"outer step {outer}: inner loss {loss.item():.4f}", flush=True)
    if rank == 0:
        with torch.no_grad():
            x = torch.randn(1024, 32, generator=torch.Generator().manual_seed(7))
            print(f"final loss {torch.nn.functional.mse_loss(model(x), target(x)).item():.6f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
