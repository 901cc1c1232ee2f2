"""Planned grants under real compute: the first iteration's stage times read from traces, the plan
made from them (different from the targets' plan), handed to the grant loop through the control
channel's ``replan`` and to the workers as a stagger file (tests/integration/test_atlas_grants.py
runs it for real)."""

from __future__ import annotations

import json

import pytest

from testbed.atlas.channel import STOP, encode_message
from testbed.atlas.controller_process import serve_messages
from testbed.atlas.grants import GrantLoop, HopTiming, boundary_paths
from testbed.atlas.timing import timing_from_json, timing_to_json
from testbed.plan.grant_plan import Hop, plan_grants
from testbed.plan.virtual_stages import experiment_boundaries
from testbed.plan.worker_config import read_stagger, write_stagger
from testbed.run.profile import FirstIterationProfile, stage_times_s, unprofiled
from testbed.spec.routing import RoutingTable
from testbed.spec.wire import TCP_GOODPUT_FRACTION
from testbed.trace import schema as T
from tests.unit.test_grant_plan import Recorder, four_pipelines


def _trace(events, workers, stage_ms, iterations=(0,), optimizer=True):
    events.mkdir(exist_ok=True)
    for w in workers:
        with open(events / f"w{w.rank}.jsonl", "a") as f:
            for it in iterations:
                for kind, ms in zip((T.FORWARD, T.BACKWARD), stage_ms[w.stage]):
                    for m in range(3):  # one slow first microbatch: the median ignores it
                        ns = int((ms * 5 if m == 0 else ms) * 1e6)
                        f.write(json.dumps({T.KIND: kind, T.ITERATION: it, T.MICROBATCH: m, T.PADDED_NS: ns}) + "\n")
                if optimizer:
                    f.write(json.dumps({T.KIND: T.OPTIMIZER, T.ITERATION: it, T.LOSS: 1.0}) + "\n")
            f.write('{"kind": "forw')  # a torn last line, as a worker writing it leaves


def test_stage_times_are_the_medians_of_the_first_iteration(tmp_path):
    e, workers = four_pipelines()
    _trace(tmp_path, workers, {0: (12, 30), 1: (7, 9)}, iterations=(0, 1))
    times = stage_times_s(tmp_path, workers, e.stages)
    assert [x for st in times for x in st] == pytest.approx([0.012, 0.030, 0.007, 0.009])


def test_no_stage_times_until_every_worker_finished_the_iteration(tmp_path):
    e, workers = four_pipelines()
    assert stage_times_s(tmp_path, workers, e.stages) is None  # nothing traced yet
    _trace(tmp_path, workers[:-1], {0: (12, 30), 1: (7, 9)})
    _trace(tmp_path, workers[-1:], {0: (12, 30), 1: (7, 9)}, optimizer=False)
    assert stage_times_s(tmp_path, workers, e.stages) is None  # the last worker is still in iteration 0
    calls = []
    profile = FirstIterationProfile(tmp_path, workers, e.stages, calls.append)
    profile.poll()
    assert calls == [] and not profile.done
    with open(tmp_path / f"w{workers[-1].rank}.jsonl", "a") as f:
        f.write("\n" + json.dumps({T.KIND: T.OPTIMIZER, T.ITERATION: 0, T.LOSS: 1.0}) + "\n")
    profile.poll()
    profile.poll()
    assert len(calls) == 1 and profile.done  # once


def test_the_profile_changes_the_plan():
    """Targets of 10 ms per block; a profile whose stage 1 takes 60 ms (forward) makes a longer
    iteration, and the stage times override the per-block targets."""
    e, workers = four_pipelines()
    targets = plan_grants(e, e.topology_spec, workers, 1, floor_share=0.05)
    same = plan_grants(e, e.topology_spec, workers, 1, floor_share=0.05, stage_s=((0.010, 0.010),) * 2)
    assert same.iteration_s == pytest.approx(targets.iteration_s)
    slow = plan_grants(e, e.topology_spec, workers, 1, floor_share=0.05, stage_s=((0.010, 0.010), (0.060, 0.010)))
    assert slow.iteration_s == pytest.approx(targets.iteration_s + 0.050)
    with pytest.raises(ValueError, match="1 stages' times for 2 virtual stages"):
        plan_grants(e, e.topology_spec, workers, 1, stage_s=((0.010, 0.010),))
    before = unprofiled(targets)
    assert all(h.order == () for h in before.hops) and before.stagger_s == (0.0,) * 4
    assert before.iteration_s == float("inf")  # not known before the profile: no half-pair expiry
    assert [h.deadline_s for h in before.hops] == [h.deadline_s for h in targets.hops]


