"""Atlas's grant plan from the schedule: a case computed by hand, the stagger, the deadlines, and
the planned grant loop (a recording switch and hand-set counters stand in for the kernel)."""

from __future__ import annotations

import gc
from dataclasses import replace

import pytest
import simpy

from testbed.atlas.grants import GrantLoop, HopTiming, boundary_paths
from testbed.plan.grant_plan import (
    DEADLINE_TRANSFERS,
    Hop,
    Transfer,
    format_grant_plan,
    plan_grants,
    simulate_wan,
    wan_links,
)
from testbed.plan.placement import place
from testbed.plan.virtual_stages import experiment_boundaries
from testbed.spec.compute import ComputeModel
from testbed.spec.model import ModelConfig
from testbed.spec.policy import parse_policy
from testbed.spec.routing import RoutingTable
from testbed.spec.wire import TCP_GOODPUT_FRACTION
from tests.unit.experiments import exp, topo

# the timelines worked out by hand leave the worker's hand-off out (tests/unit/test_handoff.py has it)
pytestmark = pytest.mark.usefixtures("without_handoff")

D_MS = 5.0


def four_pipelines(**kw):
    """2 stages (one block each, 10 ms forward and backward) in DCs a and b, 4 replicas, GPipe,
    one microbatch of 16384 bytes of activations, 10 Mbit/s links with 5 ms one way."""
    e = exp(
        topology_spec=topo({"a": 4, "b": 4}, rate="10mbit", delay=f"{D_MS:g}ms"),
        replicas=4,
        microbatches=1,
        microbatch_size=1,
        schedule="gpipe",
        model=ModelConfig(n_layers=2, d_model=64, n_heads=4, seq_len=64),
        compute=ComputeModel(forward_ms=10, backward_ms=10),
        policy=parse_policy("atlas"),
        **kw,
    )
    return e, place(e)


def test_four_pipelines_computed_by_hand():
    e, workers = four_pipelines()
    plan = plan_grants(e, e.topology_spec, workers, connections=1, floor_share=0.05)
    granted = 10e6 * (1 - 3 * 0.05)  # the link less three held floors
    tau = 16384 * 8 / (granted * TCP_GOODPUT_FRACTION)
    assert {h.hop for h in plan.hops} == {Hop("a", "b"), Hop("b", "a")}
    for h in plan.hops:
        assert h.transfer_s == pytest.approx(tau)
        assert h.deadline_s == pytest.approx(DEADLINE_TRANSFERS * tau + 2 * D_MS / 1000)
    # by hand: replica r's activations take the link at 10 ms + r tau (one after another), reach
    # stage 1 tau + d later, its forward and backward take 20 ms, the gradients then queue the same
    # way; the last replica's gradients arrive at stage 0 at 30 + d + (R + 1) tau + d, its backward
    # ends 10 ms later: 40 ms + 2 d + (R + 1) tau
    assert plan.iteration_s == pytest.approx(0.040 + 2 * D_MS / 1000 + 5 * tau)
    assert plan.hop(Hop("a", "b")).order == tuple(Transfer("F", 0, 0, r) for r in range(4))
    assert plan.hop(Hop("b", "a")).order == tuple(Transfer("B", 0, 0, r) for r in range(4))
    # offsetting replica r by r tau costs nothing here (the link is the bottleneck): the largest
    # offset tried that is free, so pipelines take the link in turn
    assert plan.stagger_s == pytest.approx(tuple(r * tau for r in range(4)))
    assert plan.iteration_unstaggered_s == pytest.approx(plan.iteration_s)
    text = format_grant_plan(plan)
    assert "order: F0r0 F0r1 F0r2 F0r3" in text and "r3 " in text


def test_a_policy_and_the_same_with_bubbletea_share_one_plan_and_other_inputs_do_not():
    e, workers = four_pipelines()
    plan = plan_grants(e, e.topology_spec, workers, connections=1)
    with_bt = replace(e, policy=parse_policy("atlas+bubbletea"))
    assert plan_grants(with_bt, with_bt.topology_spec, workers, connections=1) is plan
    slower = plan_grants(e, e.topology_spec, workers, connections=1, block_s=(0.02, 0.04))
    assert slower is not plan and slower.iteration_s > plan.iteration_s
    assert plan_grants(e, e.topology_spec, workers, connections=1, floor_share=0.2) != plan


