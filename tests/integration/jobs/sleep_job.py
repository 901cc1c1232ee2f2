"""A torch.distributed job for ``testbed launch``'s tests that joins its group, says so, and sleeps
(``testbed launch`` is then stopped from outside)."""

from __future__ import annotations

import time

import torch.distributed as dist

dist.init_process_group("gloo")
print(f"rank {dist.get_rank()} joined", flush=True)
time.sleep(600)
