"""Placement policies and the iteration-time cost model on hand-computed cases."""

from __future__ import annotations

import math

import pytest
from experiments import exp, topo

from testbed.errors import SpecError
from testbed.plan.allreduce import INTRA_DC_ROUND_S, INTRA_DC_S_PER_BYTE, loss_allreduce_s, stage_allreduce_s
from testbed.plan.boundary_transfers import Hop, LinkTiming, Transfer
from testbed.plan.connections import (
    connection_window_bytes,
    one_connection_bps,
    transfer_time_s,
    wan_connections,
    window_rate_bps,
)
from testbed.plan.cost_model import optimizer_s, predict
from testbed.plan.grant_plan import simulated_iteration, wan_links
from testbed.plan.grant_sim import simulate
from testbed.plan.placement import atlas_dc_order, place, place_dp_wan, place_pipeline
from testbed.plan.what_if import alternatives, what_if
from testbed.spec.compute import ComputeModel
from testbed.spec.model import ModelConfig, stage_param_bytes
from testbed.spec.policy import parse_policy
from testbed.spec.topology_file import parse_topology
from testbed.spec.wire import TCP_GOODPUT_FRACTION

# the timelines worked out by hand leave the worker's hand-off out (tests/unit/test_handoff.py has it)
pytestmark = pytest.mark.usefixtures("without_handoff")


def test_dp_wan_puts_each_replica_pipeline_in_its_own_dc():
    w = place_dp_wan(exp(), topo({"a": 2, "b": 2}))
    assert [(x.rank, x.stage, x.replica, x.host) for x in w] == [
        (0, 0, 0, "a-h0"),
        (1, 0, 1, "b-h0"),
        (2, 1, 0, "a-h1"),
        (3, 1, 1, "b-h1"),
    ]
    with pytest.raises(SpecError, match="under dp-wan"):
        place_dp_wan(exp(stages=3), topo({"a": 2, "b": 2}))


def test_atlas_order_takes_largest_dcs_first_and_keeps_file_order_on_ties():
    t = topo({"small": 2, "big": 4, "mid": 4})
    assert [dc.name for dc in atlas_dc_order(t)] == ["big", "mid", "small"]
    w = place_pipeline(exp(), t, atlas_dc_order(t))
    assert {x.dc for x in w} == {"big"}  # 4 hosts hold both stages of 2 replicas: one DC, no WAN hop
    assert [x.dc for x in place(exp(), t)] == ["small", "small", "big", "big"]  # pp-fair: file order


def test_prediction_single_dc_is_the_pipeline_formula():
    e = exp()
    p = predict(e, topo({"a": 4}), place(e, topo({"a": 4})))
    f, b = 0.040, 0.080  # 2 blocks per stage, the experiment's own targets
    assert p.fill_s == pytest.approx(2 * (f + b))  # S stages, no WAN
    assert p.steady_s == pytest.approx(3 * (f + b))  # (M - 1) x slowest step
    # each stage's ring of 2 inside the unshaped DC at this machine's pace: half its gradients sent,
    # by the 4 processes of the two rings side by side, no socket-buffer cap (no WAN)
    sent = max(stage_param_bytes(e.model, 2, s) for s in range(2))
    assert p.allreduce_s == pytest.approx(sent * INTRA_DC_S_PER_BYTE * 4)
    # each stage's own ring, the prediction taking the slowest
    each = stage_allreduce_s(e, topo({"a": 4}), place(e, topo({"a": 4})))
    assert each == pytest.approx({s: stage_param_bytes(e.model, 2, s) * INTRA_DC_S_PER_BYTE * 4 for s in range(2)})
    assert p.iteration_s == pytest.approx(2 * (f + b) + 3 * (f + b) + p.allreduce_s + f)  # + optimizer
    # a given optimizer target is what the workers pad the step to, and what the prediction adds
    e = exp(compute=ComputeModel(forward_ms=40, backward_ms=80, optimizer_ms=15))
    p = predict(e, topo({"a": 4}), place(e, topo({"a": 4})))
    assert p.iteration_s == pytest.approx(2 * (f + b) + 3 * (f + b) + p.allreduce_s + 0.015)
    # under a profiled compute speed (half the targets) the step scales with the forward
    assert optimizer_s(e, (f / 4, b / 4)) == pytest.approx(0.015 / 2)