def test_a_connection_share_caps_the_granted_rate():
    e, workers = four_pipelines(wan_connection_share=0.1)
    plan = plan_grants(e, e.topology_spec, workers, connections=2, floor_share=0.05)
    # a tenth of the 10 Mbit/s x 10 ms bandwidth-delay product per connection: windows of 1250
    # bytes, two of them per round trip carry 2 Mbit/s of payload
    assert plan.hops[0].transfer_s == pytest.approx(16384 * 8 / 2e6)
    assert plan.hops[0].granted_bps == pytest.approx(2e6 / TCP_GOODPUT_FRACTION)  # on the wire


def test_a_dc_local_layout_has_nothing_to_grant():
    e = exp(topology_spec=topo({"a": 4}), replicas=2, policy=parse_policy("atlas"))
    plan = plan_grants(e, e.topology_spec, place(e), connections=1)
    assert plan.hops == () and "nothing to grant" in format_grant_plan(plan)


# ---- the planned grant loop -------------------------------------------------------------------------


class Recorder:
    def __init__(self):
        self.events = []

    def apply(self, hop, replica, t_ready_ns=None, event="grant"):
        self.events.append((event, hop, replica, t_ready_ns))
        return 0

    def keep(self, hop, replica, t_ready_ns):
        self.events.append(("kept", hop, replica, t_ready_ns))

    def release(self, hop, replica, t_ns, handover, reason="done", **measured):
        self.events.append(("release", hop, replica, t_ns, reason))


def _planned_loop():
    e, workers = four_pipelines()
    plan = plan_grants(e, e.topology_spec, workers, connections=1, floor_share=0.05)
    timing = HopTiming.from_plan(plan, TCP_GOODPUT_FRACTION)
    sent = {}
    switch = Recorder()
    loop = GrantLoop(
        switch,
        {w.rank: w.replica for w in workers},
        boundary_paths(workers, RoutingTable(e.topology_spec), experiment_boundaries(e)),
        sharing="planned",
        timing=timing,
        stage_of={w.rank: w.stage for w in workers},
        notice_ns={(s, d): int(D_MS * 1e6) for s in range(8) for d in range(8)},
        counters=lambda hop, replica: sent.get((hop, replica), 0),
        iteration_ns=int(plan.iteration_s * 1e9),
    )
    return loop, switch, sent, timing[Hop("a", "b")], {(w.stage, w.replica): w.rank for w in workers}


def msg(ev, src, dst, it=0, mb=0):
    return {"ev": ev, "src": src, "dst": dst, "it": it, "mb": mb}


def test_a_grant_starts_when_the_bytes_arrive_and_ends_when_they_have_passed():
    loop, switch, sent, ab, rank = _planned_loop()
    hop = Hop("a", "b")
    s0, s1 = rank[(0, 0)], rank[(1, 0)]
    loop.handle(msg("recv", s0, s1), 0)  # the receiver posted first ...
    loop.handle(msg("ready", s0, s1), 1_000_000)  # ... so the bytes go at once after the notice: 5 ms
    assert switch.events == []  # not before the bytes can come
    assert loop.next_wakeup_ns() == 5_000_000
    loop.tick(5_000_000)
    assert switch.events == [("grant", hop, 0, 5_000_000)]
    check = loop.next_wakeup_ns()
    assert check == 5_000_000 + ab.transfer_ns  # the counter is looked at when the bytes should have passed
    sent[(hop, 0)] = ab.wire_bytes // 2  # half there: look again when the rest should be
    loop.tick(check)
    assert loop.held[hop] is not None and loop.next_wakeup_ns() > check
    sent[(hop, 0)] = ab.wire_bytes
    loop.tick(loop.next_wakeup_ns())
    assert switch.events[-1][:2] == ("release", hop) and switch.events[-1][4] == "bytes"
    assert loop.held[hop] is None and loop.granted[hop] == 0  # nothing waits: the classes stay
    loop.handle(msg("done", s0, s1), 40_000_000)  # the receiver's report after the release changes nothing
    assert switch.events[-1][4] == "bytes"


def test_waiting_transfers_go_in_the_plans_order_not_their_arrival():
    loop, switch, sent, ab, rank = _planned_loop()
    hop = Hop("a", "b")
    for r, t in ((0, 10_000_000), (2, 10_000_001), (1, 10_000_002)):  # replica 2 is ready before replica 1
        loop.handle(msg("recv", rank[(0, r)], rank[(1, r)]), 0)
        loop.handle(msg("ready", rank[(0, r)], rank[(1, r)]), t)
    loop.tick(10_000_010)
    sent[(hop, 0)] = ab.wire_bytes
    loop.tick(10_000_010 + ab.transfer_ns)
    granted = [e[2] for e in switch.events if e[0] == "grant"]
    assert granted == [0, 1]  # the plan lists r1 before r2


