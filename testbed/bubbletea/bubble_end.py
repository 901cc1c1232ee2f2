"""What ends a bubble, as the prefill server sees it: training's input arriving (``Arrived``, set
by the worker's thread, which waits on gloo itself) or a serving window's end (``Deadline``,
``alone.py``).

The server waits on it rather than sleeping between looks, so that a pass stops as soon as it is
told the input is in; the pass's GPU time ends at the bubble's end, ``t_ns``, as a high-priority
stream's kernel takes the GPU the moment its input is there.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol

from testbed.trace.clock import now_ns

#: how often a pass that has had its GPU time, waiting for the prefill stream to compute its
#: blocks (an overrun), looks whether they are (s); the worker wakes it as soon as the operation
#: that training's input feeds has started (``Arrived``)
POLL_S = 0.00025


class BubbleEnd(Protocol):
    """``threading.Event``'s reading side: ``is_set()`` whether the bubble has ended; ``wait(timeout)``
    blocks until the waiting thread is to look again (the bubble has ended and, for ``Arrived``,
    the worker has woken it) or ``timeout`` seconds have passed (None: no limit), and returns
    ``is_set()``; ``t_ns`` when it ended (``trace.clock.now_ns``), once ``is_set()``;
    ``until_woken()``, once it has ended, blocks until the thread may act on the end (at once
    but for ``Arrived``, until woken)."""

    @property
    def t_ns(self) -> int | None: ...

    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...

    def until_woken(self) -> None: ...


class Arrived:
    """A bubble that ends when another thread says training's input has arrived: ``end(t_ns)``
    marks it ended without waking a thread that ``wait``s; ``wake()`` wakes it (and ends the
    bubble now if nothing ended it before).

    Apart, so that the worker's thread marks the arrival at once and wakes the filling thread
    only once training's operation has started: woken at the arrival, that thread took the
    worker's CPU (the kernel runs a thread it wakes) or its interpreter lock between the
    arrival and the operation's start (default, 4 requests/s, 8 iterations, two runs each at
    8cd5dc6 and with the split, 2026-12-04: operations started over 1 ms after their input
    17 and 9 -> 5 and 8 of 192, start p50 0.20-0.21 -> 0.09-0.13 ms). A filling thread that
    wakes on its own (its pass's time is up, or it looks whether an overrunning pass's blocks
    are computed) sees the mark, ends its pass's GPU time at ``t_ns`` all the same, and waits
    to be woken (``until_woken``) before doing anything else."""

    def __init__(self) -> None:
        self.t_ns: int | None = None
        self._event = threading.Event()

    def end(self, t_ns: int) -> None:
        self.t_ns = t_ns

    def wake(self) -> None:
        if self.t_ns is None:  # woken unended (an error on the worker's side): ends now
            self.t_ns = now_ns()
        self._event.set()

    def is_set(self) -> bool:
        return self.t_ns is not None

    def wait(self, timeout: float | None = None) -> bool:
        """Block until woken (``wake``) or ``timeout`` s have passed; returns ``is_set()``."""
        self._event.wait(timeout)
        return self.is_set()

    def until_woken(self) -> None:
        self._event.wait()


class Deadline:
    """A bubble that ends at a time: ``t_ns`` on ``trace.clock.now_ns``'s clock."""

    def __init__(self, t_ns: int) -> None:
        self.t_ns = t_ns

    def is_set(self) -> bool:
        return now_ns() >= self.t_ns

    def wait(self, timeout: float | None = None) -> bool:
        left_s = (self.t_ns - now_ns()) / 1e9
        if left_s > 0:
            time.sleep(left_s if timeout is None else min(left_s, timeout))
        return self.is_set()

    def until_woken(self) -> None:
        pass


def hold_gpu(end_ns: int, computed: Callable[[], bool], bubble: BubbleEnd) -> tuple[int | None, int | None]:
    """Give a prefill pass the emulated GPU until ``end_ns`` (``trace.clock.now_ns``'s clock) and
    until ``computed()`` (the prefill stream has computed its blocks), unless ``bubble`` ends
    first: waiting on ``bubble`` for the rest of the time, then looking every ``POLL_S`` while
    the blocks are not computed (an overrun). Returns when the bubble ended (None: the pass had
    all its time) and when its overrun began (None: none)."""
    overrun_ns = None
    while not bubble.is_set():
        t = now_ns()
        if t < end_ns:
            bubble.wait((end_ns - t) / 1e9)
        elif computed():
            return None, overrun_ns
        else:
            overrun_ns = overrun_ns or t
            bubble.wait(POLL_S)
    return (bubble.t_ns if bubble.t_ns is not None else now_ns()), overrun_ns
