"""Metrics from traces, on small hand-built event frames (times in ms, stored in ns)."""

import math

import numpy as np
import pandas as pd
import pytest
from eventrows import event_row

from testbed.results import analysis as A
from testbed.results import link_counters as L
from testbed.trace import schema as T

MS = 1_000_000

# worker -> (host, dc, stage, replica)
WORKERS = {
    0: ("east-h0", "east", 0, 0),
    1: ("east-h1", "east", 1, 0),
    2: ("west-h0", "west", 2, 0),
    3: ("east-h2", "east", 0, 1),
}


def op(w, kind, it, mb, start_ms, end_ms, **extra):
    return event_row(w, *WORKERS[w], kind, it, mb, start_ms, end_ms, **extra)


def frame(rows):
    """Like read_events on JSON lines: missing fields become NaN (floats for numeric columns)."""
    df = pd.DataFrame(rows, columns=T.COLUMNS)
    for c in (T.BYTES, T.PEER, T.REAL_NS, T.PADDED_NS, T.LOSS):
        df[c] = pd.to_numeric(df[c])
    return df


# ---- iteration times -------------------------------------------------------------------------


def three_iterations():
    rows = []
    # iteration 0 (warm-up): 0..50 ms
    rows += [op(0, T.FORWARD, 0, 0, 0, 10), op(1, T.OPTIMIZER, 0, -1, 40, 50), op(0, T.OPTIMIZER, 0, -1, 30, 45)]
    # iteration 1: first op is worker 1's receive wait at 100; last optimizer ends at 170 (worker 0)
    rows += [
        op(1, T.RECV_WAIT, 1, 0, 100, 115, peer=0),
        op(0, T.FORWARD, 1, 0, 102, 112),
        op(1, T.OPTIMIZER, 1, -1, 150, 160),
        op(0, T.OPTIMIZER, 1, -1, 160, 170),
        op(0, T.SEND, 1, 0, 165, 190, peer=1),
    ]  # a late op that is not an optimizer: not the end
    # iteration 2: 200..230
    rows += [op(0, T.FORWARD, 2, 0, 200, 210), op(0, T.OPTIMIZER, 2, -1, 225, 230), op(1, T.OPTIMIZER, 2, -1, 215, 220)]
    # iteration 3: started, never finished (no optimizer): not a completed iteration
    rows += [op(0, T.FORWARD, 3, 0, 300, 310)]
    return frame(rows)


def test_iteration_times_start_end_and_warmup():
    it = A.iteration_times(three_iterations(), warmup=1)
    assert it[T.ITERATION].tolist() == [1, 2]
    # each iteration starts where the previous one's last optimizer step ended (50, then 170)
    assert it[T.START_NS].tolist() == [50 * MS, 170 * MS]
    assert it[T.END_NS].tolist() == [170 * MS, 230 * MS]
    assert it["duration_s"].tolist() == pytest.approx([0.120, 0.060])


def test_iteration_times_without_warmup_includes_iteration_0():
    it = A.iteration_times(three_iterations(), warmup=0)
    assert it[T.ITERATION].tolist() == [0, 1, 2]
    assert it["duration_s"].iloc[0] == pytest.approx(0.050)


def test_iteration_stats():
    it = pd.DataFrame({"duration_s": [4.0, 1.0, 3.0, 2.0]})
    st = A.iteration_stats(it)
    assert st["mean"] == pytest.approx(2.5)
    assert st["p50"] == pytest.approx(2.5)
    # linear interpolation between order statistics: position 0.95 * 3 = 2.85 -> 3 + 0.85 * (4 - 3)
    assert st["p95"] == pytest.approx(3.85)
    assert A.iteration_stats(pd.DataFrame({"duration_s": []})) == {"mean": None, "p50": None, "p95": None}


# ---- utilization -----------------------------------------------------------------------------


