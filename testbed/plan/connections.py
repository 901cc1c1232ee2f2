"""How many TCP connections a cross-DC transfer is striped over, the window one connection keeps
in flight, and the socket-buffer cap that holds it to that window: the per-connection share of a
long WAN link (DESIGN.md section 2a, section 1 item 3).

Pure functions of an experiment, its topology and its placement (and of two facts of this
machine's kernel: its release, which decides how much of a receive buffer Linux advertises as
window, and its default TCP congestion control, which the emulated hosts inherit unless the
topology names one).
"""

from __future__ import annotations

import functools
import math
import platform
import re
from pathlib import Path

from testbed.plan.virtual_stages import experiment_boundaries
from testbed.plan.workers import WorkerSpec
from testbed.spec.experiment import Experiment
from testbed.spec.experiment_fields import MAX_WAN_CONNECTIONS
from testbed.spec.routing import RoutingTable
from testbed.spec.topology import TopologySpec
from testbed.spec.wire import TCP_MSS_WITH_TIMESTAMPS

#: the window (payload bytes) Linux advertises per byte of a socket's receive buffer. Before 6.6:
#: half (tcp_adv_win_scale = 1, Documentation/networking/ip-sysctl.rst). From 6.6 ("tcp: get rid of
#: sysctl_tcp_adv_win_scale"): the payload-to-truesize ratio of the segments received (the
#: socket's scaling_ratio), whose median on the testbed's veth paths at MTU 1500 is
#: ``WINDOW_PER_BUFFER_BYTE_SCALED`` (``scripts/bench_connections.py --one`` on 6.18, two runs of
#: 25 paths of 10 Mbit/s-1 Gbit/s, 5-50 ms one way and shares 0.1-0.5: medians 0.70 and 0.69, range
#: 0.41-0.75, under 0.62 only where a 10-100 Mbit/s path's window holds under 10 segments:
#: docs/results.md)
WINDOW_PER_BUFFER_BYTE_HALF, WINDOW_PER_BUFFER_BYTE_SCALED = 0.5, 0.70
#: what one connection keeps in flight falls short of that window by about this many bytes,
#: whatever the buffer (1.4 segments): 12 caps of 6-72 kB on a 100 Mbit/s path of 40 ms RTT kept
#: 0.705 x cap - 2,005 bytes (a least-squares line, each within 15%; the ratio alone was 8-92% over
#: under 18 kB), ``scripts/bench_connections.py --caps`` on 6.18 (docs/results.md, "One
#: connection's window"). It decided the random draws whose windows held 4-10 segments.
WINDOW_SHORTFALL_BYTES = 2000
#: the first release whose window follows the measured ratio
SCALING_RATIO_RELEASE = (6, 6)


#: BBR (v1, Linux's ``bbr``, net/ipv4/tcp_bbr.c): STARTUP's pacing gain, 2/ln 2
#: (``bbr_high_gain`` = 2885/1000), and the margin taken off every pacing rate
#: (``bbr_pacing_margin_percent`` = 1)
BBR_HIGH_GAIN, BBR_PACING_MARGIN = 2.885, 0.01
#: packets of a message sent after idle that leave before BBR's pacing spaces the rest: fitted to
#: the WAN probe's messages of 26-208 packets at 40-173 ms RTT on 6.18 (within 5% on 8 of those 9
#: paths, the ninth +6.4%; ``scripts/bench_bbr_messages.py``, docs/results.md "BBR paces a message
#: after idle")
BBR_UNPACED_PACKETS = 3.5
#: Linux's default congestion control where this machine's cannot be read
LINUX_DEFAULT_CONGESTION = "cubic"
DEFAULT_CONGESTION_FILE = Path("/proc/sys/net/ipv4/tcp_congestion_control")


@functools.cache
def machine_congestion() -> str:
    """This machine's default TCP congestion control, which the emulated hosts inherit where the
    topology names none (``LINUX_DEFAULT_CONGESTION`` where it cannot be read)."""
    try:
        return DEFAULT_CONGESTION_FILE.read_text().strip() or LINUX_DEFAULT_CONGESTION
    except OSError:
        return LINUX_DEFAULT_CONGESTION


