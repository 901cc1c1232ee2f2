"""The what-if Atlas weighs (DESIGN.md section 1, item 2): other stage and replica counts at the same
global batch, each placed Atlas's way and predicted by the cost model, and whether one DC more helps."""

from __future__ import annotations

from dataclasses import dataclass, replace

from testbed.errors import SpecError
from testbed.plan.cost_model import Prediction, predict
from testbed.plan.placement import place
from testbed.plan.workers import WorkerSpec
from testbed.spec.experiment import Experiment
from testbed.spec.policy import parse_policy
from testbed.spec.topology import TopologySpec


@dataclass(frozen=True)
class Plan:
    stages: int
    replicas: int
    microbatches: int
    workers: tuple[WorkerSpec, ...] | None
    prediction: Prediction | None
    why_not: str = ""


def alternatives(exp: Experiment, topo: TopologySpec) -> list[Plan]:
    """Every (stages, replicas, microbatches) with the same global batch and microbatch size, up to
    as many stages and replicas as the topology has training hosts, placed the Atlas way (its DC
    selection); infeasible ones carry the reason."""
    sequences = exp.replicas * exp.microbatches  # microbatches of the global batch
    hosts = sum(dc.training_hosts for dc in topo.dcs)
    out = []
    for S in range(1, min(exp.model.n_layers, hosts) + 1):
        for R in range(1, min(sequences, hosts) + 1):
            if sequences % R:
                continue
            cand = replace(exp, stages=S, replicas=R, microbatches=sequences // R, policy=parse_policy("atlas"))
            try:
                workers = place(cand, topo)
            except SpecError as e:
                out.append(Plan(S, R, sequences // R, None, None, f"{e.field} {e.value} {e.problem}"))
                continue
            out.append(Plan(S, R, sequences // R, tuple(workers), predict(cand, topo, workers, exp.block_s)))
    return sorted(out, key=lambda p: (p.prediction is None, p.prediction.iteration_s if p.prediction else 0))


def what_if(plans: list[Plan]) -> tuple[Plan | None, Plan | None]:
    """(best plan, best plan that uses one DC more than it) among feasible plans."""
    feasible = [(p, p.prediction) for p in plans if p.prediction is not None]
    if not feasible:
        return None, None
    best, used = feasible[0][0], feasible[0][1].dcs_used
    more = [p for p, pred in feasible if pred.dcs_used == used + 1]
    return best, (more[0] if more else None)
