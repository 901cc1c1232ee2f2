"""Plots of a simulated sweep (``testbed sim SCENARIO --sweep``; rows of ``sim/sweep.py``): the
speed-up of atlas over each baseline as a heatmap over WAN rate and one-way delay, and GPU
utilization with and without BubbleTea against the delay, one line per rate."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from testbed.trace import metrics as M


def plot_sweep(rows: pd.DataFrame, folder: Path, title: str) -> list[Path]:
    """Write ``speedup_over_<baseline>.png`` per baseline with figures and ``utilization.png`` into
    ``folder``; return the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    atlas = rows[rows["policy"] == "atlas"]
    for col in [c for c in rows.columns if c.startswith("speedup_over_")]:
        grid = atlas.pivot_table(index="delay_us", columns="wan_rate_bps", values=col)
        if grid.empty:
            continue
        fig, ax = plt.subplots(figsize=(1.4 * len(grid.columns) + 2.5, 0.8 * len(grid.index) + 2))
        im = ax.imshow(grid.values, cmap="viridis", aspect="auto", origin="lower")
        ax.set_xticks(range(len(grid.columns)), [f"{c / 1e9:g}" for c in grid.columns])
        ax.set_yticks(range(len(grid.index)), [f"{d / 1e3:g}" for d in grid.index])
        for i in range(len(grid.index)):
            for j in range(len(grid.columns)):
                v = grid.values[i, j]
                if v == v:  # not NaN
                    ax.text(j, i, f"{v:.2f}x", ha="center", va="center", color="white", fontsize=9)
        ax.set_xlabel("WAN rate (Gbit/s)")
        ax.set_ylabel("one-way delay (ms)")
        ax.set_title(f"{title}: atlas over {col.removeprefix('speedup_over_')}")
        fig.colorbar(im, ax=ax, label="speed-up (iteration time ratio)")
        fig.tight_layout()
        path = folder / f"{col}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    fig, ax = plt.subplots(figsize=(7, 4))
    for (policy, col), style in {
        ("atlas", M.GPU_UTILIZATION): "-o",
        ("atlas+bubbletea", M.GPU_UTILIZATION): "--s",
    }.items():
        part = rows[rows["policy"] == policy]
        for rate, line in part.groupby("wan_rate_bps"):
            line = line.sort_values("delay_us")
            ax.plot(line["delay_us"] / 1e3, line[col], style, label=f"{policy}, {rate / 1e9:g} Gbit/s")
    ax.set_xlabel("one-way delay (ms)")
    ax.set_ylabel("GPU utilization of the training GPUs")
    ax.set_ylim(0, 1)
    ax.set_title(f"{title}: utilization without and with BubbleTea")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = folder / "utilization.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [*written, path]
