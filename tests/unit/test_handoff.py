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


def test_each_further_connection_adds_its_send_to_the_hand_off():
    """An output striped over k connections takes k sends: ``STRIPE_SEND_S`` each beyond the
    first; a scenario's devices still take none."""
    e = exp()
    assert handoff.action_handoff_s(e, 1) == handoff.ACTION_HANDOFF_S
    assert handoff.action_handoff_s(e, 5) == pytest.approx(handoff.ACTION_HANDOFF_S + 4 * handoff.STRIPE_SEND_S)
    assert handoff.action_handoff_s(load_scenario("gpt_7b_5dc").experiment("atlas"), 16) == 0.0


@pytest.mark.parametrize("sharing", ["tcp", "planned"])
def test_only_an_output_that_crosses_the_wan_pays_for_its_stripes(monkeypatch, sharing):
    """1 microbatch over 2 stages in DCs a and b, striped over 4 connections: stage 0's forward and
    stage 1's backward send across the WAN, so the iteration grows by two hand-offs' three further
    sends each (stage 0's backward and stage 1's forward send nothing); inside one DC, where nothing
    is striped, it does not move."""
    from testbed.plan.grant_plan import _plan_grants, simulated_iteration

    def _with_stripe(s: float) -> None:
        monkeypatch.setattr(handoff, "STRIPE_SEND_S", s)
        _plan_grants.cache_clear()  # plans kept for the same inputs were made with the figure before

    e = exp(microbatches=1, replicas=1, policy="pp-fair" if sharing == "tcp" else "atlas")
    across = topo({"a": 1, "b": 1})
    workers = place(e, across)
    assert {w.dc for w in workers} == {"a", "b"}
    _with_stripe(0.0)
    before = simulated_iteration(e, across, workers, 4)
    _with_stripe(0.001)
    assert simulated_iteration(e, across, workers, 4) - before == pytest.approx(2 * 3 * 0.001)
    inside = topo({"a": 4})
    workers = place(e, inside)
    _with_stripe(0.0)
    before = simulated_iteration(e, inside, workers, 4)
    _with_stripe(0.001)
    assert simulated_iteration(e, inside, workers, 4) == before
