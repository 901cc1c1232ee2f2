"""Fidelity under change (``testbed topo check --profile``): does a profiled link deliver what its
profile sets, at the times it sets it?

For each profiled WAN link whose DCs are routed over it directly, one direction (the file's
first DC to its second), between the first hosts of its two DCs, while the profile replays:
- a bulk TCP flow (iperf3) runs for the check's duration, and the receiving host's interface
  counters (bytes received, read through netlink) are sampled every ``interval_s`` (100 ms) on
  this machine's clock; the bytes each interval delivered must not exceed what the profile let
  through the shaper over that interval shifted back by the path's one-way delay (bytes already
  past the shaper when the rate drops arrive at the old rate; where the delay drops, the packets
  on their way catch up, counted up to ``CATCH_UP_SLACK_S`` late; each sample's time uncertain by
  half its read), by more than ``RATE_TOLERANCE`` (5%): a change that opened an unshaped window,
  or came late, would show here. The times are the profile's (its time 0, the end of the build,
  plus each step's time), not the shaping log's record of when each change was made;
- for each step that lowers the rate by more than a fifth, when the delivered rate changed,
  read from the counters (the sample interval holding the step plus the one-way delay: its bytes
  are the old rate's before the change and the new one's after), against when it was due
  (``lag_s``, reported with the uncertainty its samples' times give it, ``lag_uncertainty_s``, and
  beside the shaping log's own record of the step, ``applied_s``; the bound above judges it);
  after a rise TCP takes its own time to fill the link, so rises are not timed;
- then, on the idle path for as long again, ping every 100 ms: each phase's least RTT against
  twice the one-way delay the profile set then, within max(1 ms, 5%).
  Steps that take the link down are expected to deliver nothing.

The hosts hand the network one TCP segment per packet for the check (``netns.segment_at_hosts``:
with the kernel's 64 KB segments, HTB's output swings by 11% over 100 ms at 20 Mbit/s, which
would hide what the check looks for); runs keep the kernel's default.

Pure parts (``goodput_bound_check``, ``step_lags``, ``phase_rtts``) take the samples; ``check_profile``
measures them on a built network."""

from __future__ import annotations

import json
import math
import re
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pyroute2 import IPRoute

from testbed.errors import CheckError
from testbed.net.fidelity import RTT_TOLERANCE_FRACTION, RTT_TOLERANCE_MS
from testbed.net.iperf import PORT
from testbed.net.local import LocalNetwork
from testbed.net.netns import segment_at_hosts
from testbed.spec.addressing import HOST_IFNAME
from testbed.spec.link_profile import LinkProfile
from testbed.spec.routing import RoutingTable
from testbed.trace.shaping_log import PROFILE_STEP, SHAPING_LOG

RATE_TOLERANCE = 0.05
#: how long after a delay drop's catch-up was due its packets may still be counted (s). Where the
#: delay drops from d to d', what left the shaper in the d - d' after the change waits behind the
#: older packets and leaves the delay element with the last of them, at once (it never reorders):
#: 15 ms of 100 Mbit/s, 125 packets, each given its verdict in turn and then forwarded to the
#: host. A fresh clone's check (2026-12-07) read its counter 2.3 ms after such a burst was due
#: and counted it all in the next interval: 114.9 Mbit/s against a 100 Mbit/s bound
CATCH_UP_SLACK_S = 0.005
#: a counter read that took longer than this (ns) is made again, up to ``READS_PER_SAMPLE`` reads
#: in all, and the quickest kept: half a read's duration is its sample's uncertainty. One link's
#: read through pyroute2 takes 0.2-0.6 ms here (2026-12-07); a dump of every link's, before, took
#: about 2 ms, the largest of 40 10.7 ms (a thread descheduled inside it)
TIGHT_READ_NS = 1_000_000
READS_PER_SAMPLE = 3
#: a step that lowers the rate by more than this share is timed (``step_lags``)
TIMED_DROP = 0.2


