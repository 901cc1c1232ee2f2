"""Atlas's planned grants for a launched job (``plan/job_plan.py``): its workload read from its
events (stage times, microbatches, the schedule's order, the bytes per transfer), the Experiment
that stands for it and its grant plan; the controller's loop switching from FIFO to the plan.
A job under planned grants runs in ``tests/integration/test_launch.py``."""

from __future__ import annotations

import pandas as pd
import pytest

from testbed.atlas.grants import GrantLoop, Hop, boundary_paths
from testbed.atlas.timing import HopTiming
from testbed.plan.handoff import action_handoff_s
from testbed.plan.job_plan import job_experiment, job_grant_plan, workload_from_events
from testbed.plan.workers import WorkerSpec
from testbed.spec.policy import parse_policy
from testbed.spec.routing import RoutingTable
from testbed.spec.topology_file import load_topology
from testbed.trace import schema as T

WORKERS = [
    WorkerSpec(0, 0, 0, "east-h0", "east"),
    WorkerSpec(1, 0, 1, "east-h1", "east"),
    WorkerSpec(2, 1, 0, "west-h0", "west"),
    WorkerSpec(3, 1, 1, "west-h1", "west"),
]
#: 1F1B with 3 microbatches on 2 stages: stage 0 runs F0 F1 B0 F2 B1 B2, stage 1 F0 B0 F1 B1 F2 B2
ORDERS = {0: "F0 F1 B0 F2 B1 B2", 1: "F0 B0 F1 B1 F2 B2"}
GPIPE = "F0 F1 F2 B0 B1 B2"


def _events(orders: dict[int, str], iteration: int = 1, bytes_: int = 65536, skip_optimizer: int | None = None):
    """One iteration of every worker: its passes in ``orders`` (stage 0 forward 10 ms, backward 20;
    stage 1 forward 30, backward 40; back to back), a send per forward pass to the next stage, an
    optimizer step at the end."""
    rows = []
    took = {(0, "F"): 10, (0, "B"): 20, (1, "F"): 30, (1, "B"): 40}
    for w in WORKERS:
        t = 1_000_000_000 * w.replica
        for op in orders[w.stage].split():
            kind, mb = op[0], int(op[1:])
            ns = took[(w.stage, kind)] * 1_000_000
            rows.append(
                {
                    T.WORKER: w.rank,
                    T.KIND: T.FORWARD if kind == "F" else T.BACKWARD,
                    T.ITERATION: iteration,
                    T.MICROBATCH: mb,
                    T.START_NS: t,
                    T.END_NS: t + ns,
                }  # fmt: skip
            )
            if kind == "F" and w.stage == 0:
                rows.append(
                    {
                        T.WORKER: w.rank,
                        T.KIND: T.SEND,
                        T.ITERATION: iteration,
                        T.MICROBATCH: mb,
                        T.START_NS: t + ns,
                        T.END_NS: t + ns,
                        T.BYTES: bytes_,
                        T.PEER: w.rank + 2,
                    }  # fmt: skip
                )
            t += ns
        if w.rank != skip_optimizer:
            rows.append({T.WORKER: w.rank, T.KIND: T.OPTIMIZER, T.ITERATION: iteration, T.START_NS: t, T.END_NS: t + 1})
    return pd.DataFrame(rows)


def test_the_workload_is_read_from_one_iteration_of_the_jobs_events():
    w = workload_from_events(_events(ORDERS), WORKERS, 1)
    assert w is not None and w.schedule == "1f1b" and w.microbatches == 3 and w.transfer_bytes == 65536
    assert w.stage_s == ((0.010, 0.020), (0.030, 0.040))
    gpipe = workload_from_events(_events({0: GPIPE, 1: GPIPE}), WORKERS, 1)
    assert gpipe is not None and gpipe.schedule == "gpipe"


def test_no_workload_until_every_rank_has_finished_the_iteration():
    assert workload_from_events(_events(ORDERS, skip_optimizer=3), WORKERS, 1) is None
    assert workload_from_events(_events(ORDERS), WORKERS, 2) is None  # not traced yet
    assert workload_from_events(pd.DataFrame(), WORKERS, 1) is None
    short = {0: "F0 F1 B0 B1", 1: ORDERS[1]}
    with pytest.raises(ValueError, match="different numbers of forward passes"):
        workload_from_events(_events(short), WORKERS, 1)


def test_the_job_is_planned_as_a_built_in_run_of_its_workload():
    topo = load_topology("two_dc")
    w = workload_from_events(_events(ORDERS), WORKERS, 1)
    policy = parse_policy("pp-fair/sharing=planned/striping=on")
    exp = job_experiment(w, topo, 2, 2, policy, 4, 0.05, True)
    assert exp.activation_bytes == 65536 and exp.microbatches == 3 and exp.schedule == "1f1b"
    assert exp.wan_connections == 4 and exp.policy.sharing == "planned"
    # its own processes, timed from its own operations: none of the testbed workers' hand-off
    assert not exp.compute.emulated and action_handoff_s(exp) == 0.0
    plan = job_grant_plan(exp, WORKERS, w)
    assert plan.bytes_per_transfer == 65536
    east_west = next(h for h in plan.hops if h.hop == Hop("east", "west"))
    # every forward transfer of both pipelines, each microbatch once
    assert sorted((t.kind, t.microbatch, t.replica) for t in east_west.order) == [
        ("F", m, r) for m in range(3) for r in range(2)
    ]


def test_a_fifo_loop_switches_to_the_plan_it_is_handed():
    topo = load_topology("two_dc")
    hops = boundary_paths(WORKERS, RoutingTable(topo), [(0, 1)])
    counters = {}
    loop = GrantLoop(
        _Switch(), {w.rank: w.replica for w in WORKERS}, hops, stage_of={w.rank: w.stage for w in WORKERS},
        counters=lambda hop, replica: counters.get((hop, replica), 0),
    )  # fmt: skip
    w = workload_from_events(_events(ORDERS), WORKERS, 1)
    exp = job_experiment(w, topo, 2, 2, parse_policy("pp-fair/sharing=planned"), 4, 0.05, True)
    timing = HopTiming.from_plan(job_grant_plan(exp, WORKERS, w), 0.956)
    loop.replan(timing, 10**9, "planned")
    assert loop.sharing == "planned" and loop.timing == timing
    bare = GrantLoop(_Switch(), {w.rank: w.replica for w in WORKERS}, hops)
    with pytest.raises(ValueError, match="cannot switch from fifo to planned"):
        bare.replan(timing, 10**9, "planned")


class _Switch:
    def apply(self, hop, replica, t_ready_ns=None, event="grant"):
        return 0

    def keep(self, hop, replica, t_ready_ns):
        pass

    def release(self, hop, replica, t_ns, handover, reason="done", **measured):
        pass
