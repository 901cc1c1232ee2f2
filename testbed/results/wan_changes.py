"""What a WAN that changed did to a run, from its ``shaping.jsonl`` and its events: the rate
configured on each link direction over time (what the plots draw), each outage (when, how long,
and how long training took to resume after the link came back: TCP's retransmission backoff), and
the iteration time in each phase of the links' profiles."""

from __future__ import annotations

from typing import Any

import pandas as pd

from testbed.results import analysis as A
from testbed.results.link_counters import LINK_CLASS
from testbed.spec.topology import WAN_IFNAME_PREFIX
from testbed.trace import schema as T
from testbed.trace.shaping_log import LINK_DOWN, LINK_UP, PROFILE_STEP

#: the waits an outage stalls: a receive, a send's drain, an all-reduce
_WAITS = (T.RECV_WAIT, T.SEND, T.ALLREDUCE)
#: the columns of ``configured_rates``
RATE_COLUMNS = [T.LINK, T.T_NS, T.RATE_BPS]


def direction(netns: str, ifname: str) -> str | None:
    """The link direction (``src->dst``, as ``link_counters.jsonl`` names it) of the WAN egress
    ``ifname`` (``w-<dst>``) in router namespace ``netns`` (``<prefix>-<src>-r``, the prefix
    ``tb<hex>``: ``spec/addressing.py``); None for any other interface."""
    if not (netns.endswith("-r") and "-" in netns[:-2] and ifname.startswith(WAN_IFNAME_PREFIX)):
        return None
    return f"{netns[:-2].split('-', 1)[1]}->{ifname[len(WAN_IFNAME_PREFIX) :]}"


def configured_rates(shaping: list[dict[str, Any]], counters: pd.DataFrame | None = None) -> pd.DataFrame:
    """The rate configured on each WAN link direction over time, as steps: one row per direction
    and value, ``link`` (``a->b``), ``t_ns`` (in force from then on) and ``rate_bps`` (0 while the
    link is down), in time order per direction; a direction whose rate never changed has one row.

    The HTB rate is the ceil of the link's class (``1:1``) as ``shaping.jsonl`` logged it: its
    ``add`` at the build, then each ``change`` (a profile's step, ``testbed link rate``), at the
    time it was issued. A direction without such lines (a run folder without the log) takes the
    class's ceil as the link counters read it back from the kernel, at each sample where it
    changed. An outage (``link_down``, both directions, from when it was issued, as the summary's
    ``outages``) sets 0 until its ``link_up`` has taken effect (``t_ns + duration_ns``); the HTB
    rate is not touched by it, and applies again after it. A profile's ``profile_step`` lines add
    nothing: each of its rate changes and outages is logged by the lines above."""
    htb: dict[str, list[tuple[int, int]]] = {}
    for r in shaping:
        if r.get("event") in ("add", "change") and r.get("classid") == LINK_CLASS:
            d = direction(r["netns"], r["ifname"])
            if d is not None:
                htb.setdefault(d, []).append((int(r["t_ns"]), int(r.get("ceil_bps") or r["rate_bps"])))
    if counters is not None and not counters.empty:
        c = counters[counters[T.CLASSID] == LINK_CLASS].sort_values(T.T_NS)
        for link, g in c.groupby(T.LINK):
            if link not in htb:
                htb[str(link)] = [(int(t), int(bps)) for t, bps in zip(g[T.T_NS], g[T.RATE_BPS])]
    changes = [(t, d, "rate", bps) for d, steps in htb.items() for t, bps in steps]
    for r in shaping:
        if r.get("event") in (LINK_DOWN, LINK_UP):
            a, _, b = r["link"].partition(":")
            down = r["event"] == LINK_DOWN
            t = int(r["t_ns"]) if down else int(r["t_ns"]) + int(r.get("duration_ns", 0))
            changes += [(t, d, r["event"], 0) for d in (f"{a}->{b}", f"{b}->{a}")]
    rows: list[tuple[str, int, int]] = []
    state: dict[str, tuple[int | None, bool]] = {}  # direction: (HTB rate, down)
    for t, d, kind, bps in sorted(changes, key=lambda c: c[0]):
        rate, down = state.get(d, (None, False))
        rate, down = (bps, down) if kind == "rate" else (rate, kind == LINK_DOWN)
        state[d] = (rate, down)
        if rate is not None:  # an outage of a direction whose rate is unknown: nothing to draw
            rows.append((d, t, 0 if down else rate))
    out = pd.DataFrame(rows, columns=RATE_COLUMNS)
    out = out[out.groupby(T.LINK)[T.RATE_BPS].diff().ne(0)]  # only where the value changes
    return out.sort_values([T.LINK, T.T_NS], kind="stable").reset_index(drop=True)


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


def rates_drawn(rates: pd.DataFrame, start_ns: int, end_ns: int) -> pd.DataFrame:
    """What a plot draws of ``configured_rates`` from ``start_ns`` to ``end_ns``: each direction
    whose rate changed at some time in the run (none where the links kept their rates: such a
    run's plots are drawn as before), as the corners of a ``steps-post`` line: the rate in force
    at ``start_ns`` (from the direction's first row, where that is later), each change within the
    window, and the last rate again at ``end_ns`` to close the last step."""
    out: list[tuple[str, int, int]] = []
    for link, g in rates.groupby(T.LINK, sort=True):
        if len(g) < 2:
            continue
        before = g[g[T.T_NS] <= start_ns]
        inside = g[(g[T.T_NS] > start_ns) & (g[T.T_NS] < end_ns)]
        steps = [(start_ns, int(before[T.RATE_BPS].iloc[-1]))] if not before.empty else []
        steps += [(int(t), int(bps)) for t, bps in zip(inside[T.T_NS], inside[T.RATE_BPS])]
        if steps:
            out += [(str(link), t, bps) for t, bps in [*steps, (end_ns, steps[-1][1])]]
    return pd.DataFrame(out, columns=RATE_COLUMNS)


def down_spans(drawn: pd.DataFrame) -> list[tuple[int, int]]:
    """The windows (``start_ns``, ``end_ns``) in which a direction of ``rates_drawn`` was down
    (its rate 0), each once (a link's two directions share theirs), in time order."""
    spans = set()
    for _, g in drawn.groupby(T.LINK):
        t, bps = list(g[T.T_NS]), list(g[T.RATE_BPS])
        spans |= {(int(t[i]), int(t[i + 1])) for i in range(len(t) - 1) if bps[i] == 0 and t[i + 1] > t[i]}
    return sorted(spans)
