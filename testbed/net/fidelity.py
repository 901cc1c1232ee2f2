"""The fidelity check: is the emulated WAN what the topology asked for?

For every WAN link, one direction at a time, between the first hosts of its two DCs:
- TCP goodput with iperf3 (default 10 s after 2 s omitted), expected to be the path's bottleneck
  rate x TCP_GOODPUT_FRACTION (1448 payload bytes per 1514-byte frame, 95.6%), within 5%;
- idle RTT, median of 20 ``ping -U`` samples (user-to-user time: plain ping timestamps packets
  before PREROUTING and under-reports delay added there, DESIGN.md section 3), expected to be twice
  the sum of one-way delays on the routed path (access links included), within max(1 ms, 5%);
- where the path has loss, the UDP loss rate (iperf3 -u), expected 1 - prod(1 - p_i), within four
  binomial standard deviations (plus 10% of the expected rate);
- the packets the path's WAN queues dropped during the TCP measurement (HTB class counters; with
  netem they include its emulated loss). Reported, not judged: a queue below the path's
  bandwidth-delay product drops by design (``spec/queues.py`` warns of it at load time).
The traffic between two DCs follows the routed path, which need not be the direct link.

A direction that fails may be measured again (``attempts``): on a small machine one measurement in
a few dips under its tolerance while another process takes a core. The report keeps every
measurement; a direction that is wrong usually fails every one, while a retry lets one just
outside its tolerance pass more often: keep ``attempts`` small.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace

from testbed.errors import CheckError
from testbed.net.iperf import iperf
from testbed.net.link_control import link_name, resolve_link
from testbed.net.network import Network
from testbed.spec.wire import tcp_goodput_fraction

RATE_TOLERANCE = 0.05
RTT_TOLERANCE_MS, RTT_TOLERANCE_FRACTION = 1.0, 0.05


@dataclass
class LinkCheck:
    """Configured against measured figures of one direction of one WAN link."""

    src_dc: str
    dst_dc: str
    path: list[str]
    rate_mbit: float
    expected_goodput_mbit: float
    measured_rate_mbit: float
    delay_ms: float
    expected_rtt_ms: float
    measured_rtt_ms: float
    rtt_samples: int
    loss_pct: float
    measured_loss_pct: float | None
    rate_ok: bool
    rtt_ok: bool
    loss_ok: bool
    queue_drops: int = 0
    #: the failing measurements of this direction taken before this one (``check_fidelity(attempts=)``)
    earlier: list[dict] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.rate_ok and self.rtt_ok and self.loss_ok

    def to_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok}


#: a check's rates and durations, converted to a dilated network's emulated frame (``in_emulated_frame``)
RATE_FIELDS = ("rate_mbit", "expected_goodput_mbit", "measured_rate_mbit")
DURATION_FIELDS = ("delay_ms", "expected_rtt_ms", "measured_rtt_ms")


def in_emulated_frame(r: LinkCheck, k: float) -> LinkCheck:
    """``r``, measured on a network dilated ``k`` times (``spec/dilation.py``), in the emulated
    frame: rates x k, delays and round trips / k; the verdicts are the measurement's (rates within
    5% hold in either frame; an RTT's 1 ms floor is 1/k ms there)."""

    def convert(d: dict) -> dict:
        return d | {f: d[f] * k for f in RATE_FIELDS} | {f: d[f] / k for f in DURATION_FIELDS}

    return replace(
        r,
        **{f: getattr(r, f) * k for f in RATE_FIELDS},
        **{f: getattr(r, f) / k for f in DURATION_FIELDS},
        earlier=[convert(e) for e in r.earlier],
    )


def jitter_rtt_sd_ms(jitter_ms: float) -> float:
    """Standard deviation (ms) of a round trip over a link with ``jitter_ms`` of jitter each way:
    netem (without a distribution table) and the NFQUEUE element both draw a packet's delay
    uniformly from [d - j, d + j], so each way has sd j / sqrt(3) and the round trip, their sum,
    j x sqrt(2/3) = 2 j / sqrt(6)."""
    return 2 * jitter_ms / 6**0.5