def utilization_frame():
    rows = []
    # warm-up iteration 0 (excluded entirely, even its compute)
    rows += [op(0, T.FORWARD, 0, 0, 0, 50), op(0, T.OPTIMIZER, 0, -1, 50, 60), op(1, T.OPTIMIZER, 0, -1, 50, 60)]
    # iteration 1: window 100..200
    rows += [
        op(0, T.FORWARD, 1, 0, 100, 120),
        op(0, T.SEND, 1, 0, 120, 121, peer=1),
        op(0, T.RECV_WAIT, 1, 0, 121, 150, peer=1),
        op(0, T.BACKWARD, 1, 0, 150, 180),
        op(0, T.ALLREDUCE, 1, -1, 180, 190),
        op(0, T.OPTIMIZER, 1, -1, 190, 200),
        op(1, T.RECV_WAIT, 1, 0, 100, 125, peer=0),
        op(1, T.FORWARD, 1, 0, 125, 135),
        op(1, T.BACKWARD, 1, 0, 135, 150),
        op(1, T.OPTIMIZER, 1, -1, 195, 198),
    ]
    # iteration 2 (aborted run: no optimizer): a forward straddling the window's end counts up to it,
    # one after it counts nothing
    rows += [op(1, T.FORWARD, 2, 0, 198, 206), op(0, T.FORWARD, 2, 0, 205, 215)]
    # worker 2 only waits in the window: utilization 0
    rows += [op(2, T.RECV_WAIT, 1, 0, 110, 190, peer=1)]
    return frame(rows)


def test_worker_utilization_compute_only_clipped_to_window():
    u = A.worker_utilization(utilization_frame(), warmup=1).set_index(T.WORKER)
    assert sorted(u.index) == [0, 1, 2]
    # the window runs from the end of warm-up iteration 0 (60) to the end of iteration 1 (200)
    assert u["wall_s"].tolist() == pytest.approx([0.140] * 3)
    # worker 0: F 20 + B 30 + optimizer 10 (send, receive wait, all-reduce do not count; its
    # iteration-2 forward lies after the window)
    assert u.loc[0, "compute_s"] == pytest.approx(0.060)
    # worker 1: F 10 + B 15 + optimizer 3 + 2 of the straddling forward (198..200)
    assert u.loc[1, "compute_s"] == pytest.approx(0.030)
    assert u.loc[2, "compute_s"] == 0.0
    assert u["utilization"].tolist() == pytest.approx([0.060 / 0.140, 0.030 / 0.140, 0.0])
    assert u.loc[2, T.STAGE] == 2 and u.loc[1, T.REPLICA] == 0


def test_worker_utilization_recv_wait_is_not_compute():
    ev = utilization_frame()
    base = A.worker_utilization(ev, warmup=1).set_index(T.WORKER)
    longer = ev.copy()
    longer.loc[longer[T.KIND] == T.RECV_WAIT, T.END_NS] += 3 * MS
    assert A.worker_utilization(longer, warmup=1).set_index(T.WORKER)["compute_s"].tolist() == pytest.approx(
        base["compute_s"].tolist()
    )


def test_worker_utilization_empty_when_no_iteration_completes():
    ev = frame([op(0, T.FORWARD, 0, 0, 0, 10)])
    assert A.worker_utilization(ev).empty


def test_stage_bubbles_mean_over_replicas():
    util = pd.DataFrame({T.WORKER: [0, 3, 1], T.STAGE: [0, 0, 1], T.REPLICA: [0, 1, 0], "utilization": [0.6, 0.8, 0.5]})
    b = A.stage_bubbles(util).set_index(T.STAGE)
    assert b["utilization"].tolist() == pytest.approx([0.7, 0.5])
    assert b["bubble_fraction"].tolist() == pytest.approx([0.3, 0.5])


# ---- transfers -------------------------------------------------------------------------------