@dataclass
class ProfileCheck:
    """One profiled link's check: its samples' worst excess over the bound, the timed steps and
    the phases' RTTs."""

    link: str
    src: str
    dst: str
    one_way_s: float
    intervals: int
    worst_excess: float
    over: list[dict[str, float]]
    lags: list[dict[str, Any]]
    rtts: list[dict[str, Any]]
    rate_ok: bool
    rtt_ok: bool
    #: the measurements: (s after the profile's start, bytes received so far); (send time, RTT ms)
    samples: list[tuple[float, int]] = field(default_factory=list)
    #: each sample's time's uncertainty: half its read's duration (s)
    sample_uncertainty_s: list[float] = field(default_factory=list)
    pings: list[tuple[float, float]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.rate_ok and self.rtt_ok

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "ok": self.ok}


def configured_bps(profile: LinkProfile, t_s: float) -> int:
    """The rate the profile sets ``t_s`` after its start (bit/s; 0 down)."""
    return profile.state_at(max(0.0, t_s) * 1e6).rate_bps


def sent_bits(profile: LinkProfile, a_s: float, b_s: float) -> float:
    """What the link's shaper lets through from ``a_s`` to ``b_s`` after the profile's start at the
    rates the profile sets (bits; before the start, its first rate)."""
    edges = [c.t_us / 1e6 for c in profile.changes(int(max(b_s, 0) * 1e6) + 1) if a_s < c.t_us / 1e6 < b_s]
    points = [a_s, *edges, b_s]
    return sum(configured_bps(profile, x) * (y - x) for x, y in zip(points, points[1:]))


def delivery_window(profile: LinkProfile, base_s: float, t0_s: float, t1_s: float) -> tuple[float, float]:
    """When the bits delivered from ``t0_s`` to ``t1_s`` can have left the shaper: the interval
    moved back by the one-way delay, its start by the longest delay in force meanwhile (delay plus
    jitter, plus ``base_s``, the rest of the path) and its end by the shortest (a delay that drops
    lets packets catch up: FIFO holds them behind those already on their way). A delay in force
    until ``CATCH_UP_SLACK_S`` before the interval's bits can have left the shaper still counts:
    the catch-up after it drops may reach the counter that late."""
    longest = max(s.state.delay_us + s.state.jitter_us for s in profile.steps) / 1e6
    look_back = t0_s - base_s - longest - CATCH_UP_SLACK_S
    states = [profile.state_at(t * 1e6) for t in _times_in(profile, look_back, t1_s)]
    hi = base_s + max(x.delay_us + x.jitter_us for x in states) / 1e6
    lo = base_s + min(x.delay_us - x.jitter_us for x in states) / 1e6
    return t0_s - hi, t1_s - lo


def _times_in(profile: LinkProfile, a_s: float, b_s: float) -> list[float]:
    """``a_s`` and every change of the profile in (a_s, b_s)."""
    return [max(a_s, 0.0)] + [
        c.t_us / 1e6 for c in profile.changes(int(max(b_s, 0) * 1e6) + 1) if a_s < c.t_us / 1e6 < b_s
    ]


def goodput_bound_check(
    samples: list[tuple[float, int]],
    profile: LinkProfile,
    base_s: float,
    uncertainty_s: list[float] | None = None,
) -> tuple[float, list[dict[str, float]], int]:
    """(the worst excess of a sample interval's delivered bits over its bound, as a share of the
    bound; the intervals over ``RATE_TOLERANCE``; how many intervals) from ``samples``: (s after the
    profile's start, bytes received so far). An interval's bound is what the shaper let through
    over its ``delivery_window`` (``base_s``: the path's one-way delay besides the link's), the
    interval widened at each end by that sample's ``uncertainty_s`` (half its read's duration: the
    counter was read somewhere inside it; none: exact); while the link is down it is 0, and any
    delivery is over."""
    worst, over = 0.0, []
    widen = uncertainty_s or [0.0] * len(samples)
    for (t0, b0), (t1, b1), u0, u1 in zip(samples, samples[1:], widen, widen[1:]):
        bits = (b1 - b0) * 8
        bound = sent_bits(profile, *delivery_window(profile, base_s, t0 - u0, t1 + u1))
        excess = bits / bound - 1 if bound > 0 else (math.inf if bits > 0 else 0.0)
        worst = max(worst, excess)
        if excess > RATE_TOLERANCE:
            over.append({"t_s": t0, "delivered_bps": bits / (t1 - t0), "bound_bps": bound / (t1 - t0)})
    return worst, over, max(0, len(samples) - 1)


