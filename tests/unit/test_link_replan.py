"""Atlas's plan made again on a link profile's step (``run/link_replan.py``): the topology as it is
now (routed as built), the steps read from the shaping log, outages not planned for, and the grant
loop applying its grants again at the links' new rates (``GrantLoop.relink``)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from testbed.atlas.grants import GrantLoop, Hop
from testbed.plan.boundary_transfers import boundary_paths
from testbed.plan.profile_phases import profile_phases, topology_at
from testbed.plan.workers import WorkerSpec
from testbed.run.link_replan import REPLANS_FILE, LinkReplans
from testbed.spec.experiment_file import load_experiment
from testbed.spec.link_profile import LinkState
from testbed.spec.routing import RoutingTable
from testbed.spec.topology_file import load_topology, parse_topology
from testbed.trace.jsonl import open_jsonl, write_row
from testbed.trace.shaping_log import LINK_DOWN, LINK_RATE, LINK_UP, PROFILE_STEP, REROUTE, SHAPING_LOG
from tests.unit.test_controller_logic import RecordingSwitch, msg

REPO = Path(__file__).resolve().parents[2]


def test_the_topology_now_keeps_the_routes_it_was_built_with():
    spec = load_topology("three_dc")
    assert RoutingTable(spec).route("east", "central").dcs == ("east", "central")
    # east:central at 60 ms: least-delay routing would go through west (30 + 25 ms), the network does not
    now = topology_at(spec, {"east:central": LinkState(20_000_000, 60_000)})
    link = now.link_between("east", "central")
    assert (link.rate_bps, link.delay_us, link.route_us, link.profile) == (20_000_000, 60_000, 10_000, None)
    routes = RoutingTable(now)
    assert routes.route("east", "central").dcs == ("east", "central")
    assert routes.one_way_delay_us("east", "central") == 60_000  # the delay is the new one
    unchanged = now.link_between("east", "west")
    assert unchanged is not None and unchanged.state == spec.links[2].state and unchanged.route_metric_us == 30_000


class _Controller:
    def __init__(self) -> None:
        self.calls: list = []

    def replan(self, plan, sharing=None, link_rates=None, routes=None):
        self.calls.append((plan, link_rates))
        self.routes = routes


def _step(log, link, t_us, rate, delay):
    row = {"t_ns": 10**9 + t_us * 1000, "event": PROFILE_STEP, "link": link, "profile_t_us": t_us}
    write_row(log, {**row, "rate_bps": rate, "delay_us": delay, "jitter_us": 0, "loss_pct": 0.0})


def test_a_step_is_planned_for_once_and_an_outage_is_not(tmp_path):
    exp = load_experiment("sharing").with_overrides(policy="atlas")
    from testbed.plan.run_plan import make_plan

    plan = make_plan(exp)
    controller = _Controller()
    replans = LinkReplans(plan, controller, tmp_path, lambda _: None)  # type: ignore[arg-type]
    replans.poll()  # no log yet
    with open_jsonl(tmp_path / SHAPING_LOG) as log:
        _step(log, "east:west", 0, 25_000_000, 20_000)  # the first step: the link's own figures
    replans.poll()
    assert controller.calls == []
    with open_jsonl(tmp_path / SHAPING_LOG) as log:
        _step(log, "east:west", 8_000_000, 3_000_000, 20_000)
    replans.poll()
    [(grant_plan, rates)] = controller.calls
    assert rates == {("east", "west"): 3_000_000}
    assert grant_plan.hops[0].rate_bps == 3_000_000 and grant_plan.iteration_s > plan.grant_plan.iteration_s
    row = json.loads((tmp_path / REPLANS_FILE).read_text())
    assert row["profile_t_us"] == 8_000_000 and row["planning_ms"] >= 0
    # at 3 Mbit/s the link's order is not the one at 25 Mbit/s: a pipeline's second microbatch goes
    # before the fourth pipeline's first
    before = [f"{o.kind}{o.microbatch}r{o.replica}" for o in plan.grant_plan.hops[0].order]
    assert row["order"]["east->west"] != before
    with open_jsonl(tmp_path / SHAPING_LOG) as log:
        write_row(log, {"t_ns": 3 * 10**9, "event": LINK_DOWN, "link": "east:west"})
        _step(log, "east:west", 9_000_000, 0, 20_000)
    replans.poll()
    assert len(controller.calls) == 1  # down: nothing to plan
    with open_jsonl(tmp_path / SHAPING_LOG) as log:  # the profile brings it back: its link_up, then its step
        write_row(log, {"t_ns": 4 * 10**9, "event": LINK_UP, "link": "east:west"})
        _step(log, "east:west", 10_000_000, 25_000_000, 20_000)
    replans.poll()
    assert len(controller.calls) == 2 and controller.calls[1][1] == {("east", "west"): 25_000_000}


def test_a_run_that_profiles_first_plans_a_step_once_its_first_plan_is_made(tmp_path):
    from testbed.plan.run_plan import make_plan

    plan = make_plan(load_experiment("sharing").with_overrides(policy="atlas"))
    controller, ready = _Controller(), SimpleNamespace(done=False)
    replans = LinkReplans(plan, controller, tmp_path, lambda _: None, ready=lambda: ready.done)  # type: ignore[arg-type]
    with open_jsonl(tmp_path / SHAPING_LOG) as log:
        _step(log, "east:west", 5_000_000, 12_000_000, 20_000)
    replans.poll()
    assert controller.calls == []
    ready.done = True
    replans.poll()
    assert len(controller.calls) == 1


def test_relink_applies_each_hops_grant_again_at_the_new_rates():
    topo = parse_topology(
        {
            "dcs": [{"name": "a", "hosts": 2}, {"name": "b", "hosts": 2}],
            "links": [{"between": ["a", "b"], "rate": "10mbit", "delay": "5ms"}],
        },
        "t",
    )
    workers = [WorkerSpec(0, 0, 0, "a-h0", "a"), WorkerSpec(1, 0, 1, "a-h1", "a")]
    workers += [WorkerSpec(2, 1, 0, "b-h0", "b"), WorkerSpec(3, 1, 1, "b-h1", "b")]

    class Switch(RecordingSwitch):
        def relink(self, batches):
            self.events.append(("relink", batches))

    switch = Switch()
    loop = GrantLoop(
        switch, {w.rank: w.replica for w in workers}, boundary_paths(workers, RoutingTable(topo), [(0, 1)])
    )
    loop.handle(msg("ready", 1, 3), 10)
    loop.handle(msg("recv", 1, 3), 11)  # replica 1 holds a->b
    switch.events.clear()
    loop.relink({"new": "batches"}, 20)
    assert switch.events[0] == ("relink", {"new": "batches"})
    applied = {(e[1], e[2]) for e in switch.events[1:]}
    assert applied == {(Hop("a", "b"), 1), (Hop("b", "a"), "open")}


def _profiled(tmp_path, a_profile, b_profile):
    data = {
        "dcs": [{"name": "x", "hosts": 1}, {"name": "y", "hosts": 1}, {"name": "z", "hosts": 1}],
        "links": [
            {"between": ["x", "y"], "rate": "50mbit", "delay": "10ms", "profile": a_profile},
            {"between": ["y", "z"], "rate": "40mbit", "delay": "5ms", "profile": b_profile},
        ],
    }
    return parse_topology(data, str(tmp_path / "t.yaml"))


def test_the_phases_merge_every_links_changes(tmp_path):
    spec = _profiled(
        tmp_path,
        {"generator": "step", "at": "10s", "rate": "20mbit"},
        {"generator": "on_off", "up": "4s", "down": "2s"},
    )
    phases = profile_phases(spec)
    assert [(p.start_us // 10**6, p.end_us // 10**6) for p in phases] == [(0, 4), (4, 6), (6, 10)]
    assert [p.all_up for p in phases] == [True, False, True]
    assert phases[0].states == {"x:y": LinkState(50_000_000, 10_000), "y:z": LinkState(40_000_000, 5_000)}
    longer = profile_phases(spec, 13_000_000)
    assert longer[3].start_us == 10_000_000 and longer[3].states["x:y"].rate_bps == 20_000_000
    assert longer[-1].when == "12-13 s" and "y:z down" in longer[-2].describe()


def test_a_profile_that_holds_ends_in_a_phase_for_ever(tmp_path):
    spec = _profiled(
        tmp_path,
        {"generator": "step", "at": "10s", "rate": "20mbit"},
        {"generator": "step", "at": "3s", "delay": "9ms"},
    )
    phases = profile_phases(spec)
    assert [p.when for p in phases] == ["0-3 s", "3-10 s", "from 10 s on"]
    assert profile_phases(load_topology("three_dc")) == []


def test_bubbletea_s_workers_get_the_bubbles_predicted_for_the_new_wan(tmp_path):
    from testbed.plan.run_plan import make_plan
    from testbed.run.bubbletea_setup import bubble_prior

    exp = load_experiment("sharing").with_overrides(policy="pp-fair+bubbletea")
    plan = make_plan(exp)
    sent: list = []
    replans = LinkReplans(plan, None, tmp_path, lambda _: None, priors=sent.append)
    with open_jsonl(tmp_path / SHAPING_LOG) as log:
        _step(log, "east:west", 0, 25_000_000, 20_000)
        _step(log, "east:west", 8_000_000, 3_000_000, 20_000)
    replans.poll()
    [priors] = sent
    before, _ = bubble_prior(plan)
    assert set(priors) == set(before) and priors != before
    # at 3 Mbit/s the stages wait longer for their inputs: the bubbles before them grow
    assert sum(sum(p.values()) for p in priors.values()) > sum(sum(p.values()) for p in before.values())
    row = json.loads((tmp_path / REPLANS_FILE).read_text())
    assert row["bubble_priors"] == len(priors) and row["order"] is None


def test_a_new_prior_replaces_what_the_predictor_had_seen():
    from testbed.bubbletea.decisions import SlotPredictor

    p = SlotPredictor(2, {"F1": 0.05})
    p.observe("F1", 0.04)
    assert p.predict("F1") == 0.04
    p.reprior({"F1": 0.2, "B0": 0.1})
    assert (p.predict("F1"), p.predict("B0")) == (0.2, 0.1)


def test_a_worker_takes_a_prior_sent_to_its_inbox(tmp_path):
    """``send_priors`` (the runner) to a worker's inbox socket, read by ``PrefillServer.poll_inbox``."""
    from testbed.bubbletea.decisions import SlotPredictor
    from testbed.bubbletea.dispatcher_link import DispatcherLink
    from testbed.bubbletea.prefill import PrefillServer
    from testbed.run.bubbletea_setup import send_priors

    inbox = tmp_path / "w3.sock"
    link = DispatcherLink(str(inbox), str(tmp_path / "dispatcher.sock"))
    try:
        cfg = SimpleNamespace(inbox_of=lambda rank: str(tmp_path / f"w{rank}.sock"))
        send_priors(cfg, {"3": {"F1": 0.25}, "4": {"F1": 0.5}})  # worker 4 is gone: skipped
        server = SimpleNamespace(link=link, predictor=SlotPredictor(2, {"F1": 0.1}), jobs=[])
        server.predictor.observe("F1", 0.05)
        PrefillServer.poll_inbox(server)  # type: ignore[arg-type]
        assert server.predictor.predict("F1") == 0.25 and server.jobs == []
    finally:
        link.close()


