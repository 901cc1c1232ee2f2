"""Every schedule as worker tables over virtual stages (``plan/schedule.py``), the rules an
experiment's layout must keep under each (refused at load with the rule and the fix), and the
list-schedule simulation (``grant_sim.simulate``) of the schedules of several virtual stages or a
split backward: inside one DC it is the unit-slot grid's makespan, across DCs the boundary back
to the first worker crosses the WAN."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testbed.atlas.grants import GrantLoop
from testbed.errors import SpecError
from testbed.plan.boundary_transfers import Transfer
from testbed.plan.bubble_timeline import bubble_timeline
from testbed.plan.grant_plan import plan_grants, simulated_iteration, wan_links
from testbed.plan.memory import in_flight, peak_in_flight
from testbed.plan.placement import place
from testbed.plan.schedule import UNIT_SLOTS, RankAction, make_schedule, rank_grid, worker_tables
from testbed.plan.virtual_stages import (
    chunk_numbers,
    experiment_boundaries,
    experiment_homes,
    home_boundaries,
    padding_targets_ms,
    slot_name,
    stage_homes,
)
from testbed.plan.what_if import alternatives
from testbed.run.profile import stage_times_s
from testbed.sim.figures import simulate_policy, wan_free_bubble_fraction
from testbed.spec.compute import ComputeModel
from testbed.spec.experiment_file import parse_experiment
from testbed.spec.model import ModelConfig
from testbed.spec.pipeline_schedules import microbatches_near, rounds_problem, takes_in_rounds
from testbed.spec.policy import parse_policy
from testbed.spec.scenario_file import load_scenario
from testbed.trace import schema as T
from tests.unit.experiments import exp, topo

# the timelines worked out by hand leave the worker's hand-off out (tests/unit/test_handoff.py has it)
pytestmark = pytest.mark.usefixtures("without_handoff")

REPO = Path(__file__).resolve().parents[2]

NEW = ("interleaved-1f1b", "zb-h1", "zbv")


def test_gpipe_and_1f1b_tables_are_their_action_lists_on_one_virtual_stage_each():
    for name in ("gpipe", "1f1b"):
        assert worker_tables(name, 3, 4) == [
            [RankAction(a.kind, s, a.microbatch) for a in acts] for s, acts in enumerate(make_schedule(name, 3, 4))
        ]


def test_virtual_stages_are_looped_or_v_shaped():
    assert stage_homes("interleaved-1f1b", 3, 2) == [0, 1, 2, 0, 1, 2]
    assert stage_homes("zbv", 3, 2) == [0, 1, 2, 2, 1, 0]
    assert stage_homes("1f1b", 3, 1) == [0, 1, 2]
    # interleaving's chunk boundary goes from the last worker back to the first; ZB-V's tip stays
    assert home_boundaries([0, 1, 2, 0, 1, 2]) == [(0, 1), (1, 2), (2, 0), (0, 1), (1, 2)]
    assert home_boundaries([0, 1, 2, 2, 1, 0]) == [(0, 1), (1, 2), (2, 1), (1, 0)]
    e = exp(schedule="zbv", stages=2, model=ModelConfig(n_layers=4, d_model=64, n_heads=4, seq_len=128))
    assert e.chunks == 2 and chunk_numbers(experiment_homes(e)) == [0, 0, 1, 1]
    assert slot_name("F", 2) == "F2" and slot_name("I", 3, 1) == "B3c1" and slot_name("B", 0, 0) == "B0"


@pytest.mark.parametrize(
    "overrides, field, words",
    [
        ({"schedule": "1f1b", "virtual_stages": 3}, "virtual_stages", "interleaved-1f1b schedule only"),
        ({"schedule": "zb-h1", "microbatches": 5}, "microbatches", "2 rounds under zb-h1"),
        ({"schedule": "interleaved-1f1b", "microbatches": 5}, "microbatches", "use 4 or 6 microbatches"),
        ({"schedule": "interleaved-1f1b", "virtual_stages": 3}, "model.n_layers", "multiple of 6 blocks"),
        ({"schedule": "zbv", "stages": 3}, "model.n_layers", "3 stages x 2 virtual stages"),
    ],
)
def test_layouts_a_schedule_cannot_run_are_refused_with_the_rule_and_the_fix(overrides, field, words):
    with pytest.raises(SpecError) as e:
        exp(topology_spec=topo({"a": 6, "b": 6})).with_overrides(**overrides)
    assert e.value.field == field
    assert words in str(e.value)


def test_an_experiment_file_names_the_field_at_load():
    data = {"topology": "two_dc", "schedule": "interleaved-1f1b", "virtual_stages": 4, "stages": 2}
    with pytest.raises(SpecError, match="n_layers.*multiple of 8 blocks"):
        parse_experiment(data, "x.yaml")
    ok = parse_experiment({**data, "virtual_stages": 2, "model": {"n_layers": 8}}, "x.yaml")
    assert ok.chunks == 2


def one_dc(schedule: str, stages: int, microbatches: int) -> object:
    """``schedule`` inside one DC (communication free), a forward of a virtual stage 10 ms."""
    chunks = 2 if schedule in ("interleaved-1f1b", "zbv") else 1
    return exp(
        topology_spec=topo({"a": 8}),
        schedule=schedule,
        stages=stages,
        replicas=1,
        microbatches=microbatches,
        model=ModelConfig(n_layers=stages * chunks, d_model=64, n_heads=4, seq_len=128),
        compute=ComputeModel(forward_ms=10 * chunks, backward_ms=20 * chunks),
        policy=parse_policy("pp-fair"),
    )


@pytest.mark.parametrize("schedule", NEW)
@pytest.mark.parametrize("stages, microbatches", [(2, 4), (3, 6), (4, 8)])
def test_inside_one_dc_the_simulation_is_the_unit_slot_grid(schedule, stages, microbatches):
    e = one_dc(schedule, stages, microbatches)
    workers = place(e)
    table = worker_tables(schedule, stages, microbatches, e.chunks)
    slots = len(rank_grid(table, UNIT_SLOTS)[0])
    timeline: list = []
    assert simulated_iteration(e, e.topology_spec, workers, 1, timeline=timeline) == pytest.approx(slots * 0.010)
    # every action once, a split backward's parts half the backward each
    assert len(timeline) == sum(len(t) for t in table)
    for _, _, a, start, end in timeline:
        assert end - start == pytest.approx(0.010 * UNIT_SLOTS[a.kind])
    end, bubbles = bubble_timeline(e, e.topology_spec, workers, 1)
    idle = sum(b.duration_s for b in bubbles)
    assert idle / (end * stages) == pytest.approx(sum(c == "" for r in rank_grid(table) for c in r) / (slots * stages))


def three_dc_interleaved(policy: str = "pp-fair"):
    return exp(
        topology_spec=topo({"a": 2, "b": 2, "c": 2}, rate="50mbit", delay="10ms"),
        schedule="interleaved-1f1b",
        stages=3,
        replicas=2,
        microbatches=6,
        model=ModelConfig(n_layers=6, d_model=64, n_heads=4, seq_len=128),
        compute=ComputeModel(forward_ms=40, backward_ms=80),
        policy=parse_policy(policy),
    )


def test_interleaving_crosses_back_from_the_last_dc_to_the_first():
    e = three_dc_interleaved()
    workers = place(e)
    rank = {(w.stage, w.replica): w.rank for w in workers}
    wan = wan_links(e, e.topology_spec, workers, 1, float)
    assert [str(h) for h in wan.paths[(rank[(2, 0)], rank[(0, 0)])]] == ["c->b", "b->a"]
    assert experiment_boundaries(e) == [(0, 1), (1, 2), (2, 0), (0, 1), (1, 2)]
    # the chunk boundary's transfer crosses two links back: worker 0's forward of virtual stage 3
    # starts at least their two one-way delays (20 ms) after worker 2's of virtual stage 2 ends
    timeline: list = []
    simulated_iteration(e, e.topology_spec, workers, 1, timeline=timeline)
    ends = {(a.stage, r, a.microbatch): end for _, r, a, _, end in timeline if a.kind == "F"}
    starts = {(a.stage, r, a.microbatch): start for _, r, a, start, _ in timeline if a.kind == "F"}
    for r in range(2):
        for m in range(6):
            assert starts[(3, r, m)] - ends[(2, r, m)] >= 0.020 - 1e-9


def test_the_grant_plan_orders_every_chunk_boundarys_transfers():
    e = three_dc_interleaved("atlas")
    plan = plan_grants(e, e.topology_spec, place(e), connections=1)
    ca = plan.hop(next(h.hop for h in plan.hops if str(h.hop) == "c->b"))
    # c->b carries the chunk boundary (virtual stage 2 -> 3) forwards and 3 -> 2's... gradients of
    # boundary 1 (b<-c) backwards: 6 microbatches x 2 replicas each
    forward = [t for t in ca.order if t.kind == "F"]
    assert {t.stage for t in forward} == {2} and len(forward) == 12
    assert {t.stage for t in ca.order if t.kind == "B"} == {1, 4}


def test_the_controller_names_a_chunks_transfer_as_the_plan_does():
    e = three_dc_interleaved("atlas")
    workers = place(e)
    loop = GrantLoop(
        None,  # type: ignore[arg-type]  # no switch: only the naming is used
        {w.rank: w.replica for w in workers},
        {},
        stage_of={w.rank: w.stage for w in workers},
        homes=stage_homes("interleaved-1f1b", 3, 2),
    )
    rank = {(w.stage, w.replica): w.rank for w in workers}
    assert loop._transfer((rank[(2, 1)], rank[(0, 1)], 0, 3, 2)) == Transfer("F", 2, 3, 1)
    assert loop._transfer((rank[(0, 1)], rank[(2, 1)], 0, 3, 2)) == Transfer("B", 2, 3, 1)
    assert loop._transfer((rank[(0, 1)], rank[(1, 1)], 0, 3, 3)) == Transfer("F", 3, 3, 1)
    plain = GrantLoop(None, {0: 0, 1: 0}, {}, stage_of={0: 0, 1: 1})  # type: ignore[arg-type]
    assert plain._transfer((1, 0, 0, 2, -1)) == Transfer("B", 0, 2, 0)


def test_memory_in_flight_follows_the_table():
    assert peak_in_flight("1f1b", 4, 8) == (4, 3, 2, 1)  # 1F1B's S - s
    # interleaving's longer warm-up holds more of a chunk's (half-size) activations
    inter = peak_in_flight("interleaved-1f1b", 4, 8, 2)
    assert all(x > y for x, y in zip(inter, (4, 3, 2, 1)))
    # ZB-H1: worker r's weight parts come r steps late, and a microbatch counts until its weight
    # part (an upper bound: that part needs only its layers' inputs), S on every worker
    assert peak_in_flight("zb-h1", 4, 8) == (4, 4, 4, 4)
    e = exp(schedule="zb-h1", stages=2, microbatches=4)
    assert in_flight(e, 1) == 2


@pytest.mark.parametrize("schedule", ("1f1b", *NEW))
def test_the_wan_free_bubble_is_the_tables_own(schedule):
    """Inside one DC nothing crosses a WAN: the WAN-free bubble is the simulated bubble; across DCs
    the WAN only adds to it, and a zero-bubble table leaves less than 1F1B's."""
    e = one_dc(schedule, 3, 6)
    assert wan_free_bubble_fraction(e, place(e)) == pytest.approx(simulate_policy(e).bubble_fraction)
    w = three_dc_interleaved().with_overrides(schedule=schedule, microbatches=6)
    assert wan_free_bubble_fraction(w, place(w)) < simulate_policy(w).bubble_fraction
    if schedule != "1f1b":
        f = three_dc_interleaved().with_overrides(schedule="1f1b", microbatches=6)
        assert wan_free_bubble_fraction(w, place(w)) < wan_free_bubble_fraction(f, place(f))