def test_timing_survives_its_json_form():
    e, workers = four_pipelines()
    timing = HopTiming.from_plan(plan_grants(e, e.topology_spec, workers, 1), TCP_GOODPUT_FRACTION)
    assert timing_from_json(json.loads(json.dumps(timing_to_json(timing)))) == timing


def _granted_after_three_ready(loop, sent, rank, it, t0_ns):
    """Replicas 0, 2, 1 become ready in that order on a->b; returns the replicas granted, in turn."""
    hop = Hop("a", "b")
    for i, r in enumerate((0, 2, 1)):
        loop.handle({"ev": "recv", "src": rank[(0, r)], "dst": rank[(1, r)], "it": it, "mb": 0}, t0_ns)
        loop.handle({"ev": "ready", "src": rank[(0, r)], "dst": rank[(1, r)], "it": it, "mb": 0}, t0_ns + i)
    t, granted = t0_ns + 10, []
    for _ in range(3):
        loop.tick(t)
        granted.append(loop.held[hop].replica)
        sent[(hop, granted[-1])] = sent.get((hop, granted[-1]), 0) + loop.timing[hop].wire_bytes
        t = loop.next_wakeup_ns()
        loop.tick(t)
    return granted


def test_replan_swaps_the_order_from_readiness_to_the_profiled_plan(tmp_path):
    """Before the profile (no order) the loop grants earliest ready first; a ``replan`` message
    read by the controller's message loop makes it follow the plan's order (replica 1 before 2)."""
    e, workers = four_pipelines()
    plan = plan_grants(e, e.topology_spec, workers, 1, floor_share=0.05)
    rank = {(w.stage, w.replica): w.rank for w in workers}
    sent = {}
    loop = GrantLoop(
        Recorder(),
        {w.rank: w.replica for w in workers},
        boundary_paths(workers, RoutingTable(e.topology_spec), experiment_boundaries(e)),
        sharing="planned",
        timing=HopTiming.from_plan(unprofiled(plan), TCP_GOODPUT_FRACTION),
        stage_of={w.rank: w.stage for w in workers},
        notice_ns={},
        counters=lambda hop, replica: sent.get((hop, replica), 0),
    )
    assert _granted_after_three_ready(loop, sent, rank, 0, 10_000_000) == [0, 2, 1]
    path = tmp_path / "controller_replan.json"
    timing = HopTiming.from_plan(plan, TCP_GOODPUT_FRACTION)
    path.write_text(json.dumps({"timing": timing_to_json(timing), "iteration_ns": 123_000_000}))
    feed = [encode_message("replan"), encode_message(STOP)]
    assert serve_messages(loop, lambda n, timeout: feed.pop(0), clock=lambda: 500_000_000, replan_path=path) == 1
    assert loop.timing == timing and loop.iteration_ns == 123_000_000
    assert _granted_after_three_ready(loop, sent, rank, 1, 1_000_000_000) == [0, 1, 2]


def test_the_stagger_file_is_all_or_nothing(tmp_path):
    path = tmp_path / "stagger.json"
    assert read_stagger(str(path)) is None  # not written yet: workers do not wait for it
    write_stagger(path, (0.0, 0.0125, 0.025))
    assert read_stagger(str(path)) == (0.0, 0.0125, 0.025)
    path.write_text('{"not": "a list"}')
    assert read_stagger(str(path)) is None
    path.write_text("[0.0, 0.01")  # torn
    assert read_stagger(str(path)) is None
