"""Bubbles on small hand-built event tables (times in ms, stored in ns): idle windows, their
prediction, the fit of prefill chunks and how much of the bubbles prefill filled."""

import numpy as np
import pandas as pd
import pytest

from testbed.bubbletea import windows as Bu
from testbed.bubbletea.profile import bubble_profile, live_prediction_errors, prediction_error_stats, prediction_errors
from testbed.plan.schedule import one_f_one_b
from testbed.results.plots import plot_bubble_predictions
from testbed.trace import schema as T

MS = 1_000_000
PERIOD_MS = 200  # iteration k starts at k * PERIOD_MS


def op(w, kind, it, mb, start_ms, end_ms):
    row = dict.fromkeys(T.COLUMNS)
    row.update(
        {
            T.WORKER: w,
            T.HOST: f"h{w}",
            T.DC: "east",
            T.STAGE: w,
            T.REPLICA: 0,
            T.ITERATION: it,
            T.MICROBATCH: mb,
            T.KIND: kind,
            T.START_NS: round(start_ms * MS),
            T.END_NS: round(end_ms * MS),
        }
    )
    return row


def frame(rows):
    return pd.DataFrame(rows, columns=T.COLUMNS)


def one_iteration(it, x=0.0):
    """2 stages, 2 microbatches, 1F1B (stage 0: F0 F1 B0 B1; stage 1: F0 B0 F1 B1), forward 10 ms,
    backward 20 ms. ``x`` ms more (or less) wait for the gradient of B0 on stage 0 (a slow WAN)."""
    b = it * PERIOD_MS
    w0 = [
        (T.FORWARD, 0, 0, 10),
        (T.SEND, 0, 10, 11),
        (T.FORWARD, 1, 11, 21),
        (T.SEND, 1, 21, 22),
        (T.RECV_WAIT, 0, 22, 51 + x),
        (T.BACKWARD, 0, 51 + x, 71 + x),
        (T.RECV_WAIT, 1, 71 + x, 83 + x),
        (T.BACKWARD, 1, 83 + x, 103 + x),
        (T.OPTIMIZER, -1, 105 + x, 110 + x),
    ]  # gap 103..105
    # stage 1 starts 2 ms later; its send of B0's gradient (45..46), a gap (46..47) and the wait for
    # F1's input (47..50) form one window
    w1 = [
        (T.RECV_WAIT, 0, 2, 15),
        (T.FORWARD, 0, 15, 25),
        (T.BACKWARD, 0, 25, 45),
        (T.SEND, 0, 45, 46),
        (T.RECV_WAIT, 1, 47, 50),
        (T.FORWARD, 1, 50, 60),
        (T.BACKWARD, 1, 60, 80),
        (T.SEND, 1, 80, 81),
        (T.OPTIMIZER, -1, 83, 88),
    ]
    return [op(0, k, it, m, b + s, b + e) for k, m, s, e in w0] + [op(1, k, it, m, b + s, b + e) for k, m, s, e in w1]


def timeline(extra=None, n=1):
    extra = extra or {}
    return frame([r for it in range(n) for r in one_iteration(it, extra.get(it, 0.0))])


# worker -> [(slot, before, offset_ms, duration_ms)] of one iteration with x = 0
EXPECTED = {
    0: [(1, "F1", 10, 1), (2, "B0", 21, 30), (3, "B1", 71, 12), (Bu.SLOT_OPTIMIZER, "optimizer", 103, 2)],
    1: [(0, "F0", 0, 13), (2, "F1", 43, 5), (Bu.SLOT_OPTIMIZER, "optimizer", 78, 3)],
}


def windows_of(win, worker, it):
    g = win[(win[T.WORKER] == worker) & (win[T.ITERATION] == it)]
    return list(zip(g[Bu.SLOT], g[Bu.BEFORE], (g[Bu.OFFSET_S] * 1e3).round(6), (g[Bu.DURATION_S] * 1e3).round(6)))


# ---- windows ---------------------------------------------------------------------------------


def test_windows_offsets_durations_slots_by_hand():
    win = Bu.bubble_windows(timeline())
    assert list(win.columns) == Bu.WINDOW_COLUMNS
    for w, expected in EXPECTED.items():
        assert windows_of(win, w, 0) == expected
    # start and end in ns, on the shared clock (stage 1's window before F0 starts at its first event)
    r = win[(win[T.WORKER] == 1) & (win[Bu.SLOT] == 0)].iloc[0]
    assert (r[T.START_NS], r[T.END_NS]) == (2 * MS, 15 * MS)
    assert win.loc[win[T.WORKER] == 1, T.STAGE].unique().tolist() == [1]