def transfer_frame():
    return frame(
        [
            # forward, same DC (east): 0 -> 1; the receive was posted first (at 0), the send at 10
            op(0, T.SEND, 0, 0, 10, 11, peer=1, bytes=1000),
            op(1, T.RECV_WAIT, 0, 0, 0, 30, peer=0, bytes=1000),
            # forward, across DCs: 1 -> 2; the send at 40, the receiver busy until 55, done at 85
            op(1, T.SEND, 0, 0, 40, 41, peer=2, bytes=2000),
            op(2, T.RECV_WAIT, 0, 0, 55, 85, peer=1, bytes=2000),
            # backward, across DCs: 2 -> 1 (same pair, same microbatch, other direction)
            op(2, T.SEND, 0, 0, 100, 101, peer=1, bytes=2000),
            op(1, T.RECV_WAIT, 0, 0, 90, 140, peer=2, bytes=2000),
            # a send whose receive is in another microbatch, and one in another iteration: no match
            op(0, T.SEND, 0, 1, 12, 13, peer=1, bytes=1000),
            op(1, T.RECV_WAIT, 0, 2, 12, 20, peer=0, bytes=1000),
            op(0, T.SEND, 1, 0, 200, 201, peer=1, bytes=1000),
            op(1, T.RECV_WAIT, 2, 0, 200, 230, peer=0, bytes=1000),
            op(0, T.FORWARD, 0, 0, 0, 10),
        ]
    )


def test_transfers_match_send_to_receive():
    tr = A.transfers(transfer_frame()).sort_values(["sender", "receiver"]).reset_index(drop=True)
    assert list(zip(tr["sender"], tr["receiver"])) == [(0, 1), (1, 2), (2, 1)]
    assert tr["forward"].tolist() == [True, True, False]
    assert tr["cross_dc"].tolist() == [False, True, True]
    assert tr[T.BYTES].tolist() == [1000, 2000, 2000]
    assert tr[T.ITERATION].tolist() == [0, 0, 0] and tr[T.MICROBATCH].tolist() == [0, 0, 0]
    # from max(send start, receive start) to receive end
    assert tr["transfer_s"].tolist() == pytest.approx([(30 - 10) / 1e3, (85 - 55) / 1e3, (140 - 100) / 1e3])


def test_transfers_of_one_microbatch_between_the_same_workers_are_told_apart():
    """Interleaved over two stages: worker 1 (stage 1) sends microbatch 0 to worker 2 (stage 2)
    three times, the boundaries 1 -> 2 (activations), 2 <- 3 (gradients, worker 1 holding virtual
    stage 3) and 3 -> 4; each is matched to its own receive by boundary and tensor, and the
    activations that go from a later stage to an earlier one still count as forward."""
    crossing = {
        1: {T.VIRTUAL_STAGE: 1, T.TENSOR: T.ACTIVATIONS},
        2: {T.VIRTUAL_STAGE: 2, T.TENSOR: T.GRADIENTS},
        3: {T.VIRTUAL_STAGE: 3, T.TENSOR: T.ACTIVATIONS},
    }
    rows = []
    for k, (send_ms, recv_end_ms) in zip(crossing, [(0, 20), (30, 70), (80, 130)]):
        rows.append(op(1, T.SEND, 0, 0, send_ms, send_ms + 1, peer=2, bytes=2000, **crossing[k]))
        rows.append(op(2, T.RECV_WAIT, 0, 0, 0, recv_end_ms, peer=1, bytes=2000, **crossing[k]))
    back = {T.VIRTUAL_STAGE: 3, T.TENSOR: T.GRADIENTS}  # virtual stage 4's gradient to 3, the other way
    rows.append(op(2, T.SEND, 0, 0, 140, 141, peer=1, bytes=2000, **back))
    rows.append(op(1, T.RECV_WAIT, 0, 0, 140, 170, peer=2, bytes=2000, **back))
    tr = A.transfers(frame(rows)).sort_values("transfer_s").reset_index(drop=True)
    assert tr["transfer_s"].tolist() == pytest.approx([0.020, 0.030, 0.040, 0.050])
    assert tr["forward"].tolist() == [True, False, False, True]
    assert list(zip(tr["sender"], tr["receiver"])) == [(1, 2), (2, 1), (1, 2), (1, 2)]