def step_lags(
    samples: list[tuple[float, int]],
    profile: LinkProfile,
    one_way_s: float,
    until_s: float,
    uncertainty_s: list[float] | None = None,
) -> list[dict[str, float | None]]:
    """For each step before ``until_s`` that lowers the rate by more than ``TIMED_DROP``: when the
    delivered rate changed, read from the sample interval that holds the step plus ``one_way_s``
    (its bytes are the old rate's until the change and the new one's after:
    ``t = t0 + (bits - new x (t1 - t0)) / (old - new)``), less that due time (``lag_s``; None
    where no sample interval holds it). ``uncertainty_s``: each sample's time uncertainty (s; none
    by default); ``lag_uncertainty_s`` is what those of the interval's two ends make of the lag,
    ``(u0 x old + u1 x new) / (old - new)`` (the formula's slopes in ``t0`` and ``t1``): a
    sample's time 5 ms off its counter's at the start of a 100 -> 20 Mbit/s interval moves the lag by 6.25
    ms. Raises ValueError when ``uncertainty_s`` is not one figure per sample."""
    unc = uncertainty_s if uncertainty_s is not None else [0.0] * len(samples)
    if len(unc) != len(samples):
        raise ValueError(f"{len(unc)} sample uncertainties for {len(samples)} samples: give one per sample")
    out: list[dict[str, float | None]] = []
    changes = profile.changes(int(until_s * 1e6))
    for before, step in zip(changes, changes[1:]):
        old, new = before.state.rate_bps, step.state.rate_bps
        if not (old > 0 and new < old * (1 - TIMED_DROP)):
            continue
        due = step.t_us / 1e6 + one_way_s
        lag = lag_unc = None
        for (t0, b0), (t1, b1), u0, u1 in zip(samples, samples[1:], unc, unc[1:]):
            if t0 <= due < t1:
                changed = t0 + ((b1 - b0) * 8 - new * (t1 - t0)) / (old - new)
                lag, lag_unc = changed - due, (u0 * old + u1 * new) / (old - new)
        out.append(
            {
                "t_s": step.t_us / 1e6,
                "from_bps": float(old),
                "to_bps": float(new),
                "lag_s": lag,
                "lag_uncertainty_s": lag_unc,
            }
        )
    return out


def shaper_timing(shaping: list[dict[str, Any]], link: str, lags: list[dict[str, Any]]) -> None:
    """Set each timed step of ``lags`` beside the shaping log's own record of it (``shaping``: the
    log's rows; ``link``: ``A:B``): ``applied_s``, (when the profile player began the step's
    changes, when it had made them all) less when the step was due, in s; None where the log has
    no such step. Reported for a reader who must tell a late change from a late reading; the check
    judges the counters, not this."""
    made = {
        int(r["profile_t_us"]): (r["t_ns"] - r["due_ns"], r["t_ns"] + r["duration_ns"] - r["due_ns"])
        for r in shaping
        if r.get("event") == PROFILE_STEP and r.get("link") == link
    }
    for lag in lags:
        late = made.get(round(lag["t_s"] * 1e6))
        lag["applied_s"] = None if late is None else [late[0] / 1e9, late[1] / 1e9]


def phase_rtts(
    pings: list[tuple[float, float]], profile: LinkProfile, base_rtt_ms: float, until_s: float
) -> list[dict]:
    """Each phase's least RTT (ms) of ``pings`` (send time after the profile's start, s; RTT, ms)
    against twice the phase's one-way delay on the link plus ``base_rtt_ms`` (the rest of the
    path); ``ok`` within max(``RTT_TOLERANCE_MS``, ``RTT_TOLERANCE_FRACTION``). A phase that is
    down, or without a reply, is left out."""
    out = []
    for start, end, state in profile.phases(int(until_s * 1e6)):
        if not state.up:
            continue
        expected = 2 * state.delay_us / 1000 + base_rtt_ms
        # a ping sent near a phase's edge crosses partly at the other phase's figures
        seen = [rtt for t, rtt in pings if start / 1e6 + 0.2 <= t < end / 1e6 - expected / 1000 - 0.01]
        if not seen:
            continue
        least = min(seen)
        ok = abs(least - expected) <= max(RTT_TOLERANCE_MS, RTT_TOLERANCE_FRACTION * expected)
        out.append({"from_s": start / 1e6, "expected_ms": expected, "least_ms": least, "pings": len(seen), "ok": ok})
    return out


