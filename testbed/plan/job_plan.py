"""Atlas's grant plan for a user's own job (``testbed launch --policy .../sharing=planned``).

The testbed plans a built-in run's grants from its workload: the schedule, each stage's compute
per microbatch, the bytes crossing each boundary, the links. A job declares none of these, so they
are measured from one of its first iterations (``PROFILED_ITERATION``, ``workload_from_events``):
each stage's forward and backward
per microbatch from the passes the job's helper timed (``trace/job.py``), the microbatches from
their count, the schedule from their order (every forward before the first backward: GPipe; else
1F1B), the bytes per transfer from the hook's sends (``train/job_hook.py``). ``job_experiment``
sets them in an Experiment that stands for the job (a model whose boundary activation is exactly
those bytes: one microbatch of one token of one byte per value), and the testbed's own planner
(``grant_plan.plan_grants``) plans its grants as for a built-in run of that workload.

Pure: events in, a plan out.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from testbed.plan.grant_plan import GrantPlan, plan_grants
from testbed.plan.workers import WorkerSpec
from testbed.spec.compute import ComputeModel
from testbed.spec.experiment import Experiment
from testbed.spec.model import ModelConfig
from testbed.spec.policy import Policy
from testbed.spec.topology import TopologySpec
from testbed.trace import schema as T

#: the job's iteration its plan is made from: its second, as its first also holds what a library does
#: once (torch.distributed.pipelining runs an extra forward pass on its first step to infer its
#: stages' shapes); FIFO grants until then
PROFILED_ITERATION = 1


@dataclass(frozen=True)
class JobWorkload:
    """What the grant plan needs of a job, measured: its schedule (``1f1b`` or ``gpipe``), the
    microbatches per iteration, the payload bytes of one boundary transfer, and each stage's
    (forward, backward) seconds on one microbatch."""

    schedule: str
    microbatches: int
    transfer_bytes: int
    stage_s: tuple[tuple[float, float], ...]

    def describe(self) -> str:
        stages = ", ".join(f"stage {s} {f * 1e3:.1f}/{b * 1e3:.1f} ms" for s, (f, b) in enumerate(self.stage_s))
        return (
            f"{self.schedule}, {self.microbatches} microbatches, {self.transfer_bytes} bytes per transfer, "
            f"forward/backward per microbatch: {stages}"
        )


def workload_from_events(ev: pd.DataFrame, workers: list[WorkerSpec], iteration: int) -> JobWorkload | None:
    """The job's workload in ``iteration`` (see the module doc), or None until every worker has
    traced that iteration's ``optimizer`` step with its passes, or where the hook reported no
    transfer in it. Raises ValueError where the workers count different microbatches."""
    if ev.empty or T.ITERATION not in ev:
        return None
    mine = ev[ev[T.ITERATION] == iteration]
    done = set(mine.loc[mine[T.KIND] == T.OPTIMIZER, T.WORKER])
    if not {w.rank for w in workers} <= done:
        return None
    passes = mine[mine[T.KIND].isin((T.FORWARD, T.BACKWARD))]
    sends = mine[(mine[T.KIND] == T.SEND) & mine[T.BYTES].notna()]
    if passes.empty or sends.empty:
        return None
    counts = {int(n) for n in passes[passes[T.KIND] == T.FORWARD].groupby(T.WORKER).size()}
    if len(counts) != 1:
        raise ValueError(f"the job's ranks ran different numbers of forward passes in iteration {iteration}: {counts}")
    stages = max(w.stage for w in workers) + 1
    took = (passes[T.END_NS] - passes[T.START_NS]) / 1e9
    stage_of = {w.rank: w.stage for w in workers}
    stage = passes[T.WORKER].map(stage_of)
    stage_s = []
    for s in range(stages):
        f = took[(stage == s) & (passes[T.KIND] == T.FORWARD)]
        b = took[(stage == s) & (passes[T.KIND] == T.BACKWARD)]
        if f.empty or b.empty:
            return None
        stage_s.append((float(f.median()), float(b.median())))
    first = passes[passes[T.WORKER].map(stage_of) == 0].sort_values(T.START_NS)
    kinds = list(first[first[T.WORKER] == first[T.WORKER].iloc[0]][T.KIND])
    gpipe = T.BACKWARD in kinds and T.FORWARD not in kinds[kinds.index(T.BACKWARD) :]
    return JobWorkload("gpipe" if gpipe else "1f1b", counts.pop(), int(sends[T.BYTES].median()), tuple(stage_s))


def job_experiment(
    workload: JobWorkload,
    topo: TopologySpec,
    stages: int,
    replicas: int,
    policy: Policy,
    connections: int,
    floor_share: float,
    borrow: bool,
    base: Experiment | None = None,
) -> Experiment:
    """The Experiment standing for the job (see the module doc): its workload, its layout and
    ``policy``, ``connections`` per striped transfer, the held classes' ``floor_share`` and
    ``borrow``; the per-connection window of ``base``, the experiment it was launched on, if any."""
    model = ModelConfig(n_layers=stages, d_model=workload.transfer_bytes, n_heads=1, seq_len=1, value_bytes=1)
    return Experiment(
        name="job",
        topology=topo.name,
        topology_spec=topo,
        schedule=workload.schedule,
        stages=stages,
        replicas=replicas,
        microbatches=workload.microbatches,
        microbatch_size=1,
        model=model,
        # its own processes, not this testbed's workers: no hand-off of theirs (plan/handoff.py)
        compute=ComputeModel(mode="real", emulated=False),
        policy=policy,
        wan_connections=connections if policy.striping else 0,
        wan_connection_share=base.wan_connection_share if base is not None else None,
        wan_window_bytes=base.wan_window_bytes if base is not None else None,
        atlas_floor_share=floor_share,
        atlas_borrow=borrow,
    )


def job_grant_plan(exp: Experiment, workers: list[WorkerSpec], workload: JobWorkload) -> GrantPlan:
    """The grant plan of the job ``exp`` stands for, placed as ``workers``, from its measured
    stage times."""
    connections = exp.wan_connections if exp.policy.striping else 1
    return plan_grants(exp, exp.topology_spec, workers, connections, stage_s=workload.stage_s)
