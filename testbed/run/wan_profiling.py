"""A run's WAN measured before training (``testbed run --profile-wan``): the paths training uses,
probed one direction at a time (``net/wan_probe.py``), into the run folder's ``wan_profile.json``
for ``testbed sim --validate``."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from testbed.net.network import Network
from testbed.net.wan_probe import profile_wan
from testbed.plan.connections import socket_buffer_cap, wan_pairs
from testbed.plan.workers import WorkerSpec
from testbed.spec.experiment import Experiment
from testbed.spec.wan_profile import WAN_PROFILE_FILE


def profile_wan_paths(
    net: Network, exp: Experiment, workers: list[WorkerSpec], out_dir: Path, progress: Callable[[str], Any]
) -> None:
    """Measure the WAN paths training uses, before any worker starts (``net/wan_probe.py``:
    messages of the activations' size, one stage's forward apart), into ``wan_profile.json``."""
    pairs = wan_pairs(exp, workers)
    t = time.monotonic()
    prof = profile_wan(
        net,
        pairs,
        exp.activation_bytes,
        exp.compute.forward_ms / 1000,
        socket_buffer_cap(exp, exp.topology_spec, workers),
    )
    (out_dir / WAN_PROFILE_FILE).write_text(json.dumps(prof.to_dict(), indent=1) + "\n")
    progress(
        f"WAN profile: {len(prof.paths)} path directions in {time.monotonic() - t:.1f} s: "
        + "; ".join(
            f"{p.src}->{p.dst} {p.message_bps / 1e6:.1f} Mbit/s per message, {p.bulk_bps / 1e6:.1f} bulk"
            for p in prof.paths
        )
    )
