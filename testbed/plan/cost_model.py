"""A cost model of one training iteration (the plans Atlas weighs: ``what_if.py``, ``placement.select_dcs``).

Pure functions. For a placement of ``stages`` x ``replicas`` workers it predicts the iteration time
of a pipeline schedule with ``microbatches`` microbatches (Narayanan et al. 2021, section 2.2: the
pipeline fill and drain plus (M - 1) times the slowest step), extended with WAN terms:

  T = sum_s (f_s + b_s) + 2 sum_k x_k + (M - 1) max(max_s (f_s + b_s), max_k 2 w_k) + A + O

- f_s, b_s: padded forward and backward time of stage s on one microbatch: its blocks times the
  emulated GPU's time per block (``Experiment.block_s``: the targets over the largest stage's
  blocks), so that plans with other stage counts scale;
- x_k: one transfer across boundary k: bytes / r + 2 x one-way delay (gloo's rendezvous: the
  receiver's ready notice, then the data); 0 inside a DC. r = ``connections.transfer_rate_bps`` x
  TCP's share of the wire: the R data-parallel pipelines share the link, and each transfer's
  connections carry at most their modelled share of it on that path (one connection under pp-fair
  and dp-wan, n striped ones under atlas; ``path_connection_share``). w_k = bytes / r is
  the time a boundary is busy per microbatch and direction;
- A: the gradient all-reduce: 0 inside a DC; across the WAN (dp-wan), a ring all-reduce of every
  stage's gradients over the shared link, 2 (R - 1) / R x bytes / rate + 2 (R - 1) x delay;
- O: the optimizer step (taken as one forward target, an upper bound for a small stage).

Under Atlas's grants (``fifo`` or ``planned`` sharing) the fill, steady state and WAN terms come
instead from the grant plan's list-schedule simulation of one iteration, each link given to one
transfer at a time (``grant_sim.simulate``; ``fifo``: all pipelines starting together,
``planned``: with the plan's offsets); A and O are added as above.
"""

from __future__ import annotations

from dataclasses import dataclass

from testbed.plan.connections import path_connection_share, transfer_rate_bps, wan_connections
from testbed.plan.grant_plan import plan_grants, simulate_fifo
from testbed.plan.workers import WorkerSpec
from testbed.spec.experiment import Experiment
from testbed.spec.model import stage_layers, stage_param_bytes
from testbed.spec.routing import RoutingTable
from testbed.spec.topology import TopologySpec
from testbed.spec.wire import TCP_GOODPUT_FRACTION


@dataclass(frozen=True)
class Prediction:
    iteration_s: float
    fill_s: float
    steady_s: float
    allreduce_s: float
    dcs_used: int


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
        share = path_connection_share(exp, topo, workers, a, b)
        wire_s = act_bits / (transfer_rate_bps(rate_bps, share, connections, R) * TCP_GOODPUT_FRACTION)
        fill += 2 * (wire_s + 2 * delay_s)
        busy.append(2 * wire_s)
    steady = (M - 1) * max(max(step), max(busy, default=0.0))
    if exp.policy.grants and busy:
        plan = plan_grants(exp, topo, workers, connections, block_s=block_s)
        if exp.policy.sharing == "planned":
            fill = plan.iteration_s
        else:
            fill = simulate_fifo(exp, topo, workers, plan, block_s)
        steady = 0.0
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
            # by the per-connection share on that path times the stages that cross it
            share = path_connection_share(exp, topo, workers, a, b)
            eff_bps = transfer_rate_bps(rate_bps, share, S) * TCP_GOODPUT_FRACTION
            allreduce = max(allreduce, 2 * (R - 1) / R * bits / eff_bps + 2 * (R - 1) * delay_s)
    opt = per_layer_f * max(layers)
    return Prediction(fill + steady + allreduce + opt, fill, steady, allreduce, len({w.dc for w in workers}))