def tight_read(read: Callable[[], int], clock: Callable[[], int] = time.monotonic_ns) -> tuple[int, int, int]:
    """A counter read by ``read``, timed by ``clock`` (ns): (how long the read took, its middle, the
    count). A read that took over ``TIGHT_READ_NS`` (descheduled inside) is made again, up to
    ``READS_PER_SAMPLE`` reads in all, and the quickest kept."""
    reads = []
    for _ in range(READS_PER_SAMPLE):
        before = clock()
        count = read()
        after = clock()
        reads.append((after - before, (before + after) // 2, count))
        if after - before <= TIGHT_READ_NS:
            break
    return min(reads)


def _rx_bytes(ipr: IPRoute, index: int) -> int:
    """Bytes received by the interface ``index`` (one RTM_GETLINK of it, not a dump of them all)."""
    link = ipr.get_links(index)[0]
    return int(link.get_attr("IFLA_STATS64")["rx_bytes"])


def check_profile(net: LocalNetwork, duration_s: float, interval_s: float = 0.1) -> list[ProfileCheck]:
    """Check every profiled link of ``net`` directly routed between its DCs (module doc), all at
    once, for ``duration_s`` from now. Raises CheckError where iperf3 fails or no link has a
    profile."""
    spec = net.spec
    routes = RoutingTable(spec)
    links = [x for x in spec.links if x.profile is not None]
    if not links:
        raise CheckError(f"{spec.name} has no link with a profile: nothing to check under change")
    t0_ns = _profile_start_ns(net)
    segment_at_hosts(net.handles, net.plan, net.dcs_here)  # the shaper sees one segment per packet
    checks: list[tuple[Any, str, str, float]] = []
    for link in links:
        if routes.route(link.a, link.b).dcs != (link.a, link.b):
            continue
        src, dst = net.plan.first_host(link.a).name, net.plan.first_host(link.b).name
        checks.append((link, src, dst, routes.one_way_delay_us(link.a, link.b) / 1e6))
    holders: list[dict[str, Any]] = [{} for _ in checks]
    for run in ("bulk", "pings"):  # the rate under a bulk flow; then the RTT on an idle path
        threads = []
        for i, (_link, src, dst, _) in enumerate(checks):
            args: tuple = (net, src, dst, duration_s, interval_s, t0_ns, holders[i], PORT + i)
            if run == "pings":
                args = (net, src, dst, duration_s, t0_ns, holders[i])
            threads.append(threading.Thread(target=_bulk if run == "bulk" else _pings, args=args))
            threads[-1].start()
        for th in threads:
            th.join()
    text = (net.out_dir / SHAPING_LOG).read_text()
    lines = text.splitlines() if text.endswith("\n") else text.splitlines()[:-1]  # (a line being written)
    shaping = [json.loads(line) for line in lines]
    results = []
    for (link, src, dst, one_way), holder in zip(checks, holders):
        if "error" in holder:
            raise CheckError(f"{link.a}:{link.b}: {holder['error']}")
        samples, pings = holder["samples"], holder["pings"]
        until = max([samples[-1][0]] if samples else [] + [p[0] for p in pings[-1:]] or [0.0])
        base_s = (routes.one_way_delay_us(link.a, link.b) - link.delay_us) / 1e6  # the access links
        uncertainty = holder["uncertainty_s"]
        worst, over, n = goodput_bound_check(samples, link.profile, base_s, uncertainty)
        base_rtt_ms = 2 * base_s * 1000
        rtts = phase_rtts(pings, link.profile, base_rtt_ms, pings[-1][0] + 0.1 if pings else 0.0)
        lags = step_lags(samples, link.profile, one_way, until, uncertainty)
        shaper_timing(shaping, f"{link.a}:{link.b}", lags)
        results.append(
            ProfileCheck(
                f"{link.a}:{link.b}",
                src,
                dst,
                one_way,
                n,
                worst,
                over,
                lags,
                rtts,
                rate_ok=not over,
                rtt_ok=all(r["ok"] for r in rtts),
                samples=samples,
                pings=pings,
                sample_uncertainty_s=uncertainty,
            )
        )
    return results


def _profile_start_ns(net: LocalNetwork) -> int:
    """The profiles' time 0 (the first step's due time in the shaping log: the build's end)."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        path = net.out_dir / SHAPING_LOG
        for line in path.read_text().splitlines() if path.exists() else []:
            row = json.loads(line)
            if row.get("event") == PROFILE_STEP:
                return int(row["due_ns"])
        time.sleep(0.05)
    raise CheckError("the profiles' replay did not start (no profile_step line in shaping.jsonl)")


def _bulk(
    net: LocalNetwork,
    src: str,
    dst: str,
    duration_s: float,
    interval_s: float,
    t0_ns: int,
    holder: dict[str, Any],
    port: int,
) -> None:
    """Bulk TCP from ``src`` to ``dst`` for ``duration_s``, the receiver's bytes sampled every
    ``interval_s`` (each sample's time the middle of its read, half the read's duration its
    uncertainty: a fresh clone's check on 2026-12-07 read 95.4 and 105.1 Mbit/s on either side of
    one sample in a steady 100 Mbit/s phase, as if its counter were 4.7 ms older than its time);
    into ``holder`` (``samples`` and ``uncertainty_s``, or ``error``)."""
    netns = net.host(dst).netns
    server = net.popen(dst, ["iperf3", "-s", "-1", "-p", str(port)], stdout=subprocess.DEVNULL)
    try:
        time.sleep(0.3)
        argv = ["iperf3", "-c", str(net.host(dst).ip), "-p", str(port), "-t", f"{duration_s:g}"]
        client = net.popen(src, [*argv, "--connect-timeout", "5000"], stdout=subprocess.DEVNULL)
        samples, uncertainty = [], []
        end = time.monotonic() + duration_s
        with IPRoute(netns=netns) as ipr:  # one socket in the receiver's namespace for every sample
            found = ipr.link_lookup(ifname=HOST_IFNAME)
            if not found:
                raise CheckError(f"{dst} (namespace {netns}) has no interface {HOST_IFNAME} to read its bytes from")
            index = found[0]
            while time.monotonic() < end and client.poll() is None:
                start = time.monotonic_ns()
                took, mid, count = tight_read(lambda: _rx_bytes(ipr, index))
                samples.append(((mid - t0_ns) / 1e9, count))
                uncertainty.append(took / 2e9)
                time.sleep(max(0.0, interval_s - (time.monotonic_ns() - start) / 1e9))
        client.wait(timeout=duration_s + 30)
        holder["samples"], holder["uncertainty_s"] = samples, uncertainty
    except (OSError, subprocess.TimeoutExpired, CheckError) as e:
        holder["error"] = str(e)
    finally:
        if server.poll() is None:
            server.kill()
        server.wait()


def _pings(net: LocalNetwork, src: str, dst: str, duration_s: float, t0_ns: int, holder: dict[str, Any]) -> None:
    """Pings from ``src`` to ``dst`` every 100 ms for ``duration_s`` on an idle path; into
    ``holder`` (``pings``: send time after the profile's start, s; RTT, ms)."""
    argv = ["ping", "-D", "-n", "-i", "0.1", "-W", "2", "-w", f"{math.ceil(duration_s)}", str(net.host(dst).ip)]
    ping = net.popen(src, argv, stdout=subprocess.PIPE, text=True)
    try:
        out, _ = ping.communicate(timeout=duration_s + 30)
    except subprocess.TimeoutExpired as e:
        ping.kill()
        holder["error"] = str(e)
        return
    holder["pings"] = ping_replies(out, t0_ns)


def ping_replies(output: str, t0_ns: int) -> list[tuple[float, float]]:
    """Each reply of ``ping -D`` output: (when its request was sent, s after ``t0_ns`` on this
    machine's CLOCK_MONOTONIC; RTT, ms). ``-D`` stamps a reply's arrival in CLOCK_REALTIME: the
    send time is that less the RTT, moved to the monotonic clock."""
    offset = time.clock_gettime_ns(time.CLOCK_REALTIME) - time.monotonic_ns()
    out = []
    for line in output.splitlines():
        m = re.match(r"\[(\d+\.\d+)\].*time=([\d.]+) ms", line)
        if m:
            sent = float(m.group(1)) * 1e9 - float(m.group(2)) * 1e6 - offset
            out.append(((sent - t0_ns) / 1e9, float(m.group(2))))
    return out