def test_each_stages_ring_across_the_wan_by_hand():
    """dp-wan, 2 stages x 2 replicas in DCs a and b (100 Mbit/s, 10 ms one way), cubic, no window
    modelled: each stage's ring of 2 sends all its gradients each way, 2 steps of the one-way
    delay, and both rings cross the same link, which carries their bits together."""
    t = parse_topology(
        {
            "dcs": [{"name": "a", "hosts": 2}, {"name": "b", "hosts": 2}],
            "links": [{"between": ["a", "b"], "rate": "100mbit", "delay": "10ms"}],
            "tcp_congestion": "cubic",
        },
        "t.yaml",
    )
    e = exp(topology_spec=t, policy=parse_policy("dp-wan"))
    each = stage_allreduce_s(e, t, place(e, t))
    both_bits = sum(stage_param_bytes(e.model, 2, s) * 8 for s in range(2))
    by_hand = 2 * 0.010 + both_bits / (100e6 * TCP_GOODPUT_FRACTION)
    assert each == pytest.approx({0: by_hand, 1: by_hand})


def test_prediction_adds_transfers_across_a_wan_boundary():
    """GPipe, 2 stages in DCs a and b, 2 replicas, 4 microbatches, 40/80 ms per stage, 10 ms one
    way; w: one transfer alone. By hand: both replicas' transfers go at once, so each takes 2w.
    Stage 1 posts each receive when it reaches its forward; the bytes go once the sender is done
    and the notice (10 ms) has crossed: F0 arrives at 40 + 2w + 10, and each later one 10 + 2w + 10
    after the previous forward ends, so stage 1's forwards end at 270 + 8w; the gradients go back
    the same way (stage 0 posts each receive after the backward before): B0 ends at 740 + 16w."""
    e = exp(schedule="gpipe")
    t = topo({"a": 2, "b": 2}, rate="100mbit", delay="10ms")
    p = predict(e, t, place(e, t))
    w = e.activation_bytes * 8 / (100e6 * TCP_GOODPUT_FRACTION)
    assert p.fill_s == pytest.approx(0.740 + 16 * w)
    # each stage's ring inside its DC (no socket-buffer cap: the experiment states no WAN share)
    sent = max(stage_param_bytes(e.model, 2, s) for s in range(2))
    assert connection_window_bytes(e, t, place(e, t)) is None
    assert p.allreduce_s == pytest.approx(sent * INTRA_DC_S_PER_BYTE * 4)
    # under a cap, a window a round where that is slower than the bytes' own cost
    capped = e.with_overrides(wan_connection_share=0.01)
    window = connection_window_bytes(capped, t, place(capped, t))
    assert window is not None and INTRA_DC_ROUND_S / window > INTRA_DC_S_PER_BYTE
    capped_p = predict(capped, t, place(capped, t))
    assert capped_p.allreduce_s == pytest.approx(sent * INTRA_DC_ROUND_S / window * 4)
    assert p.steady_s == 0 and p.iteration_s == pytest.approx(p.fill_s + p.allreduce_s + 0.040)  # + optimizer


def test_a_long_iteration_is_extrapolated_from_two_short_ones(monkeypatch):
    """200 microbatches extrapolated from 64 and 128 give what simulating all 200 gives."""
    from testbed.plan import cost_model

    e = exp(schedule="gpipe", microbatches=200)
    t = topo({"a": 2, "b": 2}, rate="100mbit", delay="10ms")
    extrapolated = predict(e, t, place(e, t)).fill_s
    monkeypatch.setattr(cost_model, "SIM_MICROBATCHES", 1000)
    simulated = predict(e, t, place(e, t)).fill_s
    assert extrapolated == pytest.approx(simulated, rel=1e-9)
    assert simulated > predict(exp(schedule="gpipe", microbatches=128), t, place(e, t)).fill_s


