"""A run's events as a Chrome trace (``trace.json``: open in chrome://tracing or Perfetto)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from testbed.trace import schema as T


def chrome_trace(ev: pd.DataFrame, shaping: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Chrome trace format (chrome://tracing, Perfetto): one process per DC, one thread per worker;
    live shaping changes (Atlas grants) as instant events on the sending DC's process."""
    out = []
    dcs = {dc: i for i, dc in enumerate(dict.fromkeys(ev[T.DC]))}
    for dc, pid in dcs.items():
        out.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": f"DC {dc}"}})
    for (w, dc, stage, replica), _ in ev.groupby([T.WORKER, T.DC, T.STAGE, T.REPLICA]):
        out.append(
            {
                "name": "thread_name",
                "ph": "M",
                "pid": dcs[dc],
                "tid": int(w),
                "args": {"name": f"worker {w} (stage {stage}, replica {replica})"},
            }
        )
    t0 = int(ev[T.START_NS].min())
    for r in ev.itertuples(index=False):
        row = r._asdict()
        out.append(
            {
                "name": f"{row[T.KIND]} mb{row[T.MICROBATCH]}" if row[T.MICROBATCH] >= 0 else row[T.KIND],
                "cat": row[T.KIND],
                "ph": "X",
                "pid": dcs[row[T.DC]],
                "tid": int(row[T.WORKER]),
                "ts": (row[T.START_NS] - t0) / 1e3,
                "dur": (row[T.END_NS] - row[T.START_NS]) / 1e3,
                "args": {"iteration": int(row[T.ITERATION])},
            }
        )
    for change in shaping or []:
        if change.get("event") != "change" or change["t_ns"] < t0:
            continue
        dc = change["netns"].split("-", 1)[1].rsplit("-", 1)[0]  # <prefix>-<dc>-r
        out.append(
            {
                "name": f"{change['classid']} {change['ifname']} -> {change['rate_bps'] / 1e6:g} Mbit/s",
                "cat": "shaping",
                "ph": "i",
                "s": "p",
                "pid": dcs.get(dc, 0),
                "ts": (change["t_ns"] - t0) / 1e3,
            }
        )
    return {"traceEvents": out, "displayTimeUnit": "ms"}
