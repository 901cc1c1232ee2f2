"""What one frame on the emulated wire holds, and how many fit in a path: the figures both the
shaping (``net/shaping.py``) and the checks of a topology at load time (``spec/queues.py``) use."""

from __future__ import annotations

import math

MTU = 1500
ETH_HLEN = 14
#: bytes of one full-sized Ethernet frame as HTB counts it (MTU plus the Ethernet header)
FRAME_BYTES = MTU + ETH_HLEN
#: TCP payload per full-sized segment: MTU - IPv4 (20) - TCP (20) - timestamps option (12).
TCP_MSS_WITH_TIMESTAMPS = MTU - 20 - 20 - 12
#: Share of a shaped Ethernet rate left to TCP payload: 1448 / 1514 = 95.6% (DESIGN.md section 3).
TCP_GOODPUT_FRACTION = TCP_MSS_WITH_TIMESTAMPS / (MTU + ETH_HLEN)
#: a pure ACK on the wire: Ethernet (14) + IPv4 (20) + TCP (20) + timestamps option (12) bytes
ACK_WIRE_BYTES = ETH_HLEN + 20 + 20 + 12
#: full-sized segments a receiver acknowledges per ACK: Linux's delayed ACK acknowledges at least
#: every second one (RFC 1122 4.2.3.2, RFC 5681 4.2); its quick-ACK mode, after idle, every one
SEGMENTS_PER_ACK = 2
#: the smallest socket buffer a namespace's tcp_rmem/tcp_wmem may cap at: their minimum, one page
#: (bytes; the kernel refuses a maximum below it with EINVAL: proc_sys_net_ipv4(5), tcp(7))
MIN_SOCKET_BUFFER_BYTES = 4096


def ack_wire_bytes(payload_bytes: float) -> float:
    """Bytes of the pure ACKs a receiver sends back for ``payload_bytes`` of TCP payload in full
    segments (one per ``SEGMENTS_PER_ACK``: a lower estimate, quick ACKs send up to twice as many)."""
    return payload_bytes / TCP_MSS_WITH_TIMESTAMPS / SEGMENTS_PER_ACK * ACK_WIRE_BYTES


def tcp_goodput_fraction(mtu: int = MTU) -> float:
    """TCP payload per shaped Ethernet frame at ``mtu``: (mtu - 52) / (mtu + 14) (IPv4 20, TCP 20,
    timestamps 12; Ethernet header 14). 1500: 95.6%; 1450 (inside a VXLAN tunnel): 95.5%."""
    return (mtu - 52) / (mtu + ETH_HLEN)


def bdp_packets(rate_bps: int, delay_us: int) -> int:
    """Full-size frames in flight at ``rate_bps`` over ``delay_us`` (one way or round trip, as the
    caller needs), rounded up: the bandwidth-delay product in packets."""
    return math.ceil(rate_bps / 8 * delay_us / 1e6 / FRAME_BYTES)
