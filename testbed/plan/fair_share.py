"""Links shared as TCP's flows share them, as a fluid, recomputed whenever a flow starts or ends.

A flow whose connections send one window at a time (ACK-clocked: its bytes reach a link's queue
about as fast as they leave it) gets its max-min fair rate over the links of its path, at most its
own cap (what its connections' windows carry alone) (progressive filling: Bertsekas and Gallager,
"Data Networks", 2nd ed., section 6.5.2). Flows with the same path and cap always get the same
rate, so they are kept as one class (as the simulator's speed goal allows:
``scripts/bench_sim.py``): a class's rate is computed once for all its flows and its flows end in
the order they started.

A *burst* is a flow each of whose connections' share of the bytes fits in the window it keeps in
flight, so the sender puts them all out at its pacing rate without waiting for acknowledgements.
On a one-link path its bytes wait in the link's drop-tail queue with those of the bursts that came
before, and leave in the order they went in (``fifo_queue.PacedFifo``): a burst that starts a few
ms before another ends well before it, where fair shares would end them together. (Measured on
the sharing experiment, striped: four 64 KiB transfers sent 0, 4, 7 and 14 ms apart arrived 66,
84, 89 and 94 ms after each was sent: 22 ms of the link each.) The ACK-clocked flows share what
the bursts leave.

Units are the caller's: here capacities and caps are in transfers per second, each flow's work 1.

Pure: no kernel, no processes.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from testbed.plan.fifo_queue import PacedFifo


def max_min_rates(
    capacity: dict[Hashable, float], classes: Sequence[tuple[tuple[Hashable, ...], float, int]]
) -> list[float]:
    """Each class's per-flow rate: ``classes`` are (path: the links crossed, cap: a flow's most,
    flows: how many) and ``capacity`` each link's rate; the allocation is max-min fair with the caps
    (progressive filling: raise every unfixed flow's rate together until a link fills or a cap is
    reached, fix those flows, repeat). Raises KeyError for a link without a capacity."""
    rate = [0.0] * len(classes)
    left = {h: capacity[h] for path, _, _ in classes for h in path}
    active = {i for i, (_, _, n) in enumerate(classes) if n > 0}
    while active:
        count: dict[Hashable, int] = {}
        for i in active:
            for h in classes[i][0]:
                count[h] = count.get(h, 0) + classes[i][2]
        level = min((max(left[h], 0.0) / n for h, n in count.items()), default=math.inf)
        lowest_cap = min(classes[i][1] for i in active)
        if lowest_cap <= level:
            fixed = {i for i in active if classes[i][1] <= level and classes[i][1] == lowest_cap}
            at = lowest_cap
        else:
            full = {h for h, n in count.items() if max(left[h], 0.0) / n <= level * (1 + 1e-12)}
            fixed = {i for i in active if full.intersection(classes[i][0])}
            at = level
        for i in fixed:
            rate[i] = at
            for h in classes[i][0]:
                left[h] -= at * classes[i][2]
        active -= fixed
    return rate


@dataclass
class _Class:
    path: tuple[Hashable, ...]
    cap: float
    flows: deque = field(default_factory=deque)  # (flow, progress when it started), oldest first
    progress: float = 0.0  # work a flow of this class has done since the class was made
    rate: float = 0.0


class FairShare:
    """Flows sharing links (see the module doc): ACK-clocked flows max-min fairly, bursts on one
    link in the order their bytes went into its queue; each flow has 1 unit of work.
    ``capacity``: each link's rate, in units of work per second."""

    def __init__(self, capacity: dict[Hashable, float]):
        self.capacity = capacity
        self.classes: dict[tuple[tuple[Hashable, ...], float], _Class] = {}
        self.queues: dict[Hashable, PacedFifo] = {}
        self.now = 0.0

    def __len__(self) -> int:
        return sum(len(c.flows) for c in self.classes.values()) + sum(len(q) for q in self.queues.values())

    def _advance(self, now: float) -> None:
        dt = now - self.now
        for c in self.classes.values():
            c.progress += c.rate * dt
        for q in self.queues.values():
            q.advance(now)
        self.now = now

    def _reshare(self) -> None:
        # the ACK-clocked flows share what the bursts leave now (recomputed at the next start or end)
        live = [c for c in self.classes.values() if c.flows]
        if not live:  # only bursts (or nothing): nothing to share
            return
        left = dict(self.capacity)
        for h, q in self.queues.items():
            left[h] -= q.sending_rate()
        for c, r in zip(live, max_min_rates(left, [(c.path, c.cap, len(c.flows)) for c in live])):
            c.rate = r

    def add(
        self, now: float, flow: Hashable, path: tuple[Hashable, ...], cap: float, pacing: float | None = None
    ) -> None:
        """``flow`` starts at ``now`` over ``path``, at most ``cap`` units of work per second;
        ``pacing``: a burst, its bytes going into the queue at that rate (work per second) and
        leaving in arrival order (``fifo_queue.PacedFifo``); on a path of several links a burst
        shares them as an ACK-clocked flow does (its queue at one link would reshape it for the
        next)."""
        self._advance(now)
        if pacing is not None and len(path) == 1:
            if path[0] not in self.queues:
                self.queues[path[0]] = PacedFifo(self.capacity[path[0]])
            self.queues[path[0]].add(now, flow, pacing)
        else:
            c = self.classes.setdefault((path, cap), _Class(path, cap))
            c.flows.append((flow, c.progress))
        self._reshare()

    def next_done(self) -> tuple[float, Hashable] | None:
        """(when, flow) of the next flow to end if nothing changes before; None when none flows."""
        best = None
        for c in self.classes.values():
            if c.flows and c.rate > 0:
                flow, start = c.flows[0]
                t = self.now + max(0.0, 1.0 - (c.progress - start)) / c.rate
                if best is None or t < best[0]:
                    best = (t, flow)
        for q in self.queues.values():
            nxt = q.next_done()
            if nxt is not None and (best is None or nxt[0] < best[0]):
                best = nxt
        return best

    def remove(self, now: float, flow: Hashable) -> None:
        """``flow``, a burst or the oldest of its class, ends at ``now``. Raises KeyError for
        another flow."""
        self._advance(now)
        for q in self.queues.values():
            if flow in q:
                q.remove(now, flow)
                self._reshare()
                return
        for c in self.classes.values():
            if c.flows and c.flows[0][0] == flow:
                c.flows.popleft()
                self._reshare()
                return
        raise KeyError(flow)
