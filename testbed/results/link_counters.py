"""The WAN links' class counters (``link_counters.jsonl``, sampled by the runner) as figures: each
link's utilization per sampling interval and its mean over the measured iterations, queue drops
and the largest backlog. Pure functions, DataFrame in, DataFrame (or number) out; the definitions
are ``analysis.py``'s."""

from __future__ import annotations

import pandas as pd

from testbed.trace import schema as T

#: the HTB class of a WAN link direction: what the link carries, capped at the link's rate
LINK_CLASS = "1:1"


def link_utilization(counters: pd.DataFrame) -> pd.DataFrame:
    """Per link and sampling interval: t_s (from the first sample), bits per second sent by the
    link class 1:1 and its share of the link rate in force: the class's ceil as read back at the
    interval's two ends, their mean where it changed in between (a profile's step, ``testbed link
    rate``: the interval's bytes went out partly at each rate). An outage leaves the class's rate
    as it was: its intervals show 0."""
    c = counters[counters[T.CLASSID] == LINK_CLASS].sort_values([T.LINK, T.T_NS])
    if c.empty:
        return pd.DataFrame(columns=[T.LINK, T.T_NS, "t_s", "bps", "utilization"])
    t0 = c[T.T_NS].min()
    g = c.groupby(T.LINK)
    dt = g[T.T_NS].diff() / 1e9
    bps = g[T.TX_BYTES].diff() * 8 / dt
    rate = (c[T.RATE_BPS] + g[T.RATE_BPS].shift()) / 2
    out = pd.DataFrame(
        {
            T.LINK: c[T.LINK],
            T.T_NS: c[T.T_NS],
            "t_s": (c[T.T_NS] - t0) / 1e9,
            "bps": bps,
            "utilization": bps / rate,
        }
    ).dropna()
    return out.reset_index(drop=True)


def queue_drops(counters: pd.DataFrame) -> dict[str, int] | None:
    """Packets each WAN link direction's queues dropped while the run was sampled: per class, the
    rise of its cumulative drop counter from the first sample to the last, summed over the
    link's classes; ``{link: drops}`` for every sampled link (None for counters from before drops
    were sampled)."""
    if counters.empty or T.DROPS not in counters or counters[T.DROPS].isna().all():
        return None
    per_class = counters.groupby([T.LINK, T.CLASSID])[T.DROPS].agg(lambda d: d.max() - d.min())
    return {str(link): int(n) for link, n in per_class.groupby(level=0).sum().items()}


def queue_backlog_max_bytes(counters: pd.DataFrame) -> int | None:
    """The most bytes any WAN class held queued at a sample (None without backlog samples)."""
    if counters.empty or T.BACKLOG_BYTES not in counters or counters[T.BACKLOG_BYTES].isna().all():
        return None
    return int(counters[T.BACKLOG_BYTES].max())


def wan_utilization_mean(lu: pd.DataFrame, start_ns: int, end_ns: int) -> float | None:
    """Mean utilization of the WAN link directions that carried traffic, over the samples taken
    between ``start_ns`` and ``end_ns`` (the measured iterations: start-up and idle directions
    would otherwise dilute it, and a policy that starts slower would look less busy)."""
    w = lu[(lu[T.T_NS] > start_ns) & (lu[T.T_NS] <= end_ns)]
    used = w.groupby(T.LINK)["bps"].transform("max") > 0
    w = w[used]
    return float(w["utilization"].mean()) if not w.empty else None
