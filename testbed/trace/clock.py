"""The run's one clock: CLOCK_MONOTONIC nanoseconds, shared by every namespace on one machine
(DESIGN.md section 2). Processes on another machine (``--backend remote``) subtract their
machine's estimated offset, so every event is in the runner's clock."""

from __future__ import annotations

import os
import time

#: This machine's CLOCK_MONOTONIC minus the run's reference clock (the runner's), in ns: set by
#: ``--backend remote`` for processes on other machines (clock_offsets.json records how it was
#: estimated); 0 on the runner's machine.
CLOCK_OFFSET_NS = int(os.environ.get("TESTBED_CLOCK_OFFSET_NS", "0"))


def process_start_ns(pid: int | None = None) -> int:
    """When process ``pid`` (default: this one) started, in the run's clock: its start time from
    /proc (clock ticks since boot, proc(5) field 22) moved from CLOCK_BOOTTIME to CLOCK_MONOTONIC.
    Resolution: one clock tick (10 ms)."""
    stat = open(f"/proc/{pid or os.getpid()}/stat").read()
    ticks = int(stat.rsplit(")", 1)[1].split()[19])
    boot_ns = ticks * 1_000_000_000 // os.sysconf("SC_CLK_TCK")
    return now_ns() - (time.clock_gettime_ns(time.CLOCK_BOOTTIME) - boot_ns)


#: set by a wrapper that runs something first and then execs the command in the same process
#: (``scripts/go`` after its set-up): when it exec'd, in CLOCK_REALTIME ns (``date +%s%N``)
COMMAND_START_ENV = "TESTBED_COMMAND_START_REALTIME_NS"


def command_start_ns() -> int:
    """When the command started, in the run's clock: this process's start (``process_start_ns``),
    or the later moment a wrapper names in ``COMMAND_START_ENV`` (it ran its own work in this
    process before it exec'd the command), if that lies between the process's start and now."""
    start = process_start_ns()
    given = os.environ.get(COMMAND_START_ENV, "")
    if given.isdigit():
        t = now_ns() - (time.time_ns() - int(given))
        if start <= t <= now_ns():
            return t
    return start


def now_ns() -> int:
    """CLOCK_MONOTONIC nanoseconds in the run's reference clock (see CLOCK_OFFSET_NS)."""
    return time.monotonic_ns() - CLOCK_OFFSET_NS


def sleep_until(t_ns: int) -> None:
    """Sleep until ``now_ns()`` reaches ``t_ns`` (at once if it has): padding an operation to its
    target. ``time.sleep`` may wake early, so it sleeps again for what is left."""
    while (left := t_ns - now_ns()) > 0:
        time.sleep(left / 1e9)
