"""A small torch.distributed job for ``testbed launch``'s tests: each rank records what torchrun gave
it (environment, hostname, the peers' names resolved), sends a tensor to the next stage of its
replica and receives one from the previous, all-reduces within its stage, and writes it all to
OUT/rank<R>.json. Arguments: OUT PP DP [crash RANK STATUS | wait SECONDS (before sending)]."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

out, pp, dp = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
if len(sys.argv) > 4 and sys.argv[4] == "crash" and rank == int(sys.argv[5]):
    sys.exit(int(sys.argv[6]))
if len(sys.argv) > 4 and sys.argv[4] == "wait":
    time.sleep(float(sys.argv[5]))
stage, replica = divmod(rank, dp)
groups = [dist.new_group([s * dp + r for r in range(dp)]) for s in range(pp)]
got = None
if stage + 1 < pp:
    dist.send(torch.full((256 * 1024,), float(rank)), rank + dp)
if stage > 0:
    buf = torch.empty(256 * 1024)
    dist.recv(buf, rank - dp)
    got = buf[0].item()
total = torch.tensor([float(rank)])
dist.all_reduce(total, group=groups[stage])
dist.barrier()
info = {
    "rank": rank,
    "world": world,
    "env": {
        k: os.environ.get(k)
        for k in (
            "RANK",
            "WORLD_SIZE",
            "LOCAL_RANK",
            "MASTER_ADDR",
            "MASTER_PORT",
            "GLOO_SOCKET_IFNAME",
            "NCCL_SOCKET_IFNAME",
        )
    },
    "hostname": socket.gethostname(),
    "resolved": {name: socket.gethostbyname(name) for name in sys.argv[7:]} if len(sys.argv) > 7 else {},
    "received": got,
    "stage_sum": total.item(),
}
(out / f"rank{rank}.json").write_text(json.dumps(info))
print(f"rank {rank} of {world} on {info['hostname']}: done", flush=True)
dist.destroy_process_group()