def test_prediction_of_dp_wan_pays_the_all_reduce_over_the_wan():
    e = exp()
    t = topo({"a": 2, "b": 2}, rate="100mbit", delay="10ms")
    p = predict(e, t, place(e, t, parse_policy("dp-wan")))
    bits = sum(stage_param_bytes(e.model, 2, s) for s in range(2)) * 8  # both stages share the one link
    assert p.allreduce_s == pytest.approx(2 * 1 / 2 * bits / (100e6 * TCP_GOODPUT_FRACTION) + 2 * 0.010)
    # the pipeline itself stays inside a DC: 1F1B's fill and drain and 3 steps of 120 ms; the
    # loss's average (20 and 30 ms: below) ends before stage 1's first input comes (40 ms)
    assert p.fill_s + p.steady_s == pytest.approx(2 * 0.120 + 3 * 0.120)


def test_the_loss_averaged_across_the_wan_holds_its_worker_back():
    """dp-wan on two DCs 50 ms apart, stage 1 computing the loss: replica 1 sends it to replica 0
    once replica 0's ready notice has come (50 ms), it arrives at 100 ms; replica 0 sends the mean
    back once replica 1's notice (sent as replica 1 had sent, at 50 ms) has come, at 100 ms: it
    arrives at 150 ms. Stage 1 of replica 1 then starts at 150 ms, not at its first input's arrival
    (40 ms): the whole 1F1B pipeline, 600 ms on its own, ends 110 ms later."""
    e = exp()
    t = topo({"a": 2, "b": 2}, rate="100mbit", delay="50ms")
    workers = place(e, t, parse_policy("dp-wan"))
    assert loss_allreduce_s(e, t, workers) == pytest.approx((0.100, 0.150))
    p = predict(e, t, workers)
    assert p.fill_s + p.steady_s == pytest.approx(0.600 + 0.110)
    # a pipeline policy averages it inside one DC, over unshaped access links: no wait
    assert loss_allreduce_s(e, t, place(e, t)) == (0.0, 0.0)
    assert loss_allreduce_s(exp(replicas=1), t, place(exp(replicas=1), t)) == ()


def test_stage_param_bytes_add_up_to_the_model():
    cfg = ModelConfig(n_layers=5, d_model=32, n_heads=4, seq_len=16)
    assert sum(stage_param_bytes(cfg, 3, s) for s in range(3)) == 4 * cfg.params()


def test_alternatives_keep_the_global_batch_and_mark_infeasible_plans():
    e = exp()
    plans = alternatives(e, topo({"a": 2, "b": 2}))
    assert all(p.replicas * p.microbatches == e.replicas * e.microbatches for p in plans)
    feasible = [p for p in plans if p.prediction]
    assert [p.prediction.iteration_s for p in feasible] == sorted(p.prediction.iteration_s for p in feasible)
    assert any(p.prediction is None and "do not fit" in p.why_not for p in plans)  # 8 replicas on 4 hosts
    best, more = what_if(plans)
    assert best is feasible[0] and best.prediction.dcs_used == 2
    assert more is None  # no plan of the global batch spans a third DC here


def test_what_if_weighs_the_best_plan_with_one_more_dc():
    """Two DCs of 4 hosts over a slow link: the best plan keeps to one DC; the best plan that uses
    both (a stage boundary crosses the 10 Mbit/s link) is slower."""
    plans = alternatives(exp(), topo({"a": 4, "b": 4}, rate="10mbit", delay="50ms"))
    best, more = what_if(plans)
    assert (best.stages, best.replicas, best.prediction.dcs_used) == (1, 4, 1)
    assert more.prediction.dcs_used == 2 and more.stages >= 2
    assert more.prediction.iteration_s > best.prediction.iteration_s
    one_more = [p for p in plans if p.prediction and p.prediction.dcs_used == 2]
    assert more is min(one_more, key=lambda p: p.prediction.iteration_s)
    assert what_if([p for p in plans if p.prediction is None]) == (None, None)


