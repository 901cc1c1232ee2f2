"""BubbleTea's bubbles: the idle windows of pipeline workers, their prediction, and prefill that fits.

Pure functions, DataFrame in, DataFrame (or number, or dict) out. Definitions (once, here):

- busy: a worker is busy while it runs a forward, backward, all-reduce or optimizer step
  (``BUSY_KINDS``). A send only launches an asynchronous transfer (the worker moves on at once) and a
  receive wait is waiting, so neither is busy; were a send busy, its launch would split the wait
  before one action into two pieces. Derived ``idle`` rows (``analysis.idle_gaps``) are ignored.
- a worker's iteration: its events of that iteration; it starts at the first one's start (any
  kind). Idle time between one iteration's last busy event and the next iteration's first event
  belongs to no iteration.
- idle window: a maximal interval, from the worker's iteration start to its last busy event's end,
  covered by no busy event: receive waits, send launches and gaps between events, taken as a union
  (overlapping rows are counted once). A window ends where a busy event starts: the one it
  precedes. Idle time after the iteration's last busy event (an iteration cut short) precedes
  nothing and is no window.
- slot: a window's identifier within an iteration, the same every iteration of a run: the index
  of the F/B action it precedes among the worker's forward and backward events of the iteration
  (in start order, as in ``schedule``'s per-stage action list), or ``SLOT_ALLREDUCE`` (-1) before
  the all-reduce and ``SLOT_OPTIMIZER`` (-2) before the optimizer step. ``before`` names it: "F3",
  "B0", "allreduce", "optimizer".
"""
from __future__ import annotations

import math

import pandas as pd

from . import trace as T

# window, profile and error columns (event columns come from trace)
SLOT, BEFORE, OFFSET_S, DURATION_S = "slot", "before", "offset_s", "duration_s"
PREDICTED_S, ACTUAL_S, ERROR_S, ITERATIONS = "predicted_s", "actual_s", "error_s", "iterations"
WINDOW_COLUMNS = [T.WORKER, T.STAGE, T.REPLICA, T.ITERATION, SLOT, BEFORE, T.START_NS, T.END_NS, OFFSET_S,
                  DURATION_S]
PROFILE_COLUMNS = [T.WORKER, SLOT, BEFORE, PREDICTED_S, OFFSET_S, ITERATIONS]
ERROR_COLUMNS = [T.WORKER, SLOT, T.ITERATION, PREDICTED_S, ACTUAL_S, ERROR_S]

BUSY_KINDS = (T.FORWARD, T.BACKWARD, T.ALLREDUCE, T.OPTIMIZER)
SLOT_ALLREDUCE, SLOT_OPTIMIZER = -1, -2
DEFAULT_MIN_S = 0.0005
TOLERANCE_S = 1e-9  # float rounding allowance in fits (1 ns)

Intervals = list[tuple[int, int]]


def _require(df: pd.DataFrame, columns: list[str], what: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"{what} lacks column(s) {', '.join(missing)}: build it with testbed.trace's names")


def _non_negative(**values: float) -> None:
    for name, v in values.items():
        if not v >= 0:  # also catches NaN
            raise ValueError(f"{name} = {v!r} must be a number >= 0")


def bubble_windows(ev: pd.DataFrame, min_s: float = DEFAULT_MIN_S) -> pd.DataFrame:
    """Every idle window of every worker and iteration (definitions in the module docstring).

    Columns: worker, stage, replica, iteration, slot, before, start_ns, end_ns (CLOCK_MONOTONIC ns),
    offset_s (seconds from the worker's iteration start to the window's start) and duration_s.
    Windows shorter than ``min_s`` seconds are dropped (one exactly ``min_s`` long is kept). Rows
    are sorted by worker, iteration and start. Raises ValueError if ``min_s`` is negative or a
    column is missing."""
    _non_negative(min_s=min_s)
    _require(ev, [T.WORKER, T.STAGE, T.REPLICA, T.ITERATION, T.MICROBATCH, T.KIND, T.START_NS, T.END_NS],
             "event table")
    ev = ev[ev[T.KIND] != T.IDLE]
    rows = []
    for (w, it), g in ev.groupby([T.WORKER, T.ITERATION], sort=True):
        t0 = int(g[T.START_NS].min())
        busy = g[g[T.KIND].isin(BUSY_KINDS)].sort_values([T.START_NS, T.END_NS], kind="stable")
        cur, n_actions = t0, 0
        for kind, mb, start, end in zip(busy[T.KIND], busy[T.MICROBATCH], busy[T.START_NS], busy[T.END_NS]):
            start, end = int(start), int(end)
            if kind in (T.FORWARD, T.BACKWARD):
                slot, before = n_actions, f"{'F' if kind == T.FORWARD else 'B'}{int(mb)}"
                n_actions += 1
            else:
                slot, before = (SLOT_ALLREDUCE if kind == T.ALLREDUCE else SLOT_OPTIMIZER), kind
            if start > cur and (start - cur) / 1e9 >= min_s:
                rows.append({T.WORKER: w, T.STAGE: g[T.STAGE].iloc[0], T.REPLICA: g[T.REPLICA].iloc[0],
                             T.ITERATION: int(it), SLOT: slot, BEFORE: before, T.START_NS: cur, T.END_NS: start,
                             OFFSET_S: (cur - t0) / 1e9, DURATION_S: (start - cur) / 1e9})
            cur = max(cur, end)
    return pd.DataFrame(rows, columns=WINDOW_COLUMNS)


