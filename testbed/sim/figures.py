"""The simulator's figures of a training iteration, without root and without a network
(``testbed sim``): per policy the iteration time, tokens per second, the training GPU utilization,
the bubble fraction of each stage and the utilization of each WAN link direction, all from the
same list-schedule simulation of the same schedule tables, placement and grant plan that the cost
model uses (``plan/cost_model.py``); names as in a run's ``summary.json`` (``trace/metrics.py``).

Definitions, as the run's analysis counts them (``results/analysis.py``): a worker is busy during
its padded forwards and backwards and its optimizer step; utilization is busy over the iteration,
averaged over the workers; a stage's bubble fraction is one minus its replicas' utilization; a
link direction's utilization is the bits it carries in an iteration on the wire (the payload over
TCP's share of a frame) over its rate and the iteration, averaged over the directions that carry
any. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from testbed.errors import SpecError
from testbed.plan.allreduce import allreduce_s, wan_allreduce_bits
from testbed.plan.cost_model import optimizer_s, stage_compute_s
from testbed.plan.grant_sim import simulate
from testbed.plan.run_plan import make_plan
from testbed.plan.virtual_stages import experiment_boundaries
from testbed.plan.workers import WorkerSpec
from testbed.sim.bubbletea import PrefillFigures, prefill_in_bubbles
from testbed.spec.experiment import Experiment
from testbed.spec.policy import BUBBLETEA_SUFFIX
from testbed.spec.routing import RoutingTable
from testbed.spec.wire import TCP_GOODPUT_FRACTION
from testbed.trace import metrics as M


@dataclass(frozen=True)
class Figures:
    """One policy's simulated iteration: ``iteration_time_s`` (s), ``tokens_per_s``,
    ``gpu_utilization`` (with prefill under BubbleTea) and ``bubble_fraction`` (0-1, over the
    training workers, training alone),
    ``bubble_fraction_per_stage``, ``wan_utilization`` per link direction (``"a->b"``: 0-1),
    ``device_memory_gb`` (scenarios)."""

    policy: str
    iteration_time_s: float
    tokens_per_s: float
    gpu_utilization: float
    bubble_fraction: float
    bubble_fraction_per_stage: tuple[float, ...]
    wan_utilization: dict[str, float] = field(default_factory=dict)
    #: a scenario's largest stage on one GPU (GB; None for an experiment: ``plan/memory.py``)
    device_memory_gb: float | None = None
    #: under BubbleTea, its prefill figures (``gpu_utilization`` then counts prefill busy too)
    prefill: PrefillFigures | None = None
    #: the training workers' utilization from training alone
    training_gpu_utilization: float | None = None

    @property
    def wan_utilization_mean(self) -> float | None:
        """The mean over the link directions that carry traffic (None: none does)."""
        used = [u for u in self.wan_utilization.values() if u > 0]
        return sum(used) / len(used) if used else None

    def to_dict(self) -> dict[str, Any]:
        """The figures under the names a run's ``summary.json`` uses."""
        return {
            M.POLICY: self.policy,
            M.ITERATION_TIME_S: self.iteration_time_s,
            M.TOKENS_PER_S: self.tokens_per_s,
            M.GPU_UTILIZATION: self.gpu_utilization,
            M.BUBBLE_FRACTION: self.bubble_fraction,
            M.BUBBLE_FRACTION_PER_STAGE: list(self.bubble_fraction_per_stage),
            M.WAN_UTILIZATION_MEAN: self.wan_utilization_mean,
            "wan_utilization": dict(self.wan_utilization),
            M.TRAINING_GPU_UTILIZATION: self.training_gpu_utilization,
            **({"device_memory_gb": self.device_memory_gb} if self.device_memory_gb is not None else {}),
            **(
                {
                    M.PREFILL_TOKENS_PER_S: self.prefill.prefill_tokens_per_s,
                    M.TTFT_P50_S: self.prefill.ttft_p50_s,
                    M.TTFT_P99_S: self.prefill.ttft_p99_s,
                    M.REQUESTS_COMPLETED: self.prefill.served,
                    "requests": self.prefill.requests,
                    "prefill_share_of_prefill_alone": self.prefill.share_of_prefill_alone,
                }
                if self.prefill is not None
                else {}
            ),
        }