def test_the_planner_weighs_only_layouts_the_schedule_can_run():
    e = three_dc_interleaved()  # 6 blocks: 3 stages x 2 chunks split evenly, 2 stages do not
    plans = {(p.stages, p.replicas): p for p in alternatives(e, e.topology_spec)}
    assert plans[(3, 2)].prediction is not None
    assert plans[(2, 2)].prediction is None and "model.n_layers 6" in plans[(2, 2)].why_not


def test_the_fix_for_the_rounds_rule_names_counts_the_rule_accepts():
    """The rounds change with the count, so "a multiple of the rounds" is not the fix: the counts
    named are the nearest that pass."""
    for stages in range(1, 17):
        for m in range(1, 257):
            if not takes_in_rounds(stages, m):
                below, above = microbatches_near(stages, m)
                assert takes_in_rounds(stages, above) and (below is None or takes_in_rounds(stages, below))
                assert all(not takes_in_rounds(stages, x) for x in range((below or 0) + 1, above) if x != m)
    assert "use 30 or 35 microbatches" in rounds_problem("zb-h1", 5, 32)[1]


def test_a_new_schedule_drops_the_virtual_stages_of_the_interleaved_one():
    e = three_dc_interleaved().with_overrides(virtual_stages=3, model=ModelConfig(n_layers=18, d_model=64, n_heads=4))
    assert e.chunks == 3
    assert e.with_overrides(schedule="zbv").virtual_stages is None
    assert e.with_overrides(microbatches=3).virtual_stages == 3  # the schedule unchanged: kept


