"""What a WAN that changed did to a run, from its ``shaping.jsonl`` and its events: each outage
(when, how long, and how long training took to resume after the link came back: TCP's
retransmission backoff), and the iteration time in each phase of the links' profiles."""

from __future__ import annotations

from typing import Any

import pandas as pd

from testbed.results import analysis as A
from testbed.trace import schema as T
from testbed.trace.shaping_log import LINK_DOWN, LINK_UP, PROFILE_STEP

#: the waits an outage stalls: a receive, a send's drain, an all-reduce
_WAITS = (T.RECV_WAIT, T.SEND, T.ALLREDUCE)


def outages(shaping: list[dict[str, Any]], ev: pd.DataFrame, t0_ns: int | None = None) -> list[dict[str, Any]]:
    """Each outage in ``shaping`` (the log's rows): ``link``; ``down_s``, when it began (s after
    ``t0_ns``, the run's start; absolute ns where None); ``duration_s`` (None: still down at the
    end); and ``resume_ms``, from the link's return to the end of the first wait (receive, send,
    all-reduce) that was under way then: the first transfer that crossed again (None where none
    was under way, or the link never came back)."""
    out: list[dict[str, Any]] = []
    down: dict[str, int] = {}
    base = t0_ns or 0
    for row in sorted((r for r in shaping if r.get("event") in (LINK_DOWN, LINK_UP)), key=lambda r: r["t_ns"]):
        if row["event"] == LINK_DOWN:
            down.setdefault(row["link"], row["t_ns"])
        elif row["link"] in down:
            start = down.pop(row["link"])
            up_ns = row["t_ns"] + row.get("duration_ns", 0)  # the link carries traffic from here
            out.append(
                {
                    "link": row["link"],
                    "down_s": (start - base) / 1e9,
                    "duration_s": (up_ns - start) / 1e9,
                    "resume_ms": _resume_ms(ev, up_ns),
                }
            )
    for link, start in down.items():
        out.append({"link": link, "down_s": (start - base) / 1e9, "duration_s": None, "resume_ms": None})
    return sorted(out, key=lambda o: o["down_s"])


def _resume_ms(ev: pd.DataFrame, up_ns: int) -> float | None:
    if ev.empty:
        return None
    waits = ev[ev[T.KIND].isin(_WAITS) & (ev[T.START_NS] < up_ns) & (ev[T.END_NS] > up_ns)]
    return float((waits[T.END_NS].min() - up_ns) / 1e6) if not waits.empty else None


def profile_phases(shaping: list[dict[str, Any]], ev: pd.DataFrame, warmup: int) -> list[dict[str, Any]]:
    """The phases of the links' profiles as the run went through them (each ``profile_step`` line
    begins one): ``start_s`` (after the first step), the ``links``' figures then (``rate_bps``,
    0 while down, and ``delay_us``), and the ``iterations`` (>= ``warmup``) that began in the
    phase with their mean ``iteration_time_s`` (None where none began in it)."""
    steps = sorted((r for r in shaping if r.get("event") == PROFILE_STEP), key=lambda r: r["t_ns"])
    if not steps:
        return []
    it = A.iteration_times(ev, warmup) if not ev.empty else pd.DataFrame(columns=[T.START_NS, "duration_s"])
    state: dict[str, dict[str, int]] = {}
    phases = []
    for i, step in enumerate(steps):
        state[step["link"]] = {"rate_bps": step["rate_bps"], "delay_us": step["delay_us"]}
        if i + 1 < len(steps) and steps[i + 1]["t_ns"] == step["t_ns"]:
            continue
        end = steps[i + 1]["t_ns"] if i + 1 < len(steps) else None
        mine = it[(it[T.START_NS] >= step["t_ns"]) & ((it[T.START_NS] < end) if end is not None else True)]
        phases.append(
            {
                "start_s": (step["t_ns"] - steps[0]["t_ns"]) / 1e9,
                "links": {k: dict(v) for k, v in state.items()},
                "iterations": len(mine),
                "iteration_time_s": float(mine["duration_s"].mean()) if len(mine) else None,
            }
        )
    return phases
