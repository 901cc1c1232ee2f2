"""A run's plan, made once: everything a run derives from its experiment before it starts, as one
frozen value (:class:`RunPlan`) built by one function (``make_plan``), printed by ``testbed plan``
and read by the runner (placement, socket buffers, the memory and duration checks), Atlas's
controller (the grant plan), BubbleTea (the predicted bubbles) and the simulator (the prediction).

A run that plans again (after its first iteration under ``compute.mode: real``, from the profiled
stage times) builds a new value with the same function; every plan a run used is recorded in its
folder (``PLANS_FILE``, one JSON line each: ``plan_record``) with the time it took effect."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from testbed.plan.bubble_timeline import Bubble, bubble_timeline
from testbed.plan.connections import socket_buffer_cap, wan_connections
from testbed.plan.cost_model import Prediction, predict
from testbed.plan.grant_plan import GrantPlan, plan_grants
from testbed.plan.memory import WorkerMemory, gpu_shortfall, worker_memory
from testbed.plan.placement import WorkerSpec, place
from testbed.spec.experiment import Experiment

#: the run folder's record of every plan the run used (JSON lines)
PLANS_FILE = "plans.jsonl"


@dataclass(frozen=True)
class RunPlan:
    """What a run of ``experiment`` uses, derived before it starts.

    ``workers``: the placement (``placement.place``); ``connections``: TCP connections per cross-DC
    transfer (``connections.wan_connections``); ``socket_buffer_bytes``: the hosts' socket-buffer
    cap (None: none; ``connections.socket_buffer_cap``); ``prediction``: the cost model's iteration
    (``cost_model.predict``), with the pipelines ``start_offsets_s`` apart where given (the
    simulator's ``--validate``); ``memory``: each stage's worker memory (``memory.worker_memory``)
    and ``gpu_shortfall`` why a stage does not fit ``gpu_memory_mb`` (None: it fits, or no
    budget); ``stage_s``: the profiled (forward, backward) s per virtual stage its grants are
    planned from (None: the experiment's compute targets). ``grant_plan`` and ``bubbles`` are worked out on
    first use and kept (the simulator, which predicts many plans, reads neither)."""

    experiment: Experiment
    workers: tuple[WorkerSpec, ...]
    connections: int
    socket_buffer_bytes: int | None
    prediction: Prediction
    memory: tuple[WorkerMemory, ...]
    gpu_shortfall: str | None
    stage_s: tuple[tuple[float, float], ...] | None = None

    @cached_property
    def grant_plan(self) -> GrantPlan | None:
        """Atlas's grant plan under grants (FIFO or planned), None otherwise (``plan_grants``)."""
        exp = self.experiment
        if not (exp.policy.grants and exp.policy.training):
            return None
        return plan_grants(exp, exp.topology_spec, list(self.workers), self.connections, stage_s=self.stage_s)

    @cached_property
    def bubbles(self) -> tuple[float, tuple[Bubble, ...]] | None:
        """Under BubbleTea, every training worker's bubbles in the simulated iteration and that
        iteration (s), from the schedule, the compute targets and the WAN (``bubble_timeline``);
        None otherwise."""
        exp = self.experiment
        if not (exp.policy.bubbletea and exp.policy.training):
            return None
        t, found = bubble_timeline(exp, exp.topology_spec, list(self.workers), self.connections)
        return t, tuple(found)

    @property
    def predicted_iteration_s(self) -> float:
        return self.prediction.iteration_s

    @property
    def largest_worker(self) -> WorkerMemory:
        """The worker that needs the most memory (its stage's figures)."""
        return max(self.memory, key=lambda m: m.total_bytes)


def make_plan(
    exp: Experiment,
    workers: list[WorkerSpec] | tuple[WorkerSpec, ...] | None = None,
    stage_s: tuple[tuple[float, float], ...] | None = None,
    start_offsets_s: tuple[float, ...] | None = None,
) -> RunPlan:
    """The plan of a run of ``exp``: placed as ``workers`` (default: as its policy places it), its
    grants planned from ``stage_s`` (profiled stage times) where given, its prediction with the
    pipelines ``start_offsets_s`` apart (default: together). Raises SpecError when the policy
    cannot place the experiment, ValueError when its schedule cannot complete."""
    topo = exp.topology_spec
    placed = list(workers) if workers is not None else place(exp)
    n = wan_connections(exp, topo, placed)
    return RunPlan(
        experiment=exp,
        workers=tuple(placed),
        connections=n,
        socket_buffer_bytes=socket_buffer_cap(exp, topo, placed),
        prediction=predict(exp, topo, placed, connections=n, start_offsets_s=start_offsets_s),
        memory=tuple(worker_memory(exp, s) for s in range(exp.stages)),
        gpu_shortfall=gpu_shortfall(exp),
        stage_s=stage_s,
    )


def plan_record(plan: RunPlan, t_ns: int, why: str) -> dict[str, Any]:
    """``plan`` as one line of ``PLANS_FILE``: when it took effect (``t_ns``, the run's clock) and
    why (``why``), the placement, the connections and socket buffers, the prediction, the grant
    plan's order and offsets, each stage's memory and the predicted bubbles."""
    g = plan.grant_plan
    return {
        "t_ns": t_ns,
        "why": why,
        "policy": plan.experiment.policy.name,
        "placement": {f"s{w.stage}r{w.replica}": w.host for w in plan.workers},
        "connections": plan.connections,
        "socket_buffer_bytes": plan.socket_buffer_bytes,
        "predicted_iteration_s": plan.prediction.iteration_s,
        "prediction": {
            "fill_s": plan.prediction.fill_s,
            "steady_s": plan.prediction.steady_s,
            "allreduce_s": plan.prediction.allreduce_s,
            "dcs_used": plan.prediction.dcs_used,
        },
        "stage_s": plan.stage_s,
        "grant_plan": None
        if g is None
        else {
            "iteration_s": g.iteration_s,
            "stagger_s": g.stagger_s,
            "order": {str(h.hop): [str(t) for t in h.order] for h in g.hops},
        },
        "memory_bytes": {f"stage {m.stage}": m.total_bytes for m in plan.memory},
        "gpu_shortfall": plan.gpu_shortfall,
        "bubbles": None if plan.bubbles is None else {"iteration_s": plan.bubbles[0], "count": len(plan.bubbles[1])},
    }


def format_plan(plan: RunPlan) -> str:
    """The plan in a few lines (``testbed plan``)."""
    exp = plan.experiment
    where = ", ".join(f"s{w.stage}r{w.replica}@{w.host}" for w in plan.workers)
    buffers = "uncapped" if plan.socket_buffer_bytes is None else f"{plan.socket_buffer_bytes} bytes"
    lines = [
        f"the run's plan under {exp.policy.name}: predicted iteration {plan.prediction.iteration_s:.3f} s; "
        f"{plan.connections} connection(s) per cross-DC transfer, socket buffers {buffers}",
        f"  placement: {where}",
        f"  memory: largest worker {plan.largest_worker.total_bytes / 2**20:.0f} MiB (stage "
        f"{plan.largest_worker.stage}, mostly {plan.largest_worker.largest_part})"
        + (f"; {plan.gpu_shortfall}" if plan.gpu_shortfall else ""),
    ]
    if plan.grant_plan is not None:
        g = plan.grant_plan
        lines.append(
            f"  grants: {len(g.hops)} link direction(s), simulated iteration {g.iteration_s:.3f} s "
            f"({g.iteration_unstaggered_s:.3f} s with the pipelines together), offsets "
            + ", ".join(f"{s * 1000:.1f}" for s in g.stagger_s)
            + " ms (testbed plan --grants)"
        )
    if plan.bubbles is not None:
        t, found = plan.bubbles
        lines.append(f"  BubbleTea: {len(found)} predicted bubbles in a simulated iteration of {t:.3f} s")
    return "\n".join(lines)