def hosts_congestion(topo: TopologySpec) -> str:
    """The TCP congestion control the hosts of ``topo`` run: its ``tcp_congestion``, else this
    machine's default (``machine_congestion``)."""
    return topo.tcp_congestion or machine_congestion()


def app_limited_message_s(nbytes: float, rtt_s: float) -> float:
    """Seconds from the first to the last packet of a message of ``nbytes`` that one BBR connection
    sends after idle, as a pipeline's connection sends each transfer (the next leaves only after
    the receiver's ready notice, a round trip or more after the last): BBR paces it at its own
    bandwidth estimate, not the link's. Every round of such a connection is app-limited, so BBR
    never leaves STARTUP (``bbr_check_full_bw_reached`` skips app-limited rounds) and paces at
    ``BBR_HIGH_GAIN`` x (1 - ``BBR_PACING_MARGIN``) = G times its estimate. The estimate is the
    largest delivery-rate sample: for a message of n packets the last packet's, n over the time
    from the first packet's send to the last one's ACK (the rate sample's clock restarts when
    nothing is in flight, tcp_rate.c), D + RTT where D is the message's pacing. The estimate
    settles where the pacing it sets gives it back: with the first k = ``BBR_UNPACED_PACKETS``
    leaving at once and the rest at G x estimate, D = (n - k) RTT / ((G - 1) n + k), about RTT /
    (G - 1) = 0.54 RTT for a long message, whatever the link's rate. Measured on the emulator
    within 5% on 8 of 9 paths of 26-208 packets at 40-173 ms RTT (the ninth +6.4%); shorter at a
    few packets (6: 0.10 RTT, the formula 0.17) or a short RTT (10 ms: 0.3-0.38 RTT)."""
    n = max(1.0, math.ceil(nbytes / TCP_MSS_WITH_TIMESTAMPS))
    k = min(n, BBR_UNPACED_PACKETS)
    g = BBR_HIGH_GAIN * (1 - BBR_PACING_MARGIN)
    return (n - k) * rtt_s / ((g - 1) * n + k)


def window_per_buffer_byte(release: str | None = None) -> float:
    """The window one connection keeps per byte of its buffer cap under kernel ``release``
    (default: this machine's, ``platform.release()``); a release it cannot read counts as old."""
    m = re.match(r"(\d+)\.(\d+)", release or platform.release())
    scaled = m is not None and (int(m[1]), int(m[2])) >= SCALING_RATIO_RELEASE
    return WINDOW_PER_BUFFER_BYTE_SCALED if scaled else WINDOW_PER_BUFFER_BYTE_HALF


def buffer_for_window(window_bytes: float) -> int:
    """Socket buffer cap (bytes) under which one connection keeps ``window_bytes`` in flight on this
    machine's kernel: the window plus ``WINDOW_SHORTFALL_BYTES`` over ``window_per_buffer_byte``,
    rounded up."""
    return math.ceil((window_bytes + WINDOW_SHORTFALL_BYTES) / window_per_buffer_byte() - 1e-9)


def window_for_buffer(buffer_bytes: int) -> float:
    """The window (bytes) one connection keeps in flight under a socket-buffer cap of
    ``buffer_bytes`` on this machine's kernel: ``buffer_for_window``'s inverse."""
    return buffer_bytes * window_per_buffer_byte() - WINDOW_SHORTFALL_BYTES


def connections_for(rate_bps: float, rtt_s: float, window_bytes: float, most: int = MAX_WAN_CONNECTIONS) -> int:
    """TCP connections needed to fill a link: its bandwidth-delay product over one connection's
    window (one connection carries at most window / RTT), at least 1, at most ``most``."""
    bdp_bytes = rate_bps / 8 * rtt_s
    return max(1, min(most, math.ceil(bdp_bytes / window_bytes - 1e-9)))


def window_for_share(rate_bps: float, rtt_s: float, share: float) -> float:
    """The window (bytes) with which one connection fills ``share`` of a link of this rate and RTT:
    share x the bandwidth-delay product."""
    return share * rate_bps / 8 * rtt_s


