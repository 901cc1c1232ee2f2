"""Atlas's grant plan and BubbleTea's bubble priors made again when a link's profile changes its
rate or delay while a run trains:
the runner follows the ``profile_step`` lines of the run's ``shaping.jsonl`` (the figures the
profile set, not guessed), plans the grants for the topology as it is now (``grant_plan.plan_grants``,
the function that made the first plan, on the run's placement and connections, from the profiled
stage times where the run has them), and hands the plan and the links' new rates to the controller
(``Controller.replan``: every grant compiled again at the new rates, the grants held applied again
at once). Each re-plan is a line of ``replans.jsonl``: the step it follows, how long planning and
handing over took, the new order on each link direction and the plan's iteration; steps that take
a link down are not planned for (nothing crosses it), the step that brings it back is."""

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
from testbed.trace.jsonl import JsonlFollower, open_jsonl, write_row
from testbed.trace.shaping_log import PROFILE_STEP, SHAPING_LOG

REPLANS_FILE = "replans.jsonl"


def hop_orders(plan: GrantPlan) -> dict[str, list[str]]:
    """Each link direction's order of transfers (``src->dst``: ``F2r1``, replica 1's activations of
    microbatch 2; ``B`` for gradients), as the plan grants them."""
    return {f"{h.hop.src}->{h.hop.dst}": [f"{o.kind}{o.microbatch}r{o.replica}" for o in h.order] for h in plan.hops}


class LinkReplans:
    """Polled by the run's watch loop (``watch.py``). ``stage_s``: the profiled stage times once the
    run has them (None: the compute targets); ``stagger_path``: where the first stages read their
    offsets (planned sharing), or None; ``ready``: whether the run's first plan is made (a run
    that profiles its first iteration plans once it has; a step before that is planned for then)."""

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
        self.states = {f"{x.a}:{x.b}": x.state for x in self.spec.links}
        self.log = JsonlFollower(out_dir / SHAPING_LOG)
        self.count = 0
        #: the last step that changed a rate or delay and has not been planned for yet
        self.pending: dict | None = None

    def poll(self) -> None:
        steps = [row for row in self.log.new_rows() if row.get("event") == PROFILE_STEP]
        changed = None
        for row in steps:
            before = self.states[row["link"]]
            after = LinkState(row["rate_bps"], row["delay_us"], row["jitter_us"], row["loss_pct"])
            self.states[row["link"]] = after
            if set(after.differs(before)) & {"rate", "delay"}:
                changed = row
        if changed is not None:
            self.pending = changed
        if self.pending is not None and all(s.up for s in self.states.values()) and self.ready():
            step, self.pending = self.pending, None
            self.replan(step)

    def replan(self, step: dict) -> None:
        """Plan for the links as they are now and hand the plan to the controller, and the bubbles
        predicted then to BubbleTea's workers (module doc)."""
        t0 = time.monotonic_ns()
        exp, workers = self.run_plan.experiment, list(self.run_plan.workers)
        phase = experiment_at(exp, self.states, workers)
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
            self.controller.replan(plan, link_rates=rates)
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
                    "step_ns": step["t_ns"],
                    "link": step["link"],
                    "profile_t_us": step["profile_t_us"],
                    "t_ns": t_done,
                    "after_step_ms": (t_done - step["t_ns"]) / 1e6,
                    "planning_ms": (t_planned - t0) / 1e6,
                    "handover_ms": (t_done - t_planned) / 1e6,
                    "links": {k: {"rate_bps": s.rate_bps, "delay_us": s.delay_us} for k, s in self.states.items()},
                    "order": hop_orders(plan) if plan is not None else None,
                    "iteration_s": plan.iteration_s if plan is not None else None,
                    "bubble_priors": len(priors),
                },
            )
        if plan is not None:
            with open(self.out_dir / "grant_plan_replanned.txt", "a") as f:
                f.write(f"re-planned after {step['link']}'s step at {step['profile_t_us'] / 1e6:g} s:\n")
                f.write(format_grant_plan(plan) + "\n\n")
        what = " and ".join(x for x, on in (("grant plan", plan is not None), ("bubble priors", bool(priors))) if on)
        self.progress(
            f"{what or 'nothing'} made again for {step['link']}'s profile step at {step['profile_t_us'] / 1e6:g} s "
            f"in {(t_done - t0) / 1e6:.0f} ms"
        )
