"""Clock offsets between the runner's machine and each machine of ``--backend remote``: the
NTP-style exchange of RFC 5905 section 8 over the agent's channel, estimated before and after the
run and written to ``clock_offsets.json``; every event is recorded in the runner's clock."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from testbed.net.remote.agent_client import AgentClient

CLOCK_SAMPLES = 16


def estimate_offset(samples: Sequence[tuple[int, int, int]]) -> dict:
    """Clock offset from (t_send, t_remote, t_receive) exchanges, all in ns: the exchange with the
    smallest round trip gives ``offset_ns = t_remote - (t_send + t_receive) / 2`` with an
    uncertainty of half its round trip (RFC 5905, section 8). Pure: unit-tested."""
    if not samples:
        raise ValueError("no clock samples")
    t0, tr, t1 = min(samples, key=lambda s: s[2] - s[0])
    rtt = t1 - t0
    return {"offset_ns": int(tr - (t0 + t1) / 2), "uncertainty_ns": rtt // 2, "rtt_ns": rtt, "samples": len(samples)}


def measure_offset(agent: AgentClient, samples: int = CLOCK_SAMPLES) -> dict[str, Any]:
    """The agent's machine's CLOCK_MONOTONIC offset from ours (``estimate_offset``)."""
    got = []
    for _ in range(samples):
        t0 = time.monotonic_ns()
        tr = agent.call("clock")["t_ns"]
        got.append((t0, tr, time.monotonic_ns()))
    return estimate_offset(got)


def write_clock_offsets(path: Path, clock: dict[str, dict[str, Any]]) -> None:
    """``clock_offsets.json``: each machine's offset before (and after) the run."""
    path.write_text(
        json.dumps(
            {
                "reference": "the runner's CLOCK_MONOTONIC",
                "method": "min-RTT exchange over SSH (RFC 5905 section 8)",
                "machines": clock,
            },
            indent=1,
        )
    )