def test_testbed_link_rate_from_another_shell_is_planned_for(tmp_path):
    """``testbed link rate`` logs a ``link_rate`` line; the controller gets a plan at that rate."""
    from testbed.plan.run_plan import make_plan

    plan = make_plan(load_experiment("sharing").with_overrides(policy="atlas"))
    controller = _Controller()
    replans = LinkReplans(plan, controller, tmp_path, lambda _: None)  # type: ignore[arg-type]
    with open_jsonl(tmp_path / SHAPING_LOG) as log:
        # a grant's class change on the way: not a link's rate, not parsed
        write_row(log, {"t_ns": 1, "event": "change", "classid": "1:20", "rate_bps": 1, "ceil_bps": 1})
        write_row(log, {"t_ns": 2, "event": LINK_RATE, "link": "east:west", "rate_bps": 5_000_000})
    replans.poll()
    [(grant_plan, rates)] = controller.calls
    assert rates == {("east", "west"): 5_000_000} and grant_plan.hops[0].rate_bps == 5_000_000
    row = json.loads((tmp_path / REPLANS_FILE).read_text())
    assert (row["cause"], row["link"], row["profile_t_us"], row["routed_off"]) == (LINK_RATE, "east:west", None, [])


def test_a_failed_over_link_is_planned_around_once_the_routes_move_and_again_when_they_return(tmp_path):
    """three_dc's central:west fails over: down, nothing is planned (the routers have not moved
    yet); once they have (``reroute``), the plan goes through east and the controller is given
    routes that do; when the link returns and the routes move back, the plan is the first one."""
    from testbed.plan.run_plan import make_plan

    data = yaml.safe_load((REPO / "topologies" / "three_dc.yaml").read_text())
    data["links"][1]["failover"] = True
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(data))
    exp = load_experiment().with_overrides(topology=str(tmp_path / "t.yaml"), policy="atlas")
    plan = make_plan(exp)
    controller = _Controller()
    replans = LinkReplans(plan, controller, tmp_path, lambda _: None)  # type: ignore[arg-type]
    with open_jsonl(tmp_path / SHAPING_LOG) as log:
        write_row(log, {"t_ns": 10, "event": LINK_DOWN, "link": "central:west"})
    replans.poll()
    assert controller.calls == []
    with open_jsonl(tmp_path / SHAPING_LOG) as log:
        write_row(log, {"t_ns": 20, "event": REROUTE, "down": ["central:west"], "moved": []})
    replans.poll()
    [(around, _)] = controller.calls
    assert controller.routes.route("central", "west").dcs == ("central", "east", "west")
    hops = {f"{h.hop.src}->{h.hop.dst}" for h in around.hops}
    assert "central->west" not in hops and {"central->east", "east->west"} <= hops
    with open_jsonl(tmp_path / SHAPING_LOG) as log:
        write_row(log, {"t_ns": 30, "event": LINK_UP, "link": "central:west"})
    replans.poll()
    assert len(controller.calls) == 1  # the routes have not moved back yet: the plan holds
    with open_jsonl(tmp_path / SHAPING_LOG) as log:
        write_row(log, {"t_ns": 40, "event": REROUTE, "down": [], "moved": []})
    replans.poll()
    assert len(controller.calls) == 2
    assert controller.routes.route("central", "west").dcs == ("central", "west")
    assert controller.calls[1][0].iteration_s == plan.grant_plan.iteration_s
    rows = [json.loads(x) for x in (tmp_path / REPLANS_FILE).read_text().splitlines()]
    assert [(r["cause"], r["routed_off"]) for r in rows] == [(REROUTE, ["central:west"]), (REROUTE, [])]


