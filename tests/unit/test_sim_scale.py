"""The simulator at the paper's scale, by hand: the fluid link model (one flow, two flows sharing,
window-limited, max-min over two links), the ring all-reduce in replica order, a GPU's memory and the
scenarios' validation errors (field, value, fix)."""

from __future__ import annotations

import pytest
from experiments import exp, topo

from testbed.errors import SpecError
from testbed.plan.allreduce import allreduce_s, wan_allreduce_bits
from testbed.plan.fair_share import FairShare, max_min_rates
from testbed.plan.memory import STATE_BYTES_PER_PARAM, stage_device_bytes
from testbed.plan.placement import place
from testbed.sim.scenario import check_memory, simulate_scenario, stage_memory_gb
from testbed.spec.model import stage_param_bytes, stage_params
from testbed.spec.model_presets import MODELS
from testbed.spec.scenario_file import load_scenario, names_scenario, parse_scenario, shipped_scenarios
from testbed.spec.wire import TCP_GOODPUT_FRACTION


def test_one_flow_alone_goes_at_its_cap_or_the_link():
    assert max_min_rates({"l": 10.0}, [(("l",), 4.0, 1)]) == [4.0]  # window-limited
    assert max_min_rates({"l": 10.0}, [(("l",), 40.0, 1)]) == [10.0]  # the link


def test_flows_share_a_link_equally_unless_their_cap_is_lower():
    assert max_min_rates({"l": 10.0}, [(("l",), 40.0, 2)]) == [5.0]
    # a window-limited class takes its cap; the others share what it leaves
    assert max_min_rates({"l": 10.0}, [(("l",), 2.0, 2), (("l",), 40.0, 2)]) == [2.0, 3.0]


def test_max_min_over_two_links():
    """A crosses link 1, B crosses 1 and 2, C crosses 2; link 1 carries 1, link 2 carries 2:
    link 1 fills first at 0.5 each (A, B), C takes the 1.5 that B leaves on link 2."""
    rates = max_min_rates({1: 1.0, 2: 2.0}, [((1,), 9.0, 1), ((1, 2), 9.0, 1), ((2,), 9.0, 1)])
    assert rates == pytest.approx([0.5, 0.5, 1.5])


def test_a_flow_that_joins_slows_the_first_and_ends_later():
    """Link of 1 transfer/s: flow x alone does 0.5 by t = 0.5; then both at 0.5: x ends at 1.5,
    y has done 0.5 by then and ends alone at 2.0."""
    fs = FairShare({"l": 1.0})
    fs.add(0.0, "x", ("l",), 5.0)
    assert fs.next_done() == (pytest.approx(1.0), "x")
    fs.add(0.5, "y", ("l",), 5.0)
    assert fs.next_done() == (pytest.approx(1.5), "x")
    fs.remove(1.5, "x")
    assert fs.next_done() == (pytest.approx(2.0), "y") and len(fs) == 1
    with pytest.raises(KeyError):
        fs.remove(2.0, "x")


def test_ring_all_reduce_inside_one_dc_and_across_two():
    """2 stages x 4 replicas, each stage's ring in replica order. pp-fair: the 4 replicas in one DC
    whose 1 Gbit/s access links carry 2 (R - 1) / R = 1.5 x the stage's bits per member, over
    2 (R - 1) = 6 steps of two 1 ms access links. dp-wan on two DCs of 4 hosts: replicas 0 and 1
    in a, 2 and 3 in b, so each ring crosses the WAN once each way; both stages' rings put
    1.5 x their bits on each direction, 6 steps of the 10 ms link."""
    t = topo({"a": 8, "b": 8})
    t = type(t)(t.name, tuple(type(d)(d.name, d.hosts, 10**9, 1000) for d in t.dcs), t.links, source=t.source)
    e = exp(topology_spec=t, replicas=4)
    bits = max(stage_param_bytes(e.model, 2, s) * 8 for s in range(2))
    expected = 1.5 * bits / (10**9 * TCP_GOODPUT_FRACTION) + 6 * 0.002
    assert allreduce_s(e, t, place(e)) == pytest.approx(expected)
    dp = e.with_overrides(policy="dp-wan", topology_spec=topo({"a": 4, "b": 4}))
    workers = place(dp)
    assert sorted({(w.replica, w.dc) for w in workers}) == [(0, "a"), (1, "a"), (2, "b"), (3, "b")]
    total = sum(stage_param_bytes(e.model, 2, s) * 8 for s in range(2))
    assert wan_allreduce_bits(dp, dp.topology_spec, workers) == {
        ("a", "b"): pytest.approx(1.5 * total),
        ("b", "a"): pytest.approx(1.5 * total),
    }
    expected = 1.5 * total / (100e6 * TCP_GOODPUT_FRACTION) + 6 * 0.010
    assert allreduce_s(dp, dp.topology_spec, workers) == pytest.approx(expected)


