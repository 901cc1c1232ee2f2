"""Measuring what this machine carries through a delay mechanism (``capacity.py`` caches it).

The measurement: two one-host DCs joined by a 40 Gbit/s, 5 ms link under the mechanism, four
parallel iperf3 TCP streams for 3 s after 1 s of warm-up; the capacity is the goodput divided by
TCP's share of the Ethernet rate (``spec.wire.TCP_GOODPUT_FRACTION``). It builds a small network of
its own, so it lives above the netns backend; the backends receive it as their ``capacity``
function (``run/backends.py``), and ``testbed doctor`` calls it.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from testbed.net.capacity import CACHE, cached_capacity_bps, store_capacity_bps
from testbed.net.iperf import iperf
from testbed.net.local import LocalNetwork
from testbed.spec.topology_file import parse_topology
from testbed.spec.wire import TCP_GOODPUT_FRACTION

PROBE = {
    "name": "capacity-probe",
    "dcs": [{"name": "a", "hosts": 1}, {"name": "b", "hosts": 1}],
    "links": [{"between": ["a", "b"], "rate": "40gbit", "delay": "5ms"}],
}


def measure_capacity_bps(mechanism: str) -> int:
    """Measure the highest rate one link carries under ``mechanism`` on this machine (bit/s)."""
    spec = parse_topology(PROBE, "<capacity probe>")
    with tempfile.TemporaryDirectory(prefix="testbed-capacity-") as tmp:
        with LocalNetwork(spec, delay_mechanism=mechanism, out_dir=Path(tmp)) as net:
            result = iperf(net, "a-h0", "b-h0", duration_s=3, omit_s=1, extra=["-P", "4"])
    return int(result.bits_per_second / TCP_GOODPUT_FRACTION)


def machine_capacity_bps(mechanism: str) -> tuple[int, bool]:
    """(capacity in bit/s, whether it came from the cache). Measures and caches on a miss."""
    cached = cached_capacity_bps(mechanism)
    if cached is not None:
        return cached, True
    print(
        f"measuring what this machine carries through the {mechanism} delay mechanism (once; cached in {CACHE})",
        file=sys.stderr,
        flush=True,
    )
    bps = measure_capacity_bps(mechanism)
    store_capacity_bps(mechanism, bps)
    return bps, False


def capacity_bps(mechanism: str) -> int:
    """What this machine carries through ``mechanism`` (bit/s), cached or measured now: the
    ``capacity`` function the backends check links against."""
    return machine_capacity_bps(mechanism)[0]