def test_the_grant_loop_follows_the_transfers_to_their_new_paths():
    """``GrantLoop.reroute``: the held grant is released (``reroute``), every class opened, and a
    transfer ready afterwards is granted on each hop of its new path; a path over a link
    direction without classes is refused."""
    topo = parse_topology(
        {
            "dcs": [{"name": n, "hosts": 1} for n in ("a", "b", "c")],
            "links": [
                {"between": ["a", "b"], "rate": "10mbit", "delay": "5ms"},
                {"between": ["a", "c"], "rate": "10mbit", "delay": "5ms"},
                {"between": ["c", "b"], "rate": "10mbit", "delay": "5ms"},
            ],
        },
        "t",
    )
    workers = [WorkerSpec(0, 0, 0, "a-h0", "a"), WorkerSpec(1, 1, 0, "b-h0", "b")]
    direct = boundary_paths(workers, RoutingTable(topo), [(0, 1)])
    around = {(0, 1): [Hop("a", "c"), Hop("c", "b")], (1, 0): [Hop("b", "c"), Hop("c", "a")]}
    extra = {h for hs in around.values() for h in hs}
    switch = RecordingSwitch()
    loop = GrantLoop(switch, {0: 0, 1: 0}, direct, links=extra)
    loop.handle(msg("ready", 0, 1), 10)
    loop.handle(msg("recv", 0, 1), 11)
    assert switch.events == [("grant", Hop("a", "b"), 0, 11)]
    switch.events.clear()
    loop.reroute(around, {(0, 1): 5_000_000, (1, 0): 5_000_000}, 20)
    assert switch.events[0] == ("release", Hop("a", "b"), 0, 20, False, "reroute")
    assert {e[1] for e in switch.events[1:] if e[:1] == ("grant",) and e[2] == "open"} == set(loop.held)
    switch.events.clear()
    loop.handle(msg("done", 0, 1), 30)  # the transfer in flight at the move: nothing held for it
    assert switch.events == []
    loop.handle(msg("ready", 0, 1, mb=1), 40)
    loop.handle(msg("recv", 0, 1, mb=1), 41)
    assert switch.events == [("grant", Hop("a", "c"), 0, 41), ("grant", Hop("c", "b"), 0, 41)]
    with pytest.raises(ValueError, match="no classes on b->z: cannot grant there"):
        loop.reroute({(1, 0): [Hop("b", "z")]}, {}, 50)
