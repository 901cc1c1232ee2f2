"""A run's plots: the pipeline timeline (``timeline.png``), WAN link utilization
(``wan_utilization.png``), Atlas's grants on one link (``link_grants.png``) and BubbleTea's bubble
predictions against what was observed (``bubble_prediction.png``), drawn with matplotlib's
non-interactive backend. Where a link's rate changed during the run (a profile, ``testbed link``),
the utilization plot, and the timeline where it changed within the iterations shown, draw the
configured rate over time in a panel below their own, and shade the outages
(``wan_changes.configured_rates``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from testbed.results.wan_changes import RATE_COLUMNS, down_spans, rates_drawn
from testbed.trace import schema as T

COLORS = {
    T.FORWARD: "#4c72b0",
    T.BACKWARD: "#55a868",
    T.SEND: "#dd8452",
    T.RECV_WAIT: "#e5e5e5",
    T.ALLREDUCE: "#c44e52",
    T.OPTIMIZER: "#8172b3",
    T.IDLE: "#ffffff",
    T.PREFILL: "#e7b416",
}
_NO_RATES = pd.DataFrame(columns=RATE_COLUMNS)


def _mbit(bps: int) -> str:
    return "down" if bps == 0 else f"{bps / 1e6:g} Mbit/s"


#: the configured rate's line and the outages' shade
RATE_STYLE = {"linestyle": "--", "linewidth": 1.2, "drawstyle": "steps-post"}
DOWN_STYLE = {"color": "#d62728", "alpha": 0.12, "linewidth": 0}


def _alike(drawn: pd.DataFrame) -> dict[tuple[tuple[int, int], ...], list[str]]:
    """``rates_drawn``'s directions grouped by their steps (``(t_ns, rate_bps)`` each): a link's two
    directions changed alike are drawn and named together."""
    alike: dict[tuple[tuple[int, int], ...], list[str]] = {}
    for link, g in drawn.groupby(T.LINK, sort=True):
        alike.setdefault(tuple(zip(g[T.T_NS], g[T.RATE_BPS])), []).append(str(link))
    return alike


def _draw_rates(ax: Any, drawn: pd.DataFrame, t0_ns: int, unit_ns: float, colors: dict[str, str]) -> None:
    """``rates_drawn``'s lines on ``ax`` in Mbit/s against time in ``unit_ns`` from ``t0_ns``, one per
    direction (a link's two directions in one line where they changed alike), coloured as
    ``colors`` has them (the default cycle's next colours for the others)."""
    import matplotlib.pyplot as plt

    spare = [c for c in plt.rcParams["axes.prop_cycle"].by_key()["color"] if c not in colors.values()]
    for steps, links in _alike(drawn).items():
        color = colors.get(links[0]) or (spare.pop(0) if spare else "black")
        x = [(t - t0_ns) / unit_ns for t, _ in steps]
        ax.plot(x, [bps / 1e6 for _, bps in steps], color=color, label=", ".join(links), **RATE_STYLE)
    ax.set_ylim(bottom=0)
    ax.set_ylabel("configured\nrate (Mbit/s)")


def _shade_down(axes: list[Any], drawn: pd.DataFrame, t0_ns: int, unit_ns: float) -> None:
    """Shaded bands on ``axes`` where a link of ``drawn`` was down (labelled once, on the first)."""
    for i, (start, end) in enumerate(down_spans(drawn)):
        for ax in axes:
            label = "link down" if i == 0 and ax is axes[0] else None
            ax.axvspan((start - t0_ns) / unit_ns, (end - t0_ns) / unit_ns, label=label, **DOWN_STYLE)


def frame_note(dilation: float) -> str:
    """What an axis of a dilated run's plot says of its time (``trace/frame.py``): nothing at 1."""
    return "" if dilation == 1 else f", emulated: the run went {dilation:g}x slower"


def plot_timeline(
    ev: pd.DataFrame, path: Path, warmup: int, rates: pd.DataFrame | None = None, dilation: float = 1.0
) -> None:
    """Each worker's operations over the last two iterations (one row per worker). Where ``rates``
    (``wan_changes.configured_rates``) changed within those iterations, a panel below with each
    changed link direction's configured rate, outages shaded across both; where they changed only
    at other times, the rates these iterations ran under in the title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    last = int(ev[ev[T.KIND] == T.OPTIMIZER][T.ITERATION].max()) if (ev[T.KIND] == T.OPTIMIZER).any() else warmup + 1
    first = max(warmup, last - 1)  # the last two iterations: BubbleTea's stream is running by then
    ev = ev[(ev[T.ITERATION] >= first) & (ev[T.ITERATION] <= first + 1)]
    if ev.empty:
        return
    t0 = ev[T.START_NS].min()
    workers = sorted(ev[T.WORKER].unique())
    height = 0.5 * len(workers) + 1.5
    drawn = rates_drawn(rates, int(t0), int(ev[T.END_NS].max())) if rates is not None else _NO_RATES
    held = ""  # the rates these iterations ran under, where they changed only outside them
    if not drawn.empty and all(g[T.RATE_BPS].nunique() == 1 for _, g in drawn.groupby(T.LINK)):
        held = "; ".join(f"{', '.join(k)} {_mbit(steps[0][1])}" for steps, k in _alike(drawn).items())
        drawn, height = _NO_RATES, height + 0.3  # the title's second line
    if drawn.empty:
        fig, ax = plt.subplots(figsize=(14, height))
    else:
        fig, (ax, rx) = plt.subplots(
            2, 1, figsize=(14, height + 2.2), sharex=True, gridspec_kw={"height_ratios": [height, 1.4]}
        )
    chunked = ev[T.VIRTUAL_STAGE].notna() & (ev[T.VIRTUAL_STAGE] != ev[T.STAGE])
    several = chunked[ev[T.KIND].isin([T.FORWARD, T.BACKWARD])].any()  # workers hold several chunks
    for kind, color in COLORS.items():
        if kind in (T.IDLE, T.SEND):
            continue
        k = ev[ev[T.KIND] == kind]
        if k.empty:
            continue
        # a split backward's weight part hatched: nothing waits for it
        for hatch, label, rows in (
            ("", kind, k[k[T.PART] != T.WEIGHT_PART]),
            ("///", f"{kind} (weight part)", k[k[T.PART] == T.WEIGHT_PART]),
        ):
            if rows.empty:
                continue
            ax.barh(
                rows[T.WORKER],
                (rows[T.END_NS] - rows[T.START_NS]) / 1e6,
                left=(rows[T.START_NS] - t0) / 1e6,
                color=color,
                edgecolor="black",
                linewidth=0.3,
                label=label,
                height=0.8,
                hatch=hatch,
            )
        if kind in (T.FORWARD, T.BACKWARD):
            for r in k.itertuples():
                mb, vs = getattr(r, T.MICROBATCH), getattr(r, T.VIRTUAL_STAGE)
                ax.text(
                    (getattr(r, T.START_NS) - t0) / 1e6 + 1,
                    getattr(r, T.WORKER),
                    f"{mb}v{int(vs)}" if several and pd.notna(vs) else str(mb),
                    va="center",
                    fontsize=6,
                )
    labels = ev.groupby(T.WORKER)[[T.STAGE, T.REPLICA, T.DC]].first()
    ax.set_yticks(
        workers, [f"w{w} s{labels.loc[w, T.STAGE]} r{labels.loc[w, T.REPLICA]} {labels.loc[w, T.DC]}" for w in workers]
    )
    ax.invert_yaxis()
    xlabel = f"time (ms{frame_note(dilation)}) from the start of iteration {first}"
    what = "microbatch, v: virtual stage" if several else "microbatch"
    title = f"pipeline timeline (numbers: {what}; prefill chunks in yellow under BubbleTea)"
    ax.set_title(title + (f"\nconfigured rates over these iterations (changed at other times): {held}" if held else ""))
    if drawn.empty:
        ax.set_xlabel(xlabel)
        ax.legend(
            loc="upper center", bbox_to_anchor=(0.5, -0.12 - 0.6 / len(workers)), fontsize=7, ncol=5, frameon=False
        )
        fig.tight_layout()
    else:
        _shade_down([ax, rx], drawn, int(t0), 1e6)
        _draw_rates(rx, drawn, int(t0), 1e6, {})
        rx.set_xlabel(xlabel)
        rx.legend(fontsize=7, loc="upper right")
        fig.legend(*ax.get_legend_handles_labels(), loc="lower center", fontsize=7, ncol=6, frameon=False)
        fig.tight_layout(rect=(0, 0.3 / (height + 2.2), 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_links(lu: pd.DataFrame, path: Path, rates: pd.DataFrame | None = None, dilation: float = 1.0) -> None:
    """Each WAN link direction's utilization (``link_counters.link_utilization``: its share of the
    rate in force) over the sampled time; where ``rates`` (``wan_changes.configured_rates``)
    changed during the run, a panel below with each changed direction's configured rate (dashed)
    over what it sent (solid), outages shaded across both."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if lu.empty:
        return
    t0_ns = int(lu[T.T_NS].iloc[0]) - round(float(lu["t_s"].iloc[0]) * 1e9)  # the first sample's time
    drawn = rates_drawn(rates, t0_ns, int(lu[T.T_NS].max())) if rates is not None else _NO_RATES
    if drawn.empty:
        fig, ax = plt.subplots(figsize=(12, 4))
    else:
        fig, (ax, rx) = plt.subplots(2, 1, figsize=(12, 6.5), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    idle, colors = [], {}
    for link, g in lu.groupby(T.LINK):
        if (g["bps"] <= 0).all():
            idle.append(link)
            continue
        colors[str(link)] = ax.plot(g["t_s"], g["utilization"], label=link, linewidth=0.8)[0].get_color()
    if idle:
        ax.text(0.01, 0.95, "no traffic: " + ", ".join(idle), transform=ax.transAxes, fontsize=7, va="top")
    xlabel = f"time (s{frame_note(dilation)}) since the first sample (the network was up; workers were starting)"
    ax.set_ylabel("share of link rate")
    ax.set_ylim(0, 1.1)
    ax.set_title("WAN link utilization")
    if drawn.empty:
        ax.set_xlabel(xlabel)
    else:
        _shade_down([ax, rx], drawn, t0_ns, 1e9)
        for link, g in lu[lu[T.LINK].isin(drawn[T.LINK]) & lu[T.LINK].isin(list(colors))].groupby(T.LINK):
            rx.plot(g["t_s"], g["bps"] / 1e6, color=colors[str(link)], linewidth=0.6)
        _draw_rates(rx, drawn, t0_ns, 1e9, colors)
        rx.set_title("configured rate (dashed; 0 while down) and rate sent (solid)", fontsize=9)
        rx.set_xlabel(xlabel)
        rx.legend(fontsize=7, ncol=3, loc="upper right")
    if len(idle) < lu[T.LINK].nunique() or not drawn.empty:  # a legend needs a line
        ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def grant_intervals(log: list[dict]) -> pd.DataFrame:
    """Atlas's grants from ``controller.jsonl`` rows as a table: link, replica, grant start and end
    (ns: applied to released, or to the next grant on the link), bytes the class sent meanwhile
    (planned grants; else None)."""
    rows: list[dict] = []
    open_: dict[str, dict] = {}
    for r in sorted(log, key=lambda r: r.get("t_applied_ns", r.get("t_ns", 0))):
        link = r.get("link")
        if r.get("event") == "grant":
            if link in open_:  # the previous holder lost the link to this grant
                rows.append({**open_.pop(link), "end_ns": r["t_applied_ns"], "sent_bytes": None})
            open_[link] = {"link": link, "replica": r["replica"], "start_ns": r["t_applied_ns"]}
        elif r.get("event") == "release" and link in open_:
            rows.append({**open_.pop(link), "end_ns": r["t_ns"], "sent_bytes": r.get("sent_bytes")})
    return pd.DataFrame(rows, columns=["link", "replica", "start_ns", "end_ns", "sent_bytes"])


def plot_link_grants(grants: pd.DataFrame, ev: pd.DataFrame, path: Path, warmup: int, dilation: float = 1.0) -> None:
    """One WAN link direction (the one with the most grants) over the last measured iteration: which
    pipeline held it when (one row per replica), labelled with the bytes it sent under each grant."""
    if grants.empty or ev.empty or not (ev[T.KIND] == T.OPTIMIZER).any():
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    opt = ev[ev[T.KIND] == T.OPTIMIZER]
    last = int(opt[T.ITERATION].max())
    if last <= warmup:
        return
    t0 = opt[opt[T.ITERATION] == last - 1][T.END_NS].min()
    t1 = opt[opt[T.ITERATION] == last][T.END_NS].max()
    link = grants["link"].value_counts().index[0]
    g = grants[(grants["link"] == link) & (grants["end_ns"] > t0) & (grants["start_ns"] < t1)]
    replicas = sorted(grants[grants["link"] == link]["replica"].unique())
    fig, ax = plt.subplots(figsize=(14, 0.6 * len(replicas) + 1.5))
    for _, row in g.iterrows():
        y = replicas.index(row["replica"])
        start, end = (row["start_ns"] - t0) / 1e6, (row["end_ns"] - t0) / 1e6
        ax.barh(y, end - start, left=start, height=0.6, color=COLORS[T.SEND])
        if row["sent_bytes"] is not None and not pd.isna(row["sent_bytes"]):
            ax.text(start, y + 0.35, f"{int(row['sent_bytes']) // 1024} KiB", fontsize=6)
    ax.set_yticks(range(len(replicas)), [f"pipeline {r}" for r in replicas])
    ax.set_xlabel(f"ms{frame_note(dilation)} into iteration {last} (from iteration {last - 1}'s first optimizer end)")
    ax.set_title(f"Atlas grants on {link}: who held the link, and the bytes each grant carried")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_bubble_predictions(ev: pd.DataFrame, path: Path, warmup: int, dilation: float = 1.0) -> None:
    """BubbleTea's slot predictions against the bubbles observed, from the wait events that carry
    one (``T.PREDICTED_BUBBLE_NS`` beside ``T.BUBBLE_NS``, written as the workers ran): on the left
    the last measured iteration, one row per worker, each predicted window (outline) over the
    observed one (filled), drawn from the wait's start; on the right every measured wait, predicted
    against observed (ms) with the diagonal (above it: over-predicted, the case a guard covers).
    Draws nothing for a run without predictions (no BubbleTea, or none in a measured iteration)."""
    if T.PREDICTED_BUBBLE_NS not in ev or T.BUBBLE_NS not in ev:
        return
    w = ev[ev[T.PREDICTED_BUBBLE_NS].notna() & ev[T.BUBBLE_NS].notna() & (ev[T.ITERATION] >= warmup)]
    if w.empty:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    last = int(w[T.ITERATION].max())
    one = w[w[T.ITERATION] == last]
    t0 = ev[ev[T.ITERATION] == last][T.START_NS].min()
    workers = sorted(one[T.WORKER].unique())
    fig, (ax, sc) = plt.subplots(1, 2, figsize=(15, 0.45 * len(workers) + 2.5), gridspec_kw={"width_ratios": [3, 1]})
    start = (one[T.START_NS] - t0) / 1e6
    y = one[T.WORKER].map({x: i for i, x in enumerate(workers)})
    ax.barh(y, one[T.BUBBLE_NS] / 1e6, left=start, height=0.5, color=COLORS[T.PREFILL], label="observed bubble")
    ax.barh(
        y,
        one[T.PREDICTED_BUBBLE_NS] / 1e6,
        left=start,
        height=0.8,
        fill=False,
        edgecolor="black",
        linewidth=0.6,
        label="predicted",
    )
    labels = ev.groupby(T.WORKER)[[T.STAGE, T.REPLICA]].first()
    ax.set_yticks(range(len(workers)), [f"w{x} s{labels.loc[x, T.STAGE]} r{labels.loc[x, T.REPLICA]}" for x in workers])
    ax.invert_yaxis()
    ax.set_xlabel(f"time (ms{frame_note(dilation)}) from the start of iteration {last}")
    ax.set_title(f"iteration {last}: each filled wait's predicted bubble over the one observed")
    ax.legend(fontsize=7, loc="lower right")
    pred, seen = w[T.PREDICTED_BUBBLE_NS] / 1e6, w[T.BUBBLE_NS] / 1e6
    top = float(max(pred.max(), seen.max())) * 1.05
    sc.plot([0, top], [0, top], color="grey", linewidth=0.8)
    sc.scatter(seen, pred, s=6, color=COLORS[T.FORWARD])
    sc.text(0.03, 0.97, "over-predicted", transform=sc.transAxes, fontsize=7, va="top")
    sc.text(0.97, 0.03, "under-predicted", transform=sc.transAxes, fontsize=7, ha="right")
    sc.set_xlabel(f"observed bubble (ms{frame_note(dilation)})")
    sc.set_ylabel("predicted (ms)")
    sc.set_title(f"{len(w)} waits of iterations {warmup}-{last}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