def test_connections_from_the_bandwidth_delay_product():
    from testbed.plan.connections import (
        WINDOW_SHORTFALL_BYTES,
        buffer_for_share,
        connections_for,
        window_for_share,
        window_per_buffer_byte,
    )

    # 100 Mbit/s x 80 ms = 1 MB in flight; a 250 kB window carries a quarter: 4 connections
    assert connections_for(100e6, 0.080, 250_000) == 4
    assert connections_for(100e6, 0.080, 10**9) == 1  # one big window suffices
    assert connections_for(100e6, 0.080, 1_000) == 16  # capped
    assert connections_for(100e6, 0.080, 300_000) == 4  # ceil(1e6 / 3e5) = 4
    window = window_for_share(100e6, 0.080, 0.25)
    assert window == 0.25 * 1_000_000
    # the cap this kernel needs to keep that window in flight (the shortfall added), rounded up
    assert buffer_for_share(100e6, 0.080, 0.25) == math.ceil(
        (window + WINDOW_SHORTFALL_BYTES) / window_per_buffer_byte()
    )
    assert connections_for(100e6, 0.080, window) == 4


def test_the_window_per_buffer_byte_follows_the_kernel_release():
    from testbed.plan.connections import (
        WINDOW_PER_BUFFER_BYTE_HALF,
        WINDOW_PER_BUFFER_BYTE_SCALED,
        window_per_buffer_byte,
    )

    assert window_per_buffer_byte("6.1.0-28-amd64") == WINDOW_PER_BUFFER_BYTE_HALF == 0.5  # Debian 12
    assert window_per_buffer_byte("5.15.0-1051-azure") == 0.5
    assert window_per_buffer_byte("6.6.0") == WINDOW_PER_BUFFER_BYTE_SCALED
    assert window_per_buffer_byte("6.12.48+deb13-amd64") == WINDOW_PER_BUFFER_BYTE_SCALED  # Debian 13
    assert window_per_buffer_byte("6.18.44-fc-v1300") == WINDOW_PER_BUFFER_BYTE_SCALED
    assert window_per_buffer_byte("10.0") == WINDOW_PER_BUFFER_BYTE_SCALED
    assert window_per_buffer_byte("unknown") == 0.5


def test_dc_selection_weighs_orders_of_dc_sets_and_their_links():
    """Two large DCs joined by a fast link and a small DC on slow links, listed first: file order
    crosses the slow link; Atlas's DC selection keeps the pipeline on the fast one."""
    from testbed.plan.placement import select_dcs
    from testbed.spec.topology_file import parse_topology

    t = parse_topology(
        {
            "dcs": [{"name": "small", "hosts": 2}, {"name": "x", "hosts": 4}, {"name": "y", "hosts": 4}],
            "links": [
                {"between": ["small", "x"], "rate": "10mbit", "delay": "50ms"},
                {"between": ["small", "y"], "rate": "10mbit", "delay": "50ms"},
                {"between": ["x", "y"], "rate": "100mbit", "delay": "5ms"},
            ],
        },
        "t",
    )
    e = exp(topology_spec=t, stages=2, replicas=2)
    dcs, predicted = select_dcs(e, t, parse_policy("atlas"))
    assert {d.name for d in dcs} <= {"x", "y"} and predicted > 0
    workers = place(e, t, parse_policy("atlas"))
    assert "small" not in {w.dc for w in workers}
    assert "small" in {w.dc for w in place(e, t, parse_policy("pp-fair"))}  # file order starts there


