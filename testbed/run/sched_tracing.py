"""A run's scheduler trace (``--sched-trace``) from the runner's side: started before anything of
the run's (a refusal costs no training), then saved into the run folder and its tracefs instance
removed whatever happens (``net/tracefs.py``, ``results/sched_summary.py``)."""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from testbed.invocation import sudo_testbed
from testbed.net.tracefs import EVENTS, SchedTrace
from testbed.results.sched_summary import write_sched_trace
from testbed.run.launch import Launcher
from testbed.trace.schema import SCHED_FILE


def start_sched_trace(
    stack: ExitStack, tracer: SchedTrace, launcher: Launcher | None, out_dir: Path, progress: Callable[[str], Any]
) -> None:
    """Start ``tracer``; when ``stack`` closes, save what it recorded (``save_sched_trace``). The
    run's processes so far (the runner, the launcher the workers fork from, what the registry
    lists) are the trace's roots: what they start while it records is the run's too. Raises
    FeatureError (``SchedTrace.start``)."""
    roots = [os.getpid(), *(p.pid for p in tracer.record.processes)]
    roots += [launcher.proc.pid] if launcher is not None else []
    tracer.start()
    stack.callback(save_sched_trace, tracer, out_dir, progress, roots)


def save_sched_trace(tracer: SchedTrace, out_dir: Path, progress: Callable[[str], Any], roots: list[int]) -> None:
    """Write what ``tracer`` recorded into the run folder, then remove its tracefs instance (left
    registered for ``testbed clean`` if the kernel refuses)."""
    try:
        if tracer.made:
            tracer.stop()
            lost = tracer.lost_events()
            with tracer.trace_file() as lines:  # closed before the instance is removed
                write_sched_trace(out_dir, lines, lost, roots, EVENTS)
            progress(f"scheduler trace in {out_dir / SCHED_FILE}" + (f" ({lost} events lost)" if lost else ""))
    except BaseException:
        progress("the scheduler trace was not saved: the run was stopped while it was read")
        raise
    finally:
        if not tracer.close():
            progress(f"could not remove the tracefs instance {tracer.path}: run '{sudo_testbed('clean')}'")