def buffer_for_share(rate_bps: float, rtt_s: float, share: float) -> int:
    """Socket buffer cap (bytes) that holds one connection to ``share`` of a link of this rate and
    RTT (``buffer_for_window`` of ``window_for_share``)."""
    return buffer_for_window(window_for_share(rate_bps, rtt_s, share))


def wan_connections(exp: Experiment, topo: TopologySpec, workers: list[WorkerSpec]) -> int:
    """Connections per cross-DC transfer: 1 without striping; with it (Atlas), the experiment's
    figure or, for 0, the bandwidth-delay product of the longest boundary over one connection's
    window (4 when no per-connection share is modelled)."""
    if not exp.policy.striping:
        return 1
    if exp.wan_connections:
        return exp.wan_connections
    window = connection_window_bytes(exp, topo, workers)
    if window is None:
        return 4
    routes = RoutingTable(topo)
    pairs = wan_pairs(exp, workers)
    if not pairs:
        return 1
    return max(connections_for(routes.wan_rate_bps(a, b), routes.rtt_us(a, b) / 1e6, window) for a, b in pairs)


def wan_pairs(exp: Experiment, workers: list[WorkerSpec]) -> list[tuple[str, str]]:
    """DC pairs whose WAN path carries training traffic: the workers a stage boundary of one
    pipeline joins (PP: ``schedule.experiment_boundaries``) and replicas of one stage (the gradient
    all-reduce), where the two sit in different DCs."""
    by = {(w.stage, w.replica): w for w in workers}
    nxt = {a: [b for x, b in experiment_boundaries(exp) if x == a] for a in range(exp.stages)}
    pairs: set[tuple[str, str]] = set()
    for w in workers:
        for other in (*(by.get((b, w.replica)) for b in nxt[w.stage]), by.get((w.stage, w.replica + 1))):
            if other is not None and other.dc != w.dc:
                a, b = sorted((w.dc, other.dc))
                pairs.add((a, b))
    return sorted(pairs)


def path_connection_share(
    exp: Experiment, topo: TopologySpec, workers: list[WorkerSpec], a: str, b: str
) -> float | None:
    """The share of the path ``a`` -> ``b``'s rate that one TCP connection fills with its window
    (``connection_window_bytes``, over the path's bandwidth-delay product), at most 1; None when no
    share is modelled."""
    window = connection_window_bytes(exp, topo, workers)
    if window is None:
        return None
    routes = RoutingTable(topo)
    bdp_bytes = routes.wan_rate_bps(a, b) / 8 * routes.rtt_us(a, b) / 1e6
    return min(1.0, window / bdp_bytes)


def connection_window_bytes(exp: Experiment, topo: TopologySpec, workers: list[WorkerSpec]) -> float | None:
    """The window one TCP connection keeps in flight (bytes): ``exp.wan_window_bytes``, else
    ``exp.wan_connection_share`` of the bandwidth-delay product of the WAN path (of those training
    traffic crosses, ``wan_pairs``) where that is smallest; None when neither is modelled or no
    path is crossed. The hosts' socket buffers are capped to hold it (``socket_buffer_cap``). One
    window holds every connection of a host, so on paths with a larger bandwidth-delay product one
    connection fills less than the share: ``wan_load.BoundaryLoad`` states the share of each path
    (``testbed plan`` prints it)."""
    if exp.wan_window_bytes is not None:
        return float(exp.wan_window_bytes)
    if exp.wan_connection_share is None:
        return None
    routes = RoutingTable(topo)
    pairs = wan_pairs(exp, workers)
    if not pairs:
        return None
    return min(
        window_for_share(routes.wan_rate_bps(a, b), routes.rtt_us(a, b) / 1e6, exp.wan_connection_share)
        for a, b in pairs
    )


def window_rate_bps(window_bytes: float | None, rtt_s: float) -> float | None:
    """What one connection carries with ``window_bytes`` in flight per round trip of ``rtt_s``
    (payload bit/s), or None where it is not limited (no window modelled, or a path without
    delay)."""
    if window_bytes is None or rtt_s <= 0:
        return None
    return window_bytes * 8 / rtt_s


