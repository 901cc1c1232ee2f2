"""A cost model of one training iteration, and the plans Atlas weighs (DESIGN.md section 1, item 2).

Pure functions. For a placement of ``stages`` x ``replicas`` workers it predicts the iteration time
of a pipeline schedule with ``microbatches`` microbatches (Narayanan et al. 2021, section 2.2: the
pipeline fill and drain plus (M - 1) times the slowest step), extended with WAN terms:

  T = sum_s (f_s + b_s) + 2 sum_k x_k + (M - 1) max(max_s (f_s + b_s), max_k 2 w_k) + A + O

- f_s, b_s: padded forward and backward time of stage s on one microbatch (scaled from the
  experiment's targets by the stage's share of the blocks);
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

from .errors import SpecError
from .experiment import Experiment
from .model import ModelConfig, stage_layers
from .placement import WorkerSpec, atlas_dc_order, place, place_pipeline
from .routing import RoutingTable
from .topology import TopologySpec


def stage_param_bytes(cfg: ModelConfig, n_stages: int, stage: int) -> int:
    """fp32 bytes of one stage's parameters (its blocks, plus embeddings or head at the ends)."""
    d = cfg.d_model
    block = 12 * d * d + 13 * d
    n = len(stage_layers(cfg.n_layers, n_stages, stage)) * block
    if stage == 0:
        n += cfg.vocab * d + cfg.seq_len * d
    if stage == n_stages - 1:
        n += 2 * d + d * cfg.vocab + cfg.vocab
    return 4 * n


def activation_bytes(exp: Experiment) -> int:
    """fp32 bytes of one microbatch's activations (or their gradients) at a stage boundary."""
    return 4 * exp.microbatch_size * exp.model.seq_len * exp.model.d_model


@dataclass(frozen=True)
class Prediction:
    iteration_s: float
    fill_s: float
    steady_s: float
    allreduce_s: float
    dcs_used: int


def per_block_s(exp: Experiment) -> tuple[float, float]:
    """(forward, backward) seconds of one block on one microbatch: the experiment's per-stage
    targets divided by its blocks per stage."""
    return (exp.compute.forward_ms / 1000 * exp.stages / exp.model.n_layers,
            exp.compute.backward_ms / 1000 * exp.stages / exp.model.n_layers)


def flow_rate_bps(exp: Experiment, link_bps: float, flows: int, connections: int = 1) -> float:
    """Rate one of ``flows`` concurrent transfers gets on a link of ``link_bps``: a fair share of the
    link, but no more than its ``connections`` TCP connections can carry when the experiment models
    a per-connection share (each connection ``wan_connection_share`` x link rate; DESIGN.md 2a)."""
    fair = link_bps / flows
    if exp.wan_connection_share is None:
        return fair
    return min(fair, connections * exp.wan_connection_share * link_bps)


