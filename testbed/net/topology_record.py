"""A built network's record in its run folder (``topology.json``), and where a network's folder goes
when the caller names none."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any


def default_out_dir(prefix: str) -> Path:
    return Path("results") / f"topo-{time.strftime('%Y%m%d-%H%M%S')}-{prefix}"


def write_topology_record(net: Any, **extra: Any) -> None:
    """``topology.json`` of a built network: the resolved topology, the run prefix, the backend,
    the delay mechanism and every host's DC, address and namespace (plus ``extra``)."""
    hosts = {h.name: {"dc": h.dc, "ip": str(h.ip), "netns": h.netns} for h in net.plan.hosts.values()}
    for name, more in extra.pop("host_extra", {}).items():
        hosts[name].update(more)
    (net.out_dir / "topology.json").write_text(
        json.dumps(
            {
                **net.spec.to_dict(),
                "prefix": net.prefix,
                "backend": net.backend,
                "delay_mechanism": net.mechanism,
                **extra,
                "hosts": hosts,
            },
            indent=1,
        )
    )