def test_a_grant_whose_bytes_never_pass_ends_at_its_deadline():
    loop, switch, sent, ab, rank = _planned_loop()
    hop = Hop("a", "b")
    loop.handle(msg("recv", rank[(0, 0)], rank[(1, 0)]), 0)
    loop.handle(msg("ready", rank[(0, 0)], rank[(1, 0)]), 10_000_000)
    loop.tick(10_000_000)
    t = 10_000_000
    while loop.held[hop] is not None:  # the counter never moves (the bytes went elsewhere)
        t = loop.next_wakeup_ns()
        loop.tick(t)
    assert t == 10_000_000 + ab.deadline_ns and loop.deadline_releases == 1
    assert ("release", hop, 0, t, "deadline") in switch.events


def test_fifo_grants_release_at_their_deadline_without_done():
    from testbed.atlas.grants import HopTiming as T

    e, workers = four_pipelines()
    timing = {Hop("a", "b"): T(1, 0, 30_000_000, 1, 10_000_000), Hop("b", "a"): T(1, 0, 30_000_000, 1, 10_000_000)}
    switch = Recorder()
    loop = GrantLoop(
        switch,
        {w.rank: w.replica for w in workers},
        boundary_paths(workers, RoutingTable(e.topology_spec), experiment_boundaries(e)),
        timing=timing,
    )
    by = {(w.stage, w.replica): w.rank for w in workers}
    for r in (0, 1):
        loop.handle(msg("ready", by[(0, r)], by[(1, r)]), 0)
        loop.handle(msg("recv", by[(0, r)], by[(1, r)]), 0)
    assert [x[2] for x in switch.events if x[0] == "grant"] == [0]
    loop.tick(29_999_999)
    assert loop.deadline_releases == 0
    loop.tick(30_000_000)  # replica 0's done was lost: the link goes to replica 1 at the deadline
    assert loop.deadline_releases == 1
    assert [x[2] for x in switch.events if x[0] == "grant"] == [0, 1]


def test_a_lost_recv_costs_at_most_one_iteration_and_one_deadline():
    loop, switch, sent, ab, rank = _planned_loop()
    hop = Hop("a", "b")
    loop.handle(msg("ready", rank[(0, 0)], rank[(1, 0)]), 1_000_000)  # the receiver's recv never comes
    expiry = 1_000_000 + loop.iteration_ns + ab.deadline_ns
    assert switch.events == [] and loop.next_wakeup_ns() == expiry
    loop.tick(expiry - 1)  # a receiver may post late: within an iteration it is not lost
    assert switch.events == [] and loop.rendezvous.expired == 0
    loop.tick(expiry)
    assert loop.rendezvous.expired == 1 and [e[:3] for e in switch.events] == [("grant", hop, 0)]


def test_late_and_repeated_messages_about_a_finished_transfer_are_ignored():
    loop, switch, sent, ab, rank = _planned_loop()
    s0, s1 = rank[(0, 0)], rank[(1, 0)]
    loop.handle(msg("done", s0, s1), 5)  # the receiver's done overtook the sender's ready
    loop.handle(msg("ready", s0, s1), 6)
    loop.handle(msg("recv", s0, s1), 7)
    loop.tick(100_000_000)
    assert switch.events == [] and loop.next_wakeup_ns() is None


def test_a_transfer_over_two_hops_is_granted_on_the_second_one_link_delay_after_the_first():
    e = exp(
        topology_spec=topo({"a": 1, "b": 1, "c": 1}, rate="10mbit", delay="5ms"),
        replicas=1,
        stages=2,
        microbatches=1,
        microbatch_size=1,
        model=ModelConfig(n_layers=2, d_model=64, n_heads=4, seq_len=64),
        policy=parse_policy("atlas"),
    )
    from testbed.plan.workers import WorkerSpec

    workers = [WorkerSpec(0, 0, 0, "a-h0", "a"), WorkerSpec(1, 1, 0, "c-h0", "c")]  # a -> b -> c
    plan = plan_grants(e, e.topology_spec, workers, connections=1)
    timing = HopTiming.from_plan(plan, TCP_GOODPUT_FRACTION)
    switch = Recorder()
    loop = GrantLoop(
        switch,
        {0: 0, 1: 0},
        boundary_paths(workers, RoutingTable(e.topology_spec), experiment_boundaries(e)),
        sharing="planned",
        timing=timing,
        stage_of={0: 0, 1: 1},
        notice_ns={(0, 1): 10_000_000, (1, 0): 10_000_000},
        counters=lambda hop, replica: 0,
    )
    loop.handle(msg("recv", 0, 1), 0)
    loop.handle(msg("ready", 0, 1), 20_000_000)
    assert [x[:3] for x in switch.events] == [("grant", Hop("a", "b"), 0)]
    assert loop.next_wakeup_ns() == 20_000_000 + timing[Hop("a", "b")].delay_ns  # b -> c: one link later
    loop.tick(25_000_000)
    assert [x[:3] for x in switch.events] == [("grant", Hop("a", "b"), 0), ("grant", Hop("b", "c"), 0)]


