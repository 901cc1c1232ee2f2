"""What this machine can carry through the chosen delay mechanism, measured once and cached.

A link whose rate is above it would silently run slower than asked, so building refuses it.
The measurement: two one-host DCs joined by a 40 Gbit/s, 5 ms link under the mechanism, four
parallel iperf3 TCP streams for 3 s after 1 s of warm-up; the capacity is the goodput divided by
TCP's share of the Ethernet rate (shaping.TCP_GOODPUT_FRACTION). Cached in
``/var/cache/testbed/capacity.json`` per kernel, mechanism, CPU count and delay-element version.
"""
from __future__ import annotations

import json
import os
import platform
import tempfile
from pathlib import Path

from .delay_element import CACHE_DIR, helper_path
from .errors import BuildError
from .shaping import TCP_GOODPUT_FRACTION
from .topology import TopologySpec, parse_topology
from .units import format_rate

CACHE = CACHE_DIR / "capacity.json"
PROBE = {"name": "capacity-probe",
         "dcs": [{"name": "a", "hosts": 1}, {"name": "b", "hosts": 1}],
         "links": [{"between": ["a", "b"], "rate": "40gbit", "delay": "5ms"}]}


def cache_key(mechanism: str) -> str:
    helper = helper_path().name if mechanism == "nfqueue" else "kernel"
    return f"{mechanism}|{platform.release()}|{os.cpu_count()}|{helper}"


def measure_capacity_bps(mechanism: str) -> int:
    """Measure the highest rate one link carries under ``mechanism`` on this machine (bit/s)."""
    from .emulation import Emulation
    from .iperf import iperf

    spec = parse_topology(PROBE, "<capacity probe>")
    with tempfile.TemporaryDirectory(prefix="testbed-capacity-") as tmp:
        with Emulation(spec, delay_mechanism=mechanism, out_dir=Path(tmp), check_capacity=False) as emu:
            result = iperf(emu, "a-h0", "b-h0", duration_s=3, omit_s=1, extra=["-P", "4"])
    return int(result.bits_per_second / TCP_GOODPUT_FRACTION)


def machine_capacity_bps(mechanism: str) -> tuple[int, bool]:
    """(capacity in bit/s, whether it came from the cache). Measures on a cache miss."""
    key = cache_key(mechanism)
    try:
        cache = json.loads(CACHE.read_text())
    except (OSError, ValueError):
        cache = {}
    if key in cache:
        return int(cache[key]), True
    bps = measure_capacity_bps(mechanism)
    cache[key] = bps
    CACHE.parent.mkdir(parents=True, exist_ok=True)
    CACHE.write_text(json.dumps(cache, indent=1))
    return bps, False


def check_rates(spec: TopologySpec, mechanism: str) -> None:
    """Raise BuildError naming the first link (or DC) whose rate exceeds what this machine carries."""
    cap, _ = machine_capacity_bps(mechanism)
    fields = [(f"links[{i}].rate", link.rate_bps) for i, link in enumerate(spec.links)]
    fields += [(f"dcs[{i}].intra_rate", dc.intra_rate_bps) for i, dc in enumerate(spec.dcs) if dc.intra_rate_bps]
    for field, rate in fields:
        if rate > cap:
            raise BuildError(
                f"{spec.source}: {field}: {format_rate(rate)!r} is above what this machine carries through the "
                f"{mechanism} delay mechanism (measured {format_rate(cap)}, cached in {CACHE}); "
                f"use a rate of at most {format_rate(cap)}, or scale the topology down (DESIGN.md section 2a)")
