"""The first iteration's compute, profiled, for Atlas's grant plan under real compute (the Atlas
issue, item 1): with padded compute the plan is made before the run from the padding targets;
with ``compute.mode: real`` those targets say nothing of how long an operation takes, so the
controller grants earliest ready first during iteration 0, and once every worker has finished it
the runner reads each stage's forward and backward times from the workers' traces, makes the plan
from them and hands it to the controller (``Controller.replan``) and the stagger to the first
stages (``worker_config.write_stagger``), which apply it from their next iteration on."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from testbed.atlas.controller import Controller
from testbed.plan.grant_plan import GrantPlan, format_grant_plan
from testbed.plan.run_plan import RunPlan, make_plan
from testbed.plan.virtual_stages import experiment_homes
from testbed.plan.worker_config import write_stagger
from testbed.plan.workers import WorkerSpec
from testbed.run.records import record_plan
from testbed.trace import schema as T
from testbed.trace.clock import now_ns
from testbed.trace.jsonl import read_jsonl

#: the profiled iteration
PROFILED_ITERATION = 0


def stage_times_s(
    events_dir: Path, workers: list[WorkerSpec], stages: int, iteration: int = PROFILED_ITERATION
) -> tuple[tuple[float, float], ...] | None:
    """Each of the ``stages`` virtual stages' (forward, backward) seconds on one microbatch in
    ``iteration`` (a worker's stage where each holds one): the median of every forward and backward
    its replicas traced (``padded_ns``: the real time under real compute; a split backward's two
    parts added up). None until every worker has traced that iteration's optimizer step."""
    ops: dict[int, dict[str, list[int]]] = {s: {T.FORWARD: [], T.BACKWARD: []} for s in range(stages)}
    for w in workers:
        rows = [r for r in read_jsonl(events_dir / f"w{w.rank}.jsonl") if r.get(T.ITERATION) == iteration]
        if not any(r.get(T.KIND) == T.OPTIMIZER for r in rows):
            return None
        backward: dict[tuple[int, int], int] = {}  # (virtual stage, microbatch) -> its parts' time
        for r in rows:
            v = r.get(T.VIRTUAL_STAGE, w.stage)  # runs from before virtual stages: the worker's
            if r.get(T.KIND) == T.FORWARD and isinstance(r.get(T.PADDED_NS), int):
                ops[v][T.FORWARD].append(r[T.PADDED_NS])
            elif r.get(T.KIND) == T.BACKWARD and isinstance(r.get(T.PADDED_NS), int):
                backward[(v, r[T.MICROBATCH])] = backward.get((v, r[T.MICROBATCH]), 0) + r[T.PADDED_NS]
        for (v, _), ns in backward.items():
            ops[v][T.BACKWARD].append(ns)
    if any(not v for op in ops.values() for v in op.values()):
        return None
    return tuple(
        (statistics.median(ops[s][T.FORWARD]) / 1e9, statistics.median(ops[s][T.BACKWARD]) / 1e9) for s in range(stages)
    )


class FirstIterationProfile:
    """Polled by the run's watch loop: once the first iteration is profiled, calls ``replan`` with
    each of the ``stages`` virtual stages' (forward, backward) seconds, once."""

    def __init__(
        self,
        events_dir: Path,
        workers: list[WorkerSpec],
        stages: int,
        replan: Callable[[tuple[tuple[float, float], ...]], None],
    ) -> None:
        self.events_dir, self.workers, self.stages, self.replan = events_dir, workers, stages, replan
        self.done = False
        #: the profiled (forward, backward) s per virtual stage, once known
        self.times: tuple[tuple[float, float], ...] | None = None

    def poll(self) -> None:
        if self.done:
            return
        times = stage_times_s(self.events_dir, self.workers, self.stages)
        if times is not None:
            self.done, self.times = True, times
            self.replan(times)


def unprofiled(plan: GrantPlan) -> GrantPlan:
    """``plan`` before the profile: no order (earliest ready first), no offsets and no known
    iteration time (a half-reported transfer waits for its other side as long as it takes); its
    deadlines, which depend on the bytes and the links only, stay."""
    return replace(
        plan,
        hops=tuple(replace(h, order=()) for h in plan.hops),
        stagger_s=(0.0,) * len(plan.stagger_s),
        iteration_s=math.inf,
        iteration_unstaggered_s=math.inf,
    )


def replan_from_profile(
    run_plan: RunPlan,
    controller: Controller,
    out_dir: Path,
    stagger_path: Path,
    progress: Callable[[str], object],
) -> FirstIterationProfile:
    """The profile of a run under planned grants and real compute: once iteration 0 is traced, a new
    run plan is made from its stage times (``make_plan``, the same function as the first), its
    grant plan goes to the controller and its stagger to the workers; the plan is recorded
    (``records.record_plan``) with the time it took effect, its grants in ``grant_plan_profiled.txt``."""
    exp, workers = run_plan.experiment, list(run_plan.workers)

    def replan(stage_s: tuple[tuple[float, float], ...]) -> None:
        profiled = make_plan(exp, workers, stage_s=stage_s)
        plan = profiled.grant_plan
        assert plan is not None  # a run that profiles first has planned grants (``profiles_first``)
        controller.replan(plan)
        record_plan(out_dir, profiled, now_ns(), f"profiled from iteration {PROFILED_ITERATION}")
        write_stagger(stagger_path, plan.stagger_s)  # after the controller has the order
        name = "virtual stage" if exp.chunks > 1 else "stage"
        profile = ", ".join(f"{name} {s} {f * 1e3:.1f}/{b * 1e3:.1f} ms" for s, (f, b) in enumerate(stage_s))
        (out_dir / "grant_plan_profiled.txt").write_text(
            f"profiled in iteration {PROFILED_ITERATION} (forward/backward per microbatch): {profile}\n"
            + format_grant_plan(plan)
            + "\n"
        )
        progress(
            f"grant plan made from iteration {PROFILED_ITERATION}'s compute ({profile}): pipeline offsets "
            + ", ".join(f"{x * 1e3:.1f} ms" for x in plan.stagger_s)
        )

    return FirstIterationProfile(out_dir / "events", workers, len(experiment_homes(exp)), replan)
