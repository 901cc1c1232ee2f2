"""A run's plots: the pipeline timeline (``timeline.png``) and WAN link utilization
(``wan_utilization.png``), drawn with matplotlib's non-interactive backend."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

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


def plot_timeline(ev: pd.DataFrame, path: Path, warmup: int) -> None:
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
    fig, ax = plt.subplots(figsize=(14, 0.5 * len(workers) + 1.5))
    for kind, color in COLORS.items():
        if kind in (T.IDLE, T.SEND):
            continue
        k = ev[ev[T.KIND] == kind]
        if k.empty:
            continue
        ax.barh(
            k[T.WORKER],
            (k[T.END_NS] - k[T.START_NS]) / 1e6,
            left=(k[T.START_NS] - t0) / 1e6,
            color=color,
            edgecolor="black",
            linewidth=0.3,
            label=kind,
            height=0.8,
        )
        if kind in (T.FORWARD, T.BACKWARD):
            for r in k.itertuples():
                ax.text(
                    (getattr(r, T.START_NS) - t0) / 1e6 + 1,
                    getattr(r, T.WORKER),
                    str(getattr(r, T.MICROBATCH)),
                    va="center",
                    fontsize=6,
                )
    labels = ev.groupby(T.WORKER)[[T.STAGE, T.REPLICA, T.DC]].first()
    ax.set_yticks(
        workers, [f"w{w} s{labels.loc[w, T.STAGE]} r{labels.loc[w, T.REPLICA]} {labels.loc[w, T.DC]}" for w in workers]
    )
    ax.invert_yaxis()
    ax.set_xlabel(f"time (ms) from the start of iteration {first}")
    ax.set_title("pipeline timeline (numbers: microbatch; prefill chunks in yellow under BubbleTea)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12 - 0.6 / len(workers)), fontsize=7, ncol=5, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_links(lu: pd.DataFrame, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if lu.empty:
        return
    fig, ax = plt.subplots(figsize=(12, 4))
    idle = []
    for link, g in lu.groupby(T.LINK):
        if (g["bps"] <= 0).all():
            idle.append(link)
            continue
        ax.plot(g["t_s"], g["utilization"], label=link, linewidth=0.8)
    if idle:
        ax.text(0.01, 0.95, "no traffic: " + ", ".join(idle), transform=ax.transAxes, fontsize=7, va="top")
    ax.set_xlabel("time (s) since the first sample (the network was up; workers were starting)")
    ax.set_ylabel("share of link rate")
    ax.set_ylim(0, 1.1)
    ax.set_title("WAN link utilization")
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
