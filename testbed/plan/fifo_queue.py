"""One link direction's drop-tail queue fed by bursts, as a fluid: each flow puts its bytes into the
queue at its own pacing rate from when it starts until all are in, and the link sends them in the
order they went in, at its capacity. A byte then leaves at a time fixed by the bytes ahead of it
alone, so the queue is described by its *virtual time* ``x``: the instant at which the byte now
leaving went in (``x`` equals the present while the queue is empty). While the queue holds bytes,
``x`` advances at the capacity over the rate at which bytes went in at ``x``; a flow is done when
``x`` passes the instant its last byte went in. (A FIFO system's cumulative input and output
functions, the horizontal distance between them being a byte's delay: Le Boudec and Thiran,
"Network Calculus", 2001, chapter 1.)

Units are the caller's: here capacities and pacing rates in transfers per second, each flow's
work 1.

Pure: no kernel, no processes.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass

#: times closer than this (s) are one instant
_EPS = 1e-12


@dataclass(frozen=True)
class _Burst:
    flow: Hashable
    start: float  # when its first byte goes in (s)
    end: float  # when its last byte goes in (s)
    rate: float  # its pacing rate (work per second)


class PacedFifo:
    """A link direction of ``capacity`` (work per second) serving paced bursts in arrival order
    (see the module doc)."""

    def __init__(self, capacity: float):
        if not capacity > 0:
            raise ValueError(f"capacity {capacity!r} is not positive")
        self.capacity = capacity
        self.bursts: list[_Burst] = []
        self.now = 0.0
        self.x = 0.0  # the virtual time: when the byte leaving now went in
        # caches, until the bursts change: the rate look-up, the next burst done
        self._table: Callable[[float], tuple[float, float]] | None = None
        self._next: tuple[float, Hashable] | None = None

    def __len__(self) -> int:
        return len(self.bursts)

    def __contains__(self, flow: Hashable) -> bool:
        return any(b.flow == flow for b in self.bursts)

    def _going_in(self) -> Callable[[float], tuple[float, float]]:
        """For any instant ``x``: (the rate at which bytes went in just after ``x``, the next
        instant that rate changes), from the bursts' edges sorted once per change of the bursts
        (O(log n) a look-up)."""
        if self._table is not None:
            return self._table
        delta: dict[float, float] = {}
        for b in self.bursts:
            delta[b.start] = delta.get(b.start, 0.0) + b.rate
            delta[b.end] = delta.get(b.end, 0.0) - b.rate
        edges = sorted(delta)
        rates = list(itertools.accumulate(delta[t] for t in edges))
        tiny = self.capacity * 1e-9  # what is left of the rates' sum once every burst has ended

        def at(x: float) -> tuple[float, float]:
            i = bisect.bisect_right(edges, x + _EPS)
            rate = rates[i - 1] if i else 0.0
            return (rate if rate > tiny else 0.0), (edges[i] if i < len(edges) else math.inf)

        self._table = at
        return at

    def _run(self, x: float, now: float, until_t: float = math.inf, until_x: float = math.inf) -> tuple[float, float]:
        """(x, now) advanced until ``now`` reaches ``until_t`` or ``x`` reaches ``until_x``."""
        going_in = self._going_in()
        while now < until_t - _EPS and x < until_x - _EPS:
            rate, nxt = going_in(x)
            if x >= now - _EPS and rate <= self.capacity:  # no queue: bytes leave as they go in
                step = min(until_t, until_x, nxt) - now
                if math.isinf(step):
                    return x, now  # nothing more will happen
                x = now = now + step
                continue
            if rate == 0.0:  # nothing went in between x and the next edge: no time passes
                x = min(nxt, now, until_x)
                continue
            speed = self.capacity / rate  # dx/dt
            dt = min((min(nxt, until_x) - x) / speed, until_t - now)
            if speed > 1:  # the queue drains: x catches up with the present
                dt = min(dt, (now - x) / (speed - 1))
            x, now = min(x + speed * dt, now + dt), now + dt
        while x < now - _EPS and x < until_x - _EPS:  # skip what nothing went in over
            rate, nxt = going_in(x)
            if rate > 0:
                break
            x = min(nxt, now, until_x)
        return x, now

    def advance(self, now: float) -> None:
        """The queue as it is at ``now`` (not before the last call's time)."""
        if now <= self.now:
            return
        if not self.bursts:
            self.x = self.now = now
            return
        self.x, self.now = self._run(self.x, self.now, until_t=now)
        self.x = min(self.x, self.now)

    def add(self, now: float, flow: Hashable, rate: float) -> None:
        """``flow`` starts at ``now``, putting its 1 unit of work in at ``rate`` per second."""
        if not rate > 0:
            raise ValueError(f"pacing rate {rate!r} of {flow!r} is not positive")
        self.advance(now)
        self.bursts.append(_Burst(flow, now, now + 1 / rate, rate))
        self._table = self._next = None

    def next_done(self) -> tuple[float, Hashable] | None:
        """(when, flow) of the next flow whose last byte leaves, if no flow starts before; None
        when the queue carries none."""
        if not self.bursts:
            return None
        if self._next is None:  # what the queue does next changes only when the bursts do
            first = min(self.bursts, key=lambda b: b.end)
            _, t = self._run(self.x, self.now, until_x=first.end)
            self._next = (t, first.flow)
        return self._next

    def remove(self, now: float, flow: Hashable) -> None:
        """``flow`` is done at ``now``. Raises KeyError for a flow it does not carry."""
        self.advance(now)
        for i, b in enumerate(self.bursts):
            if b.flow == flow:
                del self.bursts[i]
                self._table = self._next = None
                return
        raise KeyError(flow)

    def sending_rate(self) -> float:
        """The work per second the link sends of these flows now: all of it while bytes wait."""
        if self.x < self.now - _EPS:
            return self.capacity
        return min(self.capacity, self._going_in()(self.now)[0])
