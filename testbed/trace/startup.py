"""A run's start-up log (``startup.jsonl``): when the run began, its network was built, its workers
were started and each joined the process group. The summary's ``startup_s`` and
``scripts/bench_startup.py`` read it."""

from __future__ import annotations

from pathlib import Path

from testbed.trace import schema as T
from testbed.trace.clock import now_ns
from testbed.trace.jsonl import write_row

#: a run's start-up phases, one line each: ``phase``, ``t_ns`` and ``worker`` (None for the runner's)
STARTUP_LOG = "startup.jsonl"
#: a worker's fair-scheduler slice as the kernel reported it (ns; None: not reported), on its
#: ``process_group`` line (``thread_slice.py``)
SLICE_NS = "slice_ns"
#: the real-time priority its main thread waits for an input at (``SCHED_FIFO``; None: refused), on
#: the same line (``thread_slice.WaitSwitch``)
WAIT_RT_PRIORITY = "wait_rt_priority"
#: the nice value its main thread waits for an input with where the real-time class was refused
#: (None: the real-time class granted, or the nice value refused, or no slice), on the same line
WAIT_NICE = "wait_nice"
#: the nice value of its BubbleTea filling thread, on the same line of a BubbleTea run's workers
#: (``bubbletea.fill.Filler``: ``thread_slice.FILL_THREAD_NICE``, or its own where the kernel refused it)
FILL_NICE = "fill_nice"
#: the interpreter's switch interval the worker trains with (µs; ``sys.getswitchinterval``), on the
#: same line: ``bubbletea.fill.SWITCH_INTERVAL_S`` where a filling thread shares its interpreter lock
SWITCH_INTERVAL_US = "switch_interval_us"
#: the phases, in order: the run began, its network was built (and, with ``--profile-wan``, its
#: WAN paths measured: ``wan_profiled``, counted in the start-up), the launcher had preloaded the run,
#: the workers were started; each worker was forked (or its interpreter had imported the package)
#: and had joined the process group. Its first forward is in the events.
STARTUP_PHASES = (
    "run_start",
    "network_built",
    "wan_profiled",
    "launcher_ready",
    "workers_started",
    "forked",
    "imported",
    "process_group",
)


def mark_startup(
    run_dir: Path, phase: str, worker: int | None = None, t_ns: int | None = None, **fields: int | None
) -> None:
    """Append one start-up phase to ``run_dir``'s ``startup.jsonl`` (now, unless ``t_ns``), with
    ``fields`` (a worker's ``process_group`` line: ``SLICE_NS``, ``WAIT_RT_PRIORITY``, ``WAIT_NICE``, ``FILL_NICE``,
    ``SWITCH_INTERVAL_US``)."""
    with open(run_dir / STARTUP_LOG, "a") as f:
        write_row(f, {T.WORKER: worker, "phase": phase, "t_ns": t_ns if t_ns is not None else now_ns(), **fields})
