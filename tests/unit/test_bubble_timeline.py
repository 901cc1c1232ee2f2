"""Bubble timelines predicted from hand-built schedules (GPipe and 1F1B, inside a DC and across
the WAN, with and without a stagger), against windows and closed forms computed by hand."""

from __future__ import annotations

import pytest
from experiments import exp, topo

from testbed.plan.bubble_timeline import END, Bubble, bubble_timeline, stage_bubble_fractions
from testbed.plan.placement import place
from testbed.plan.workers import WorkerSpec
from testbed.spec.compute import ComputeModel
from testbed.spec.policy import parse_policy

# the timelines worked out by hand leave the worker's hand-off out (tests/unit/test_handoff.py has it)
pytestmark = pytest.mark.usefixtures("without_handoff")


def _one_dc(stages: int, replicas: int = 1) -> list[WorkerSpec]:
    return [
        WorkerSpec(s * replicas + r, s, r, f"a-h{s * replicas + r}", "a")
        for s in range(stages)
        for r in range(replicas)
    ]


def _unit(schedule: str, stages: int, microbatches: int):
    """One block per stage, forward 1 s and backward 2 s: the schedule in unit steps."""
    from testbed.spec.model import ModelConfig

    return exp(
        topology_spec=topo({"a": 8}),
        schedule=schedule,
        stages=stages,
        replicas=1,
        microbatches=microbatches,
        model=ModelConfig(n_layers=stages, d_model=64, n_heads=4, seq_len=128),
        compute=ComputeModel(forward_ms=1000, backward_ms=2000),
    )


def test_gpipe_inside_a_dc_by_hand():
    """2 stages, 4 microbatches: stage 0's forwards end at 4 s, stage 1's last forward at 5 and
    its backwards run 5-13; stage 0 waits 4-7 for the first gradient and runs its backwards 7-15.
    Stage 1 waits 1 s before its first forward and 2 s at the end: both 3 of 15 s, the closed
    form (p - 1) / (m + p - 1) = 1/5."""
    e = _unit("gpipe", 2, 4)
    t, bubbles = bubble_timeline(e, e.topology_spec, _one_dc(2), connections=1)
    assert t == pytest.approx(15.0)
    assert bubbles == [
        Bubble(0, 0, "B3", 4.0, 3.0),
        Bubble(1, 0, "F0", 0.0, 1.0),
        Bubble(1, 0, END, 13.0, 2.0),
    ]
    assert stage_bubble_fractions(bubbles, t, 2, 1) == pytest.approx([1 / 5, 1 / 5])


@pytest.mark.parametrize("p,m", [(2, 4), (3, 6), (4, 8)])
def test_1f1b_inside_a_dc_matches_the_closed_form(p, m):
    e = _unit("1f1b", p, m)
    t, bubbles = bubble_timeline(e, e.topology_spec, _one_dc(p), connections=1)
    assert t == pytest.approx(3.0 * (m + p - 1))
    assert stage_bubble_fractions(bubbles, t, p, 1) == pytest.approx([(p - 1) / (m + p - 1)] * p)


@pytest.mark.parametrize(("p", "m"), [(2, 4), (3, 6), (4, 8)])
def test_gpipe_inside_a_dc_matches_the_closed_form(p, m):
    e = _unit("gpipe", p, m)
    t, bubbles = bubble_timeline(e, e.topology_spec, _one_dc(p), connections=1)
    assert t == pytest.approx(3.0 * (m + p - 1))
    assert stage_bubble_fractions(bubbles, t, p, 1) == pytest.approx([(p - 1) / (m + p - 1)] * p)


def test_across_the_wan_the_transfers_add_bubbles_and_planned_offsets_show():
    """Two DCs 10 ms apart: every stage waits longer than inside a DC; under planned grants the
    replicas' first stages start at the plan's offsets (a bubble before replica r's first forward)."""
    e = exp(topology_spec=topo({"a": 2, "b": 2}, rate="10mbit", delay="10ms"), schedule="gpipe")
    t_local, local = bubble_timeline(e, e.topology_spec, _one_dc(2, 2), connections=1)
    t_wan, wan = bubble_timeline(e, e.topology_spec, place(e), connections=1)
    assert t_wan > t_local
    assert sum(b.duration_s for b in wan) > sum(b.duration_s for b in local)
    atlas = e.with_overrides(policy="atlas")
    from testbed.plan.grant_plan import plan_grants

    plan = plan_grants(atlas, atlas.topology_spec, place(atlas), 1)
    _, planned = bubble_timeline(atlas, atlas.topology_spec, place(atlas), connections=1)
    assert parse_policy("atlas").sharing == "planned" and plan.stagger_s[1] > 0  # replica 1 is offset
    first = {b.replica: b for b in planned if b.stage == 0 and b.start_s == 0.0}
    assert 0 not in first  # replica 0 starts at once
    assert first[1].before == "F0" and first[1].duration_s == pytest.approx(plan.stagger_s[1])
