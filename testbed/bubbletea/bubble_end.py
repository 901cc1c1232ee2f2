"""What ends a bubble, as the prefill server sees it: training's input arriving
(``train/arrival.Arrival``) or a serving window's end (``Deadline``, ``alone.py``).

The server waits on it rather than sleeping between looks, so that a pass stops as soon as the
thread that saw the input wakes it: with a fixed poll the operation that input feeds started on
average half a poll interval later, on top of the machine's own wake-up time.
"""

from __future__ import annotations

import time
from typing import Protocol

from testbed.trace.clock import now_ns


class BubbleEnd(Protocol):
    """``threading.Event``'s reading side: ``is_set()`` whether the bubble has ended; ``wait(timeout)``
    blocks until it has or ``timeout`` seconds have passed (None: no limit) and returns ``is_set()``."""

    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...


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
