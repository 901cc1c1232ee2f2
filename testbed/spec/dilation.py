"""Time dilation: an emulated world run ``k`` times slower than it claims, so that the machine
keeps up with more GPUs and faster links than it has (Gupta et al., "To Infinity and Beyond:
Time-Warped Network Emulation", NSDI 2006; here in user space, since the testbed owns the clocks
that decide its results).

``dilate_experiment`` turns an experiment described in the emulated frame (``time_dilation: k``)
into the one that runs in real time: every duration the testbed sets is multiplied by ``k``
(compute targets, one-way delays and jitter, a link profile's times, the failover detection
time, BubbleTea's guard and TTFT SLO, the outage timeout) and every rate divided by it (the WAN
links' and the access links' rates, BubbleTea's request rate; a request trace's times are
stretched through its ``time_scale``). Sizes do not change (bytes, packets, windows, queues:
a link's bandwidth-delay product in packets stays the same). Shares and counts do not change.
What is not dilated: the kernel's TCP timers (minimum RTO 200 ms, delayed ACKs), gloo's own
timeouts, per-packet CPU costs and unshaped links (an access link without ``intra_rate`` runs at
the machine's speed), documented in docs/time-dilation.md. The reported figures go back to the
emulated frame in ``trace/frame.py``. Pure."""

from __future__ import annotations

from dataclasses import replace

from testbed.spec.experiment import Experiment
from testbed.spec.link_profile import LinkProfile, LinkState, ProfileStep
from testbed.spec.topology import DCSpec, LinkSpec, TopologySpec


def _us(value: int, k: float) -> int:
    return round(value * k)


def _bps(value: int, k: float) -> int:
    return max(1, round(value / k))


def dilate_state(s: LinkState, k: float) -> LinkState:
    """A link's figures ``k`` times slower: rate / k (0, down, stays 0), delay and jitter x k."""
    return LinkState(_bps(s.rate_bps, k) if s.rate_bps else 0, _us(s.delay_us, k), _us(s.jitter_us, k), s.loss_pct)


def dilate_profile(p: LinkProfile, k: float) -> LinkProfile:
    """A link profile ``k`` times slower: each step at k x its time, its figures dilated."""
    steps = tuple(ProfileStep(_us(s.t_us, k), dilate_state(s.state, k)) for s in p.steps)
    period = _us(p.period_us, k) if p.period_us is not None else None
    return replace(p, steps=steps, period_us=period, note=f"{p.note} (dilated x{k:g})".strip())


def dilate_link(link: LinkSpec, k: float) -> LinkSpec:
    s = dilate_state(link.state, k)
    return replace(
        link,
        rate_bps=s.rate_bps,
        delay_us=s.delay_us,
        jitter_us=s.jitter_us,
        profile=dilate_profile(link.profile, k) if link.profile is not None else None,
        route_us=_us(link.route_us, k) if link.route_us is not None else None,
        failover_after_us=_us(link.failover_after_us, k),
    )


def dilate_dc(dc: DCSpec, k: float) -> DCSpec:
    rate = _bps(dc.intra_rate_bps, k) if dc.intra_rate_bps is not None else None
    return replace(dc, intra_rate_bps=rate, intra_delay_us=_us(dc.intra_delay_us, k))


def dilate_topology(spec: TopologySpec, k: float) -> TopologySpec:
    """``spec`` ``k`` times slower (module doc); ``k`` = 1 returns it unchanged."""
    if k == 1:
        return spec
    return replace(
        spec,
        dcs=tuple(dilate_dc(dc, k) for dc in spec.dcs),
        links=tuple(dilate_link(x, k) for x in spec.links),
        description=f"{spec.description} (dilated x{k:g}: rates / {k:g}, delays x {k:g})".strip(),
    )


def dilate_experiment(exp: Experiment) -> Experiment:
    """The experiment that runs in real time for ``exp``, described in the emulated frame with
    ``exp.time_dilation`` = k (module doc): its own ``time_dilation`` is 1, so that nothing
    dilates it twice; the run records k beside it (``config.json``'s ``time_dilation_applied``)."""
    k = exp.time_dilation
    if k == 1:
        return exp
    c = exp.compute
    compute = replace(
        c,
        forward_ms=c.forward_ms * k,
        backward_ms=c.backward_ms * k,
        optimizer_ms=c.optimizer_ms * k if c.optimizer_ms is not None else None,
        device=None,  # the targets are the device's, resolved: dilated, they stand for themselves
        reference_forward_tflop=None,
    )
    bt = exp.bubbletea
    bubbletea = replace(
        bt,
        request_rate=bt.request_rate / k,
        time_scale=bt.time_scale * k,
        guard_ms=bt.guard_ms * k,
        ttft_slo_s=bt.ttft_slo_s * k,
    )
    return replace(
        exp,
        topology_spec=dilate_topology(exp.topology_spec, k),
        compute=compute,
        bubbletea=bubbletea,
        outage_timeout=_us(exp.outage_timeout, k),
        time_dilation=1.0,
    )