def rtt_within(measured_ms: float, expected_ms: float, floor_ms: float = 0.0) -> bool:
    """Whether an RTT (ms) is within max(1 ms, 5%) of the expected one, plus ``floor_ms``: the
    round trip a machine adds on its own (an emulated CPU's late timers, for one)."""
    return abs(measured_ms - expected_ms) <= max(RTT_TOLERANCE_MS, RTT_TOLERANCE_FRACTION * expected_ms) + floor_ms


def rate_within(measured: float, expected: float) -> bool:
    return abs(measured - expected) <= RATE_TOLERANCE * expected


def loss_within(measured_pct: float, expected_pct: float, packets: int) -> bool:
    p = expected_pct / 100
    sigma = math.sqrt(max(p * (1 - p), 1e-12) / max(packets, 1))
    return abs(measured_pct / 100 - p) <= 4 * sigma + 0.1 * p


def parse_ping_ms(output: str) -> list[float]:
    """Per-reply RTTs (ms) from iputils ping output (``time=12.3 ms`` lines)."""
    return [float(x) for x in re.findall(r"time=([0-9.]+) ms", output)]


#: RTT samples on a path with jitter (see check_direction)
JITTER_RTT_SAMPLES = 80


def measure_rtt_ms(net: Network, src: str, dst: str, samples: int) -> tuple[float, int]:
    proc = net.run(
        src,
        ["ping", "-U", "-n", "-c", str(samples), "-i", "0.05", "-W", "3", str(net.host(dst).ip)],
        timeout_s=samples * 4 + 10,
    )
    rtts = parse_ping_ms(proc.stdout)
    if len(rtts) < max(3, samples // 2):
        raise CheckError(f"ping {src}->{dst} got {len(rtts)} of {samples} replies: {proc.stdout[-300:]}")
    return statistics.median(rtts), len(rtts)


def path_queue_drops(net: Network, dcs: list[str]) -> int:
    """Packets dropped so far by the WAN queues along the routed path ``dcs`` (every class of every
    hop's egress: ``Network.wan_counters``)."""
    counters = net.wan_counters()
    hops = zip(dcs, dcs[1:])
    return sum(c["drops"] for hop in hops for c in counters.get(hop, {}).values())


def check_direction(
    net: Network,
    src_dc: str,
    dst_dc: str,
    duration_s: float,
    omit_s: float,
    rtt_samples: int,
    rtt_floor_ms: float = 0.0,
) -> LinkCheck:
    src, dst = net.plan.first_host(src_dc).name, net.plan.first_host(dst_dc).name
    route = net.routes.route(src_dc, dst_dc)
    rate = net.routes.bottleneck_bps(src_dc, dst_dc)
    one_way_us = net.routes.one_way_delay_us(src_dc, dst_dc)
    net.wait_quiet()  # an earlier transfer may have left a deep queue: RTT is measured idle
    if any(link.jitter_us for link in route.links):
        # jitter spreads each sample over +-2 x jitter: the median of a few samples wanders by more
        # than the tolerance allows, so take at least JITTER_RTT_SAMPLES (its error falls as 1/sqrt(n))
        rtt_samples = max(rtt_samples, JITTER_RTT_SAMPLES)
    rtt_ms, n = measure_rtt_ms(net, src, dst, rtt_samples)
    expected_rtt = net.routes.rtt_us(src_dc, dst_dc) / 1000
    drops_before = path_queue_drops(net, list(route.dcs))
    tcp = iperf(net, src, dst, duration_s, omit_s)
    drops = path_queue_drops(net, list(route.dcs)) - drops_before
    expected_goodput = rate * tcp_goodput_fraction(net.mtu or 1500)
    loss_pct = 100 * (1 - route.delivery_probability)
    measured_loss, loss_ok = None, True
    if loss_pct > 0:
        # a fifth of the link: drops then come from the emulated loss, not from queues or a busy receiver
        udp = iperf(net, src, dst, duration_s, 0, udp_rate_bps=min(rate // 5, 20_000_000))
        measured_loss = udp.lost_percent
        loss_ok = loss_within(measured_loss, loss_pct, udp.packets or 0)
    net.check_alive()
    return LinkCheck(
        src_dc,
        dst_dc,
        list(route.dcs),
        rate / 1e6,
        expected_goodput / 1e6,
        tcp.bits_per_second / 1e6,
        one_way_us / 1000,
        expected_rtt,
        rtt_ms,
        n,
        loss_pct,
        measured_loss,
        # with loss, TCP cannot reach the shaped rate (Mathis et al. 1997): rate not judged
        rate_within(tcp.bits_per_second, expected_goodput) if loss_pct == 0 else True,
        rtt_within(rtt_ms, expected_rtt, rtt_floor_ms),
        loss_ok,
        drops,
    )


def check_fidelity(
    net: Network,
    duration_s: float = 10,
    omit_s: float = 2,
    rtt_samples: int = 20,
    progress=None,
    attempts: int = 1,
    rtt_floor_ms: float = 0.0,
    links: Sequence[str] = (),
    dilation: float = 1.0,
) -> dict:
    """Measure every WAN link in both directions, or those named in ``links`` (``DC:DC``, as
    ``testbed link list`` names them); return the report (see ``testbed topo check --json``).

    A direction that fails is measured again, up to ``attempts`` measurements in all, and is judged
    by its last; the failing ones are kept in its ``earlier``. ``rtt_floor_ms`` widens the RTT
    tolerance by the machine's own round trip (see ``rtt_within``). Raises ``ValueError`` for
    ``attempts`` that is not a whole number from 1 or a negative or NaN ``rtt_floor_ms``,
    ``CheckError`` where a measurement cannot be taken, ``LinkError`` for a name in ``links`` that
    the topology has not. ``dilation``: ``net`` is a topology dilated this many times; the rows
    are given in its emulated frame (``in_emulated_frame``).
    """
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        raise ValueError(f"attempts={attempts!r}: give a whole number of measurements per direction, 1 or more")
    if not (math.isfinite(rtt_floor_ms) and rtt_floor_ms >= 0):
        raise ValueError(f"rtt_floor_ms={rtt_floor_ms!r}: give the machine's own round trip, a finite ms >= 0")
    chosen = {resolve_link(net.spec, name) for name in links}
    results = []
    for link in net.spec.links:
        if chosen and link_name(link.a, link.b) not in chosen:
            continue
        for a, b in ((link.a, link.b), (link.b, link.a)):
            earlier: list[dict] = []
            while True:
                result = check_direction(net, a, b, duration_s, omit_s, rtt_samples, rtt_floor_ms)
                if result.ok or len(earlier) + 1 >= attempts:
                    break
                earlier.append({k: v for k, v in result.to_dict().items() if k != "earlier"})
            result.earlier = earlier
            if dilation != 1:
                result = in_emulated_frame(result, dilation)
            results.append(result)
            if progress:
                progress(result)
    return {
        "topology": net.spec.name,
        "source": net.spec.source,
        "delay_mechanism": net.mechanism,
        "duration_s": duration_s,
        "omit_s": omit_s,
        "attempts": attempts,
        "rtt_floor_ms": rtt_floor_ms,
        "time_dilation": dilation,
        "links": [r.to_dict() for r in results],
        "ok": all(r.ok for r in results),
    }


def format_row(r: LinkCheck) -> str:
    loss = f"{r.loss_pct:.3g}%/{r.measured_loss_pct:.3g}%" if r.measured_loss_pct is not None else "-"
    return (
        f"{r.src_dc:>10} -> {r.dst_dc:<10} {r.rate_mbit:9.3g} {r.expected_goodput_mbit:9.2f} "
        f"{r.measured_rate_mbit:9.2f} {r.expected_rtt_ms:8.2f} {r.measured_rtt_ms:8.2f} {loss:>13} "
        f"{'ok' if r.ok else 'FAIL'}"
        + (f" (queue dropped {r.queue_drops})" if r.queue_drops else "")
        + (f" (measurement {len(r.earlier) + 1}; earlier {', '.join(map(_brief, r.earlier))})" if r.earlier else "")
    )


def _brief(d: dict) -> str:
    """One failing measurement in a few words: its rate and RTT."""
    return f"{d['measured_rate_mbit']:.1f} Mbit/s, {d['measured_rtt_ms']:.2f} ms"


HEADER = (
    f"{'src':>10}    {'dst':<10} {'rate':>9} {'goodput':>9} {'measured':>9} {'RTT':>8} {'measured':>8} "
    f"{'loss/meas':>13} verdict\n{'':>10}    {'':<10} {'Mbit/s':>9} {'expected':>9} {'Mbit/s':>9} "
    f"{'ms':>8} {'ms':>8}"
)