def wan_frame():
    rows = []
    for it, (fwd_ms, xfer_ms) in enumerate([(50, 500), (10, 15), (20, 25), (10, 20)]):
        b = 1000 * it
        rows += [
            op(1, T.FORWARD, it, 0, b, b + fwd_ms),
            op(1, T.SEND, it, 0, b + fwd_ms, b + fwd_ms + 1, peer=2, bytes=8),
            op(2, T.RECV_WAIT, it, 0, b, b + fwd_ms + xfer_ms, peer=1, bytes=8),
            op(2, T.FORWARD, it, 0, b + 600, b + 900),  # receiver's forward: not in the ratio
            op(0, T.FORWARD, it, 0, b + 500, b + 800),  # a same-DC sender's forward: not in it
            op(2, T.SEND, it, 0, b + 900, b + 901, peer=1, bytes=8),  # backward across DCs: not in it
            op(1, T.RECV_WAIT, it, 0, b + 100, b + 990, peer=2, bytes=8),
            op(0, T.SEND, it, 0, b, b + 1, peer=1, bytes=8),  # forward inside east: not in it
            op(1, T.RECV_WAIT, it, 0, b, b + 400, peer=0, bytes=8),
        ]
    return frame(rows)


def test_wan_compute_ratio_medians_measured_iterations():
    # iterations 1..3: transfers 15, 25, 20 ms (median 20); sender's forwards 10, 20, 10 (median 10)
    assert A.wan_compute_ratio(wan_frame(), warmup=1) == pytest.approx(20 / 10)
    # with the warm-up: transfers 500, 15, 25, 20 (median 22.5); forwards 50, 10, 20, 10 (median 15)
    assert A.wan_compute_ratio(wan_frame(), warmup=0) == pytest.approx(22.5 / 15)


def test_wan_compute_ratio_takes_each_pairs_median_first():
    """Two cross-DC pairs whose transfers cluster apart (as over links of unequal delay): 1 -> 2
    takes 10, 12 and 20 ms, 3 -> 2 40, 42 and 44 ms, each sender's forward 10 ms. The pairs'
    medians, 12 and 42, give 27 ms; the pooled transfers' median, 30 ms, would be set by 1 -> 2's
    slowest and 3 -> 2's quickest."""
    rows = []
    for sender, times in ((1, (10, 12, 20)), (3, (40, 42, 44))):
        for mb, xfer_ms in enumerate(times):
            b = 100 * mb + (1000 if sender == 3 else 0)
            rows += [
                op(sender, T.FORWARD, 0, mb, b, b + 10),
                op(sender, T.SEND, 0, mb, b + 10, b + 11, peer=2, bytes=8),
                op(2, T.RECV_WAIT, 0, mb, 0, b + 10 + xfer_ms, peer=sender, bytes=8),
            ]
    assert A.wan_compute_ratio(frame(rows)) == pytest.approx(27 / 10)


def test_wan_compute_ratio_none_without_cross_dc_forward():
    ev = transfer_frame()
    # without the one forward across DCs (1 -> 2) only the backward 2 -> 1 crosses: no ratio
    fwd_wan = ((ev[T.WORKER] == 1) & (ev[T.KIND] == T.SEND) & (ev[T.PEER] == 2)) | (
        (ev[T.WORKER] == 2) & (ev[T.KIND] == T.RECV_WAIT)
    )
    assert A.wan_compute_ratio(ev[~fwd_wan]) is None


# ---- overruns, losses ------------------------------------------------------------------------


