"""One link direction's drop-tail queue fed by bursts, as a fluid: each flow puts its bytes into the
queue at its own pacing rate from when it starts until all are in, and the link sends them in the
order they went in, at its capacity. A byte then leaves at a time fixed by the bytes ahead of it
alone, so the queue is described by its *virtual time* ``x``: the instant at which the byte now
leaving went in (``x`` equals the present while the queue is empty). While the queue holds bytes,
``x`` advances at the capacity over the rate at which bytes went in at ``x``; a flow is done when
``x`` passes the instant its last byte went in. (The fluid FIFO queue of network calculus: Le
Boudec and Thiran, "Network Calculus", 2001, section 1.1; its departure time of a byte is the
virtual time used here.)

Units are the caller's: here capacities and pacing rates in transfers per second, each flow's
work 1.

Pure: no kernel, no processes.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
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

    def __len__(self) -> int:
        return len(self.bursts)

    def __contains__(self, flow: Hashable) -> bool:
        return any(b.flow == flow for b in self.bursts)

    def _going_in(self, x: float) -> tuple[float, float]:
        """(the rate at which bytes went in just after instant ``x``, the next instant it changes)."""
        rate, nxt = 0.0, math.inf
        for b in self.bursts:
            if b.start <= x + _EPS and x + _EPS < b.end:
                rate += b.rate
            for edge in (b.start, b.end):
                if edge > x + _EPS:
                    nxt = min(nxt, edge)
        return rate, nxt

    def _run(self, x: float, now: float, until_t: float = math.inf, until_x: float = math.inf) -> tuple[float, float]:
        """(x, now) advanced until ``now`` reaches ``until_t`` or ``x`` reaches ``until_x``."""
        while now < until_t - _EPS and x < until_x - _EPS:
            rate, nxt = self._going_in(x)
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
            rate, nxt = self._going_in(x)
            if rate > 0:
                break
            x = min(nxt, now, until_x)
        return x, now

    def advance(self, now: float) -> None:
        """The queue as it is at ``now`` (not before the last call's time)."""
        self.x, self.now = self._run(self.x, self.now, until_t=now)
        self.x = min(self.x, self.now)

    def add(self, now: float, flow: Hashable, rate: float) -> None:
        """``flow`` starts at ``now``, putting its 1 unit of work in at ``rate`` per second."""
        if not rate > 0:
            raise ValueError(f"pacing rate {rate!r} of {flow!r} is not positive")
        self.advance(now)
        self.bursts.append(_Burst(flow, now, now + 1 / rate, rate))

    def next_done(self) -> tuple[float, Hashable] | None:
        """(when, flow) of the next flow whose last byte leaves, if no flow starts before; None
        when the queue carries none."""
        if not self.bursts:
            return None
        first = min(self.bursts, key=lambda b: b.end)
        _, t = self._run(self.x, self.now, until_x=first.end)
        return t, first.flow

    def remove(self, now: float, flow: Hashable) -> None:
        """``flow`` is done at ``now``. Raises KeyError for a flow it does not carry."""
        self.advance(now)
        for i, b in enumerate(self.bursts):
            if b.flow == flow:
                del self.bursts[i]
                return
        raise KeyError(flow)

    def sending_rate(self) -> float:
        """The work per second the link sends of these flows now: all of it while bytes wait."""
        if self.x < self.now - _EPS:
            return self.capacity
        return min(self.capacity, self._going_in(self.now)[0])
