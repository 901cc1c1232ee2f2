"""What this machine can carry through the chosen delay mechanism: the cached figure and the check
of a topology's rates against it.

A link whose rate is above it would silently run slower than asked, so building refuses it. The
figure is measured by ``capacity_probe.py`` (``testbed doctor``, or a build that finds no cached
figure) and cached in ``/var/cache/testbed/capacity.json`` per kernel, mechanism, CPU count and
delay-element version.
"""

from __future__ import annotations

import json
import os
import platform

from testbed.errors import BuildError
from testbed.net.delay_element import CACHE_DIR, helper_path
from testbed.spec.topology import TopologySpec
from testbed.spec.units import format_rate

CACHE = CACHE_DIR / "capacity.json"


def cache_key(mechanism: str) -> str:
    helper = helper_path().name if mechanism == "nfqueue" else "kernel"
    return f"{mechanism}|{platform.release()}|{os.cpu_count()}|{helper}"


def cached_capacity_bps(mechanism: str) -> int | None:
    """The cached figure for ``mechanism`` on this kernel and machine, or None."""
    try:
        cache = json.loads(CACHE.read_text())
    except (OSError, ValueError):
        return None
    value = cache.get(cache_key(mechanism)) if isinstance(cache, dict) else None
    return int(value) if isinstance(value, (int, float)) else None


def store_capacity_bps(mechanism: str, bps: int) -> None:
    try:
        cache = json.loads(CACHE.read_text())
    except (OSError, ValueError):
        cache = {}
    if not isinstance(cache, dict):
        cache = {}
    cache[cache_key(mechanism)] = int(bps)
    CACHE.parent.mkdir(parents=True, exist_ok=True)
    CACHE.write_text(json.dumps(cache, indent=1))


def check_rates(spec: TopologySpec, mechanism: str, cap: int) -> None:
    """Raise BuildError naming the first link (or DC) whose rate exceeds ``cap``, what this machine
    carries through ``mechanism`` (bit/s)."""
    fields = [(f"links[{i}].rate", link.rate_bps) for i, link in enumerate(spec.links)]
    fields += [
        (f"links[{i}].profile", max(s.state.rate_bps for s in link.profile.steps))
        for i, link in enumerate(spec.links)
        if link.profile is not None
    ]
    fields += [(f"dcs[{i}].intra_rate", dc.intra_rate_bps) for i, dc in enumerate(spec.dcs) if dc.intra_rate_bps]
    for field, rate in fields:
        if rate > cap:
            raise BuildError(
                f"{spec.source}: {field}: {format_rate(rate)!r} is above what this machine carries through the "
                f"{mechanism} delay mechanism (measured {format_rate(cap)}, cached in {CACHE}); "
                f"use a rate of at most {format_rate(cap)}, or scale the topology down (DESIGN.md section 2a)"
            )