def test_overrun_fraction_excludes_warmup_and_other_kinds():
    targets = {T.FORWARD: 10 * MS, T.BACKWARD: 20 * MS}
    ev = frame(
        [
            op(0, T.FORWARD, 0, 0, 0, 30, real_ns=30 * MS),  # warm-up overrun: excluded
            op(0, T.BACKWARD, 0, 0, 30, 90, real_ns=60 * MS),  # warm-up overrun: excluded
            op(0, T.FORWARD, 1, 0, 100, 111, real_ns=11 * MS),  # overrun
            op(0, T.FORWARD, 1, 1, 111, 121, real_ns=10 * MS),  # exactly on target: not an overrun
            op(0, T.BACKWARD, 1, 0, 121, 141, real_ns=19 * MS),
            op(0, T.BACKWARD, 1, 1, 141, 161, real_ns=5 * MS),
            op(0, T.OPTIMIZER, 1, -1, 161, 300, real_ns=999 * MS),  # not a padded kind
        ]
    )
    assert A.overrun_fraction(ev, targets, warmup=1) == pytest.approx(1 / 4)
    assert A.overrun_fraction(ev, targets, warmup=0) == pytest.approx(3 / 6)
    assert A.overrun_fraction(ev[ev[T.KIND] == T.OPTIMIZER], targets) == 0.0


def test_compute_headroom_smallest_target_over_median_real():
    targets = {T.FORWARD: 12 * MS, T.BACKWARD: 20 * MS}
    ev = frame(
        [
            op(0, T.FORWARD, 0, 0, 0, 12, real_ns=100 * MS),  # warm-up: excluded
            op(0, T.FORWARD, 1, 0, 0, 12, real_ns=2 * MS),
            op(0, T.FORWARD, 1, 1, 0, 12, real_ns=3 * MS),
            op(0, T.FORWARD, 1, 2, 0, 12, real_ns=9 * MS),  # forward median 3 ms: headroom 4
            op(0, T.BACKWARD, 1, 0, 0, 20, real_ns=4 * MS),
            op(0, T.BACKWARD, 1, 1, 0, 20, real_ns=6 * MS),  # backward median 5 ms: headroom 4
        ]
    )
    assert A.compute_headroom(ev, targets, warmup=1) == pytest.approx(min(12 / 3, 20 / 5))
    ev.loc[ev[T.KIND] == T.BACKWARD, T.REAL_NS] *= 2  # backward median 10 ms: headroom 2
    assert A.compute_headroom(ev, targets, warmup=1) == pytest.approx(2.0)
    assert A.compute_headroom(ev[ev[T.ITERATION] == 0], targets, warmup=1) is None


def test_losses_from_the_optimizer_rows_that_carry_one():
    ev = frame(
        [
            op(0, T.OPTIMIZER, 0, -1, 0, 1),
            op(2, T.OPTIMIZER, 0, -1, 0, 1, loss=5.5),
            op(2, T.FORWARD, 1, 0, 1, 2, loss=9.9),  # not an optimizer row
            op(0, T.OPTIMIZER, 1, -1, 2, 3),
            op(2, T.OPTIMIZER, 1, -1, 2, 3, loss=4.25),
        ]
    )
    loss = A.losses(ev)
    assert loss.index.tolist() == [0, 1]
    assert loss.tolist() == [5.5, 4.25]
    assert loss.dtype == float


# ---- idle gaps -------------------------------------------------------------------------------


