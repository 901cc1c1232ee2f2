"""Time dilation (``spec/dilation.py``, ``trace/frame.py``): every duration an experiment sets
stretched by k and every rate divided by it, nothing else touched; and every reported figure
taken back to the emulated frame by its unit."""

from __future__ import annotations

import dataclasses

import pytest

from testbed.errors import SpecError
from testbed.spec.compute import ComputeModel
from testbed.spec.dilation import dilate_experiment, dilate_topology
from testbed.spec.experiment_file import load_experiment
from testbed.spec.link_profile import LinkState
from testbed.spec.topology_file import parse_topology
from testbed.trace import metrics as M
from testbed.trace.frame import DURATIONS, RATES, REAL_TIME, RECORDS, run_dilation, to_emulated_frame


def _topology():
    return parse_topology(
        {
            "dcs": [
                {"name": "a", "hosts": 2, "intra_rate": "1gbit", "intra_delay": "1ms"},
                {"name": "b", "hosts": 2},
                {"name": "c", "hosts": 2},
            ],
            "links": [
                {"between": ["a", "b"], "rate": "100mbit", "delay": "10ms", "jitter": "1ms", "loss": "1%",
                 "queue": 500, "failover": True, "failover_after": "200ms",
                 "profile": {"generator": "step", "at": "2s", "rate": "50mbit", "delay": "20ms"}},
                {"between": ["b", "c"], "rate": "40mbit", "delay": "5ms"},
                {"between": ["a", "c"], "rate": "40mbit", "delay": "5ms"},
            ],
        },
        "t",
    )  # fmt: skip


def test_every_figure_of_a_topology_is_dilated_and_nothing_else():
    spec = _topology()
    d = dilate_topology(spec, 4)
    ab, dab = spec.links[0], d.links[0]
    assert (dab.rate_bps, dab.delay_us, dab.jitter_us) == (25_000_000, 40_000, 4_000)
    assert (dab.loss_pct, dab.queue_packets, dab.failover) == (ab.loss_pct, ab.queue_packets, True)
    assert dab.failover_after_us == 800_000
    assert [s.t_us for s in dab.profile.steps] == [4 * s.t_us for s in ab.profile.steps]
    assert dab.profile.steps[-1].state == LinkState(12_500_000, 80_000, 4_000, 1.0)
    assert (d.dcs[0].intra_rate_bps, d.dcs[0].intra_delay_us) == (250_000_000, 4_000)
    assert d.dcs[1].intra_rate_bps is None  # unshaped stays unshaped: the machine's speed (not dilated)
    assert [dc.hosts for dc in d.dcs] == [dc.hosts for dc in spec.dcs] and d.name == spec.name
    # every field of a link is either dilated above or the same
    same = {"a", "b", "loss_pct", "queue_packets", "failover", "route_us"}
    for f in dataclasses.fields(ab):
        if f.name in same:
            assert getattr(dab, f.name) == getattr(ab, f.name), f.name
    assert dilate_topology(spec, 1) is spec


def test_an_experiment_is_dilated_into_what_runs_in_real_time():
    exp = load_experiment().with_overrides(time_dilation=3)
    run = dilate_experiment(exp)
    assert run.time_dilation == 1  # nothing dilates it twice
    assert (run.compute.forward_ms, run.compute.backward_ms) == (120.0, 240.0)
    assert run.compute.optimizer_target_ms == 120.0
    assert run.outage_timeout == 3 * exp.outage_timeout
    bt, rbt = exp.bubbletea, run.bubbletea
    assert (rbt.request_rate, rbt.time_scale, rbt.guard_ms, rbt.ttft_slo_s) == (
        bt.request_rate / 3,
        bt.time_scale * 3,
        bt.guard_ms * 3,
        bt.ttft_slo_s * 3,
    )
    assert rbt.max_prompt_tokens == bt.max_prompt_tokens and rbt.ttft_slo_scale == bt.ttft_slo_scale
    assert run.topology_spec == dilate_topology(exp.topology_spec, 3)
    # sizes, counts and shares are not durations
    for name in ("stages", "replicas", "microbatches", "microbatch_size", "iterations", "wan_window_bytes",
                 "wan_connection_share", "atlas_floor_share", "model", "policy", "schedule"):  # fmt: skip
        assert getattr(run, name) == getattr(exp, name), name
    assert dilate_experiment(load_experiment()) == load_experiment()


def test_real_compute_cannot_be_dilated():
    exp = load_experiment()
    with pytest.raises(SpecError, match="time_dilation: 2 stretches the compute targets, and compute.mode real"):
        exp.with_overrides(time_dilation=2, compute=ComputeModel(mode="real"))
    with pytest.raises(SpecError, match="time_dilation"):
        exp.with_overrides(time_dilation=0.5)


