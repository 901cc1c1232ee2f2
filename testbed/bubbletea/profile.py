"""How well the bubbles of one iteration predict the next: the per-slot profile of the last few
iterations (the statistic BubbleTea's workers keep as they run, ``decisions.SlotPredictor``) and its
error against what each next iteration did (pure functions on ``windows.bubble_windows`` tables);
and the error of the predictions the workers actually placed chunks by, read from their wait
events (``live_prediction_errors``: what a run's summary reports)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from testbed.bubbletea.windows import (
    ACTUAL_S,
    BEFORE,
    DURATION_S,
    ERROR_COLUMNS,
    ERROR_S,
    ITERATIONS,
    OFFSET_S,
    PREDICTED_S,
    PROFILE_COLUMNS,
    SLOT,
    WINDOW_COLUMNS,
    require_columns,
)
from testbed.trace import schema as T


def bubble_profile(windows: pd.DataFrame, window: int) -> pd.DataFrame:
    """Predicted bubbles per (worker, slot) from the windows of the last ``window`` iterations in
    ``windows``: one row per (worker, slot) with ``before``, ``predicted_s``, ``offset_s`` and
    ``iterations`` (in how many of those iterations the slot occurred).


    Predicted duration: the minimum over those iterations, and 0 for a slot that is missing from
    any of them (it was shorter than ``min_s`` there, or did not occur). The minimum because the
    two errors cost differently: predicting too long lets a prefill chunk run past the bubble's end
    and delays the next training operation, and through it the later stages (training must not
    slow down), while predicting too short only leaves part of a bubble unused. Waits vary mostly
    upward (a late transfer or a slow peer lengthens one), so the minimum of a few recent
    iterations is rarely above the next one; a low quantile such as p10 would knowingly
    over-predict about one bubble in ten. ``fits``' guard covers what remains. Predicted offset:
    the median (it locates a bubble; the dispatcher starts a chunk when the bubble actually begins).
    Raises ValueError if ``window`` < 1 or a column is missing."""
    if window < 1:
        raise ValueError(f"window = {window!r} must be at least 1 iteration")
    require_columns(windows, WINDOW_COLUMNS, "window table")
    keep = sorted(windows[T.ITERATION].unique())[-window:]
    hist = windows[windows[T.ITERATION].isin(keep)]
    if hist.empty:
        return pd.DataFrame(columns=PROFILE_COLUMNS)
    n = hist[T.ITERATION].nunique()
    g = hist.groupby([T.WORKER, SLOT])
    out = pd.DataFrame(
        {
            BEFORE: g[BEFORE].first(),
            PREDICTED_S: g[DURATION_S].min(),
            OFFSET_S: g[OFFSET_S].median(),
            ITERATIONS: g[T.ITERATION].nunique(),
        }
    )
    out.loc[out[ITERATIONS] < n, PREDICTED_S] = 0.0
    return out.reset_index()[PROFILE_COLUMNS]


def prediction_errors(windows: pd.DataFrame, warmup: int, window: int) -> pd.DataFrame:
    """How well ``bubble_profile`` predicts each next iteration.

    Only iterations >= ``warmup`` are used, as history and as targets. Each iteration preceded by at
    least ``window`` such iterations (counting those with windows) is predicted from the
    ``window`` before it and compared, per (worker, slot), with what happened. A slot predicted but
    absent has actual_s 0 (the bubble vanished or fell below ``min_s``); a slot that occurs but has
    no prediction has predicted_s 0 (nothing would be placed there). Columns: worker, slot,
    iteration, predicted_s, actual_s, error_s = actual_s - predicted_s (negative: over-predicted).
    Raises ValueError if ``warmup`` < 0 or ``window`` < 1."""
    if warmup < 0:
        raise ValueError(f"warmup = {warmup!r} must be >= 0")
    if window < 1:
        raise ValueError(f"window = {window!r} must be at least 1 iteration")
    require_columns(windows, WINDOW_COLUMNS, "window table")
    w = windows[windows[T.ITERATION] >= warmup]
    its = sorted(w[T.ITERATION].unique())
    parts = []
    for k in range(window, len(its)):
        pred = bubble_profile(w[w[T.ITERATION].isin(its[k - window : k])], window)
        pred = pred.set_index([T.WORKER, SLOT])[PREDICTED_S]
        act = w[w[T.ITERATION] == its[k]].set_index([T.WORKER, SLOT])[DURATION_S]
        both = pd.concat([pred.rename(PREDICTED_S), act.rename(ACTUAL_S)], axis=1).fillna(0.0)
        parts.append(both.reset_index().assign(**{T.ITERATION: int(its[k])}))
    if not parts:
        return pd.DataFrame(columns=ERROR_COLUMNS)
    out = pd.concat(parts, ignore_index=True)
    out[ERROR_S] = out[ACTUAL_S] - out[PREDICTED_S]
    return out[ERROR_COLUMNS]


def live_prediction_errors(ev: pd.DataFrame, warmup: int) -> pd.DataFrame:
    """The errors of the predictions the workers placed prefill by, as they ran: every wait event
    of iterations >= ``warmup`` that carries one (``T.PREDICTED_BUBBLE_NS``, written by
    ``PrefillServer.observe``), its observed bubble beside it. Columns as ``prediction_errors``'s,
    the slot named by the wait's kind and microbatch."""
    if T.PREDICTED_BUBBLE_NS not in ev or T.BUBBLE_NS not in ev:
        return pd.DataFrame(columns=ERROR_COLUMNS)
    w = ev[ev[T.PREDICTED_BUBBLE_NS].notna() & (ev[T.ITERATION] >= warmup)]
    out = pd.DataFrame(
        {
            T.WORKER: w[T.WORKER],
            SLOT: w[T.KIND].astype(str) + ":" + w[T.MICROBATCH].astype(str),
            T.ITERATION: w[T.ITERATION],
            PREDICTED_S: w[T.PREDICTED_BUBBLE_NS].astype(float) / 1e9,
            ACTUAL_S: w[T.BUBBLE_NS].astype(float) / 1e9,
        }
    )
    out[ERROR_S] = out[ACTUAL_S] - out[PREDICTED_S]
    return out[ERROR_COLUMNS].reset_index(drop=True)


def prediction_error_stats(errors: pd.DataFrame) -> dict[str, Any]:
    """Summary of ``prediction_errors``: ``windows`` (rows), ``abs_error_p50_ms`` and
    ``abs_error_p99_ms`` (quantiles of |error| in ms, linear interpolation), ``over_predicted_share``
    (share of windows predicted longer than they turned out: the case that delays training) and
    ``over_prediction_p99_ms`` (p99 of predicted - actual over those windows: what a guard must
    cover) and ``beyond_prediction_share`` (of the windows' observed time, the part after their
    predicted end: for the live predictions, the part no chunk may start in). Values are None where there
    is nothing to measure."""
    e = errors[ERROR_S].astype(float)
    over = -e[e < 0]
    observed = float(errors[ACTUAL_S].astype(float).sum())

    def q(s: pd.Series, p: float) -> float | None:
        return float(s.quantile(p) * 1e3) if len(s) else None

    return {
        "windows": int(len(e)),
        "abs_error_p50_ms": q(e.abs(), 0.5),
        "abs_error_p99_ms": q(e.abs(), 0.99),
        "over_predicted_share": float(len(over) / len(e)) if len(e) else None,
        "over_prediction_p99_ms": q(over, 0.99),
        "beyond_prediction_share": float(e.clip(lower=0).sum() / observed) if observed > 0 else None,
    }