def test_the_simulation_of_1f1b_keeps_every_dependency():
    """Under 1F1B with several microbatches no action starts before its input can have arrived:
    the simulated iteration is at least the fill and drain of one microbatch plus the steady state."""
    e, workers = four_pipelines()
    e = e.with_overrides(schedule="1f1b", microbatches=4)
    plan = plan_grants(e, e.topology_spec, workers, connections=1)
    tau = plan.hops[0].transfer_s
    assert plan.iteration_s >= 0.040 + 2 * D_MS / 1000 + 2 * tau  # one microbatch there and back
    assert plan.iteration_s >= 4 * 4 * tau  # each direction carries 16 transfers, one at a time
    for h in plan.hops:
        assert sorted(h.order) == sorted(Transfer(h.order[0].kind, 0, m, r) for m in range(4) for r in range(4))


def test_fifo_grants_leave_the_rendezvous_idle_only_where_held_classes_may_not_borrow():
    """On the sharing experiment, FIFO grants without borrowing hold the link for each transfer's
    notice, bytes and flight; with borrowing the held classes fill the notice and the flight, so
    FIFO is the planned sharing's one transfer at a time with no offsets (the same simulation)."""
    from testbed.plan.grant_plan import simulated_iteration
    from testbed.spec.experiment_file import load_experiment

    fifo = load_experiment("sharing").with_overrides(policy="pp-fair/placement=atlas/striping=on/sharing=fifo")
    assert fifo.atlas_borrow
    workers = place(fifo)
    n = 4
    borrowing = simulated_iteration(fifo, fifo.topology_spec, workers, n)
    held = simulated_iteration(fifo.with_overrides(atlas_borrow=False), fifo.topology_spec, workers, n)
    assert borrowing < held
    from testbed.plan.grant_plan import granted_class_bps, held_floor_share, wan_links
    from testbed.plan.grant_sim import simulate

    wan = wan_links(
        fifo, fifo.topology_spec, workers, n, lambda bps: granted_class_bps(bps, fifo.replicas, held_floor_share(fifo))
    )
    planned, _ = simulate(
        fifo, workers, wan.links, wan.paths, wan.one_way_s, (0.0,) * fifo.replicas, sharing="planned", stripes=n
    )
    assert borrowing == pytest.approx(planned)


def test_a_notice_queued_behind_the_receivers_own_bytes_waits_for_them():
    """Replica 0's gradient (stage 1 -> 0, link b->a) is granted at 5 ms. At 6 ms stage 1 posts
    the receive of the next activation: gloo writes its notice behind the gradient's bytes still
    leaving, so the activation (a->b) is not granted 5 ms later but one notice after the
    gradient's bytes have passed; a receive posted once they have passed is not held back."""
    loop, switch, sent, ab, rank = _planned_loop()
    s0, s1 = rank[(0, 0)], rank[(1, 0)]
    ba, hop = Hop("b", "a"), Hop("a", "b")
    loop.handle(msg("recv", s1, s0), 0)
    loop.handle(msg("ready", s1, s0), 0)
    loop.tick(5_000_000)
    assert switch.events == [("grant", ba, 0, 5_000_000)]
    loop.handle(msg("recv", s0, s1, mb=1), 6_000_000)
    loop.handle(msg("ready", s0, s1, mb=1), 7_000_000)
    loop.tick(11_000_000)  # the notice alone would have crossed by now
    assert [e for e in switch.events if e[0] == "grant"] == [("grant", ba, 0, 5_000_000)]
    sent[(ba, 0)] = loop.timing[ba].wire_bytes
    passed = loop.next_wakeup_ns()
    loop.tick(passed)  # the gradient's bytes have passed: the notice leaves now
    assert switch.events[-1][:2] == ("release", ba)
    assert loop.next_wakeup_ns() == passed + D_MS * 1_000_000
    loop.tick(passed + D_MS * 1_000_000)
    assert switch.events[-1] == ("grant", hop, 0, passed + D_MS * 1_000_000)
    # replica 1: its receive posted after its gradient passed goes as usual
    r0, r1 = rank[(0, 1)], rank[(1, 1)]
    t = passed + 100_000_000
    loop.handle(msg("recv", r1, r0), t)
    loop.handle(msg("ready", r1, r0), t)
    loop.tick(t + D_MS * 1_000_000)
    sent[(ba, 1)] = loop.timing[ba].wire_bytes
    t2 = loop.next_wakeup_ns()
    loop.tick(t2)
    loop.handle(msg("recv", r0, r1, mb=1), t2 + 1)
    loop.handle(msg("ready", r0, r1, mb=1), t2 + 1)
    assert loop.next_wakeup_ns() == t2 + 1 + D_MS * 1_000_000


