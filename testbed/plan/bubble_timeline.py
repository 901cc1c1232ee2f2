"""Each worker's idle windows (bubbles) over one iteration, predicted before the run from the
schedule tables, the compute targets and the WAN: the list-schedule simulation the cost model and
Atlas's grant plan use (``grant_sim.simulate``), with the links shared as the policy shares them
and, under planned grants, the plan's pipeline offsets. The start of BubbleTea's bubble
predictor (DESIGN.md section 1, item 5) and of the simulator's bubble figures. Pure.

Times are from the iteration's start (replica 0's first forward on stage 0), in seconds; the
iteration ends with the last compute or byte on a link (the all-reduce and the optimizer step
follow it and are not simulated here).
"""

from __future__ import annotations

from dataclasses import dataclass

from testbed.plan.connections import wan_connections
from testbed.plan.grant_plan import simulated_iteration
from testbed.plan.virtual_stages import chunk_numbers, experiment_homes, slot_name
from testbed.plan.workers import WorkerSpec
from testbed.spec.experiment import Experiment
from testbed.spec.topology import TopologySpec

#: the wait after a worker's last action until the iteration's end (the drain)
END = "end"


@dataclass(frozen=True)
class Bubble:
    """One idle window of a worker: pipeline ``stage``, data-parallel ``replica``, the action it
    precedes (``schedule.slot_name``: ``F2``, the forward of microbatch 2; ``END``: the drain), when
    it starts and how long it lasts (s)."""

    stage: int
    replica: int
    before: str
    start_s: float
    duration_s: float


def bubble_timeline(
    exp: Experiment,
    topo: TopologySpec,
    workers: list[WorkerSpec],
    connections: int | None = None,
    block_s: tuple[float, float] | None = None,
) -> tuple[float, list[Bubble]]:
    """(the simulated iteration in s, every worker's bubbles in it, by stage, replica and time) for
    ``exp`` placed as ``workers`` on ``topo``; ``connections`` per cross-DC transfer (default the
    policy's), ``block_s`` per-block (forward, backward) seconds (default the experiment's).
    Raises ValueError when the schedule cannot complete."""
    if connections is None:
        connections = wan_connections(exp, topo, workers)
    timeline: list = []
    end = simulated_iteration(exp, topo, workers, connections, block_s, timeline)
    chunk = chunk_numbers(experiment_homes(exp))
    bubbles = []
    actions: dict[tuple[int, int], list] = {}
    for x in timeline:
        actions.setdefault((x[0], x[1]), []).append(x)
    for w in sorted(workers, key=lambda x: (x.stage, x.replica)):
        mine = sorted(actions.get((w.stage, w.replica), []), key=lambda x: x[3])
        t = 0.0
        for _, _, action, start, finish in mine:
            if start > t + 1e-12:
                slot = slot_name(action.kind, action.microbatch, chunk[action.stage])
                bubbles.append(Bubble(w.stage, w.replica, slot, t, start - t))
            t = finish
        if end > t + 1e-12:
            bubbles.append(Bubble(w.stage, w.replica, END, t, end - t))
    return end, bubbles


def stage_bubble_fractions(bubbles: list[Bubble], iteration_s: float, stages: int, replicas: int) -> list[float]:
    """Each stage's share of the iteration spent in bubbles, averaged over its replicas."""
    total = [0.0] * stages
    for b in bubbles:
        total[b.stage] += b.duration_s
    return [x / replicas / iteration_s for x in total]