class BubbleProfile:
    """Predicted bubbles per (worker, slot), from the windows of the last ``window`` iterations.

    Predicted duration: the minimum over those iterations, and 0 for a slot that is missing from
    any of them (it was shorter than ``min_s`` there, or did not occur). The minimum because the
    two errors cost differently: predicting too long lets a prefill chunk run past the bubble's end
    and delays the next training operation, and through it the later stages (training must not
    slow down), while predicting too short only leaves part of a bubble unused. Waits vary mostly
    upward (a late transfer or a slow peer lengthens one), so the minimum of a few recent
    iterations is rarely above the next one; a low quantile such as p10 would knowingly
    over-predict about one bubble in ten. ``fits``' guard covers what remains. Predicted offset: the median (it locates a
    bubble; the dispatcher starts a chunk when the bubble actually begins).

    ``table`` holds the predictions (worker, slot, before, predicted_s, offset_s, iterations: in how
    many of the history's iterations the slot occurred); ``history`` the windows they come from.
    Raises ValueError if ``window`` < 1."""

    def __init__(self, windows: pd.DataFrame, window: int = 5) -> None:
        if window < 1:
            raise ValueError(f"window = {window!r} must be at least 1 iteration")
        self.window = window
        self.history = pd.DataFrame(columns=WINDOW_COLUMNS)
        self.table = pd.DataFrame(columns=PROFILE_COLUMNS)
        self.update(windows)

    def update(self, new_windows: pd.DataFrame) -> None:
        """Add the windows of new iterations (those of an iteration already held are replaced) and
        rebuild the profile from the latest ``window`` iterations."""
        _require(new_windows, WINDOW_COLUMNS, "window table")
        old = self.history[~self.history[T.ITERATION].isin(new_windows[T.ITERATION].unique())]
        frames = [df[WINDOW_COLUMNS] for df in (old, new_windows) if len(df)]
        both = pd.concat(frames, ignore_index=True) if frames else old
        keep = sorted(both[T.ITERATION].unique())[-self.window:]
        self.history = both[both[T.ITERATION].isin(keep)].reset_index(drop=True)
        self.table = self._build(self.history)

    @staticmethod
    def _build(hist: pd.DataFrame) -> pd.DataFrame:
        if hist.empty:
            return pd.DataFrame(columns=PROFILE_COLUMNS)
        n = hist[T.ITERATION].nunique()
        g = hist.groupby([T.WORKER, SLOT])
        out = pd.DataFrame({BEFORE: g[BEFORE].first(), PREDICTED_S: g[DURATION_S].min(),
                            OFFSET_S: g[OFFSET_S].median(), ITERATIONS: g[T.ITERATION].nunique()})
        out.loc[out[ITERATIONS] < n, PREDICTED_S] = 0.0
        return out.reset_index()[PROFILE_COLUMNS]

    def _row(self, worker: int, slot: int) -> pd.DataFrame:
        return self.table[(self.table[T.WORKER] == worker) & (self.table[SLOT] == slot)]

    def predict(self, worker: int, slot: int) -> float | None:
        """Predicted duration in seconds of the bubble at ``slot`` of ``worker``; None if it never
        occurred in the history."""
        r = self._row(worker, slot)
        return float(r[PREDICTED_S].iloc[0]) if len(r) else None

    def predict_offset(self, worker: int, slot: int) -> float | None:
        """Predicted offset in seconds of that bubble from the worker's iteration start; None if
        unknown."""
        r = self._row(worker, slot)
        return float(r[OFFSET_S].iloc[0]) if len(r) else None

    def slots(self, worker: int) -> list[int]:
        """The worker's known slots in the order they occur in an iteration (by predicted offset)."""
        t = self.table[self.table[T.WORKER] == worker].sort_values(OFFSET_S, kind="stable")
        return [int(s) for s in t[SLOT]]

    def total_predicted_s(self, worker: int) -> float:
        """Predicted bubble time of the worker per iteration, in seconds (0 for an unknown worker)."""
        return float(self.table.loc[self.table[T.WORKER] == worker, PREDICTED_S].sum())