def test_a_transfer_alone_is_link_or_window_limited():
    # windows covering the bandwidth-delay product (100 Mbit/s x 40 ms = 500 kB): the link decides
    assert transfer_time_s(65536, 100e6, window_rate_bps(600_000, 0.040), 1) == pytest.approx(65536 * 8 / 100e6)
    assert transfer_time_s(65536, 100e6, window_rate_bps(None, 0.040), 1) == pytest.approx(65536 * 8 / 100e6)
    assert window_rate_bps(1000, 0.0) is None  # a path without delay is not window-limited
    # a window of 100 kB per 40 ms: 20 Mbit/s per connection, two of them 40 Mbit/s
    assert transfer_time_s(1_000_000, 100e6, window_rate_bps(100_000, 0.040), 2) == pytest.approx(1_000_000 * 8 / 40e6)


def test_fair_sharing_slows_overlapping_transfers_only_while_they_overlap():
    """Two pipelines whose transfers overlap for part of their time: processor sharing, by hand."""
    e, workers = (lambda x: (x, place(x)))(exp(schedule="gpipe", microbatches=1, stages=2, replicas=2))
    hop = Hop("a", "b")
    back = Hop("b", "a")
    by = {(w.stage, w.replica): w.rank for w in workers}
    paths = {(by[(0, r)], by[(1, r)]): [hop] for r in (0, 1)} | {(by[(1, r)], by[(0, r)]): [back] for r in (0, 1)}
    one_way = dict.fromkeys(paths, 0.010)
    links = {hop: LinkTiming(0.020, 0.010), back: LinkTiming(0.020, 0.010)}
    # replica 1 starts 10 ms later: its activations are ready at 50 ms, replica 0's at 40 ms. Alone
    # 10 ms, then both at half speed: replica 0's last 10 ms of work take 20 ms (done at 70), then
    # replica 1 alone finishes its remaining 10 ms at 80. Arrivals 80 and 90; stage 1's forward and
    # backward (120 ms) end at 200 and 210; the gradients: 200-210 alone, 210-230 shared (0 done at
    # 230), 230-240 (1 done at 240); arrivals 240 and 250; stage 0's backward ends at 330.
    end, order = simulate(e, workers, links, paths, one_way, (0.0, 0.010), sharing="tcp")
    assert end == pytest.approx(0.330)
    assert order[hop] == [Transfer("F", 0, 0, 0), Transfer("F", 0, 0, 1)]


def test_fair_sharing_over_two_links_goes_at_the_slowest_links_pace():
    """Stage 0 in a, stage 1 in c, routed a -> b -> c (5 ms each): one flow per transfer on both
    links at once. a->b takes 20 ms alone, b->c 10 ms, each carries one transfer at full speed: two
    at once get half of each, 25 and 50 transfers/s, so a->b decides: 40 ms each, by hand. The
    activations go at 40 ms and arrive at 90; stage 1's 120 ms end at 210; the gradients likewise
    arrive at 260; stage 0's backward ends at 340."""
    e = exp(schedule="gpipe", microbatches=1, stages=2, replicas=2)
    workers = place(e)
    by = {(w.stage, w.replica): w.rank for w in workers}
    ab, bc, cb, ba = Hop("a", "b"), Hop("b", "c"), Hop("c", "b"), Hop("b", "a")
    paths = {(by[(0, r)], by[(1, r)]): [ab, bc] for r in (0, 1)} | {(by[(1, r)], by[(0, r)]): [cb, ba] for r in (0, 1)}
    one_way = dict.fromkeys(paths, 0.010)
    links = {ab: LinkTiming(0.020, 0.005), bc: LinkTiming(0.010, 0.005), cb: LinkTiming(0.010, 0.005)}
    links[ba] = LinkTiming(0.020, 0.005)
    end, order = simulate(e, workers, links, paths, one_way, (0.0, 0.0), sharing="tcp")
    assert end == pytest.approx(0.340)
    assert order[bc] == order[ab] == [Transfer("F", 0, 0, 0), Transfer("F", 0, 0, 1)]
    with pytest.raises(ValueError, match="unknown sharing"):
        simulate(e, workers, links, paths, one_way, (0.0, 0.0), sharing="fair")


