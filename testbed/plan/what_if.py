"""The what-if Atlas weighs (DESIGN.md section 1, item 2): other stage and replica counts at the same
global batch, each placed Atlas's way and predicted by the cost model, and whether one DC more helps."""

from __future__ import annotations

from dataclasses import dataclass, replace

from testbed.errors import SpecError
from testbed.plan.cost_model import Prediction, predict
from testbed.plan.memory import gpu_shortfall
from testbed.plan.placement import place
from testbed.plan.workers import WorkerSpec
from testbed.spec.experiment import Experiment
from testbed.spec.model import largest_stage_blocks
from testbed.spec.pipeline_schedules import schedule_problem
from testbed.spec.policy import Policy, parse_policy
from testbed.spec.topology import TopologySpec


@dataclass(frozen=True)
class Plan:
    stages: int
    replicas: int
    microbatches: int
    workers: tuple[WorkerSpec, ...] | None
    prediction: Prediction | None
    why_not: str = ""


def _planned_policy(exp: Experiment) -> Policy:
    """The policy the what-if plans under: the experiment's striping and sharing with Atlas's DC
    selection (Atlas's own parts where the experiment does not place pipelines across DCs)."""
    pol = exp.policy if exp.policy.pipeline_across_dcs else parse_policy("atlas")
    name = pol.base if pol.placement == "atlas" else f"{pol.base}/placement=atlas"
    return parse_policy(name + pol.name[len(pol.base) :])  # its suffix kept: +bubbletea, +prefill-alone


def alternatives(exp: Experiment, topo: TopologySpec) -> list[Plan]:
    """Every (stages, replicas, microbatches) with the same global batch and microbatch size, up to
    as many stages and replicas as the topology has training hosts, placed the Atlas way (its DC
    selection) under ``exp``'s own striping and sharing where it places pipelines across DCs;
    infeasible ones (a layout the schedule cannot run, no placement, or a stage above
    ``gpu_memory_mb``) carry the reason."""
    pol = _planned_policy(exp)
    sequences = exp.replicas * exp.microbatches  # microbatches of the global batch
    hosts = sum(dc.training_hosts for dc in topo.dcs)
    out = []
    for S in range(1, min(exp.model.n_layers, hosts) + 1):
        for R in range(1, min(sequences, hosts) + 1):
            if sequences % R:
                continue
            cand = replace(exp, stages=S, replicas=R, microbatches=sequences // R, policy=pol)
            rule = schedule_problem(cand.schedule, S, cand.microbatches, cand.virtual_stages, cand.model.n_layers)
            if rule is not None:  # a layout the schedule cannot run (its rounds, its chunks' blocks)
                field, value, problem, _ = rule
                out.append(Plan(S, R, cand.microbatches, None, None, f"{field} {value} {problem}"))
                continue
            short = gpu_shortfall(cand)
            if short:
                out.append(Plan(S, R, sequences // R, None, None, short))
                continue
            try:
                workers = place(cand, topo)
            except SpecError as e:
                out.append(Plan(S, R, sequences // R, None, None, f"{e.field} {e.value} {e.problem}"))
                continue
            out.append(Plan(S, R, sequences // R, tuple(workers), predict(cand, topo, workers, exp.block_s)))
    return sorted(out, key=lambda p: (p.prediction is None, p.prediction.iteration_s if p.prediction else 0))


def best_plan(exp: Experiment, topo: TopologySpec) -> tuple[Experiment, str]:
    """``exp`` with the stages, replicas and microbatches of the fastest predicted plan of
    ``alternatives`` (same global batch and microbatch size), and a line saying which plan and why.
    Raises SpecError when no plan is feasible."""
    plans = alternatives(exp, topo)
    best, _ = what_if(plans)
    if best is None or best.prediction is None:
        raise SpecError(exp.source, "--plan", "best", "finds no feasible plan", "run the experiment's own layout")
    feasible = sum(p.prediction is not None for p in plans)
    # the plan as it was predicted: Atlas's DC selection, and the same emulated GPU (per-block times)
    blocks = largest_stage_blocks(exp.model.n_layers, best.stages)
    per_f, per_b = exp.block_s
    own_blocks = largest_stage_blocks(exp.model.n_layers, exp.stages)
    compute = replace(
        exp.compute,
        forward_ms=per_f * blocks * 1000,
        backward_ms=per_b * blocks * 1000,
        # a given optimizer target follows the largest stage's parameters, as the forward does
        optimizer_ms=exp.compute.optimizer_ms * blocks / own_blocks if exp.compute.optimizer_ms is not None else None,
    )
    chosen = exp.with_overrides(
        stages=best.stages,
        replicas=best.replicas,
        microbatches=best.microbatches,
        policy=_planned_policy(exp),
        compute=compute,
    )
    why = (
        f"--plan best: {best.stages} stages x {best.replicas} replicas x {best.microbatches} microbatches, the "
        f"fastest predicted ({best.prediction.iteration_s:.3f} s) of {feasible} feasible plans of the same global "
        f"batch (the experiment's own: {exp.stages} x {exp.replicas} x {exp.microbatches})"
    )
    return chosen, why


def what_if(plans: list[Plan]) -> tuple[Plan | None, Plan | None]:
    """(best plan, best plan that uses one DC more than it) among feasible plans."""
    feasible = [(p, p.prediction) for p in plans if p.prediction is not None]
    if not feasible:
        return None, None
    best, used = feasible[0][0], feasible[0][1].dcs_used
    more = [p for p, pred in feasible if pred.dcs_used == used + 1]
    return best, (more[0] if more else None)