def test_every_reported_figure_goes_back_to_the_emulated_frame_by_its_unit():
    """Each figure of METRICS given the value 8 (records: one of each kind of key): durations come
    back / k, rates x k, the rest as measured; the real-time three stay."""
    k = 4.0
    summary = {m.name: 8.0 for m in M.METRICS if m.name not in RECORDS}
    summary[M.OUTAGES] = [{"link": "a:b", "down_s": 8.0, "duration_s": None, "resume_ms": 8.0}]
    summary[M.PROFILE_PHASES] = [
        {"start_s": 8.0, "links": {"a:b": {"rate_bps": 8, "delay_us": 8}}, "iterations": 8, "iteration_time_s": 8.0}
    ]
    out = to_emulated_frame(summary, k)
    for m in M.METRICS:
        if m.name in RECORDS or m.name == M.TIME_DILATION:
            continue
        want = 8.0 if m.name in REAL_TIME else 2.0 if m.unit in DURATIONS else 32.0 if m.unit in RATES else 8.0
        assert out[m.name] == want, (m.name, m.unit)
    assert out[M.TIME_DILATION] == k
    assert out[M.ITERATION_TIME_S] == 2.0 and out[M.TOKENS_PER_S] == 32.0 and out[M.GPU_UTILIZATION] == 8.0
    assert out[M.OUTAGES] == [{"link": "a:b", "down_s": 2.0, "duration_s": None, "resume_ms": 2.0}]
    [phase] = out[M.PROFILE_PHASES]
    assert phase == {"start_s": 2.0, "links": {"a:b": {"rate_bps": 32, "delay_us": 2.0}}, "iterations": 8,
                     "iteration_time_s": 2.0}  # fmt: skip
    assert to_emulated_frame(summary, 1) == {**summary, M.TIME_DILATION: 1}
    with pytest.raises(ValueError, match="a factor of 1 or more"):
        to_emulated_frame(summary, 0.5)
    assert run_dilation({}) == 1.0 and run_dilation({"time_dilation_applied": 2}) == 2.0


def test_every_time_figure_has_a_unit_the_frame_knows():
    """A figure whose name says it is a duration or a rate must have a unit the conversion reads:
    a new figure declared with a wrong unit would stay in real time silently."""
    for m in M.METRICS:
        if m.name in RECORDS or m.name in REAL_TIME:
            continue
        if m.name.endswith("_per_s"):
            assert m.unit in RATES, m
        elif m.name.endswith(("_s", "_ms", "_us")):
            assert m.unit in DURATIONS, m


def test_the_smallest_dilation_stretches_the_targets_past_the_machines_compute_and_links(monkeypatch):
    """``fit.suggest_dilation`` with the stage's real time fixed (the pure arithmetic; the timing
    itself is torch's): 6 workers on 2 cores taking 100 ms a microbatch against 120 ms of targets
    are at 250% of them, so k = 250/70 = 3.6, rounded up to 4; a link at 3x what the machine
    carries asks for k = 3, below that; at 10 ms it is 1."""
    from testbed.plan.run_plan import make_plan
    from testbed.run import fit

    plan = make_plan(load_experiment())
    monkeypatch.setattr(fit, "real_stage_s", lambda exp, stage: 0.1)
    need = fit.suggest_dilation(plan, cores=2, capacity_bps=plan.experiment.topology_spec.links[0].rate_bps // 3)
    assert (need.k, round(need.compute_share, 3), round(need.link_load, 3)) == (4.0, 2.5, 3.0)
    assert "k = 4 (compute 250% of its targets" in need.describe()
    monkeypatch.setattr(fit, "real_stage_s", lambda exp, stage: 0.01)
    assert fit.suggest_dilation(plan, cores=2).k == 1.0
    assert fit.suggest_dilation(plan, cores=2, capacity_bps=10**6).k == 100.0  # 100 Mbit/s on 1 Mbit/s


def test_a_summary_goes_back_to_real_time_for_the_simulator():
    summary = {M.ITERATION_TIME_S: 2.0, M.TOKENS_PER_S: 40.0, M.GPU_UTILIZATION: 0.5, M.STARTUP_S: 3.0}
    from testbed.trace.frame import to_real_frame

    emulated = to_emulated_frame(summary, 4)
    assert to_real_frame(emulated) == {**summary, M.TIME_DILATION: 4}
    assert to_real_frame(summary) == {**summary, M.TIME_DILATION: 1.0}  # a run from before: as it is


def test_plots_and_comparisons_say_their_time_is_the_emulated_frame():
    from testbed.results.compare import aggregate, format_comparison
    from testbed.results.plots import frame_note

    assert frame_note(1) == "" and frame_note(4) == ", emulated: the run went 4x slower"
    run = {M.ITERATION_TIME_S: 1.0, M.TOKENS_PER_S: 10.0, M.GPU_UTILIZATION: 0.5, M.BUBBLE_FRACTION: 0.5}
    dilated = aggregate({"pp-fair": [{**run, M.TIME_DILATION: 4.0}], "atlas": [{**run, M.TIME_DILATION: 4.0}]})
    assert dilated[M.TIME_DILATION] == [4.0]
    assert format_comparison(dilated).startswith("(every figure in the emulated frame: the runs went 4x slower)")
    plain = aggregate({"pp-fair": [run], "atlas": [run]})  # summaries from before dilation: 1
    assert plain[M.TIME_DILATION] == [1.0] and format_comparison(plain).startswith("policy")