def wan_bits(exp: Experiment, workers: list[WorkerSpec]) -> dict[str, float]:
    """Bits on the wire per iteration on each WAN link direction (``"a->b"``) of a placement: every
    cross-DC boundary transfer (``schedule.experiment_boundaries``) along its routed path
    (activations one way, their gradients back, ``microbatches`` of each per pipeline), and the
    gradient all-reduce of each stage whose replicas sit in several DCs (``allreduce.wan_allreduce_bits``)."""
    routes = RoutingTable(exp.topology_spec)
    at = {(w.stage, w.replica): w.dc for w in workers}
    bits: dict[str, float] = {}

    def carry(a: str, b: str, nbytes: float) -> None:
        if a == b:
            return
        dcs = routes.route(a, b).dcs
        for x, y in zip(dcs, dcs[1:]):
            bits[f"{x}->{y}"] = bits.get(f"{x}->{y}", 0.0) + nbytes * 8 / TCP_GOODPUT_FRACTION

    for r in range(exp.replicas):
        for sender, receiver in experiment_boundaries(exp):
            carry(at[(sender, r)], at[(receiver, r)], exp.microbatches * exp.activation_bytes)
            carry(at[(receiver, r)], at[(sender, r)], exp.microbatches * exp.activation_bytes)
    for (a, b), payload in wan_allreduce_bits(exp, exp.topology_spec, workers).items():
        bits[f"{a}->{b}"] = bits.get(f"{a}->{b}", 0.0) + payload / TCP_GOODPUT_FRACTION
    return bits


def simulate_policy(
    exp: Experiment,
    policy: str | None = None,
    workers: list[WorkerSpec] | None = None,
    start_offsets_s: tuple[float, ...] | None = None,
) -> Figures:
    """The figures of ``exp`` under ``policy`` (default its own), placed as ``workers`` (default
    as the policy places it), its pipelines starting together or ``start_offsets_s`` apart
    (``grant_plan.simulated_iteration``). Raises SpecError when the policy cannot place the experiment or
    trains nothing (``+prefill-alone``, an emulator measurement) and ValueError when its schedule
    cannot complete."""
    if policy is not None:
        exp = exp.with_overrides(policy=policy)
    if not exp.policy.training:
        raise SpecError(
            exp.source,
            "policy",
            exp.policy.name,
            "serves prefill alone, with no training: the simulator predicts training runs, and gives "
            "the prefill a BubbleTea policy's GPUs would serve alone beside it",
            f"simulate {exp.policy.base}{BUBBLETEA_SUFFIX}",
        )
    plan = make_plan(exp, workers, start_offsets_s=start_offsets_s)
    workers, t = list(plan.workers), plan.predicted_iteration_s
    busy, util = stage_utilization(exp, t)
    rates = {f"{link.a}->{link.b}": link.rate_bps for link in exp.topology_spec.links}
    rates.update({f"{link.b}->{link.a}": link.rate_bps for link in exp.topology_spec.links})
    wan = {k: v / (rates[k] * t) for k, v in sorted(wan_bits(exp, workers).items())}
    training = sum(util) / len(util)  # every stage has the same number of replicas
    prefill = prefill_in_bubbles(plan, t, sum(busy) / len(busy)) if exp.policy.bubbletea else None
    return Figures(
        exp.policy.name,
        t,
        exp.tokens_per_iteration / t,
        prefill.gpu_utilization_with_prefill if prefill is not None else training,
        1 - training,
        tuple(1 - u for u in util),
        wan,
        prefill=prefill,
        training_gpu_utilization=training,
    )


def wan_free_bubble_fraction(exp: Experiment, workers: list[WorkerSpec]) -> float:
    """The bubble fraction ``exp``'s schedule table leaves with every transfer instant (no WAN, no
    rendezvous): the list-schedule simulation (``grant_sim.simulate``) without links, then the
    gradient all-reduce and the optimizer step as the cost model counts them, the figure defined as
    ``Figures.bubble_fraction`` is (one minus the busy share, averaged over the stages). What a run
    measures beyond it is the bubble the WAN causes. Raises ValueError when the schedule cannot
    complete."""
    pipeline_s, _ = simulate(exp, workers, {}, {}, {}, (0.0,) * exp.replicas)
    _, util = stage_utilization(exp, pipeline_s + allreduce_s(exp, exp.topology_spec, workers) + optimizer_s(exp))
    return 1 - sum(util) / len(util)


def stage_utilization(exp: Experiment, iteration_s: float) -> tuple[list[float], list[float]]:
    """Per stage, (its busy seconds in an iteration of ``iteration_s``: its microbatches' padded
    forward and backward and the optimizer step; its share of the iteration busy, at most 1)."""
    busy = [exp.microbatches * c + optimizer_s(exp) for c in stage_compute_s(exp)]
    return busy, [min(1.0, b / iteration_s) for b in busy]
