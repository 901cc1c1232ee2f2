"""A lower bound of one simulated iteration (``grant_sim.simulate``): the longest path through the
first pipeline's schedule tables, each transfer at its speed alone. Atlas's DC selection prunes the
DC orders whose bound exceeds the best prediction found (``placement.select_dcs``,
``cost_model.lower_bound_s``).

Pure: no kernel, no processes.
"""

from __future__ import annotations

from testbed.plan.actions import action_seconds, input_of, output_of
from testbed.plan.boundary_transfers import Hop, LinkTiming, Transfer
from testbed.plan.schedule import experiment_tables
from testbed.plan.virtual_stages import stage_homes
from testbed.plan.workers import WorkerSpec
from testbed.spec.experiment import Experiment


def critical_path_s(
    exp: Experiment,
    workers: list[WorkerSpec],
    links: dict[Hop, LinkTiming],
    paths: dict[tuple[int, int], list[Hop]],
    one_way_s: dict[tuple[int, int], float],
    block_s: tuple[float, float] | None = None,
    path_links: dict[tuple[int, int], tuple[LinkTiming, ...]] | None = None,
) -> float:
    """A lower bound (s) of ``simulate``'s iteration under any sharing, with every pipeline starting
    at 0 or later: the longest path through the first pipeline's schedule tables, where an action
    starts once its worker is free and its input has arrived, and a transfer across DCs leaves once
    it is ready and the receiver's ready notice has crossed (one one-way delay after the receiver
    reached the action that needs it), then takes its time alone on the slowest link of its path
    and one one-way delay. ``simulate`` adds only time to this: waits for a link's share, a
    queue's turn, a grant, or the notice queued behind the receiver's own bytes, and the further
    sends of an output striped over several connections (``handoff.STRIPE_SEND_S``). The last is why this is a
    longest path rather than ``simulate`` without contention, whose tie-breaks can make it the
    longer (a transfer that leaves earlier can hold a notice back). Arguments as ``simulate``'s;
    raises ValueError when the schedule cannot complete."""
    S = exp.stages
    home = stage_homes(exp.schedule, S, exp.chunks)
    V = len(home)
    took_s = action_seconds(exp, V, block_s, None)
    rank_of = {w.stage: w.rank for w in workers if w.replica == 0}
    actions = experiment_tables(exp)
    pos, free = [0] * S, [0.0] * S  # per worker: its next action, when it is free
    ready: dict[Transfer, float] = {}  # when each transfer's bytes are ready at its sender
    moved = True
    while moved:
        moved = False
        for s in range(S):
            while pos[s] < len(actions[s]):
                a = actions[s][pos[s]]
                start = free[s]
                need = input_of(a, 0, V)
                if need is not None:
                    if need not in ready:
                        break
                    src, dst = (need.stage, need.stage + 1) if need.kind == "F" else (need.stage + 1, need.stage)
                    key = (rank_of[home[src]], rank_of[home[dst]])
                    if key in paths:
                        leaves = max(ready[need], free[s] + one_way_s[key])
                        own = (path_links or {}).get(key) or [links[h] for h in paths[key]]
                        alone = max(x.transfer_s for x in own)
                        start = max(start, leaves + alone + one_way_s[key])
                    else:
                        start = max(start, ready[need])
                free[s] = start + took_s[a.kind][a.stage]
                out = output_of(a, 0, V)
                if out is not None:
                    ready[out] = free[s]
                pos[s] += 1
                moved = True
    if any(p < len(actions[s]) for s, p in enumerate(pos)):
        s = next(s for s, p in enumerate(pos) if p < len(actions[s]))
        raise ValueError(f"the schedule does not complete: stage {s} waits at {actions[s][pos[s]]}")
    return max(free)
