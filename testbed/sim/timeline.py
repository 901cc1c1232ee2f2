"""One simulated iteration as a run's events (the columns of ``trace/schema.py``), so that
``testbed sim --timeline`` writes the same Chrome trace and timeline plot as a run folder: every
forward and backward (with its virtual stage and, for a split backward, its part) where the
simulation placed it (``grant_plan.simulated_iteration``, the links
shared as the policy shares them), then each worker's gradient all-reduce and optimizer step as the
cost model counts them (after the pipeline's end: ``allreduce.allreduce_s``,
``cost_model.optimizer_s``). Times from the iteration's start, in ns. Pure.
"""

from __future__ import annotations

from typing import Any

from testbed.plan.allreduce import allreduce_s
from testbed.plan.connections import wan_connections
from testbed.plan.cost_model import optimizer_s
from testbed.plan.grant_plan import simulated_iteration
from testbed.plan.workers import WorkerSpec
from testbed.spec.experiment import Experiment
from testbed.trace import schema as T

#: at most this many replicas of each stage are drawn (a scenario has dozens; the trace keeps all)
PLOTTED_REPLICAS = 4


def simulated_events(exp: Experiment, workers: list[WorkerSpec]) -> list[dict[str, Any]]:
    """The rows of one simulated iteration (iteration 0), one per compute action, all-reduce and
    optimizer step of every worker. Raises ValueError when the schedule cannot complete."""
    topo = exp.topology_spec
    timeline: list = []
    end = simulated_iteration(exp, topo, workers, wan_connections(exp, topo, workers), timeline=timeline)
    by = {(w.stage, w.replica): w for w in workers}

    def row(w: WorkerSpec, kind: str, microbatch: int, start_s: float, end_s: float) -> dict[str, Any]:
        out: dict[str, Any] = dict.fromkeys(T.COLUMNS)
        out.update(
            {
                T.WORKER: w.rank,
                T.HOST: w.host,
                T.DC: w.dc,
                T.STAGE: w.stage,
                T.REPLICA: w.replica,
                T.ITERATION: 0,
                T.MICROBATCH: microbatch,
                T.KIND: kind,
                T.START_NS: round(start_s * 1e9),
                T.END_NS: round(end_s * 1e9),
            }
        )
        return out

    part = {"I": T.INPUT_PART, "W": T.WEIGHT_PART}
    rows = [
        {
            **row(by[(s, r)], T.FORWARD if a.kind == "F" else T.BACKWARD, a.microbatch, start, finish),
            T.VIRTUAL_STAGE: a.stage,
            T.PART: part.get(a.kind),
        }
        for s, r, a, start, finish in timeline
    ]
    reduce_s, step_s = allreduce_s(exp, topo, workers), optimizer_s(exp)
    for w in workers:
        if reduce_s > 0:
            rows.append(row(w, T.ALLREDUCE, -1, end, end + reduce_s))
        rows.append(row(w, T.OPTIMIZER, -1, end + reduce_s, end + reduce_s + step_s))
    return sorted(rows, key=lambda x: (x[T.START_NS], x[T.WORKER]))