def test_slots_stable_across_iterations_and_match_schedule():
    win = Bu.bubble_windows(timeline({1: 8.0, 2: -6.0}, n=3))
    sched = one_f_one_b(2, 2)
    for w in (0, 1):
        per_it = [[(s, b) for s, b, _, _ in windows_of(win, w, it)] for it in range(3)]
        assert per_it[0] == per_it[1] == per_it[2] == [(s, b) for s, b, _, _ in EXPECTED[w]]
    # a window at slot s >= 0 precedes action s of its stage's schedule
    for _, r in win[win[Bu.SLOT] >= 0].iterrows():
        assert r[Bu.BEFORE] == str(sched[r[T.STAGE]][r[Bu.SLOT]])
    # iteration 1's gradient came 8 ms late: the wait before B0 is longer, later offsets shift
    assert windows_of(win, 0, 1) == [
        (1, "F1", 10, 1),
        (2, "B0", 21, 38),
        (3, "B1", 79, 12),
        (Bu.SLOT_OPTIMIZER, "optimizer", 111, 2),
    ]
    assert windows_of(win, 0, 2)[1] == (2, "B0", 21, 24)


def test_overlapping_waits_and_gaps_counted_once_and_busy_wins():
    ev = frame(
        [
            op(0, T.FORWARD, 0, 0, 0, 10),
            op(0, T.RECV_WAIT, 0, 1, 11, 15),  # overlaps the gap 10..12 and the next wait
            op(0, T.RECV_WAIT, 0, 1, 12, 20),
            op(0, T.IDLE, 0, -1, 10, 20),  # derived idle rows are ignored
            op(0, T.FORWARD, 0, 1, 20, 30),
            op(0, T.RECV_WAIT, 0, 0, 28, 33),  # overlaps the forward: only 30..33 is idle
            op(0, T.BACKWARD, 0, 1, 33, 60),
            op(0, T.BACKWARD, 0, 0, 45, 50),  # inside the other backward: no window after it
            op(0, T.OPTIMIZER, 0, -1, 62, 65),
        ]
    )
    win = Bu.bubble_windows(ev)
    # summing the rows would give 1 (gap) + 4 + 8 = 13 ms before F1 and 5 ms before B1
    assert windows_of(win, 0, 0) == [(1, "F1", 10, 10), (2, "B1", 30, 3), (Bu.SLOT_OPTIMIZER, "optimizer", 60, 2)]


def test_the_allreduce_is_idle_and_the_optimizer_slot_holds_it_and_a_cut_short_iteration_has_none():
    ev = frame(
        [
            op(0, T.FORWARD, 0, 0, 0, 10),
            op(0, T.BACKWARD, 0, 0, 10, 30),
            op(0, T.ALLREDUCE, 0, -1, 34, 40),
            op(0, T.OPTIMIZER, 0, -1, 41, 45),
            # iteration 1 cut short: a forward, then a wait that nothing follows
            op(0, T.FORWARD, 1, 0, 100, 110),
            op(0, T.RECV_WAIT, 1, 0, 110, 150),
        ]
    )
    win = Bu.bubble_windows(ev)
    # one accounting (as gpu_utilization): the all-reduce waits on the network, so from the
    # backward's end at 30 to the optimizer at 41 is one window
    assert windows_of(win, 0, 0) == [(Bu.SLOT_OPTIMIZER, "optimizer", 30, 11)]
    assert windows_of(win, 0, 1) == []


def test_min_s_filter():
    ev = frame(
        [
            op(0, T.FORWARD, 0, 0, 0, 10),
            op(0, T.FORWARD, 0, 1, 10.3, 20.3),  # 0.3 ms gap
            op(0, T.BACKWARD, 0, 1, 22.3, 40),
            op(0, T.BACKWARD, 0, 0, 41, 60),
        ]
    )  # 2 ms, 1 ms
    assert [d for *_, d in windows_of(Bu.bubble_windows(ev), 0, 0)] == [2, 1]  # default 0.5 ms
    assert [d for *_, d in windows_of(Bu.bubble_windows(ev, min_s=0.0), 0, 0)] == [0.3, 2, 1]
    assert [d for *_, d in windows_of(Bu.bubble_windows(ev, min_s=0.002), 0, 0)] == [2]  # exactly min_s: kept
    with pytest.raises(ValueError):
        Bu.bubble_windows(ev, min_s=-1.0)


