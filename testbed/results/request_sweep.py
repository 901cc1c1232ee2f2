"""BubbleTea over the request rate (``scripts/sweep_requests.py``): one row per pair of runs (the
policy without and with ``+bubbletea`` at one rate), their medians and ranges per rate, and the
curves of utilization, TTFT and slowdown against the rate."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from testbed.results.compare import spread
from testbed.trace import metrics as M

#: the BubbleTea run's figures a row keeps (``trace/metrics.py``)
FIGURES = (
    M.GPU_UTILIZATION,
    M.TRAINING_GPU_UTILIZATION,
    M.BUBBLE_FILL_FRACTION,
    M.PREFILL_TOKENS_PER_S,
    M.REQUESTS_ASSIGNED,
    M.REQUESTS_COMPLETED,
    M.TTFT_P50_S,
    M.TTFT_P99_S,
    M.DISPATCH_DELAY_P50_MS,
    M.TTFT_WITHIN_SLO_SHARE,
    M.TTFT_SLO_ATTAINMENT,
    M.TTFT_SCALED_SLO_ATTAINMENT,
    M.TRAINING_OPS_DELAYED_BY_PREFILL,
    M.TRAINING_OPS_WITH_INPUT,
    M.TRAINING_OPS_STARTED_LATE,
)
#: the plain run's figures a row keeps, as ``<figure>_plain``: operations started late without
#: BubbleTea are the floor of the BubbleTea run's (``analysis.start_after_arrival``)
PLAIN_FIGURES = (M.TRAINING_OPS_STARTED_LATE,)


def sweep_row(rate_per_s: float, repeat: int, plain: dict, bubbletea: dict) -> dict:
    """One pair's row: the rate, the repeat, both iteration times (s, mean), the pair's training
    slowdown (BubbleTea's iteration time over the plain run's, a ratio as ``compare``'s), the
    BubbleTea run's ``FIGURES`` and the plain run's ``PLAIN_FIGURES`` (suffixed ``_plain``)."""
    return {
        "rate_per_s": rate_per_s,
        "repeat": repeat,
        "iteration_time_s": plain[M.ITERATION_TIME_S],
        "iteration_time_bubbletea_s": bubbletea[M.ITERATION_TIME_S],
        "training_slowdown": bubbletea[M.ITERATION_TIME_S] / plain[M.ITERATION_TIME_S],
        **{k: bubbletea.get(k) for k in FIGURES},
        **{f"{k}_plain": plain.get(k) for k in PLAIN_FIGURES},
    }


def sweep_summary(rows: pd.DataFrame) -> pd.DataFrame:
    """Per rate, as ``testbed compare`` reports a pair of policies (``results/compare.py``): the
    training slowdown (the median BubbleTea iteration time over the median plain one, a ratio) and
    the noise floor (the larger ``spread`` of the two policies' iteration times; None below two
    repeats); the median, min and max of every ``FIGURES`` entry and of the plain runs'
    ``PLAIN_FIGURES`` over the repeats (columns ``<figure>``, ``<figure>_min``, ``<figure>_max``;
    ``<figure>_plain`` and so on), the pairs' own slowdowns' min and max
    (``training_slowdown_min``/``_max``) and the repeats. Rows of a sweep recorded before a
    figure was kept have it empty."""
    rows = rows.copy()
    cols = [*FIGURES, *(f"{k}_plain" for k in PLAIN_FIGURES)]
    for c in cols:
        if c not in rows:
            rows[c] = None
        rows[c] = pd.to_numeric(rows[c])
    g = rows.groupby("rate_per_s")
    out = g[cols].median()
    out = out.join(g[cols].min().add_suffix("_min")).join(g[cols].max().add_suffix("_max"))
    out["training_slowdown"] = g["iteration_time_bubbletea_s"].median() / g["iteration_time_s"].median()
    out["training_slowdown_min"] = g["training_slowdown"].min()
    out["training_slowdown_max"] = g["training_slowdown"].max()
    out["repeats"] = g.size()
    floors = [
        max((x for x in (spread(list(a)), spread(list(b))) if x is not None), default=None)
        for (_, a), (_, b) in zip(g["iteration_time_s"], g["iteration_time_bubbletea_s"])
    ]
    out["noise_floor"] = floors
    return out.reset_index()


#: the share of requests that must meet the TTFT SLO at an operating point (the issue's 90%)
SLO_SHARE = 0.9


def slo_operating_point(summary: pd.DataFrame, column: str = M.TTFT_SCALED_SLO_ATTAINMENT) -> dict | None:
    """The rate of ``summary`` (``sweep_summary``'s) with the highest median GPU utilization among
    those whose median ``column`` is at least ``SLO_SHARE``, as {rate_per_s, gpu_utilization,
    attainment}; None where no rate reaches it."""
    ok = summary[summary[column].notna() & (summary[column] >= SLO_SHARE) & summary[M.GPU_UTILIZATION].notna()]
    if ok.empty:
        return None
    best = ok.loc[ok[M.GPU_UTILIZATION].idxmax()]
    return {
        "rate_per_s": float(best["rate_per_s"]),
        M.GPU_UTILIZATION: float(best[M.GPU_UTILIZATION]),
        "attainment": float(best[column]),
    }


def plot_request_sweep(summary: pd.DataFrame, path: Path, title: str) -> Path:
    """Write the sweep's plot to ``path``: TTFT p50/p99 (left) and GPU utilization, bubble fill
    and training slowdown beside the noise floor (right) against the rate, medians with their
    min-max ranges as error bars (the slowdown's: its pairs'). Returns ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = summary["rate_per_s"]

    def line(ax, col: str, fmt: str, label: str) -> None:
        lo, hi = summary[col] - summary[f"{col}_min"], summary[f"{col}_max"] - summary[col]
        ax.errorbar(x, summary[col], yerr=[lo, hi], fmt=fmt, capsize=3, label=label)

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    line(a, M.TTFT_P50_S, "o-", "TTFT p50")
    line(a, M.TTFT_P99_S, "s--", "TTFT p99")
    a.set_xscale("log")
    a.set_xlabel("requests per second")
    a.set_ylabel("seconds")
    a.set_ylim(bottom=0)
    a.legend()
    line(b, M.GPU_UTILIZATION, "s-", "GPU utilization (training + prefill)")
    line(b, M.BUBBLE_FILL_FRACTION, "o-", "bubble fill fraction")
    if summary[M.TTFT_SCALED_SLO_ATTAINMENT].notna().any():  # a rate with none judged is a gap
        line(b, M.TTFT_SCALED_SLO_ATTAINMENT, "d-.", "share meeting the scaled TTFT SLO")
    slow = summary[["training_slowdown", "training_slowdown_min", "training_slowdown_max"]] - 1
    b.errorbar(
        x,
        slow["training_slowdown"],
        yerr=[
            slow["training_slowdown"] - slow["training_slowdown_min"],
            slow["training_slowdown_max"] - slow["training_slowdown"],
        ],
        fmt="^--",
        capsize=3,
        label="training slowdown (pairs' range)",
    )
    b.plot(x, summary["noise_floor"], ":", color="grey", label="noise floor (the policies' spread)")
    b.set_xscale("log")
    b.set_xlabel("requests per second")
    b.legend(fontsize=8)
    fig.suptitle(f"{title} (medians of {int(summary['repeats'].min())}+ repeats, min-max bars)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _ranged(key: str, median: float | None, low: float | None, high: float | None, fmt: str) -> dict:
    """``{key: median}``, with ``key_min`` and ``key_max`` where the two ends read differently in
    ``fmt`` (a range that shows as one number is not shown)."""
    out: dict = {key: median}
    if low is not None and high is not None and fmt.format(low) != fmt.format(high):
        out |= {f"{key}_min": low, f"{key}_max": high}
    return out


def page_rows(summary: pd.DataFrame, experiment: str) -> list[dict]:
    """The results page's rows of a sweep (``sweep_summary``'s), one per rate, in the keys of
    ``PAGE_COLUMNS``: medians over the repeats, with the min-max range where it shows; shares and
    the slowdown in percent."""

    def pct(r: dict, col: str) -> tuple:
        return tuple(None if pd.isna(r.get(c)) else 100 * r[c] for c in (col, f"{col}_min", f"{col}_max"))

    rows = []
    for r in summary.to_dict("records"):
        slowdown = tuple(
            100 * (r[c] - 1) for c in ("training_slowdown", "training_slowdown_min", "training_slowdown_max")
        )
        counts = {
            "late": M.TRAINING_OPS_STARTED_LATE,
            "late_plain": f"{M.TRAINING_OPS_STARTED_LATE}_plain",
            "held": M.TRAINING_OPS_DELAYED_BY_PREFILL,
        }
        row = {
            "experiment": experiment,
            "rate": r["rate_per_s"],
            "noise": r["noise_floor"],
            "ttft_p50": r[M.TTFT_P50_S],
        }
        row |= _ranged(
            "gpu", r[M.GPU_UTILIZATION], r[f"{M.GPU_UTILIZATION}_min"], r[f"{M.GPU_UTILIZATION}_max"], "{:.2f}"
        )
        row |= _ranged("slowdown_pct", *slowdown, "{:+.1f}")
        row |= _ranged("scaled_pct", *pct(r, M.TTFT_SCALED_SLO_ATTAINMENT), "{:.0f}")
        row["slo_pct"] = pct(r, M.TTFT_SLO_ATTAINMENT)[0]
        for key, col in counts.items():
            row |= _ranged(key, r[col], r[f"{col}_min"], r[f"{col}_max"], "{:.0f}")
        # plain numbers for JSON, a figure no run gave as None
        rows.append(
            {k: v if isinstance(v, str) else None if v is None or pd.isna(v) else float(v) for k, v in row.items()}
        )
    return rows


#: the results page's sweep table: (header, cell formats), the first whose figures a row has
PAGE_COLUMNS = (
    ("experiment", ("{experiment}",)),
    ("requests/s", ("{rate:g}",)),
    ("GPU utilization", ("{gpu:.2f} ({gpu_min:.2f}-{gpu_max:.2f})", "{gpu:.2f}")),
    (
        "slowdown",
        ("{slowdown_pct:+.1f}% ({slowdown_pct_min:+.1f} to {slowdown_pct_max:+.1f}%)", "{slowdown_pct:+.1f}%"),
    ),
    ("noise floor", ("{noise:.1%}",)),
    ("TTFT p50", ("{ttft_p50:.1f} s",)),
    ("within 3 x alone", ("{scaled_pct:.0f}% ({scaled_pct_min:.0f}-{scaled_pct_max:.0f}%)", "{scaled_pct:.0f}%")),
    ("within 1 s", ("{slo_pct:.0f}%",)),
    ("late", ("{late_min:.0f}-{late_max:.0f}", "{late:.0f}")),
    ("late without BubbleTea", ("{late_plain_min:.0f}-{late_plain_max:.0f}", "{late_plain:.0f}")),
    ("held", ("{held_min:.0f}-{held_max:.0f}", "{held:.0f}")),
)