def test_over_two_hops_a_notice_behind_the_receivers_bytes_comes_with_them():
    """Stage 1's gradient goes back over c->b (fast: 1 ms) then b->a (slow: 20 ms), 5 ms a hop.
    Stage 1 posts the next activation's receive while the gradient leaves: its notice travels
    behind the gradient's bytes, which wait at b->a after passing c->b, so the activation (a->b->c)
    is granted only once they have passed b->a and crossed it (its release plus 5 ms), not one
    notice (10 ms) after they passed the first hop (random-7-113, docs/results.md)."""
    ab, bc, cb, ba = Hop("a", "b"), Hop("b", "c"), Hop("c", "b"), Hop("b", "a")
    ms = 1_000_000
    timing = {h: HopTiming(t * ms, 5 * ms, 1000 * ms, 10_000, 10**8) for h, t in ((ab, 20), (bc, 1), (cb, 1), (ba, 20))}
    sent: dict = {}
    switch = Recorder()
    loop = GrantLoop(
        switch,
        {0: 0, 1: 0},
        {(0, 1): [ab, bc], (1, 0): [cb, ba]},
        sharing="planned",
        timing=timing,
        stage_of={0: 0, 1: 1},
        notice_ns={(0, 1): 10 * ms, (1, 0): 10 * ms},
        counters=lambda hop, replica: sent.get((hop, replica), 0),
        iteration_ns=10_000 * ms,
    )
    loop.handle(msg("recv", 1, 0), 0)  # the gradient: stage 0 waits for it
    loop.handle(msg("ready", 1, 0), 0)
    loop.tick(10 * ms)
    assert ("grant", cb, 0, 10 * ms) in switch.events
    loop.handle(msg("recv", 0, 1, mb=1), 11 * ms)  # behind the gradient's bytes
    loop.handle(msg("ready", 0, 1, mb=1), 12 * ms)
    sent[(cb, 0)] = timing[cb].wire_bytes
    loop.tick(loop.next_wakeup_ns())
    first = next(e[3] for e in switch.events if e[:2] == ("release", cb))
    loop.tick(first + 10 * ms)  # a notice that left there would have crossed by now
    assert not [e for e in switch.events if e[:2] == ("grant", ab)]
    sent[(ba, 0)] = timing[ba].wire_bytes
    while not any(e[:2] == ("release", ba) for e in switch.events):
        loop.tick(loop.next_wakeup_ns())
    last = next(e[3] for e in switch.events if e[:2] == ("release", ba))
    assert loop.next_wakeup_ns() == last + 5 * ms
    loop.tick(last + 5 * ms)
    assert switch.events[-1] == ("grant", ab, 0, last + 5 * ms)


@pytest.mark.parametrize("enabled", [True, False])
def test_the_simulation_leaves_the_garbage_collector_as_it_found_it(enabled, monkeypatch):
    """The collector is held off while a simulation runs (its speed: grant_sim._collector_paused),
    then left as it was, also when the simulation raises."""
    e, workers = four_pipelines()
    wan = wan_links(e, e.topology_spec, workers, 1, float)
    seen = []
    real_run = simpy.Environment.run

    def run(env, *args, **kwargs):
        seen.append(gc.isenabled())
        return real_run(env, *args, **kwargs)

    monkeypatch.setattr(simpy.Environment, "run", run)
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        simulate_wan(e, e.topology_spec, workers, wan, (0.0,) * 4)
        assert seen == [False]
        assert gc.isenabled() is enabled
        with pytest.raises(ValueError, match="unknown sharing"):
            simulate_wan(e, e.topology_spec, workers, wan, (0.0,) * 4, sharing="nonsense")
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()
