"""What one frame on the emulated wire holds, and how many fit in a path: the figures both the
shaping (``net/shaping.py``) and the checks of a topology at load time (``spec/queues.py``) use."""

from __future__ import annotations

import math

MTU = 1500
ETH_HLEN = 14
#: bytes of one full-sized Ethernet frame as HTB counts it (MTU plus the Ethernet header)
FRAME_BYTES = MTU + ETH_HLEN


def bdp_packets(rate_bps: int, delay_us: int) -> int:
    """Full-size frames in flight at ``rate_bps`` over ``delay_us`` (one way or round trip, as the
    caller needs), rounded up: the bandwidth-delay product in packets."""
    return math.ceil(rate_bps / 8 * delay_us / 1e6 / FRAME_BYTES)