def test_a_gpus_memory_by_hand():
    cfg = MODELS["gpt3-175b"][0]
    # stage 0 of 16 under 1F1B with recomputation: 6 blocks and the embeddings at 16 bytes a
    # parameter over 8 GPUs, 16 microbatches in flight of 6 inputs 2 s b h and a boundary s b h x 2 / 8
    s, h = 2048, 12288
    per_mb = 6 * 2 * s * h + 2 * s * h / 8
    expected = STATE_BYTES_PER_PARAM * stage_params(cfg, 16, 0) / 8 + 16 * per_mb
    assert stage_device_bytes(cfg, 16, 0, 1, 16, tensor_parallel=8, recompute=True) == pytest.approx(expected, abs=1)
    sc = load_scenario("gpt3_175b_2dc")
    assert stage_memory_gb(sc)[0] == pytest.approx(expected / 1e9)
    assert check_memory(sc) == max(stage_memory_gb(sc)) < 80


def test_a_scenario_that_does_not_fit_is_infeasible_with_the_figure():
    sc = load_scenario("gpt3_175b_2dc")
    from dataclasses import replace

    without = replace(sc, recompute=False, microbatch_size=2)
    with pytest.raises(SpecError, match=r"gpu_memory.*stage 0 needs on one GPU \(\d+\.\d GB") as e:
        simulate_scenario(without, "pp-fair")
    assert "recompute: true" in e.value.fix


def test_every_shipped_scenario_loads_and_is_recognised():
    names = shipped_scenarios()
    assert {"gpt3_175b_2dc", "gpt_70b_3dc", "gpt3_175b_4dc", "gpt_7b_5dc"} <= set(names)
    for name in names:
        sc = load_scenario(name)
        assert names_scenario(name) and sc.replicas * sc.stages * sc.tensor_parallel == sc.gpus
        assert sc.microbatches * sc.replicas * sc.microbatch_size == sc.global_batch
    assert not names_scenario("default")  # an experiment


def _scenario(**kw):
    base = {
        "model": "gpt-7b",
        "device": "h100",
        "tensor_parallel": 4,
        "stages": 2,
        "global_batch": 64,
        "dcs": [{"name": "a", "gpus": 16}, {"name": "b", "gpus": 16}],
        "links": [{"between": ["a", "b"], "rate": "100gbit", "delay": "10ms"}],
    }
    base.update(kw)
    return base


@pytest.mark.parametrize(
    ("change", "field", "fix"),
    [
        ({"model": "gpt-4"}, "model", "gpt3-175b"),
        ({"device": "tpu"}, "device", "a100"),
        ({"tensor_parallel": 3}, "tensor_parallel", "divisor of n_heads"),
        ({"stages": 3}, "stages", "divides them"),
        ({"global_batch": 62}, "global_batch", "multiple of 4"),
        ({"dcs": [{"name": "a", "gpus": 18}, {"name": "b", "gpus": 16}]}, "dcs[0].gpus", "multiple of 4"),
        ({"tcp_window": "64"}, "tcp_window", "64MiB"),
        ({"links": [{"between": ["a", "c"], "rate": "1gbit", "delay": "1ms"}]}, "links[0].between", "known DCs"),
        ({"shedule": "1f1b"}, "shedule", "schedule"),
    ],
)
def test_scenario_errors_name_field_value_and_fix(change, field, fix):
    with pytest.raises(SpecError) as e:
        parse_scenario(_scenario(**change), "s.yaml")
    assert e.value.field == field and fix in e.value.fix


def test_a_scenario_is_simulated_under_each_policy():
    sc = parse_scenario(_scenario(), "s.yaml")
    assert (sc.replicas, sc.microbatches) == (4, 16)
    pp, atlas = simulate_scenario(sc, "pp-fair"), simulate_scenario(sc, "atlas")
    assert 0 < pp.gpu_utilization <= 1 and atlas.iteration_time_s <= pp.iteration_time_s * 1.001
    assert pp.device_memory_gb == pytest.approx(max(stage_memory_gb(sc)))


