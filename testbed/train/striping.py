"""A tensor sent between two pipeline stages striped over several TCP connections (Atlas): gloo
gives concurrent operations their own connection when GLOO_SOCKET_IFNAME repeats the interface,
so ``n`` chunks sent at once travel on ``n`` connections. The data-parallel groups are created
with one connection per pair (``one_connection_per_pair``)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist


def send_striped(t: torch.Tensor, dst: int, tag: int, n: int) -> list:
    """isend ``t`` as ``n`` concurrent chunks (gloo gives concurrent operations their own connection
    when GLOO_SOCKET_IFNAME repeats the interface), tags tag*64 + i."""
    flat = t.reshape(-1)
    return [dist.isend(c.contiguous(), dst=dst, tag=tag * 64 + i) for i, c in enumerate(flat.chunk(n))]


def post_recv_striped(buf: torch.Tensor, src: int, tag: int, n: int) -> list:
    """Post the receives into ``buf`` of the ``n`` chunks sent by ``send_striped``; returns them."""
    return [dist.irecv(c, src=src, tag=tag * 64 + i) for i, c in enumerate(buf.view(-1).chunk(n))]


@contextmanager
def one_connection_per_pair() -> Iterator[None]:
    """Process groups created inside get one gloo device (one connection per pair), on the first
    interface of a striped GLOO_SOCKET_IFNAME, which gloo reads when a group is created. For the
    data-parallel groups: with several devices, every collective on a group inside a DC took about
    three round trips to the first DC (measured on the default experiment: the gradient all-reduce
    5 ms in east, 67 ms in central, 188 ms in west; the last stage's loss all-reduce likewise),
    and striping is for the pipeline's cross-DC transfers only
    (``tests/integration/test_atlas_grants.py``'s ablation test checks it)."""
    names = os.environ.get("GLOO_SOCKET_IFNAME")
    if names is None or "," not in names:
        yield
        return
    os.environ["GLOO_SOCKET_IFNAME"] = names.split(",")[0]
    try:
        yield
    finally:
        os.environ["GLOO_SOCKET_IFNAME"] = names
