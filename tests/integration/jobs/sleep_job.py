"""A torch.distributed job for ``testbed launch``'s tests that joins its group, says so with its
process id, and sleeps (``testbed launch`` is then stopped, or one rank killed, from outside).
Argument ``late R``: rank R sleeps before joining instead (it never joins in time)."""

from __future__ import annotations

import os
import sys
import time

import torch.distributed as dist

if sys.argv[1:3] == ["late", os.environ["RANK"]]:
    time.sleep(600)
dist.init_process_group("gloo")
print(f"rank {dist.get_rank()} joined as pid {os.getpid()}", flush=True)
time.sleep(600)
