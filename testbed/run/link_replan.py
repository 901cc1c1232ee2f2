"""Atlas's grant plan and BubbleTea's bubble priors made again when the WAN changes while a run
trains. The runner follows the run's ``shaping.jsonl`` (the figures set, not guessed): a link
profile's ``profile_step`` lines, ``testbed link rate`` from another shell (``link_rate``), links
going down and up (``link_down``, ``link_up``, by a profile or ``testbed link``) and the routers'
moves around failed-over links (``reroute``, ``net/failover.py``). On a change of a link's rate
or delay, or of the routes, it plans the grants for the topology as it is then
(``grant_plan.plan_grants``, the function that made the first plan, on the run's placement and
connections, from the profiled stage times where the run has them; a link the routes avoid left
out), and hands the plan, the links' new rates and the routes to the controller
(``Controller.replan``: every grant compiled again at the new rates, the grants held applied again
at once; on new routes the grant loop follows each transfer's new path: ``GrantLoop.reroute``).
Each re-plan is a line of ``replans.jsonl``: what it follows, how long planning and handing over
took, the new order on each link direction and the plan's iteration. While a link is down and
the routes have not moved off it, nothing is planned (nothing crosses it): a change then is
planned for once the routes move or the link returns."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from testbed.atlas.controller import Controller
from testbed.plan.grant_plan import GrantPlan, format_grant_plan, plan_grants
from testbed.plan.profile_phases import experiment_at
from testbed.plan.run_plan import RunPlan, make_plan
from testbed.plan.worker_config import write_stagger
from testbed.run.bubbletea_setup import bubble_prior
from testbed.spec.link_profile import LinkState
from testbed.spec.routing import RoutingTable
from testbed.trace.jsonl import JsonlFollower, open_jsonl, write_row
from testbed.trace.shaping_log import LINK_DOWN, LINK_RATE, LINK_UP, PROFILE_STEP, REROUTE, SHAPING_LOG

REPLANS_FILE = "replans.jsonl"
#: the shaping log's lines a re-plan follows
FOLLOWED = (PROFILE_STEP, LINK_RATE, LINK_DOWN, LINK_UP, REROUTE)


def hop_orders(plan: GrantPlan) -> dict[str, list[str]]:
    """Each link direction's order of transfers (``src->dst``: ``F2r1``, replica 1's activations of
    microbatch 2; ``B`` for gradients), as the plan grants them."""
    return {f"{h.hop.src}->{h.hop.dst}": [f"{o.kind}{o.microbatch}r{o.replica}" for o in h.order] for h in plan.hops}


class LinkReplans:
    """Polled by the run's watch loop (``watch.py``). ``stage_s``: the profiled stage times once the
    run has them (None: the compute targets); ``stagger_path``: where the first stages read their
    offsets (planned sharing), or None; ``ready``: whether the run's first plan is made (a run
    that profiles its first iteration plans once it has; a change before that is planned for then)."""

    def __init__(
        self,
        run_plan: RunPlan,
        controller: Controller | None,
        out_dir: Path,
        progress: Callable[[str], object],
        stage_s: Callable[[], tuple[tuple[float, float], ...] | None] = lambda: None,
        stagger_path: Path | None = None,
        ready: Callable[[], bool] = lambda: True,
        priors: Callable[[dict[str, dict[str, float]]], None] | None = None,
    ) -> None:
        self.run_plan, self.controller, self.out_dir, self.progress = run_plan, controller, out_dir, progress
        self.priors = priors
        self.stage_s, self.stagger_path, self.ready = stage_s, stagger_path, ready
        self.spec = run_plan.experiment.topology_spec
        #: each link's figures as last set (a profile's step, ``testbed link rate``)
        self.states = {f"{x.a}:{x.b}": x.state for x in self.spec.links}
        #: links down now (``link_down`` without its ``link_up`` yet), and those the routers route around
        self.down: set[str] = set()
        self.routed_off: set[str] = set()
        self.log = JsonlFollower(out_dir / SHAPING_LOG, FOLLOWED)
        self.count = 0
        #: the last change that has not been planned for yet
        self.pending: dict | None = None

    def poll(self) -> None:
        changed = None
        for row in self.log.new_rows():
            event, link = row.get("event"), row.get("link")
            if event == LINK_DOWN:
                self.down.add(link)
            elif event == LINK_UP:
                self.down.discard(link)
            elif event == REROUTE:
                if set(row["down"]) != self.routed_off:
                    self.routed_off = set(row["down"])
                    changed = row
            elif event in (PROFILE_STEP, LINK_RATE) and link in self.states:
                before = self.states[link]
                after = (
                    replace(before, rate_bps=row["rate_bps"])
                    if event == LINK_RATE
                    else LinkState(row["rate_bps"], row["delay_us"], row["jitter_us"], row["loss_pct"])
                )
                self.states[link] = after
                if set(after.differs(before)) & {"rate", "delay"}:
                    changed = row
        if changed is not None:
            self.pending = changed
        stalled = any(not s.up for k, s in self.states.items() if k not in self.routed_off)
        stalled |= bool(self.down - self.routed_off)
        if self.pending is not None and not stalled and self.ready():
            cause, self.pending = self.pending, None
            self.replan(cause)

    def replan(self, cause: dict) -> None:
        """Plan for the links as they are now and hand the plan to the controller, and the bubbles
        predicted then to BubbleTea's workers (module doc). ``cause``: the log's line planned for."""
        t0 = time.monotonic_ns()
        exp, workers = self.run_plan.experiment, list(self.run_plan.workers)
        phase = experiment_at(exp, self.states, workers, self.routed_off)
        spec = phase.topology_spec
        plan = None
        if self.controller is not None:
            plan = plan_grants(phase, spec, workers, self.run_plan.connections, stage_s=self.stage_s())
        priors: dict[str, dict[str, float]] = {}
        if self.priors is not None:
            priors, _ = bubble_prior(replace(make_plan(phase, workers), connections=self.run_plan.connections))
        t_planned = time.monotonic_ns()
        if self.controller is not None and plan is not None:
            rates = {(x.a, x.b): x.rate_bps for x in spec.links}
            self.controller.replan(plan, link_rates=rates, routes=RoutingTable(spec))
            if self.stagger_path is not None and exp.policy.sharing == "planned":
                write_stagger(self.stagger_path, plan.stagger_s)
        if self.priors is not None and priors:
            self.priors(priors)
        t_done = time.monotonic_ns()
        self.count += 1
        with open_jsonl(self.out_dir / REPLANS_FILE) as log:
            write_row(
                log,
                {
                    "step_ns": cause["t_ns"],
                    "cause": cause["event"],
                    "link": cause.get("link"),
                    "profile_t_us": cause.get("profile_t_us"),
                    "t_ns": t_done,
                    "after_step_ms": (t_done - cause["t_ns"]) / 1e6,
                    "planning_ms": (t_planned - t0) / 1e6,
                    "handover_ms": (t_done - t_planned) / 1e6,
                    "links": {k: {"rate_bps": s.rate_bps, "delay_us": s.delay_us} for k, s in self.states.items()},
                    "routed_off": sorted(self.routed_off),
                    "order": hop_orders(plan) if plan is not None else None,
                    "iteration_s": plan.iteration_s if plan is not None else None,
                    "bubble_priors": len(priors),
                },
            )
        after = describe_cause(cause)
        if plan is not None:
            with open(self.out_dir / "grant_plan_replanned.txt", "a") as f:
                f.write(f"re-planned after {after}:\n")
                f.write(format_grant_plan(plan) + "\n\n")
        what = " and ".join(x for x, on in (("grant plan", plan is not None), ("bubble priors", bool(priors))) if on)
        self.progress(f"{what or 'nothing'} made again after {after} in {(t_done - t0) / 1e6:.0f} ms")


def describe_cause(row: dict) -> str:
    """What a re-plan followed, in words: ``east:west's profile step at 8 s``, ``testbed link rate
    east:west 20 Mbit/s``, ``the routes moved off central:west`` (or back onto every link)."""
    if row["event"] == PROFILE_STEP:
        return f"{row['link']}'s profile step at {row['profile_t_us'] / 1e6:g} s"
    if row["event"] == LINK_RATE:
        return f"testbed link rate {row['link']} {row['rate_bps'] / 1e6:g} Mbit/s"
    off = ", ".join(row["down"])
    return f"the routes moved off {off}" if off else "the routes moved back onto every link"