def test_a_scenario_names_what_it_gives_for_each_rule(tmp_path):
    base = (REPO / "workloads" / "scenarios" / "gpt_70b_3dc.yaml").read_text()
    for extra, field, words in (
        ("schedule: zb-h1", "global_batch", "use a global_batch of 720 (60 microbatches) or 780 (65 microbatches)"),
        ("schedule: zbv", "stages", "use 10 or 20 or 40 stages"),
    ):
        path = tmp_path / "s.yaml"
        path.write_text(base.replace("schedule: 1f1b", "") + f"\n{extra}\n")
        with pytest.raises(SpecError) as e:
            load_scenario(path)
        assert e.value.field == field and words in str(e.value), str(e.value)


def test_a_split_backwards_parts_overrun_against_their_own_targets():
    from testbed.results.analysis import overrun_fraction
    from tests.unit.test_analysis import frame, op

    targets = {k: int(v * 1e6) for k, v in padding_targets_ms(40, 80, 40, 1).items()}
    rows = [
        op(0, T.BACKWARD, 0, 0, 0, 45, real_ns=45_000_000, padded_ns=45_000_000, part=T.INPUT_PART),  # over 40
        op(0, T.BACKWARD, 0, 1, 50, 90, real_ns=30_000_000, padded_ns=40_000_000, part=T.WEIGHT_PART),
        op(0, T.BACKWARD, 0, 2, 90, 170, real_ns=70_000_000, padded_ns=80_000_000),  # whole: 80
    ]
    assert overrun_fraction(frame(rows), targets) == pytest.approx(1 / 3)
    assert padding_targets_ms(40, 80, 40, 2)[T.FORWARD] == 20 and padding_targets_ms(40, 80, 40, 2)[T.WEIGHT_PART] == 20


