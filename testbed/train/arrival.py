"""Knowing, without blocking, that gloo point-to-point operations have finished.

gloo's send and receive works report ``is_completed()`` only once ``wait()`` has been called on
them: a receive whose bytes are all in its buffer still says False (torch 2.13's
ProcessGroupGloo; ``tests/integration/test_bubbletea.py`` checks the replacement below on real
runs), and ``wait(timeout)`` blocks past its timeout until the bytes are in. A worker that fills a
wait with prefill (BubbleTea) must see the arrival while a chunk runs, so a thread waits on the
works instead and records when they finished.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from testbed.trace.clock import now_ns


class Arrival:
    """The works ``works`` (gloo sends, receives or an all-reduce) waited on by a daemon thread:
    ``is_set()`` says whether all have finished, ``t_ns`` when (``trace.clock.now_ns``), and
    ``wait(timeout)`` blocks until they have, as ``threading.Event.wait`` (so a prefill pass is
    woken by the arrival: ``bubbletea/bubble_end.BubbleEnd``). ``arrived_ns()`` blocks until
    they have and re-raises what a work's ``wait`` raised (a timeout, a dead peer)."""

    def __init__(self, works: Sequence[Any]) -> None:
        self.t_ns: int | None = None
        self._error: BaseException | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._wait_all, args=(list(works),), daemon=True)
        self._thread.start()

    def _wait_all(self, works: list[Any]) -> None:
        try:
            for w in works:
                w.wait()
        except BaseException as e:  # handed to the waiting worker by wait()
            self._error = e
        self.t_ns = now_ns()
        self._done.set()

    def is_set(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every work has finished or ``timeout`` seconds have passed (None: no
        limit); returns whether they have."""
        return self._done.wait(timeout)

    def arrived_ns(self) -> int:
        """Block until every work has finished; returns when they did (ns). Raises what a work's
        ``wait`` raised."""
        self._done.wait()
        if self._error is not None:
            raise self._error
        assert self.t_ns is not None
        return self.t_ns
