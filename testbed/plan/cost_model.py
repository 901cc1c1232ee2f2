"""A cost model of one training iteration (the plans Atlas weighs: ``what_if.py``, ``placement.select_dcs``).

Pure functions. For a placement of ``stages`` x ``replicas`` workers it predicts the iteration time
of a pipeline schedule with ``microbatches`` microbatches:

  T = P + A + O

- P, the pipeline: under GPipe and 1F1B when no stage boundary crosses the WAN, the fill and
  drain plus (M - 1) times the slowest step (Narayanan et al. 2021, section 2.2), sum_s (f_s + b_s)
  + (M - 1) max_s (f_s + b_s), with f_s, b_s the padded forward and backward time of stage s on one
  microbatch (its blocks times the emulated GPU's time per block, ``Experiment.block_s``, so that
  plans with other stage counts scale), each with the worker's hand-off after it
  (``handoff.action_handoff_s``). When one does, or under the schedules of several virtual
  stages or a split backward (no such closed form), the list-schedule simulation of the schedule tables
  (``grant_sim.simulate``): every action starts when its worker is free and its input has arrived;
  a transfer moves once its receive is posted and the receiver's ready notice has crossed back
  (gloo's rendezvous; the notice queues behind the receiver's own bytes to that sender on their
  connection); its time alone on a link is its bytes at what its connections carry on the
  path (``connections.transfer_time_s``: the link's TCP payload rate, or one window per round trip
  per connection where the hosts' socket-buffer cap holds them below it), and the link is shared
  as the policy shares it: as TCP does among the transfers on it (``tcp``), one transfer at a time
  for the whole rendezvous (``fifo``), or in the grant plan's order with its pipeline offsets
  (``planned``). So too where the last stage starts later than its first input comes, having
  averaged the loss over its replicas across the WAN (dp-wan: ``allreduce.loss_allreduce_s``). Above 2 x
  ``SIM_MICROBATCHES`` microbatches the simulation is extrapolated.
- A: the gradient all-reduce (``allreduce.allreduce_s``): each stage's ring in replica order, as
  the workers run it, its edges inside a DC over the access links (free where they are unshaped,
  as in the emulator) and across DCs (dp-wan) over the shared WAN path, one connection an edge;
- O: the optimizer step, padded to its target as the workers pad it (``compute.optimizer_target_ms``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from testbed.plan.allreduce import allreduce_s, loss_allreduce_s
from testbed.plan.connections import wan_connections
from testbed.plan.grant_plan import iteration_lower_bound, simulated_iteration
from testbed.plan.handoff import action_handoff_s
from testbed.plan.virtual_stages import experiment_boundaries
from testbed.plan.workers import WorkerSpec
from testbed.spec.experiment import Experiment
from testbed.spec.model import stage_layers
from testbed.spec.pipeline_schedules import IN_ROUNDS
from testbed.spec.topology import TopologySpec

#: above twice this many microbatches an iteration is simulated with this many and twice as many,
#: and extrapolated (``_pipelined_s``)
SIM_MICROBATCHES = 64


@dataclass(frozen=True)
class Prediction:
    """A predicted iteration (s): ``fill_s`` the pipeline (when it crosses the WAN, the whole
    simulated pipeline, and ``steady_s`` 0; else its fill and drain, and ``steady_s`` the (M - 1)
    slowest steps), ``allreduce_s`` the gradient all-reduce, ``iteration_s`` all of it with the
    optimizer step; ``dcs_used`` the DCs the placement uses."""

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
    start_offsets_s: tuple[float, ...] | None = None,
) -> Prediction:
    """Predicted iteration time of ``exp`` placed as ``workers`` on ``topo`` (see the module doc).
    ``block_s``: per-block (forward, backward) seconds, by default from ``exp`` itself;
    ``connections`` per cross-DC pipeline transfer, by default ``wan_connections`` of the policy;
    ``start_offsets_s``: when each pipeline starts (``simulated_iteration``)."""
    if connections is None:
        connections = wan_connections(exp, topo, workers)
    M = exp.microbatches
    # a microbatch's forward and backward on a stage, each with the worker's hand-off after it
    step = [c + 2 * action_handoff_s(exp) for c in stage_compute_s(exp, block_s)]
    dc_of = {(w.stage, w.replica): w.dc for w in workers}
    fill, steady = sum(step), (M - 1) * max(step)
    crosses = any(dc_of[(a, 0)] != dc_of[(b, 0)] for a, b in experiment_boundaries(exp))
    if crosses or _loss_late(exp, topo, workers, block_s) or exp.schedule not in ("gpipe", "1f1b"):
        # the list-schedule simulation of the schedule tables
        fill = _pipelined_s(
            exp, lambda e: simulated_iteration(e, topo, workers, connections, block_s, start_offsets_s=start_offsets_s)
        )
        steady = 0.0
    allreduce = allreduce_s(exp, topo, workers)
    opt = optimizer_s(exp, block_s)
    return Prediction(fill + steady + allreduce + opt, fill, steady, allreduce, len({w.dc for w in workers}))


def lower_bound_s(exp: Experiment, topo: TopologySpec, workers: list[WorkerSpec]) -> float | None:
    """A lower bound (s) of ``predict(exp, topo, workers).iteration_s`` when ``exp``'s links are
    shared as TCP's flows share them (no grants) and its pipelines start together: the pipeline's
    longest path, each transfer at its speed alone (``grant_plan.iteration_lower_bound``), the all-reduce and
    the optimizer step as ``predict`` has them; the prediction itself where no boundary crosses the
    WAN. None where ``predict`` extrapolates (more than 2 x ``SIM_MICROBATCHES`` microbatches: a
    bound on each simulation bounds no difference of two). Raises ValueError under grants."""
    if exp.policy.grants:
        raise ValueError(f"a lower bound under TCP sharing, not under {exp.policy.sharing} grants")
    dc_of = {(w.stage, w.replica): w.dc for w in workers}
    crosses = any(dc_of[(a, 0)] != dc_of[(b, 0)] for a, b in experiment_boundaries(exp))
    if not crosses and not _loss_late(exp, topo, workers) and exp.schedule in ("gpipe", "1f1b"):
        return predict(exp, topo, workers).iteration_s
    if _simulated_microbatches(exp) is not None:
        return None
    pipeline = iteration_lower_bound(exp, topo, workers, wan_connections(exp, topo, workers))
    return pipeline + allreduce_s(exp, topo, workers) + optimizer_s(exp)


def _loss_late(
    exp: Experiment, topo: TopologySpec, workers: list[WorkerSpec], block_s: tuple[float, float] | None = None
) -> bool:
    """Whether the last stage, averaging the loss over its replicas first
    (``allreduce.loss_allreduce_s``: across the WAN under dp-wan), starts an iteration later than
    its first input comes (every stage before it done with its first forward, inside one DC), so
    that the closed form of GPipe and 1F1B no longer holds."""
    waits = loss_allreduce_s(exp, topo, workers)
    per_f, h = (block_s or exp.block_s)[0], action_handoff_s(exp)
    first_input_s = sum(len(stage_layers(exp.model.n_layers, exp.stages, s)) * per_f + h for s in range(exp.stages - 1))
    return max(waits, default=0.0) > first_input_s


def stage_compute_s(exp: Experiment, block_s: tuple[float, float] | None = None) -> list[float]:
    """Each stage's forward plus backward on one microbatch (s): its blocks times the per-block
    targets (``Experiment.block_s``)."""
    per_f, per_b = block_s or exp.block_s
    return [len(stage_layers(exp.model.n_layers, exp.stages, s)) * (per_f + per_b) for s in range(exp.stages)]


def optimizer_s(exp: Experiment, block_s: tuple[float, float] | None = None) -> float:
    """The optimizer step (s): its padding target (``ComputeModel.optimizer_target_ms``, what the
    workers pad it to), scaled by ``block_s``'s forward over the experiment's own when ``block_s``
    is given: a profiled compute speed, or (``what_if.alternatives``) a candidate layout's, whose
    largest stage holds another number of blocks."""
    scale = block_s[0] / exp.block_s[0] if block_s is not None else 1.0
    return exp.compute.optimizer_target_ms / 1000 * scale


def _pipelined_s(exp: Experiment, simulated_s: Callable[[Experiment], float]) -> float:
    """``simulated_s(exp)``; for more than 2 x ``SIM_MICROBATCHES`` microbatches its linear
    extrapolation from K and 2K of them (K = ``SIM_MICROBATCHES``): once the pipeline is full each
    further microbatch adds the same steady step, so the cost of a prediction stays bounded. Under a
    schedule that takes microbatches in rounds, K is rounded up to a multiple of the stages."""
    k = _simulated_microbatches(exp)
    if k is None:
        return simulated_s(exp)
    M = exp.microbatches
    t1, t2 = simulated_s(exp.with_overrides(microbatches=k)), simulated_s(exp.with_overrides(microbatches=2 * k))
    return t2 + (M - 2 * k) * (t2 - t1) / k


def _simulated_microbatches(exp: Experiment) -> int | None:
    """K of ``_pipelined_s``'s extrapolation (from K and 2K microbatches), None where ``exp`` is
    simulated whole (at most 2K microbatches)."""
    k = SIM_MICROBATCHES
    if exp.schedule in IN_ROUNDS:  # K and 2K in whole rounds of ``stages`` microbatches
        k = exp.stages * math.ceil(k / exp.stages)
    return None if exp.microbatches <= 2 * k else k
