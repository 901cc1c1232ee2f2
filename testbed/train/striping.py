"""A tensor sent between two pipeline stages striped over several TCP connections (Atlas): gloo
gives concurrent operations their own connection when GLOO_SOCKET_IFNAME repeats the interface,
so ``n`` chunks sent at once travel on ``n`` connections."""

from __future__ import annotations

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
