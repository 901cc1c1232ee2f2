"""When one pipeline may stand for all in ``grant_sim.simulate``: pipelines that run the same
timeline are simulated once, each link's capacity divided among the copies (``symmetric_copies``),
and the order in which every pipeline took each link made from the first's (``CopiedOrder``).

Pure: no kernel, no processes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from testbed.plan.boundary_transfers import Hop, LinkTiming, Transfer
from testbed.spec.experiment import Experiment


def symmetric_copies(
    exp: Experiment,
    rank_at: list[list[int]],
    timing: dict[tuple[int, int], tuple[LinkTiming, ...]],
    paths: dict[tuple[int, int], list[Hop]],
    one_way_s: dict[tuple[int, int], float],
    stagger_s: tuple[float, ...],
    fair: bool,
) -> int:
    """How many identical copies of the first pipeline ``simulate`` may stand the pipelines for:
    ``exp.replicas`` where every pipeline runs the same timeline, else 1. They do where they start
    together, each boundary of every pipeline crosses the same hops with the same one-way delay and
    the same timing on each (``timing``: each pair's on each hop of its path) as the first's, and
    the links are shared as TCP's flows share them (``fair``) or not crossed at
    all. Sharing then scales: R copies of a set of flows on links of capacity C get what one set
    gets on C / R (max-min fairness, by the allocation's uniqueness; a fluid FIFO queue, whose
    bursts that start together go in side by side and end together, by its virtual time's speed,
    capacity over input rate), so one pipeline simulated on each link's R-th is every pipeline's
    timeline (for issue 39's speed goals: ``scripts/bench_sim.py``). Pure."""
    R = exp.replicas
    if R == 1 or len(set(stagger_s)) > 1 or (timing and not fair):
        return 1
    for v in range(len(rank_at) - 1):
        first = (rank_at[v][0], rank_at[v + 1][0])
        for r in range(1, R):
            pair = (rank_at[v][r], rank_at[v + 1][r])
            for a, b in ((pair, first), (pair[::-1], first[::-1])):
                if (
                    paths.get(a) != paths.get(b)
                    or one_way_s.get(a) != one_way_s.get(b)
                    or timing.get(a) != timing.get(b)
                ):
                    return 1
    return R


class CopiedOrder(Mapping[Hop, list[Transfer]]):
    """Each link direction's order of every pipeline where the first stood for ``copies``
    (``symmetric_copies``): each of the first's transfers followed by the same transfer of the
    other pipelines, in replica order. A link's list is made when it is first read: most callers
    read none (``placement.select_dcs`` simulates every DC order for its iteration time alone)."""

    def __init__(self, first: dict[Hop, list[Transfer]], copies: int) -> None:
        self._first, self._copies = first, copies
        self._made: dict[Hop, list[Transfer]] = {}

    def __getitem__(self, hop: Hop) -> list[Transfer]:
        if hop not in self._made:
            self._made[hop] = [t._replace(replica=r) for t in self._first[hop] for r in range(self._copies)]
        return self._made[hop]

    def __iter__(self) -> Iterator[Hop]:
        return iter(self._first)

    def __len__(self) -> int:
        return len(self._first)