def test_a_transfer_takes_its_own_paths_time_on_a_link_a_longer_path_also_crosses():
    """A triangle whose b-c link is slower in delay than the way through a (45 against 60 ms): stage
    1 (in b) sends its gradients straight to a (40 ms RTT) and its activations to c through a (90
    ms RTT), both over the link b->a. Under a window too small for either path, each transfer
    goes at its own path's window per RTT: the gradients in their own time, not the activations'
    (random-7-075's pp-fair was predicted 32.9% slow for it: the slowest path's time applied to
    every transfer over a link)."""
    t = parse_topology(
        {
            "dcs": [{"name": n, "hosts": 1} for n in "abc"],
            "links": [
                {"between": ["a", "b"], "rate": "100mbit", "delay": "20ms"},
                {"between": ["a", "c"], "rate": "10mbit", "delay": "25ms"},
                {"between": ["b", "c"], "rate": "100mbit", "delay": "60ms"},
            ],
        },
        "t.yaml",
    )
    e = exp(topology_spec=t, stages=3, replicas=1, microbatches=1, schedule="gpipe", wan_connection_share=0.2)
    workers = place(e)
    rank = {w.stage: w.rank for w in workers}
    n = wan_connections(e, t, workers)
    wan = wan_links(e, t, workers, n, float)
    ba, straight, through = Hop("b", "a"), (rank[1], rank[0]), (rank[1], rank[2])
    assert wan.paths[straight] == [ba] and wan.paths[through] == [ba, Hop("a", "c")]
    nbytes = e.activation_bytes
    own = transfer_time_s(
        nbytes, 100e6 * TCP_GOODPUT_FRACTION, one_connection_bps(e, t, workers, "b", "a", nbytes / n), n
    )
    assert wan.path_links[straight][0].transfer_s == pytest.approx(own)
    # the link's own timing (a grant's deadline) is the slowest path's: twice the RTT, twice the time
    assert wan.links[ba].transfer_s == wan.path_links[through][0].transfer_s == pytest.approx(own * 90 / 40)
    timeline: list = []
    simulated_iteration(e, t, workers, n, timeline=timeline)
    (b1_end,) = [end for s, _, a, _, end in timeline if s == 1 and a.kind == "B"]
    (b0_start,) = [start for s, _, a, start, _ in timeline if s == 0 and a.kind == "B"]
    # stage 0 posted its receive long before: the gradients leave when ready, alone on their path
    assert b0_start - b1_end == pytest.approx(own + wan.one_way_s[straight])


def test_dp_wan_with_more_replicas_than_dcs_puts_consecutive_replicas_together():
    # 3 replicas of 2 stages on two DCs of 4 hosts: replicas 0 and 1 in a, replica 2 in b
    w = place_dp_wan(exp(replicas=3), topo({"a": 4, "b": 4}))
    assert [(x.stage, x.replica, x.host) for x in w] == [
        (0, 0, "a-h0"),
        (0, 1, "a-h2"),
        (0, 2, "b-h0"),
        (1, 0, "a-h1"),
        (1, 1, "a-h3"),
        (1, 2, "b-h1"),
    ]
    # a small first DC: the rest goes where there is room
    assert [x.dc for x in place_dp_wan(exp(replicas=3), topo({"a": 2, "b": 6})) if x.stage == 0] == ["a", "b", "b"]
    with pytest.raises(SpecError, match="hold only 2 whole pipelines"):
        place_dp_wan(exp(replicas=3), topo({"a": 2, "b": 3}))


