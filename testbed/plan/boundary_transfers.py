"""What crosses the WAN at a stage boundary in one iteration, as data: the link directions a
boundary's flows cross (``Hop``, ``boundary_paths``), one boundary transfer (``Transfer``) and what
a link direction takes of it (``LinkTiming``). ``grant_sim.simulate`` plays them; ``grant_plan``
orders them.

Pure: no kernel, no processes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from testbed.plan.workers import WorkerSpec
from testbed.spec.routing import RoutingTable


@dataclass(frozen=True, order=True)
class Hop:
    """One WAN egress (router of ``src`` towards neighbour ``dst``) crossed by a boundary's flows."""

    src: str
    dst: str

    def __str__(self) -> str:
        return f"{self.src}->{self.dst}"


class Transfer(NamedTuple):
    """One stage-boundary transfer of an iteration: pipeline ``replica``'s activations (``F``,
    virtual stage ``stage`` to ``stage + 1``) or activation gradients (``B``, ``stage + 1`` to
    ``stage``) of ``microbatch``. Under one virtual stage per worker (GPipe, 1F1B, ZB-H1) a virtual
    stage is the worker's stage. A named tuple, not a dataclass: the simulation hashes transfers
    millions of times an iteration at the paper's scale, and a tuple hashes in C
    (``scripts/bench_sim.py``)."""

    kind: str
    stage: int
    microbatch: int
    replica: int

    def __str__(self) -> str:
        return f"{self.kind}{self.microbatch}r{self.replica}"


def boundary_paths(
    workers: list[WorkerSpec], routes: RoutingTable, boundaries: list[tuple[int, int]]
) -> dict[tuple[int, int], list[Hop]]:
    """For each (sender rank, receiver rank) pair of a pipeline's workers that a stage boundary
    joins (``boundaries``: pairs of workers' stages, ``schedule.home_boundaries``) in different
    DCs (both directions), the WAN egresses its packets cross, in order."""
    by = {(w.stage, w.replica): w for w in workers}
    out = {}
    for w in workers:
        for a_stage, b_stage in boundaries:
            if w.stage != a_stage:
                continue
            nxt = by.get((b_stage, w.replica))
            if nxt is None or nxt.dc == w.dc:
                continue
            for a, b in ((w, nxt), (nxt, w)):
                dcs = routes.route(a.dc, b.dc).dcs
                out[(a.rank, b.rank)] = [Hop(x, y) for x, y in zip(dcs, dcs[1:])]
    return out


@dataclass(frozen=True)
class LinkTiming:
    """What the simulation needs of one crossed link direction: one transfer's time on it when
    granted, or alone (s), the link's one-way delay (s) and, for fair sharing, how many transfers
    it carries at once before they slow down (``concurrency``: the link's rate over what one
    transfer's connections fill of it, at least 1) and whether each transfer reaches it as one
    burst, so that it sends transfers in the order they arrive (``bursts``:
    ``connections.sent_at_once``; ``fair_share``'s bursts); ``delivery_s``, under grants, the time
    from a transfer's last byte reaching the far end of the last link of its path to its receiver
    having it, beyond the delay (0 in a plan; a run's measured figure where
    ``sim/plan_gap.py`` puts it in)."""

    transfer_s: float
    delay_s: float
    concurrency: float = 1.0
    bursts: bool = False
    delivery_s: float = 0.0
