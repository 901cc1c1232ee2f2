"""A cost model of one training iteration, and the plans Atlas weighs (DESIGN.md section 1, item 2).

Pure functions. For a placement of ``stages`` x ``replicas`` workers it predicts the iteration time
of a pipeline schedule with ``microbatches`` microbatches (Narayanan et al. 2021, section 2.2: the
pipeline fill and drain plus (M - 1) times the slowest step), extended with WAN terms:

  T = sum_s (f_s + b_s) + 2 sum_k x_k + (M - 1) max(max_s (f_s + b_s), max_k 2 w_k) + A + O

- f_s, b_s: padded forward and backward time of stage s on one microbatch: its blocks times the
  emulated GPU's time per block (``Experiment.block_s``: the targets over the largest stage's
  blocks), so that plans with other stage counts scale;
- x_k: one transfer across boundary k: bytes / r + 2 x one-way delay (gloo's rendezvous: the
  receiver's ready notice, then the data); 0 inside a DC. r = ``flow_rate_bps``: the R data-parallel
  pipelines share the link, and each transfer's connections carry at most their modelled share of
  it (one connection under pp-fair and dp-wan, n striped ones under atlas). w_k = bytes / r is
  the time a boundary is busy per microbatch and direction;
- A: the gradient all-reduce: 0 inside a DC; across the WAN (dp-wan), a ring all-reduce of every
  stage's gradients over the shared link, 2 (R - 1) / R x bytes / rate + 2 (R - 1) x delay;
- O: the optimizer step (taken as one forward target, an upper bound for a small stage).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from testbed.errors import SpecError
from testbed.plan.connections import wan_connections
from testbed.plan.placement import WorkerSpec, place
from testbed.spec.experiment import Experiment
from testbed.spec.model import stage_layers, stage_param_bytes
from testbed.spec.policy import parse_policy
from testbed.spec.routing import RoutingTable
from testbed.spec.topology import TopologySpec


@dataclass(frozen=True)
class Prediction:
    iteration_s: float
    fill_s: float
    steady_s: float
    allreduce_s: float
    dcs_used: int


def flow_rate_bps(exp: Experiment, link_bps: float, flows: int, connections: int = 1) -> float:
    """Rate one of ``flows`` concurrent transfers gets on a link of ``link_bps``: a fair share of the
    link, but no more than its ``connections`` TCP connections can carry when the experiment models
    a per-connection share (each connection ``wan_connection_share`` x link rate; DESIGN.md 2a)."""
    fair = link_bps / flows
    if exp.wan_connection_share is None:
        return fair
    return min(fair, connections * exp.wan_connection_share * link_bps)


def predict(
    exp: Experiment,
    topo: TopologySpec,
    workers: list[WorkerSpec],
    block_s: tuple[float, float] | None = None,
    connections: int | None = None,
) -> Prediction:
    """Predicted iteration time of ``exp`` placed as ``workers`` on ``topo`` (see the module doc).
    ``block_s``: per-block (forward, backward) seconds, by default from ``exp`` itself;
    ``connections`` per cross-DC pipeline transfer, by default ``wan_connections`` of the policy."""
    if connections is None:
        connections = wan_connections(exp, topo, workers)
    routes = RoutingTable(topo)
    S, R, M = exp.stages, exp.replicas, exp.microbatches
    per_layer_f, per_layer_b = block_s or exp.block_s
    layers = [len(stage_layers(exp.model.n_layers, S, s)) for s in range(S)]
    step = [n * (per_layer_f + per_layer_b) for n in layers]
    dc_of = {(w.stage, w.replica): w.dc for w in workers}
    act_bits = exp.activation_bytes * 8
    fill, busy = sum(step), []
    for s in range(S - 1):
        a, b = dc_of[(s, 0)], dc_of[(s + 1, 0)]
        if a == b:
            continue
        rate_bps = routes.wan_rate_bps(a, b)
        delay_s = routes.one_way_delay_us(a, b) / 1e6
        wire_s = act_bits / flow_rate_bps(exp, rate_bps, R, connections)
        fill += 2 * (wire_s + 2 * delay_s)
        busy.append(2 * wire_s)
    steady = (M - 1) * max(max(step), max(busy, default=0.0))
    allreduce = 0.0
    if R > 1:
        per_link: dict[tuple[str, str], float] = {}
        for s in range(S):
            dcs = sorted({dc_of[(s, r)] for r in range(R)})
            for a, b in zip(dcs, dcs[1:]):
                per_link[(a, b)] = per_link.get((a, b), 0.0) + stage_param_bytes(exp.model, S, s) * 8
        for (a, b), bits in per_link.items():
            rate_bps = routes.wan_rate_bps(a, b)
            delay_s = routes.one_way_delay_us(a, b) / 1e6
            # every stage's all-reduce runs at once, one connection each: the link's share is bounded
            # by the per-connection share times the stages that cross it
            eff_bps = min(rate_bps, S * (exp.wan_connection_share or 1.0) * rate_bps)
            allreduce = max(allreduce, 2 * (R - 1) / R * bits / eff_bps + 2 * (R - 1) * delay_s)
    opt = per_layer_f * max(layers)
    return Prediction(fill + steady + allreduce + opt, fill, steady, allreduce, len({w.dc for w in workers}))


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
    as many stages and replicas as the topology has training hosts, placed the Atlas way (largest
    DCs first); infeasible ones carry the reason."""
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