def test_the_timeline_is_a_runs_events(tmp_path):
    """Every forward and backward of one simulated iteration, then each worker's optimizer step,
    written as a run folder's trace.json and timeline.png."""
    from testbed.cli.sim import write_timeline
    from testbed.sim.timeline import simulated_events
    from testbed.trace import schema as T

    e = exp()
    rows = simulated_events(e, place(e))
    kinds = [r[T.KIND] for r in rows]
    assert kinds.count(T.FORWARD) == kinds.count(T.BACKWARD) == 2 * 2 * 4  # stages x replicas x microbatches
    assert kinds.count(T.OPTIMIZER) == kinds.count(T.ALLREDUCE) == 4  # replicas in one DC, at the machine's pace
    assert all(set(r) == set(T.COLUMNS) and r[T.END_NS] > r[T.START_NS] for r in rows)
    folder = write_timeline(e, tmp_path / "atlas")
    trace = __import__("json").loads((folder / "trace.json").read_text())
    assert sum(1 for x in trace["traceEvents"] if x.get("ph") == "X") == len(rows)
    assert (folder / "timeline.png").stat().st_size > 0


def test_prefill_fills_the_bubbles_only_and_grows_with_the_request_rate():
    """The default experiment under atlas+bubbletea: prefill adds busy time only inside the
    bubbles (with prefill, utilization stays at or below training plus its bubbles), every served
    request's TTFT is positive, and a higher request rate prefills more tokens."""
    from dataclasses import replace

    from testbed.sim.figures import simulate_policy
    from testbed.spec.experiment_file import load_experiment

    e = load_experiment().with_overrides(policy="atlas+bubbletea")
    low = simulate_policy(e)
    high = simulate_policy(replace(e, bubbletea=replace(e.bubbletea, request_rate=16.0)))
    for f in (low, high):
        p = f.prefill
        assert f.training_gpu_utilization < f.gpu_utilization <= 1.0
        assert 0 < p.served <= p.requests and p.ttft_p50_s > 0 and p.ttft_p99_s >= p.ttft_p50_s
        assert 0 < p.share_of_prefill_alone < 1
    assert high.prefill.prefill_tokens_per_s > low.prefill.prefill_tokens_per_s
    assert high.training_gpu_utilization == low.training_gpu_utilization  # training is not slowed


@pytest.mark.parametrize(
    ("text", "field", "fix"),
    [
        ("rate=1gbit", "--sweep", "wan_rate and delay"),
        ("1gbit", "--sweep", "wan_rate=100gbit"),
        ("wan_rate=1gbit,delay=5", "--sweep delay", "25ms"),
        ("wan_rate=0gbit", "--sweep wan_rate", "above 0"),
        ("delay=5ms,delay=6ms", "--sweep", "one name"),
    ],
)
def test_sweep_grid_errors_name_the_value_and_fix(text, field, fix):
    from testbed.sim.sweep import parse_sweep

    with pytest.raises(SpecError) as e:
        parse_sweep(text)
    assert e.value.field == field and fix in e.value.fix


def test_a_sweep_gives_every_point_and_atlas_speedups(tmp_path):
    from testbed.sim.sweep import parse_sweep, sweep

    sc = parse_scenario(_scenario(), "s.yaml")
    grid = parse_sweep("wan_rate=10gbit,100gbit,delay=1ms,20ms")
    assert grid == {"wan_rate": [10**10, 10**11], "delay": [1000, 20000]}
    rows = sweep(sc, grid, ("pp-fair", "dp-wan", "atlas"), workers=2)
    assert len(rows) == 4 * 3
    for row in (r for r in rows if r["policy"] == "atlas"):
        pp = next(
            x
            for x in rows
            if x["policy"] == "pp-fair" and (x["wan_rate_bps"], x["delay_us"]) == (row["wan_rate_bps"], row["delay_us"])
        )
        assert row["speedup_over_pp-fair"] == pytest.approx(pp["iteration_time_s"] / row["iteration_time_s"])
    # a longer delay never makes pp-fair faster
    pp = {(r["wan_rate_bps"], r["delay_us"]): r["iteration_time_s"] for r in rows if r["policy"] == "pp-fair"}
    assert pp[(10**10, 20000)] >= pp[(10**10, 1000)]