@pytest.mark.parametrize(
    "sharing, borrow, end_s", [("planned", True, 0.480), ("tcp", True, 0.480), ("fifo", False, 0.510)]
)
def test_a_ready_notice_waits_behind_the_receivers_own_bytes_to_the_sender(sharing, borrow, end_s):
    """1F1B, 2 stages of 40/80 ms in DCs a and b, one pipeline of 2 microbatches; a transfer takes
    20 ms on its link, 10 ms one way. By hand: F0 goes 40-60, arrives 70; stage 1 runs F0 and B0
    (70-190); B0's gradient leaves 190-210 on b->a. Stage 1 posts F1's receive at 190, but its
    notice shares the connection with that gradient: it leaves at 210, arrives 220 (not 200), so F1
    goes 220-240 and arrives 250; stage 1's F1 and B1 take 250-370, B1 goes 370-390 and arrives
    400 (stage 0's notice for it left at 300, when its own F1 bytes were long gone); stage 0's B1
    ends at 480. A notice that skipped the queue would give 460.

    FIFO without borrowing holds a link from both sides ready, the notice's crossing included: F0
    holds a->b 40-70 and arrives 80; stage 1 runs 80-200; B0 holds b->a 200-230 (its bytes leave
    210-230, the notice having come at 90) and arrives 240; F1's notice leaves at 230, F1 holds
    a->b 230-260 and arrives 270; stage 1's F1 and B1 take 270-390; B1 holds b->a 390-420 and
    arrives 430; stage 0's B1 ends at 510 (480 with a notice that skipped the queue)."""
    e = exp(
        schedule="1f1b",
        microbatches=2,
        stages=2,
        replicas=1,
        topology_spec=topo({"a": 1, "b": 1}),
        atlas_borrow=borrow,
    )
    workers = place(e)
    by = {(w.stage, w.replica): w.rank for w in workers}
    ab, ba = Hop("a", "b"), Hop("b", "a")
    paths = {(by[(0, 0)], by[(1, 0)]): [ab], (by[(1, 0)], by[(0, 0)]): [ba]}
    one_way = dict.fromkeys(paths, 0.010)
    links = {ab: LinkTiming(0.020, 0.010), ba: LinkTiming(0.020, 0.010)}
    end, _ = simulate(e, workers, links, paths, one_way, (0.0,), sharing=sharing)
    assert end == pytest.approx(end_s)


def test_over_two_hops_a_notice_behind_the_receivers_bytes_comes_with_them():
    """The same pipeline across a -> b -> c (each hop 5 ms one way, 10 ms the path): the gradient
    goes back over c->b in 1 ms and then b->a in 20 ms. Stage 1 posts F1's receive as B0's gradient
    leaves, so F1's notice comes behind the gradient's bytes, which wait at b->a: F1 leaves stage 0
    when the gradient arrives there (stage 0 starts B0 then), and takes its path's 20 + 5 + 5 ms
    to stage 1. A notice taken as leaving once the bytes passed c->b would have let F1 go 19 ms
    earlier (random-7-113, docs/results.md)."""
    e = exp(schedule="1f1b", microbatches=2, stages=2, replicas=1, topology_spec=topo({"a": 1, "b": 1}))
    workers = place(e)
    by = {(w.stage, w.replica): w.rank for w in workers}
    ab, bc, cb, ba = Hop("a", "b"), Hop("b", "c"), Hop("c", "b"), Hop("b", "a")
    paths = {(by[(0, 0)], by[(1, 0)]): [ab, bc], (by[(1, 0)], by[(0, 0)]): [cb, ba]}
    links = {ab: LinkTiming(0.020, 0.005), bc: LinkTiming(0.001, 0.005), cb: LinkTiming(0.001, 0.005)}
    links[ba] = LinkTiming(0.020, 0.005)
    timeline: list = []
    simulate(e, workers, links, paths, dict.fromkeys(paths, 0.010), (0.0,), sharing="planned", timeline=timeline)
    start = {(s, a.kind, a.microbatch): t for s, _, a, t, _ in timeline}
    assert start[(1, "F", 1)] - start[(0, "B", 0)] == pytest.approx(0.030)