def test_the_profile_keeps_each_virtual_stages_own_times(tmp_path):
    """Under ZB-V worker 0 holds the embedding's chunk and the head's: the profile keeps each virtual
    stage's median, and a split backward's parts add up to its backward."""
    e = exp(schedule="zbv", stages=2, replicas=1, microbatches=2)
    workers = place(e)
    forward_ms = {0: 10, 1: 20, 2: 30, 3: 40}  # virtual stage -> forward
    for w in workers:
        rows = []
        for v in (v for v, h in enumerate(experiment_homes(e)) if h == w.stage):
            for m in range(2):
                base = {T.ITERATION: 0, T.MICROBATCH: m, T.VIRTUAL_STAGE: v}
                rows.append({**base, T.KIND: T.FORWARD, T.PADDED_NS: forward_ms[v] * 1_000_000})
                for part, ms in ((T.INPUT_PART, forward_ms[v]), (T.WEIGHT_PART, forward_ms[v])):
                    rows.append({**base, T.KIND: T.BACKWARD, T.PART: part, T.PADDED_NS: ms * 1_000_000})
        rows.append({T.ITERATION: 0, T.MICROBATCH: -1, T.KIND: T.OPTIMIZER, T.PADDED_NS: 1})
        (tmp_path / f"w{w.rank}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    times = stage_times_s(tmp_path, workers, 4)
    assert [x for t in times for x in t] == pytest.approx([x / 1e3 for f in (10, 20, 30, 40) for x in (f, 2 * f)])
    plan_grants(e, e.topology_spec, workers, 1, stage_s=times)  # one entry per virtual stage
    with pytest.raises(ValueError, match="2 stages' times for 4 virtual stages"):
        plan_grants(e, e.topology_spec, workers, 1, stage_s=times[:2])
