"""The figures of a launched job (``testbed launch``) beyond its exit statuses: from the event lines
its ranks wrote (``trace/job.py``, ``train/job_hook.py``) the iteration time, the stages' bubbles
and the WAN transfers, as for a built-in run (``analysis.py``'s definitions); from the Atlas hook,
its own cost and the bytes it reported against those the pipelines' HTB classes counted.

Pure: DataFrames and dicts in, dicts out.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from testbed.atlas.classes import CLASS_BASE
from testbed.results.analysis import iteration_stats, iteration_times, stage_bubbles, worker_utilization
from testbed.spec.wire import TCP_GOODPUT_FRACTION, ack_wire_bytes
from testbed.trace import schema as T
from testbed.trace.shaping_log import class_id


def training_figures(ev: pd.DataFrame, warmup: int) -> dict[str, Any] | None:
    """Iteration time (mean, p50, p95 in s, over iterations >= ``warmup``; an iteration ends with
    its last ``optimizer`` event), how many iterations were measured, and each stage's bubble
    fraction (1 - its ranks' mean share of the iterations spent in forward, backward and optimizer);
    None where the job wrote no ``optimizer`` events (it marks no iterations)."""
    if ev.empty or not (ev[T.KIND] == T.OPTIMIZER).any():
        return None
    it = iteration_times(ev, warmup)
    util = worker_utilization(ev, warmup)
    bubbles = stage_bubbles(util) if not util.empty else pd.DataFrame(columns=[T.STAGE, "bubble_fraction"])
    return {
        "iterations_measured": len(it),
        "warmup_iterations": warmup,
        "iteration_time_s": iteration_stats(it),
        "bubble_fraction": {str(int(r[T.STAGE])): float(r["bubble_fraction"]) for _, r in bubbles.iterrows()},
    }


def hook_figures(
    totals: list[dict[str, Any]], iterations: int | None, iteration_s: float | None, wall_s: float
) -> dict[str, Any]:
    """The hook's cost: transfers it handled (a send and a receive each count), its time in all
    (s), per transfer (us), and as a share of the job: per rank, its time over the iterations it
    ran (``iterations``, all of them, warm-up included, each counted at the measured mean
    ``iteration_s``, where the job marks them; else over the wall time ``wall_s``), the largest
    share over the ranks. ``totals``: each rank's ``hook/r<R>.json``."""
    n = sum(t["transfers"] for t in totals)
    total_ns = sum(t["hook_ns"] for t in totals)
    span_s = iterations * iteration_s if iterations and iteration_s else wall_s
    worst = max((t["hook_ns"] / 1e9 / span_s for t in totals), default=0.0) if span_s > 0 else None
    return {
        "transfers": n,
        "hook_s": total_ns / 1e9,
        "per_transfer_us": total_ns / n / 1e3 if n else None,
        "share_of_job": worst,
        "share_over": "marked iterations" if iterations and iteration_s else "wall time (the job marks no iterations)",
    }


def sent_bytes(counters: pd.DataFrame, minor: int) -> dict[str, int]:
    """Bytes HTB class ``1:minor`` sent on each WAN link direction over the job (its counter's last
    sample minus its first)."""
    mine = counters[counters[T.CLASSID] == class_id(minor)]
    return {str(link): int(b.max() - b.min()) for link, b in mine.groupby(T.LINK)[T.TX_BYTES]}


def class_bytes(counters: pd.DataFrame, replicas: int) -> dict[tuple[str, int], int]:
    """Bytes each pipeline's HTB class (``1:(CLASS_BASE + replica)``) sent on each WAN link
    direction over the job."""
    return {(link, r): n for r in range(replicas) for link, n in sent_bytes(counters, CLASS_BASE + r).items()}


def reported_bytes(
    ev: pd.DataFrame, paths: dict[tuple[int, int], list[str]], replica_of: dict[int, int]
) -> dict[tuple[str, int], int]:
    """Payload bytes the hook reported sent (``send`` events) per (WAN link direction, replica):
    each transfer counted on every link of its sender-receiver pair's path (``paths``)."""
    out: dict[tuple[str, int], int] = {}
    sends = ev[ev[T.KIND] == T.SEND]
    for (src, dst), b in sends.groupby([T.WORKER, T.PEER])[T.BYTES].sum().items():
        for link in paths.get((int(src), int(dst)), []):
            key = (link, replica_of[int(src)])
            out[key] = out.get(key, 0) + int(b)
    return out


def bytes_check(reported: dict[tuple[str, int], int], counted: dict[tuple[str, int], int]) -> list[dict[str, Any]]:
    """Per (link direction, replica): the hook's payload bytes; what the class should carry on the
    wire (``wire_bytes``: that payload over ``TCP_GOODPUT_FRACTION``, the headers of full segments,
    plus the ACKs of the pipeline's reverse flow, ``wire.ack_wire_bytes`` of the payload reported
    the other way, which cross the link in the same class); the bytes the class counted; and
    counted over expected. A class also carries whatever else its host pairs send (the
    rendezvous's store, connection set-up, gloo's message headers)."""
    rows = []
    for key in sorted(set(reported) | set(counted)):
        link, replica = key
        a, b = link.split("->")
        payload = reported.get(key, 0)
        wire = payload / TCP_GOODPUT_FRACTION + ack_wire_bytes(reported.get((f"{b}->{a}", replica), 0))
        got = counted.get(key, 0)
        rows.append(
            {
                "link": link,
                "replica": replica,
                "reported_bytes": payload,
                "wire_bytes": int(wire),
                "class_bytes": got,
                "class_over_wire": got / wire if wire else None,
            }
        )
    return rows