def test_windows_of_empty_table_and_missing_column():
    assert Bu.bubble_windows(frame([])).empty
    with pytest.raises(ValueError, match="kind"):
        Bu.bubble_windows(timeline().drop(columns=[T.KIND]))


# ---- profile and prediction errors -----------------------------------------------------------

EXTRA = {3: 8.0, 4: -6.0}  # worker 0's wait before B0: 30 ms, but 38 in iteration 3 and 24 in 4


def _predicted(profile, worker, slot):
    row = profile[(profile[T.WORKER] == worker) & (profile[Bu.SLOT] == slot)]
    return None if row.empty else float(row[Bu.PREDICTED_S].iloc[0])


def test_profile_is_the_minimum_of_the_last_iterations():
    win = Bu.bubble_windows(timeline(EXTRA, n=8))
    p = bubble_profile(win[win[T.ITERATION] <= 2], window=3)
    assert list(p.columns) == Bu.PROFILE_COLUMNS
    assert _predicted(p, 0, 2) == pytest.approx(0.030)
    row = p[(p[T.WORKER] == 0) & (p[Bu.SLOT] == 3)]
    assert float(row[Bu.OFFSET_S].iloc[0]) == pytest.approx(0.071) and int(row[Bu.ITERATIONS].iloc[0]) == 3
    assert sorted(p[p[T.WORKER] == 0][Bu.SLOT]) == sorted([1, 2, 3, Bu.SLOT_OPTIMIZER])
    assert float(p[p[T.WORKER] == 0][Bu.PREDICTED_S].sum()) == pytest.approx((1 + 30 + 12 + 2) / 1e3)
    assert _predicted(p, 0, 0) is None and _predicted(p, 7, 2) is None
    # only the last ``window`` iterations count: 2, 3, 4 (the short one rules), then 5, 6, 7
    assert _predicted(bubble_profile(win[win[T.ITERATION] <= 4], window=3), 0, 2) == pytest.approx(0.024)
    row = bubble_profile(win[win[T.ITERATION] <= 4], window=3)
    row = row[(row[T.WORKER] == 0) & (row[Bu.SLOT] == 3)]
    assert float(row[Bu.OFFSET_S].iloc[0]) == pytest.approx(0.071)  # median of 71, 79, 65
    later = bubble_profile(win, window=3)
    assert _predicted(later, 0, 2) == pytest.approx(0.030) and _predicted(later, 1, 0) == pytest.approx(0.013)


def test_profile_slot_missing_from_an_iteration_predicts_zero():
    win = Bu.bubble_windows(timeline(n=3))
    gone = win[~((win[T.ITERATION] == 1) & (win[T.WORKER] == 0) & (win[Bu.SLOT] == 3))]
    p = bubble_profile(gone, window=3)
    assert _predicted(p, 0, 3) == 0.0 and _predicted(p, 0, 2) == pytest.approx(0.030)
    with pytest.raises(ValueError):
        bubble_profile(win, window=0)


def test_prediction_errors_by_hand():
    win = Bu.bubble_windows(timeline(EXTRA, n=8))
    err = prediction_errors(win, warmup=1, window=2)
    assert list(err.columns) == Bu.ERROR_COLUMNS
    # measured iterations 1..7; 3..7 have two before them; 7 windows per iteration
    assert sorted(err[T.ITERATION].unique()) == [3, 4, 5, 6, 7] and len(err) == 35
    s = err[(err[T.WORKER] == 0) & (err[Bu.SLOT] == 2)].set_index(T.ITERATION)
    assert (s[Bu.PREDICTED_S] * 1e3).tolist() == pytest.approx([30, 30, 24, 24, 30])
    assert (s[Bu.ACTUAL_S] * 1e3).tolist() == pytest.approx([38, 24, 30, 30, 30])
    assert (s[Bu.ERROR_S] * 1e3).tolist() == pytest.approx([8, -6, 6, 6, 0])
    others = err[~((err[T.WORKER] == 0) & (err[Bu.SLOT] == 2))]
    assert np.abs(others[Bu.ERROR_S]).max() < 1e-9
    st = prediction_error_stats(err)
    assert st["windows"] == 35
    assert st["abs_error_p50_ms"] == pytest.approx(0.0, abs=1e-6)
    # |error| sorted: 31 zeros, 6, 6, 6, 8; position 0.99 * 34 = 33.66 -> 6 + 0.66 * 2
    assert st["abs_error_p99_ms"] == pytest.approx(7.32)
    assert st["over_predicted_share"] == pytest.approx(1 / 35)
    assert st["over_prediction_p99_ms"] == pytest.approx(6.0)