def prediction_errors(windows: pd.DataFrame, warmup: int, window: int) -> pd.DataFrame:
    """How well ``BubbleProfile`` predicts each next iteration.

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
    _require(windows, WINDOW_COLUMNS, "window table")
    w = windows[windows[T.ITERATION] >= warmup]
    its = sorted(w[T.ITERATION].unique())
    parts = []
    for k in range(window, len(its)):
        pred = BubbleProfile(w[w[T.ITERATION].isin(its[k - window:k])], window).table
        pred = pred.set_index([T.WORKER, SLOT])[PREDICTED_S]
        act = w[w[T.ITERATION] == its[k]].set_index([T.WORKER, SLOT])[DURATION_S]
        both = pd.concat([pred.rename(PREDICTED_S), act.rename(ACTUAL_S)], axis=1).fillna(0.0)
        parts.append(both.reset_index().assign(**{T.ITERATION: int(its[k])}))
    if not parts:
        return pd.DataFrame(columns=ERROR_COLUMNS)
    out = pd.concat(parts, ignore_index=True)
    out[ERROR_S] = out[ACTUAL_S] - out[PREDICTED_S]
    return out[ERROR_COLUMNS]


def prediction_error_stats(errors: pd.DataFrame) -> dict:
    """Summary of ``prediction_errors``: ``windows`` (rows), ``abs_error_p50_ms`` and
    ``abs_error_p99_ms`` (quantiles of |error| in ms, linear interpolation), ``over_predicted_share``
    (share of windows predicted longer than they turned out: the case that delays training) and
    ``over_prediction_p99_ms`` (p99 of predicted - actual over those windows: what a guard must
    cover). Values are None where there is nothing to measure."""
    e = errors[ERROR_S].astype(float)
    over = -e[e < 0]

    def q(s: pd.Series, p: float) -> float | None:
        return float(s.quantile(p) * 1e3) if len(s) else None

    return {"windows": int(len(e)), "abs_error_p50_ms": q(e.abs(), 0.5), "abs_error_p99_ms": q(e.abs(), 0.99),
            "over_predicted_share": float(len(over) / len(e)) if len(e) else None,
            "over_prediction_p99_ms": q(over, 0.99)}


def fits(predicted_bubble_s: float, elapsed_s: float, chunk_s: float, guard_s: float) -> bool:
    """Whether a prefill chunk of ``chunk_s`` seconds may start ``elapsed_s`` seconds into a bubble
    predicted to last ``predicted_bubble_s``, keeping ``guard_s`` spare: elapsed + chunk + guard <=
    predicted (with 1 ns of float tolerance). Raises ValueError for a negative or NaN argument."""
    _non_negative(predicted_bubble_s=predicted_bubble_s, elapsed_s=elapsed_s, chunk_s=chunk_s, guard_s=guard_s)
    return elapsed_s + chunk_s + guard_s <= predicted_bubble_s + TOLERANCE_S


def chunk_tokens_that_fit(predicted_bubble_s: float, guard_s: float, seconds_per_token: float,
                          max_tokens: int) -> int:
    """The most prompt tokens, at most ``max_tokens``, whose prefill (``seconds_per_token`` each: a
    linear cost model) ``fits`` a fresh bubble of ``predicted_bubble_s`` with ``guard_s`` spare; 0 if
    not even one does. Raises ValueError if ``seconds_per_token`` <= 0, ``max_tokens`` < 0 or a
    duration is negative or NaN."""
    _non_negative(predicted_bubble_s=predicted_bubble_s, guard_s=guard_s, max_tokens=max_tokens)
    if not seconds_per_token > 0:
        raise ValueError(f"seconds_per_token = {seconds_per_token!r} must be > 0")
    room = (predicted_bubble_s - guard_s) / seconds_per_token  # in tokens; may be inf
    if room >= max_tokens:
        n = int(max_tokens)
    else:  # one more than the quotient says, in case it rounded down; checked below
        n = min(int(max_tokens), math.floor(room) + 1) if room >= 0 else 0
    while n > 0 and not fits(predicted_bubble_s, 0.0, n * seconds_per_token, guard_s):
        n -= 1
    return n


def _union(iv: Intervals) -> Intervals:
    out: Intervals = []
    for a, b in sorted(iv):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _length(iv: Intervals) -> int:
    return sum(b - a for a, b in iv)


def _intersection(x: Intervals, y: Intervals) -> Intervals:
    """Overlap of two sorted, disjoint interval lists."""
    out: Intervals = []
    i = j = 0
    while i < len(x) and j < len(y):
        a, b = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        if a < b:
            out.append((a, b))
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return out


def _pairs(df: pd.DataFrame) -> Intervals:
    return [(int(a), int(b)) for a, b in zip(df[T.START_NS], df[T.END_NS])]


def fill_stats(ev: pd.DataFrame, prefill: pd.DataFrame, warmup: int = 0, min_s: float = 0.0) -> dict:
    """How much of the bubbles prefill filled, and the GPU utilization it gave.

    ``ev``: training events; ``prefill``: one row per prefill chunk run (worker, start_ns, end_ns).
    Only iterations >= ``warmup`` count (as in ``analysis``). Per worker:
    - wall time: from its first measured event's start to its last one's end (its own span, unlike
      ``analysis.worker_utilization``'s pipeline period); prefill outside it is ignored;
    - bubbles: its ``bubble_windows`` of at least ``min_s`` seconds (default 0: every idle moment);
    - busy time: the union of its compute (forward, backward, optimizer, as in ``analysis``) and its
      prefill chunks; time covered by both counts once.
    Returns ``bubble_s``, ``prefill_s`` and ``prefill_in_bubbles_s`` (sums over workers, seconds),
    ``bubble_fill_fraction`` = prefill_in_bubbles_s / bubble_s, ``gpu_utilization`` (busy over wall
    time, mean over workers) and ``training_utilization`` (the same without prefill); a ratio is None
    when its denominator is 0. Prefill outside bubbles (over compute, an all-reduce, or between
    iterations) is in ``prefill_s`` but not in the fill. Raises ValueError for a missing column or a
    negative ``warmup`` or ``min_s``."""
    _non_negative(warmup=warmup, min_s=min_s)
    _require(prefill, [T.WORKER, T.START_NS, T.END_NS], "prefill table")
    _require(ev, [T.WORKER, T.ITERATION, T.KIND, T.START_NS, T.END_NS], "event table")
    ev = ev[(ev[T.KIND] != T.IDLE) & (ev[T.ITERATION] >= warmup)]
    windows = bubble_windows(ev, min_s)
    bubble_ns = prefill_ns = inside_ns = 0
    util, train_util = [], []
    for w, g in ev.groupby(T.WORKER):
        t0, t1 = int(g[T.START_NS].min()), int(g[T.END_NS].max())
        if t1 <= t0:
            continue
        bub = _union(_pairs(windows[windows[T.WORKER] == w]))
        pre = _union([(max(a, t0), min(b, t1)) for a, b in _pairs(prefill[prefill[T.WORKER] == w])])
        comp = _union(_pairs(g[g[T.KIND].isin(T.COMPUTE_KINDS)]))
        bubble_ns += _length(bub)
        prefill_ns += _length(pre)
        inside_ns += _length(_intersection(bub, pre))
        util.append(_length(_union(comp + pre)) / (t1 - t0))
        train_util.append(_length(comp) / (t1 - t0))
    return {"bubble_s": bubble_ns / 1e9, "prefill_s": prefill_ns / 1e9, "prefill_in_bubbles_s": inside_ns / 1e9,
            "bubble_fill_fraction": inside_ns / bubble_ns if bubble_ns else None,
            "gpu_utilization": sum(util) / len(util) if util else None,
            "training_utilization": sum(train_util) / len(train_util) if train_util else None}