def test_idle_gaps_between_consecutive_ops_per_worker():
    ev = frame(
        [
            op(0, T.FORWARD, 0, 0, 0, 10),
            op(0, T.SEND, 0, 0, 4, 6, peer=1),  # nested in the forward: no gap
            op(0, T.BACKWARD, 0, 0, 12, 20),  # gap 10..12
            op(0, T.IDLE, 0, -1, 20, 30),  # old idle rows are ignored
            op(0, T.OPTIMIZER, 0, -1, 25, 26),  # gap 20..25
            op(1, T.RECV_WAIT, 0, 0, 1, 3, peer=0),
            op(1, T.FORWARD, 0, 0, 3, 5),  # back to back: no gap
            op(1, T.OPTIMIZER, 1, -1, 9, 10),  # gap 5..9, iteration 1
        ]
    )
    idle = A.idle_gaps(ev).sort_values([T.WORKER, T.START_NS]).reset_index(drop=True)
    assert (idle[T.KIND] == T.IDLE).all() and (idle[T.MICROBATCH] == -1).all()
    got = list(zip(idle[T.WORKER], idle[T.START_NS] // MS, idle[T.END_NS] // MS, idle[T.ITERATION]))
    assert got == [(0, 10, 12, 0), (0, 20, 25, 0), (1, 5, 9, 1)]
    assert idle.loc[2, T.DC] == "east" and idle.loc[2, T.HOST] == "east-h1" and idle.loc[2, T.STAGE] == 1


def test_idle_gaps_none():
    ev = frame([op(0, T.FORWARD, 0, 0, 0, 10), op(0, T.BACKWARD, 0, 0, 10, 20)])
    assert A.idle_gaps(ev).empty


# ---- link utilization ------------------------------------------------------------------------


def test_link_utilization_from_class_1_1_byte_deltas():
    rows = [
        # east->west, 100 Mbit/s: 1.25 MB in 0.1 s = 100 Mbit/s (1.0), then 0.625 MB in 0.2 s = 25 Mbit/s
        (0, "east->west", "1:1", 0, 100_000_000),
        (100 * MS, "east->west", "1:1", 1_250_000, 100_000_000),
        (300 * MS, "east->west", "1:1", 1_875_000, 100_000_000),
        (100 * MS, "east->west", "1:10", 9_999_999, 100_000_000),  # other class: ignored
        # west->east starts later, 50 Mbit/s: 0.3125 MB in 0.1 s = 25 Mbit/s (0.5)
        (50 * MS, "west->east", "1:1", 1000, 50_000_000),
        (150 * MS, "west->east", "1:1", 1000 + 312_500, 50_000_000),
    ]
    counters = pd.DataFrame(rows, columns=[T.T_NS, T.LINK, T.CLASSID, T.TX_BYTES, T.RATE_BPS])
    lu = L.link_utilization(counters)
    got = {(r[T.LINK], round(r["t_s"], 6)): (r["bps"], r["utilization"]) for _, r in lu.iterrows()}
    assert set(got) == {("east->west", 0.1), ("east->west", 0.3), ("west->east", 0.15)}
    assert got[("east->west", 0.1)] == pytest.approx((100e6, 1.0))
    assert got[("east->west", 0.3)] == pytest.approx((25e6, 0.25))
    assert got[("west->east", 0.15)] == pytest.approx((25e6, 0.5))


def test_link_utilization_empty_without_class_1_1():
    counters = pd.DataFrame([(0, "a->b", "1:10", 0, 1)], columns=[T.T_NS, T.LINK, T.CLASSID, T.TX_BYTES, T.RATE_BPS])
    assert L.link_utilization(counters).empty
    assert list(L.link_utilization(counters).columns) == [T.LINK, T.T_NS, "t_s", "bps", "utilization"]


def test_mean_wan_utilization_covers_the_measured_window_and_used_directions():
    rows = [  # a->b busy in the window; b->a never carries anything; samples outside the window ignored
        (0, "a->b", "1:1", 0, 1000),
        (100 * MS, "a->b", "1:1", 0, 1000),  # start-up: idle
        (200 * MS, "a->b", "1:1", 10, 1000),
        (300 * MS, "a->b", "1:1", 15, 1000),  # 0.8 then 0.4
        (100 * MS, "b->a", "1:1", 0, 1000),
        (200 * MS, "b->a", "1:1", 0, 1000),
        (300 * MS, "b->a", "1:1", 0, 1000),
    ]
    lu = L.link_utilization(pd.DataFrame(rows, columns=[T.T_NS, T.LINK, T.CLASSID, T.TX_BYTES, T.RATE_BPS]))
    assert L.wan_utilization_mean(lu, 150 * MS, 300 * MS) == pytest.approx(0.6)
    assert L.wan_utilization_mean(lu, 400 * MS, 500 * MS) is None


def test_nan_to_none():
    assert A.nan_to_none(float("nan")) is None and A.nan_to_none(None) is None
    assert A.nan_to_none(1.5) == 1.5 and A.nan_to_none(np.float64(2.0)) == 2.0
    assert not math.isnan(A.nan_to_none(0.0))


def test_startup_from_the_run_start_to_the_first_forward():
    from testbed.results.analysis import startup_phases, startup_s

    ev = pd.DataFrame(
        [
            event_row(0, "a-h0", "a", 0, 0, T.FORWARD, 0, 0, 3500, 3540),
            event_row(1, "b-h0", "b", 1, 0, T.FORWARD, 0, 0, 3600, 3640),
        ]
    )
    assert startup_s(ev, 1_000_000_000) == pytest.approx(2.54)
    assert startup_s(ev, None) is None and startup_s(ev.iloc[0:0], 1) is None
    rows = [
        {"worker": None, "phase": "run_start", "t_ns": 1_000_000_000},
        {"worker": None, "phase": "network_built", "t_ns": 1_500_000_000},
        {"worker": 0, "phase": "forked", "t_ns": 3_000_000_000},
        {"worker": 1, "phase": "forked", "t_ns": 3_200_000_000},
    ]
    phases = startup_phases(rows, ev)
    assert phases == pytest.approx({"run_start": 0.0, "network_built": 0.5, "forked": 2.2, "first_forward": 2.54})
    assert startup_phases(rows[1:], ev) == {}  # no run start recorded: nothing to count from


def test_process_start_is_before_now_and_within_a_tick_of_this_process():
    import os
    import time

    from testbed.trace.clock import now_ns, process_start_ns

    here = process_start_ns()
    assert here <= now_ns()
    child = __import__("subprocess").Popen(["sleep", "1"])
    try:
        time.sleep(0.2)
        started = process_start_ns(child.pid)
        assert abs(now_ns() - 0.2e9 - started) < 0.1e9  # 10 ms ticks, and a loaded machine
    finally:
        child.kill()
        child.wait()
    assert os.getpid() > 0


def test_queue_drops_are_the_rise_of_each_class_counter_summed_per_link():
    cols = [T.T_NS, T.LINK, T.CLASSID, T.DROPS, T.BACKLOG_BYTES]
    rows = [
        (0, "a->b", "1:1", 0, 0),
        (0, "a->b", "1:10", 5, 0),  # dropped before the first sample: not this run's
        (0, "a->b", "1:11", 0, 0),
        (0, "b->a", "1:10", 0, 0),
        (1, "a->b", "1:1", 0, 0),
        (1, "a->b", "1:10", 12, 30_000),
        (1, "a->b", "1:11", 3, 1514),
        (1, "b->a", "1:10", 0, 0),
    ]
    counters = pd.DataFrame(rows, columns=cols)
    assert L.queue_drops(counters) == {"a->b": 10, "b->a": 0}
    assert L.queue_backlog_max_bytes(counters) == 30_000


def test_queue_drops_unknown_for_counters_that_never_sampled_them():
    old = pd.DataFrame([(0, "a->b", "1:1", 0, 1)], columns=[T.T_NS, T.LINK, T.CLASSID, T.TX_BYTES, T.RATE_BPS])
    assert L.queue_drops(old) is None and L.queue_backlog_max_bytes(old) is None
    assert L.queue_drops(pd.DataFrame(old, columns=T.LINK_COUNTER_COLUMNS)) is None  # read back: NaN columns


def test_grant_intervals_pair_grants_with_their_releases():
    from testbed.results.plots import grant_intervals

    log = [
        {"event": "grant", "t_ready_ns": 0, "t_applied_ns": 10, "link": "a->b", "replica": 0},
        {"event": "release", "t_ns": 30, "link": "a->b", "replica": 0, "reason": "bytes", "sent_bytes": 65000},
        {"event": "grant", "t_ready_ns": 31, "t_applied_ns": 32, "link": "a->b", "replica": 1},
        {"event": "grant", "t_ready_ns": 40, "t_applied_ns": 41, "link": "a->b", "replica": 0},  # took it over
        {"event": "release", "t_ns": 50, "link": "a->b", "replica": 0, "reason": "done"},
    ]
    g = grant_intervals(log)
    assert g[["replica", "start_ns", "end_ns"]].values.tolist() == [[0, 10, 30], [1, 32, 41], [0, 41, 50]]
    assert g["sent_bytes"].tolist()[0] == 65000


def test_a_wrapper_that_execs_the_command_names_its_start(monkeypatch):
    """scripts/go sets up, then execs ``testbed run`` in its own process: the run's start-up is
    counted from the exec, not from the script's start; a value outside the process's life is
    ignored."""
    import time as _time

    from testbed.trace.clock import COMMAND_START_ENV, command_start_ns, now_ns, process_start_ns

    monkeypatch.delenv(COMMAND_START_ENV, raising=False)
    assert command_start_ns() == pytest.approx(process_start_ns(), abs=1_000_000)
    monkeypatch.setenv(COMMAND_START_ENV, str(_time.time_ns() - 10_000_000))  # 10 ms ago
    assert now_ns() - command_start_ns() == pytest.approx(10_000_000, abs=5_000_000)
    monkeypatch.setenv(COMMAND_START_ENV, str(_time.time_ns() + 10**12))  # in the future: ignored
    assert command_start_ns() == pytest.approx(process_start_ns(), abs=1_000_000)
    monkeypatch.setenv(COMMAND_START_ENV, "yesterday")
    assert command_start_ns() == pytest.approx(process_start_ns(), abs=1_000_000)


# ---- start of an operation after its input arrived ----------------------------------------------


def test_start_after_arrival_of_the_measured_operations_that_received_an_input():
    """start less ready, forward and backward only, warm-up left out; held where a prefill pass
    had the GPU when the input came; the figures count those over 1 ms."""
    ev = frame(
        [
            op(1, T.FORWARD, 0, 0, 10.0, 20.0, ready_ns=5 * MS),  # warm-up: left out
            op(1, T.FORWARD, 1, 0, 100.2, 110.0, ready_ns=100 * MS),  # 0.2 ms
            op(1, T.BACKWARD, 1, 0, 203.0, 230.0, ready_ns=200 * MS, prefill_delay_ns=3 * MS),  # 3 ms, held
            op(2, T.FORWARD, 1, 0, 301.5, 310.0, ready_ns=300 * MS, prefill_delay_ns=0),  # 1.5 ms
            op(0, T.FORWARD, 1, 0, 100.0, 110.0),  # stage 0 receives nothing
            op(1, T.RECV_WAIT, 1, 0, 90.0, 100.0, ready_ns=100 * MS),  # not an operation
        ]
    )
    ev[T.READY_NS] = pd.to_numeric(ev[T.READY_NS])
    late = A.start_after_arrival(ev, warmup=1)
    assert sorted(late["late_ns"] / MS) == pytest.approx([0.2, 1.5, 3.0])
    assert list(late.sort_values("late_ns")["held"]) == [False, False, True]
    fig = A.late_start_figures(late)
    assert fig["training_ops_with_input"] == 3 and fig["training_ops_started_late"] == 2
    assert fig["start_after_arrival_p50_ms"] == pytest.approx(1.5)
    empty = A.late_start_figures(A.start_after_arrival(ev.drop(columns=[T.READY_NS]), warmup=1))
    assert empty["training_ops_with_input"] == 0 and empty["start_after_arrival_p99_ms"] is None
