"""Placement policies and the iteration-time cost model on hand-computed cases."""
from __future__ import annotations

import pytest

from testbed.errors import SpecError
from testbed.experiment import ComputeModel, Experiment
from testbed.model import ModelConfig
from testbed.placement import atlas_dc_order, place, place_dp_wan, place_pipeline
from testbed.planner import activation_bytes, alternatives, predict, stage_param_bytes, what_if
from testbed.topology import parse_topology


def topo(hosts: dict[str, int], rate="100mbit", delay="10ms"):
    names = list(hosts)
    links = [{"between": [a, b], "rate": rate, "delay": delay} for a, b in zip(names, names[1:])]
    return parse_topology({"dcs": [{"name": n, "hosts": h} for n, h in hosts.items()], "links": links}, "t.yaml")


def exp(**kw):
    base = dict(name="e", topology="t", stages=2, replicas=2, microbatches=4, microbatch_size=4,
                iterations=3, warmup_iterations=1, model=ModelConfig(n_layers=4, d_model=64, n_heads=4, seq_len=128),
                compute=ComputeModel(forward_ms=40, backward_ms=80))
    base.update(kw)
    return Experiment(**base)


def test_dp_wan_puts_each_replica_pipeline_in_its_own_dc():
    w = place_dp_wan(exp(), topo({"a": 2, "b": 2}))
    assert [(x.rank, x.stage, x.replica, x.host) for x in w] == [
        (0, 0, 0, "a-h0"), (1, 0, 1, "b-h0"), (2, 1, 0, "a-h1"), (3, 1, 1, "b-h1")]
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
    f, b = 0.040, 0.080                                 # 2 blocks per stage, the experiment's own targets
    assert p.fill_s == pytest.approx(2 * (f + b))       # S stages, no WAN
    assert p.steady_s == pytest.approx(3 * (f + b))     # (M - 1) x slowest step
    assert p.allreduce_s == 0
    assert p.iteration_s == pytest.approx(2 * (f + b) + 3 * (f + b) + f)  # + optimizer (one forward target)


def test_prediction_adds_transfers_across_a_wan_boundary():
    e = exp()
    t = topo({"a": 2, "b": 2}, rate="100mbit", delay="10ms")
    p = predict(e, t, place(e, t))
    w = 2 * activation_bytes(e) * 8 / 100e6             # two pipelines share the link
    assert p.fill_s == pytest.approx(2 * 0.120 + 2 * (w + 2 * 0.010))
    assert p.steady_s == pytest.approx(3 * max(0.120, 2 * w))


def test_prediction_of_dp_wan_pays_the_all_reduce_over_the_wan():
    e = exp()
    t = topo({"a": 2, "b": 2}, rate="100mbit", delay="10ms")
    p = predict(e, t, place(e, t, "dp-wan"))
    bits = sum(stage_param_bytes(e.model, 2, s) for s in range(2)) * 8   # both stages share the one link
    assert p.allreduce_s == pytest.approx(2 * 1 / 2 * bits / 100e6 + 2 * 0.010)
    assert p.fill_s == pytest.approx(2 * 0.120)          # the pipeline itself stays inside a DC


def test_stage_param_bytes_add_up_to_the_model():
    cfg = ModelConfig(n_layers=5, d_model=32, n_heads=4, seq_len=16)
    assert sum(stage_param_bytes(cfg, 3, s) for s in range(3)) == 4 * cfg.params()


def test_alternatives_keep_the_global_batch_and_mark_infeasible_plans():
    e = exp()
    plans = alternatives(e, topo({"a": 2, "b": 2}))
    assert all(p.replicas * p.microbatches == e.replicas * e.microbatches for p in plans)
    feasible = [p for p in plans if p.prediction]
    assert [p.prediction.iteration_s for p in feasible] == sorted(p.prediction.iteration_s for p in feasible)
    assert any(p.prediction is None and "do not fit" in p.why_not for p in plans)   # 8 replicas on 4 hosts
    best, more = what_if(plans)
    assert best is feasible[0]
    assert more is None or more.prediction.dcs_used == best.prediction.dcs_used + 1


def test_connections_from_the_bandwidth_delay_product():
    from testbed.planner import buffer_for_share, connections_for

    # 100 Mbit/s x 80 ms = 1 MB in flight; a 250 kB window carries a quarter: 4 connections
    assert connections_for(100e6, 0.080, 250_000) == 4
    assert connections_for(100e6, 0.080, 10**9) == 1            # one big window suffices
    assert connections_for(100e6, 0.080, 1_000) == 16           # capped
    assert connections_for(100e6, 0.080, 300_000) == 4          # ceil(1e6 / 3e5) = 4
    buf = buffer_for_share(100e6, 0.080, 0.25)
    assert buf == 2 * 0.25 * 1_000_000                           # twice the window (receive overhead)
    assert connections_for(100e6, 0.080, buf / 2) == 4