def test_prediction_errors_vanished_and_new_windows():
    win = Bu.bubble_windows(timeline(n=3))
    gone = win[~((win[T.ITERATION] == 2) & (win[T.WORKER] == 1) & (win[Bu.SLOT] == 2))]
    new = pd.DataFrame([{**gone.iloc[0].to_dict(), T.ITERATION: 2, Bu.SLOT: 9, Bu.BEFORE: "F9", Bu.DURATION_S: 0.004}])
    err = prediction_errors(pd.concat([gone, new], ignore_index=True), warmup=0, window=2).set_index(
        [T.WORKER, Bu.SLOT]
    )
    # predicted 5 ms, did not occur: over-predicted by 5 ms; unpredicted 4 ms window: predicted 0
    assert err.loc[(1, 2), [Bu.PREDICTED_S, Bu.ACTUAL_S, Bu.ERROR_S]].tolist() == pytest.approx([0.005, 0, -0.005])
    assert err.loc[(0, 9), [Bu.PREDICTED_S, Bu.ACTUAL_S]].tolist() == pytest.approx([0.0, 0.004])
    assert prediction_error_stats(err)["over_predicted_share"] == pytest.approx(1 / len(err))


def test_prediction_errors_without_enough_history_and_bad_arguments():
    win = Bu.bubble_windows(timeline(n=3))
    err = prediction_errors(win, warmup=1, window=2)
    assert err.empty and list(err.columns) == Bu.ERROR_COLUMNS
    st = prediction_error_stats(err)
    assert st["windows"] == 0 and st["abs_error_p99_ms"] is None and st["over_predicted_share"] is None
    with pytest.raises(ValueError):
        prediction_errors(win, warmup=-1, window=2)
    with pytest.raises(ValueError):
        prediction_errors(win, warmup=0, window=0)


# ---- fitting chunks --------------------------------------------------------------------------


def test_fits_edges():
    assert Bu.fits(1.0, 0.25, 0.5, 0.25)  # exactly fills the bubble
    assert not Bu.fits(1.0, 0.25, 0.5 + 1e-6, 0.25)  # 1 us too long
    assert Bu.fits(0.3, 0.1, 0.2, 0.0)  # 0.1 + 0.2 > 0.3 in floats: tolerance
    assert not Bu.fits(0.0, 0.0, 0.001, 0.0)
    assert Bu.fits(0.0, 0.0, 0.0, 0.0)
    for bad in ((-1.0, 0, 0, 0), (1.0, -0.1, 0, 0), (1.0, 0, float("nan"), 0), (1.0, 0, 0, -0.001)):
        with pytest.raises(ValueError):
            Bu.fits(*bad)


def fill_case():
    ev = frame(
        [
            # warm-up iteration 0: excluded, and so is prefill in it
            op(0, T.FORWARD, 0, 0, 0, 10),
            op(0, T.RECV_WAIT, 0, 0, 10, 40),
            op(0, T.OPTIMIZER, 0, -1, 40, 45),
            op(1, T.OPTIMIZER, 0, -1, 40, 45),
            # iteration 1, worker 0: wall 100..160, compute 10 + 20 + 10, bubble 110..130
            op(0, T.FORWARD, 1, 0, 100, 110),
            op(0, T.SEND, 1, 0, 110, 111),
            op(0, T.RECV_WAIT, 1, 0, 111, 130),
            op(0, T.BACKWARD, 1, 0, 130, 150),
            op(0, T.OPTIMIZER, 1, -1, 150, 160),
            # worker 1: wall 100..135, compute 10 + 10 + 5, bubbles 100..105 and 125..130
            op(1, T.RECV_WAIT, 1, 0, 100, 105),
            op(1, T.FORWARD, 1, 0, 105, 115),
            op(1, T.BACKWARD, 1, 0, 115, 125),
            op(1, T.OPTIMIZER, 1, -1, 130, 135),
        ]
    )
    prefill = pd.DataFrame(
        {
            T.WORKER: [0, 0, 0, 1, 1, 2],
            T.START_NS: [20 * MS, 112 * MS, 155 * MS, 101 * MS, 126 * MS, 100 * MS],
            T.END_NS: [30 * MS, 122 * MS, 158 * MS, 104 * MS, 132 * MS, 120 * MS],
        }
    )
    return ev, prefill


