"""The worker's hand-off between two operations (``plan/handoff.py``) in the model: added to every
forward and backward of an experiment run on this testbed, in the closed form and the simulation
alike, and to no scenario's."""

from __future__ import annotations

import pytest
from experiments import exp, topo

from testbed.plan import handoff
from testbed.plan.cost_model import predict
from testbed.plan.grant_sim import simulate
from testbed.plan.placement import place
from testbed.spec.scenario_file import load_scenario


def _with(monkeypatch, h: float) -> None:
    monkeypatch.setattr(handoff, "ACTION_HANDOFF_S", h)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_inside_a_dc_each_step_of_the_pipeline_takes_two_hand_offs_more(monkeypatch, schedule):
    """2 stages, 4 microbatches inside one DC: the fill, drain and steady steps are S + M - 1 = 5
    steps of a forward and a backward, each followed by its hand-off: 10 hand-offs more. The closed
    form (``predict``) and the simulation of the schedule tables give the same."""
    e = exp(schedule=schedule)
    t = topo({"a": 4})
    workers = place(e, t)
    _with(monkeypatch, 0.0)
    before = predict(e, t, workers).iteration_s
    _with(monkeypatch, 0.002)
    after = predict(e, t, workers)
    assert after.iteration_s - before == pytest.approx(10 * 0.002)
    simulated = simulate(e, workers, {}, {}, {}, (0.0, 0.0))[0]
    assert simulated == pytest.approx(after.fill_s + after.steady_s)


def test_across_the_wan_an_output_leaves_after_its_hand_off(monkeypatch):
    """1 microbatch over 2 stages in DCs a and b, under TCP sharing: the activations leave once
    stage 0's forward and its hand-off are done, the gradient once stage 1's backward and its
    hand-off are, so each of the four operations on the one path adds its hand-off."""
    e = exp(microbatches=1, replicas=1)
    workers = place(e, e.topology_spec)
    _with(monkeypatch, 0.0)
    before = predict(e, e.topology_spec, workers).iteration_s
    _with(monkeypatch, 0.003)
    assert predict(e, e.topology_spec, workers).iteration_s - before == pytest.approx(4 * 0.003)


def test_a_scenarios_devices_take_no_hand_off(monkeypatch):
    """A scenario stands for real GPUs: its experiment is not run here, and its prediction does not
    move with the testbed's hand-off."""
    sc = load_scenario("gpt_7b_5dc").experiment("pp-fair")
    assert not sc.compute.emulated and handoff.action_handoff_s(sc) == 0.0
    assert exp().compute.emulated and handoff.action_handoff_s(exp()) == handoff.ACTION_HANDOFF_S > 0
    t = sc.topology_spec
    workers = place(sc, t)
    before = predict(sc, t, workers).iteration_s
    _with(monkeypatch, 0.01)
    assert predict(sc, t, workers).iteration_s == before
