"""The simulator's figures (``testbed sim``): a layout inside one DC and the WAN's bits per link
by hand, a run's record read back, and a measured run set beside its simulation
(tests/integration/test_training.py validates a real run)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict

import pandas as pd
import pytest
from eventrows import event_row
from experiments import exp, topo

from testbed.errors import SpecError
from testbed.plan.allreduce import allreduce_s
from testbed.plan.placement import place
from testbed.sim.figures import simulate_policy, wan_bits
from testbed.sim.validate import IN_STEP, MEASURED_STARTS, pipeline_start_offsets_s, validate_run
from testbed.spec.experiment import Experiment
from testbed.spec.experiment_file import load_experiment
from testbed.spec.model import stage_param_bytes
from testbed.spec.wire import TCP_GOODPUT_FRACTION
from testbed.trace import schema as T

# the timelines worked out by hand leave the worker's hand-off out (tests/unit/test_handoff.py has it)
pytestmark = pytest.mark.usefixtures("without_handoff")


def test_inside_one_dc_by_hand():
    """2 stages x 2 replicas, 4 microbatches of 40 + 80 ms per stage, no WAN: the iteration is the
    fill and drain (2 x 0.12) plus 3 steady steps plus the all-reduce inside the DC (``ar``, at this
    machine's pace: ``allreduce.intra_dc_machine_s``) plus the optimizer (0.04): 0.64 s + ar; each
    worker is busy 4 x 0.12 + 0.04 = 0.52 s of it."""
    e = exp(topology_spec=topo({"a": 8}))
    f = simulate_policy(e, "pp-fair")
    t = 0.64 + allreduce_s(e, e.topology_spec, place(e))
    assert f.iteration_time_s == pytest.approx(t)
    assert f.gpu_utilization == pytest.approx(0.52 / t)
    assert f.bubble_fraction_per_stage == pytest.approx((1 - 0.52 / t, 1 - 0.52 / t))
    assert f.tokens_per_s == pytest.approx(2 * 4 * 4 * 128 / t)
    assert f.wan_utilization == {} and f.wan_utilization_mean is None


def test_a_policy_that_trains_nothing_is_not_simulated():
    with pytest.raises(SpecError, match=r"serves prefill alone.*simulate atlas\+bubbletea"):
        simulate_policy(exp(topology_spec=topo({"a": 8}), iterations=8), "atlas+prefill-alone")


def test_the_wan_carries_the_boundary_transfers_and_the_all_reduce():
    e = exp()  # stages in DCs a and b, 2 replicas, 4 microbatches
    per_direction = 2 * 4 * e.activation_bytes * 8 / TCP_GOODPUT_FRACTION
    assert wan_bits(e, place(e)) == pytest.approx({"a->b": per_direction, "b->a": per_direction})
    dp = e.with_overrides(policy="dp-wan")  # each replica's pipeline in one DC: the all-reduce crosses
    grads = sum(stage_param_bytes(e.model, 2, s) for s in range(2)) * 8 / TCP_GOODPUT_FRACTION  # ring of 2
    assert wan_bits(dp, place(dp)) == pytest.approx({"a->b": grads, "b->a": grads})
    f = simulate_policy(dp)
    assert f.wan_utilization["a->b"] == pytest.approx(grads / (100e6 * f.iteration_time_s))


def test_a_runs_record_reads_back():
    for name in ("default", "four_dc", "sharing", "two_dc"):
        e = load_experiment(name)
        assert Experiment.from_dict(json.loads(json.dumps(e.to_dict()))).to_dict() == e.to_dict()


def _fake_run(tmp_path, e, measured):
    workers = place(e)
    (tmp_path / "config.json").write_text(json.dumps({**e.to_dict(), "workers": [asdict(w) for w in workers]}))
    (tmp_path / "summary.json").write_text(json.dumps(measured))
    return tmp_path


def test_validation_sets_measured_beside_predicted(tmp_path):
    e = load_experiment("two_dc")
    f = simulate_policy(e)
    run = _fake_run(tmp_path, e, {"iteration_time_s": 2 * f.iteration_time_s, "gpu_utilization": 0.25})
    got = validate_run(run)["figures"]
    assert got["iteration_time_s"] == {
        "predicted": f.iteration_time_s,
        "measured": 2 * f.iteration_time_s,
        "error": pytest.approx(0.5),  # (measured - predicted) / measured
    }
    assert got["gpu_utilization"]["error"] == pytest.approx(0.25 - f.gpu_utilization)  # a difference
    assert got["tokens_per_s"]["error"] is None  # not measured


def test_validation_of_something_else_is_refused(tmp_path):
    with pytest.raises(SpecError, match="config.json"):
        validate_run(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "summary.json").write_text("{}")
    with pytest.raises(SpecError, match="not a run's record"):
        validate_run(tmp_path)


def test_the_command_prints_json_and_refuses_an_unknown_policy():
    cli = [sys.executable, "-m", "testbed.cli", "sim", "two_dc"]
    out = subprocess.run([*cli, "--json", "--policies", "pp-fair,atlas"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert set(data) == {"pp-fair", "atlas"} and data["atlas"]["iteration_time_s"] > 0
    bad = subprocess.run([*cli, "--policies", "atlas,nope"], capture_output=True, text=True)
    assert bad.returncode == 2 and "'nope'" in bad.stderr


def test_validation_starts_the_pipelines_as_far_apart_as_the_run_did(tmp_path):
    """The sharing experiment, striped under TCP sharing: its four pipelines' bursts share the one
    link. The run's stage-0 first forwards 0, 1, 2 and 3 ms apart in its one measured iteration:
    the simulation starts them so and predicts another iteration than in step."""
    e = load_experiment("sharing").with_overrides(policy="pp-fair/placement=atlas/striping=on", iterations=3)
    run = _fake_run(tmp_path, e, {"iteration_time_s": 1.0})
    rows = [
        event_row(w.rank, w.host, w.dc, 0, w.replica, T.FORWARD, 2, 0, 100 + w.replica, 140 + w.replica)
        for w in place(e)
        if w.stage == 0
    ]
    pd.DataFrame(rows).to_parquet(run / "events.parquet")
    got = validate_run(run)
    assert got["starts"] == MEASURED_STARTS
    assert got["start_offsets_s"] == pytest.approx((0.0, 0.001, 0.002, 0.003))
    in_step = validate_run(run, measured_starts=False)
    assert in_step["starts"] == IN_STEP and in_step["start_offsets_s"] is None
    predicted = got["figures"]["iteration_time_s"]["predicted"]
    assert predicted != pytest.approx(in_step["figures"]["iteration_time_s"]["predicted"], rel=1e-3)


def test_pipeline_start_offsets_sorted_and_averaged_over_measured_iterations():
    """Stage 0 of replicas 0 and 1: iteration 0 (warm-up) 50 ms apart; iteration 1 replica 1
    first by 3 ms, iteration 2 replica 0 first by 1 ms: sorted, (0, 3) and (0, 1), their mean
    (0, 2) ms. The first forward decides, not a later microbatch's nor another stage's."""

    def fwd(stage, replica, it, mb, start_ms):
        return event_row(stage * 2 + replica, "h", "a", stage, replica, T.FORWARD, it, mb, start_ms, start_ms + 10)

    ev = pd.DataFrame(
        [
            fwd(0, 0, 0, 0, 0),
            fwd(0, 1, 0, 0, 50),
            fwd(0, 0, 1, 0, 103),
            fwd(0, 1, 1, 0, 100),
            fwd(0, 1, 1, 1, 110),
            fwd(0, 0, 2, 0, 200),
            fwd(0, 1, 2, 0, 201),
            fwd(1, 0, 2, 0, 190),  # stage 1: not a pipeline's start
        ]
    )
    assert pipeline_start_offsets_s(ev, warmup=1) == pytest.approx((0.0, 0.002))
    assert pipeline_start_offsets_s(ev[ev[T.REPLICA] == 0], warmup=1) is None  # one replica
