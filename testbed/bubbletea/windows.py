"""BubbleTea's bubbles: the idle windows of pipeline workers, whether a chunk fits one, and how
much of them prefill filled (their prediction: ``profile.py``).

Pure functions, DataFrame in, DataFrame (or number, or dict) out. Definitions (once, here):

- busy: a worker is busy while it runs a forward, backward or optimizer step (``BUSY_KINDS``,
  training's ``COMPUTE_KINDS``: the same definition as ``gpu_utilization``); the gradient
  all-reduce is waiting on the network, so it is idle, and BubbleTea fills it. A send only
  launches an asynchronous transfer (the worker moves on at once) and a receive wait is waiting,
  so neither is busy; were a send busy, its launch would split the wait before one action into
  two pieces. Derived ``idle`` rows (``analysis.idle_gaps``) are ignored.
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
  (in start order, as in ``schedule``'s per-stage action list), or ``SLOT_OPTIMIZER`` (-2)
  before the optimizer step (the send drain and the all-reduce). ``before`` names it: "F3", "B0",
  "optimizer".
"""

from __future__ import annotations

import pandas as pd

from testbed.trace import schema as T

# window, profile and error columns (event columns come from trace)
SLOT, BEFORE, OFFSET_S, DURATION_S = "slot", "before", "offset_s", "duration_s"
PREDICTED_S, ACTUAL_S, ERROR_S, ITERATIONS = "predicted_s", "actual_s", "error_s", "iterations"
WINDOW_COLUMNS = [T.WORKER, T.STAGE, T.REPLICA, T.ITERATION, SLOT, BEFORE, T.START_NS, T.END_NS, OFFSET_S, DURATION_S]
PROFILE_COLUMNS = [T.WORKER, SLOT, BEFORE, PREDICTED_S, OFFSET_S, ITERATIONS]
ERROR_COLUMNS = [T.WORKER, SLOT, T.ITERATION, PREDICTED_S, ACTUAL_S, ERROR_S]

BUSY_KINDS = T.COMPUTE_KINDS
SLOT_OPTIMIZER = -2
DEFAULT_MIN_S = 0.0005
TOLERANCE_S = 1e-9  # float rounding allowance in fits (1 ns)

Intervals = list[tuple[int, int]]


def require_columns(df: pd.DataFrame, columns: list[str], what: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"{what} lacks column(s) {', '.join(missing)}: build it with testbed.trace.schema's names")


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
    require_columns(
        ev, [T.WORKER, T.STAGE, T.REPLICA, T.ITERATION, T.MICROBATCH, T.KIND, T.START_NS, T.END_NS], "event table"
    )
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
                slot, before = SLOT_OPTIMIZER, kind
            if start > cur and (start - cur) / 1e9 >= min_s:
                rows.append(
                    {
                        T.WORKER: w,
                        T.STAGE: g[T.STAGE].iloc[0],
                        T.REPLICA: g[T.REPLICA].iloc[0],
                        T.ITERATION: int(it),
                        SLOT: slot,
                        BEFORE: before,
                        T.START_NS: cur,
                        T.END_NS: start,
                        OFFSET_S: (cur - t0) / 1e9,
                        DURATION_S: (start - cur) / 1e9,
                    }
                )
            cur = max(cur, end)
    return pd.DataFrame(rows, columns=WINDOW_COLUMNS)


def fits(predicted_bubble_s: float, elapsed_s: float, chunk_s: float, guard_s: float) -> bool:
    """Whether a prefill chunk of ``chunk_s`` seconds may start ``elapsed_s`` seconds into a bubble
    predicted to last ``predicted_bubble_s``, keeping ``guard_s`` spare: elapsed + chunk + guard <=
    predicted (with 1 ns of float tolerance). Raises ValueError for a negative or NaN argument."""
    if not (predicted_bubble_s >= 0 and elapsed_s >= 0 and chunk_s >= 0 and guard_s >= 0):  # NaN fails too
        _non_negative(predicted_bubble_s=predicted_bubble_s, elapsed_s=elapsed_s, chunk_s=chunk_s, guard_s=guard_s)
    return elapsed_s + chunk_s + guard_s <= predicted_bubble_s + TOLERANCE_S


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
    require_columns(prefill, [T.WORKER, T.START_NS, T.END_NS], "prefill table")
    require_columns(ev, [T.WORKER, T.ITERATION, T.KIND, T.START_NS, T.END_NS], "event table")
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
    return {
        "bubble_s": bubble_ns / 1e9,
        "prefill_s": prefill_ns / 1e9,
        "prefill_in_bubbles_s": inside_ns / 1e9,
        "bubble_fill_fraction": inside_ns / bubble_ns if bubble_ns else None,
        "gpu_utilization": sum(util) / len(util) if util else None,
        "training_utilization": sum(train_util) / len(train_util) if train_util else None,
    }
