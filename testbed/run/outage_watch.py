"""Outages while a run trains: the WAN links that are down, followed from the run's
``shaping.jsonl`` (``link_down``/``link_up`` lines, written by a profile's replay or by ``testbed
link down|up`` from another shell), so that the run's watcher (``watch.py``) neither takes the
stall for a hung worker nor waits on it for ever: a link down longer than the experiment's
``outage_timeout`` aborts the run, naming the link.

The workers' collective timeout (gloo's) is set above the outage timeout (``runner.timeout_s``), so
that it is this watcher, not gloo, that decides."""

from __future__ import annotations

import time
from collections.abc import Collection
from pathlib import Path

from testbed.errors import TestbedError
from testbed.trace.jsonl import JsonlFollower
from testbed.trace.shaping_log import LINK_DOWN, LINK_UP, SHAPING_LOG


class OutageError(TestbedError):
    """A WAN link stayed down past the experiment's outage timeout; the run was aborted."""


class OutageWatch:
    """Follows ``out_dir``'s shaping log from where it ends now. ``timeout_s``: how long a link may
    stay down (s); ``fails_over``: links (``a:b``) whose outages do not count: the routers move
    their traffic to the other path (``net/failover.py``), and training goes on (a run stuck even
    so is caught by the hang timeout)."""

    def __init__(
        self,
        out_dir: Path,
        timeout_s: float,
        fails_over: Collection[str] = (),
        setting: tuple[str, str] = ("the experiment's", "outage_timeout"),
    ) -> None:
        """``setting``: whose and what sets the timeout, for the message (``("the job's",
        "--outage-timeout")`` for a launched job)."""
        self.log = JsonlFollower(out_dir / SHAPING_LOG, (LINK_DOWN, LINK_UP))
        self.timeout_s, self.setting = timeout_s, setting
        self.fails_over = set(fails_over)
        #: links down now: name -> when it went down (CLOCK_MONOTONIC, ns)
        self.down: dict[str, int] = {}
        #: when the last link came back (ns; 0: none has)
        self.last_up_ns = 0

    def poll(self) -> None:
        """Read the lines appended since the last poll."""
        for row in self.log.new_rows():
            if row.get("link") in self.fails_over:
                continue
            if row.get("event") == LINK_DOWN:
                self.down.setdefault(row["link"], int(row["t_ns"]))
            elif row.get("event") == LINK_UP:
                self.down.pop(row["link"], None)
                self.last_up_ns = max(self.last_up_ns, int(row["t_ns"]))

    def check(self, now_ns: int | None = None) -> None:
        """Raise OutageError naming the link that has been down longest, where that is past the
        timeout."""
        self.poll()
        if not self.down:
            return
        now_ns = time.monotonic_ns() if now_ns is None else now_ns
        link, since = min(self.down.items(), key=lambda kv: kv[1])
        down_s = (now_ns - since) / 1e9
        if down_s > self.timeout_s:
            raise OutageError(
                f"WAN link {link} has been down for {down_s:.1f} s, past {self.setting[0]} {self.setting[1]} "
                f"({self.timeout_s:g} s): training cannot go on without it, and the run was aborted "
                f"(its traces are kept). Bring the link up sooner (testbed link up), or give a longer {self.setting[1]}"
            )