def one_connection_bps(
    exp: Experiment, topo: TopologySpec, workers: list[WorkerSpec], a: str, b: str, nbytes: float
) -> float | None:
    """What one TCP connection carries from DC ``a`` to DC ``b`` when it carries ``nbytes`` of a
    transfer (payload bit/s), or None where it is not limited: measured, where the experiment
    carries a profile of that path (``exp.wan_profile``, ``spec/wan_profile.py``), else one
    modelled window per round trip (``connection_window_bytes``, ``window_rate_bps``); where the
    hosts run BBR (``hosts_congestion``), its bytes over BBR's pacing of a message after idle
    (``app_limited_message_s``) where they fit in the window, and the slower of the two where they
    do not."""
    measured = exp.wan_profile.path(a, b) if exp.wan_profile is not None else None
    if measured is not None:
        return measured.one_connection_bps(nbytes)
    rtt_s = RoutingTable(topo).rtt_us(a, b) / 1e6
    window = connection_window_bytes(exp, topo, workers)
    window_bps = window_rate_bps(window, rtt_s)
    if hosts_congestion(topo) != "bbr" or rtt_s <= 0:
        return window_bps
    fits = window is None or nbytes <= window
    paced_s = app_limited_message_s(nbytes, rtt_s)
    if paced_s <= 0:  # one packet: it leaves at once
        return None if fits else window_bps
    paced_bps = nbytes * 8 / paced_s
    # bytes that fit in the window leave paced, not a window per round trip (docs/results.md, "What
    # the validation found": a 64 KiB message on four_dc in 29 ms where the window rate gives 52)
    return paced_bps if fits or window_bps is None else min(window_bps, paced_bps)


def sent_at_once(
    exp: Experiment, topo: TopologySpec, workers: list[WorkerSpec], a: str, b: str, nbytes: float, connections: int
) -> bool:
    """Whether a transfer of ``nbytes`` over ``connections`` from DC ``a`` to DC ``b`` leaves as one
    burst: each connection's share fits in the window it keeps in flight (measured where the
    experiment profiles the path, ``PathProfile.window_bytes``; else the modelled window,
    ``connection_window_bytes``; always where no window is modelled), so all its bytes reach the
    bottleneck's queue at once (``fair_share``'s bursts)."""
    measured = exp.wan_profile.path(a, b) if exp.wan_profile is not None else None
    window = measured.window_bytes if measured is not None else connection_window_bytes(exp, topo, workers)
    return window is None or nbytes / connections <= window


def connection_rate_bps(rate_bps: float, one_bps: float | None, connections: int) -> float:
    """What ``connections`` TCP connections carry on a path whose link gives ``rate_bps``: each at
    most ``one_bps`` (``one_connection_bps``; None: not limited), together at most the link."""
    if one_bps is None:
        return rate_bps
    return min(rate_bps, connections * one_bps)


def transfer_time_s(nbytes: float, rate_bps: float, one_bps: float | None, connections: int) -> float:
    """Seconds from a transfer's first byte on the wire to its last, alone on a link whose payload
    carries ``rate_bps`` (the line rate times TCP's goodput share), over ``connections`` of at most
    ``one_bps`` each: its bytes at ``connection_rate_bps``. (A window-by-window model, rounds one
    RTT apart, predicted the default experiment's pp-fair layouts in the wrong order: see the
    prediction table in docs/results.md.)"""
    return nbytes * 8 / connection_rate_bps(rate_bps, one_bps, connections)


def socket_buffer_cap(exp: Experiment, topo: TopologySpec, workers: list[WorkerSpec]) -> int | None:
    """The hosts' socket-buffer cap (bytes) under which one connection keeps
    ``connection_window_bytes`` in flight on this machine's kernel (``buffer_for_window``), or None
    when no window is modelled."""
    window = connection_window_bytes(exp, topo, workers)
    return None if window is None else buffer_for_window(window)