def test_fill_stats_by_hand():
    ev, prefill = fill_case()
    st = Bu.fill_stats(ev, prefill, warmup=1)
    assert st["bubble_s"] == pytest.approx(0.030)  # 20 + 5 + 5
    # in bubbles: 112..122 (10), 101..104 (3), 126..130 (4); 155..158 lies over the optimizer,
    # 130..132 over worker 1's optimizer, 20..30 in warm-up, worker 2 has no training events
    assert st["prefill_in_bubbles_s"] == pytest.approx(0.017)
    assert st["prefill_s"] == pytest.approx(0.010 + 0.003 + 0.003 + 0.006)
    assert st["bubble_fill_fraction"] == pytest.approx(17 / 30)
    # busy = compute plus prefill, overlap once: worker 0 40 + 10 of 60, worker 1 25 + 3 + 4 of 35
    assert st["gpu_utilization"] == pytest.approx((50 / 60 + 32 / 35) / 2)
    assert st["training_utilization"] == pytest.approx((40 / 60 + 25 / 35) / 2)


def test_fill_stats_warmup_and_no_prefill():
    ev, prefill = fill_case()
    none = Bu.fill_stats(ev, prefill.iloc[0:0], warmup=1)
    assert none["bubble_fill_fraction"] == 0.0 and none["gpu_utilization"] == none["training_utilization"]
    # with iteration 0 measured, worker 0's wall starts at 0 and its 20..30 prefill is in a bubble
    all_its = Bu.fill_stats(ev, prefill, warmup=0)
    assert all_its["prefill_in_bubbles_s"] == pytest.approx(0.027)
    with pytest.raises(ValueError, match="prefill"):
        Bu.fill_stats(ev, prefill.drop(columns=[T.END_NS]))


def test_the_live_predictions_the_chunks_were_placed_by_are_the_ones_scored():
    """Wait events carrying the slot predictor's prediction (``PrefillServer.observe``): those of
    measured iterations are scored against the bubble observed; a wait nothing was predicted for
    and the warm-up iteration are left out."""
    rows = []
    for it, (pred_ms, seen_ms) in enumerate([(50, 10), (30, 36), (40, 31), (None, 20)]):
        r = op(0, T.RECV_WAIT, it, 1, it * PERIOD_MS, it * PERIOD_MS + seen_ms)
        r[T.BUBBLE_NS] = seen_ms * MS
        r[T.PREDICTED_BUBBLE_NS] = None if pred_ms is None else pred_ms * MS
        rows.append(r)
    rows.append(op(0, T.FORWARD, 1, 1, 100, 140))  # not a wait: no prediction
    err = live_prediction_errors(pd.DataFrame(rows), warmup=1)
    assert list(err.columns) == Bu.ERROR_COLUMNS
    assert err[T.ITERATION].tolist() == [1, 2]
    assert (err[Bu.ERROR_S] * 1e3).tolist() == pytest.approx([6, -9])  # observed - predicted
    st = prediction_error_stats(err)
    assert st["windows"] == 2 and st["over_predicted_share"] == 0.5
    assert st["abs_error_p50_ms"] == pytest.approx(7.5)
    # observed 36 and 31 ms; the first lasted 6 ms past its predicted 30, the second ended early
    assert st["beyond_prediction_share"] == pytest.approx(6 / 67)
    assert live_prediction_errors(pd.DataFrame([op(0, T.FORWARD, 1, 1, 0, 40)]).drop(columns=[T.BUBBLE_NS]), 0).empty


def test_the_prediction_plot_draws_the_measured_waits_and_nothing_without_them(tmp_path):
    """``bubble_prediction.png`` from the same kind of wait events; none for a run whose waits carry
    no prediction (training alone) or only in the warm-up."""
    rows = []
    for it, (pred_ms, seen_ms) in enumerate([(50, 10), (30, 36), (40, 31)]):
        for w in (0, 1):
            r = op(w, T.RECV_WAIT, it, 1, it * PERIOD_MS, it * PERIOD_MS + seen_ms)
            r[T.BUBBLE_NS], r[T.PREDICTED_BUBBLE_NS] = seen_ms * MS, pred_ms * MS
            rows.append(r)
    ev = pd.DataFrame(rows)
    plot_bubble_predictions(ev, tmp_path / "a.png", warmup=1)
    assert (tmp_path / "a.png").stat().st_size > 10_000
    plot_bubble_predictions(ev, tmp_path / "warmup_only.png", warmup=3)
    plot_bubble_predictions(ev.assign(**{T.PREDICTED_BUBBLE_NS: None}), tmp_path / "none.png", warmup=0)
    plot_bubble_predictions(ev.drop(columns=[T.PREDICTED_BUBBLE_NS]), tmp_path / "absent.png", warmup=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.png"]
