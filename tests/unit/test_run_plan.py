"""A run's plan (``plan/run_plan.py``): one frozen value made by one function, holding what the
separate planning functions give, its grants and bubbles worked out once, recorded as JSON."""

from __future__ import annotations

import dataclasses
import json

import pytest

from testbed.plan.bubble_timeline import bubble_timeline
from testbed.plan.connections import socket_buffer_cap, wan_connections
from testbed.plan.cost_model import predict
from testbed.plan.grant_plan import plan_grants
from testbed.plan.memory import gpu_shortfall, largest_worker
from testbed.plan.placement import place
from testbed.plan.run_plan import format_plan, make_plan, plan_record
from testbed.spec.experiment_file import load_experiment


@pytest.mark.parametrize("policy", ["pp-fair", "dp-wan", "atlas", "atlas+bubbletea"])
def test_the_plan_holds_what_each_planning_function_gives(policy):
    exp = load_experiment().with_overrides(policy=policy)
    topo, workers = exp.topology_spec, place(exp)
    plan = make_plan(exp)
    n = wan_connections(exp, topo, workers)
    assert list(plan.workers) == workers and plan.connections == n
    assert plan.socket_buffer_bytes == socket_buffer_cap(exp, topo, workers)
    assert plan.prediction == predict(exp, topo, workers, connections=n)
    assert plan.largest_worker == largest_worker(exp) and plan.gpu_shortfall == gpu_shortfall(exp)
    grants = plan_grants(exp, topo, workers, n) if exp.policy.grants else None
    assert plan.grant_plan == grants
    if exp.policy.bubbletea:
        t, bubbles = bubble_timeline(exp, topo, workers, n)
        assert plan.bubbles == (t, tuple(bubbles))
    else:
        assert plan.bubbles is None


def test_the_plan_is_frozen_and_worked_out_once():
    plan = make_plan(load_experiment().with_overrides(policy="atlas"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.connections = 1  # type: ignore[misc]
    assert plan.grant_plan is plan.grant_plan  # made on first use, then kept


def test_a_profiled_plan_is_made_by_the_same_function_from_the_stage_times():
    exp = load_experiment("sharing").with_overrides(policy="atlas")
    before = make_plan(exp)
    stage_s = tuple((0.005, 0.010) for _ in range(exp.stages))
    after = make_plan(exp, before.workers, stage_s=stage_s)
    assert after.workers == before.workers and after.stage_s == stage_s
    want = plan_grants(exp, exp.topology_spec, list(before.workers), before.connections, stage_s=stage_s)
    assert after.grant_plan == want != before.grant_plan


def test_the_record_of_a_plan_is_json_with_when_and_why():
    plan = make_plan(load_experiment().with_overrides(policy="atlas+bubbletea"))
    row = json.loads(json.dumps(plan_record(plan, 123, "made before the run")))
    assert row["t_ns"] == 123 and row["why"] == "made before the run" and row["policy"] == "atlas+bubbletea"
    assert row["placement"] == {f"s{w.stage}r{w.replica}": w.host for w in plan.workers}
    assert row["predicted_iteration_s"] == plan.predicted_iteration_s and row["bubbles"]["count"] > 0
    assert row["grant_plan"]["stagger_s"] == list(plan.grant_plan.stagger_s)
    text = format_plan(plan)
    assert f"predicted iteration {plan.predicted_iteration_s:.3f} s" in text and "BubbleTea" in text