def predict(exp: Experiment, topo: TopologySpec, workers: list[WorkerSpec],
            block_s: tuple[float, float] | None = None, connections: int | None = None) -> Prediction:
    """Predicted iteration time of ``exp`` placed as ``workers`` on ``topo`` (see the module doc).
    ``block_s``: per-block (forward, backward) seconds, by default from ``exp`` itself;
    ``connections`` per cross-DC pipeline transfer, by default ``wan_connections`` of the policy."""
    if connections is None:
        connections = wan_connections(exp, topo, workers)
    routes = RoutingTable(topo)
    S, R, M = exp.stages, exp.replicas, exp.microbatches
    per_layer_f, per_layer_b = block_s or per_block_s(exp)
    layers = [len(stage_layers(exp.model.n_layers, S, s)) for s in range(S)]
    step = [n * (per_layer_f + per_layer_b) for n in layers]
    dc_of = {(w.stage, w.replica): w.dc for w in workers}
    act = activation_bytes(exp) * 8
    fill, busy = sum(step), []
    for s in range(S - 1):
        a, b = dc_of[(s, 0)], dc_of[(s + 1, 0)]
        if a == b:
            continue
        rate = routes.bottleneck_bps(a, b)
        delay = routes.one_way_delay_us(a, b) / 1e6
        w = act / flow_rate_bps(exp, rate, R, connections)
        fill += 2 * (w + 2 * delay)
        busy.append(2 * w)
    steady = (M - 1) * max(max(step), max(busy, default=0.0))
    allreduce = 0.0
    if R > 1:
        per_link: dict[tuple[str, str], float] = {}
        for s in range(S):
            dcs = sorted({dc_of[(s, r)] for r in range(R)})
            for a, b in zip(dcs, dcs[1:]):
                per_link[(a, b)] = per_link.get((a, b), 0.0) + stage_param_bytes(exp.model, S, s) * 8
        for (a, b), bits in per_link.items():
            rate = routes.bottleneck_bps(a, b)
            delay = routes.one_way_delay_us(a, b) / 1e6
            # every stage's all-reduce runs at once, one connection each: the link's share is bounded
            # by the per-connection share times the stages that cross it
            eff = min(rate, S * (exp.wan_connection_share or 1.0) * rate)
            allreduce = max(allreduce, 2 * (R - 1) / R * bits / eff + 2 * (R - 1) * delay)
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
    """Every (stages, replicas, microbatches) with the same global batch and microbatch size,
    placed the Atlas way (largest DCs first); infeasible ones carry the reason."""
    sequences = exp.replicas * exp.microbatches  # microbatches of the global batch
    out = []
    for S in range(1, exp.model.n_layers + 1):
        for R in range(1, sequences + 1):
            if sequences % R:
                continue
            cand = replace(exp, stages=S, replicas=R, microbatches=sequences // R, policy="atlas")
            try:
                workers = place_pipeline(cand, topo, atlas_dc_order(topo))
            except SpecError as e:
                out.append(Plan(S, R, sequences // R, None, None, f"{e.field} {e.value} {e.problem}"))
                continue
            out.append(Plan(S, R, sequences // R, tuple(workers), predict(cand, topo, workers, per_block_s(exp))))
    return sorted(out, key=lambda p: (p.prediction is None, p.prediction.iteration_s if p.prediction else 0))


def what_if(plans: list[Plan]) -> tuple[Plan | None, Plan | None]:
    """(best plan, best plan that uses one DC more than it) among feasible plans."""
    feasible = [p for p in plans if p.prediction]
    if not feasible:
        return None, None
    best = feasible[0]
    more = [p for p in feasible if p.prediction.dcs_used == best.prediction.dcs_used + 1]
    return best, (more[0] if more else None)


def predicted_for_run(exp: Experiment, topo: TopologySpec) -> Prediction:
    return predict(exp, topo, place(exp, topo))


#: Linux advertises about half of a socket's receive buffer as window (tcp_adv_win_scale = 1,
#: Documentation/networking/ip-sysctl.rst), so a buffer of 2 x W bytes allows a window of W.
RCVBUF_PER_WINDOW = 2


def connections_for(rate_bps: float, rtt_s: float, window_bytes: float, most: int = 16) -> int:
    """TCP connections needed to fill a link: its bandwidth-delay product over one connection's
    window (one connection carries at most window / RTT), at least 1, at most ``most``."""
    import math

    bdp_bytes = rate_bps / 8 * rtt_s
    return max(1, min(most, math.ceil(bdp_bytes / window_bytes - 1e-9)))


def buffer_for_share(rate_bps: float, rtt_s: float, share: float) -> int:
    """Socket buffer cap (bytes) that holds one connection to ``share`` of a link of this rate and
    RTT: a window of share x BDP, doubled for the kernel's receive-buffer overhead."""
    return int(RCVBUF_PER_WINDOW * share * rate_bps / 8 * rtt_s)


def wan_connections(exp: Experiment, topo, workers) -> int:
    """Connections per cross-DC transfer: 1 except under atlas, where it is the experiment's figure
    or, for 0, the bandwidth-delay product of the longest boundary over one connection's window
    (4 when no per-connection share is modelled)."""
    if exp.base_policy != "atlas":
        return 1
    if exp.wan_connections:
        return exp.wan_connections
    cap = socket_buffer_cap(exp, topo, workers)
    if cap is None:
        return 4
    routes = RoutingTable(topo)
    pairs = wan_pairs(workers)
    if not pairs:
        return 1
    return max(connections_for(routes.bottleneck_bps(a, b), 2 * routes.one_way_delay_us(a, b) / 1e6,
                               cap / RCVBUF_PER_WINDOW) for a, b in pairs)


def wan_pairs(workers) -> list[tuple[str, str]]:
    """DC pairs whose WAN path carries training traffic: neighbouring stages of one pipeline (PP)
    and replicas of one stage (the gradient all-reduce), where the two sit in different DCs."""
    by = {(w.stage, w.replica): w for w in workers}
    pairs = set()
    for w in workers:
        for other in (by.get((w.stage + 1, w.replica)), by.get((w.stage, w.replica + 1))):
            if other is not None and other.dc != w.dc:
                pairs.add(tuple(sorted((w.dc, other.dc))))
    return sorted(pairs)


def socket_buffer_cap(exp: Experiment, topo, workers) -> int | None:
    """Socket buffer cap reproducing ``exp.wan_connection_share`` on the slowest, longest WAN path
    that training traffic crosses (``wan_pairs``) (planner.buffer_for_share), or None when no share is modelled."""
    if exp.wan_connection_share is None:
        return None
    routes = RoutingTable(topo)
    pairs = wan_pairs(workers)
    if not pairs:
        return None
    return min(buffer_for_share(routes.bottleneck_bps(a, b), 2 * routes.one_way_delay_us(a, b) / 1e6,
                                exp.wan_connection_share) for a, b in pairs)
