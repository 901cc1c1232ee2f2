"""The kernel's scheduler traced for one run (``testbed run --sched-trace``): a tracefs instance of
the run's own (``<tracefs>/instances/<prefix>-sched``) records every context switch
(``sched_switch``) and wake-up (``sched_wakeup``) of the machine, timed on CLOCK_MONOTONIC
(``trace_clock mono``, the run's clock: ``trace/clock.py``), each line with its task's process id
(``record-tgid``). An instance has its own buffer, clock, options and events, so the machine's own
tracing (the top-level buffer, other instances) is never touched, and removing its directory
removes all of it: the run records it before making it, and ``testbed clean`` removes it after a
crash (``registry.clean_run``). Kernel documentation: Documentation/trace/ftrace.rst (Instances,
trace_clock, record-tgid) and Documentation/trace/events.rst."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

from testbed.errors import FeatureError
from testbed.net.registry import RunRecord, remove_trace_instance

#: where tracefs is mounted, in the order looked at (the second is the older debugfs path)
TRACEFS_MOUNTS = (Path("/sys/kernel/tracing"), Path("/sys/kernel/debug/tracing"))
EVENTS = ("sched/sched_switch", "sched/sched_wakeup")
#: each CPU's ring buffer (KiB): an 8-iteration run of the default experiment on 2 cores writes
#: about half of it; events that do not fit are counted (``SchedTrace.stop``), never silently lost
BUFFER_KB_PER_CPU = 65536
#: the most the buffers may take of the memory the kernel reports available
MAX_MEMORY_SHARE = 0.125


def tracefs_root() -> Path:
    """The mounted tracefs with the scheduler's events. Raises FeatureError naming the fix."""
    for root in TRACEFS_MOUNTS:
        if (root / "instances").is_dir():
            missing = [e for e in EVENTS if not (root / "events" / e / "enable").exists()]
            if missing:
                raise FeatureError(
                    f"tracefs at {root} has no {', '.join(missing)} event: --sched-trace needs a kernel built "
                    "with CONFIG_FTRACE and its scheduler tracepoints; run without --sched-trace"
                )
            return root
    raise FeatureError(
        "no tracefs mounted (looked at " + ", ".join(str(p) for p in TRACEFS_MOUNTS) + "): --sched-trace reads the "
        "kernel's scheduler events there; mount it (mount -t tracefs nodev /sys/kernel/tracing) or run without it"
    )


def buffer_kb_per_cpu(n_cpus: int, available_kb: int) -> int:
    """Each CPU's ring buffer (KiB): ``BUFFER_KB_PER_CPU``, less where all of them together would
    take more than ``MAX_MEMORY_SHARE`` of ``available_kb``; at least 1 MiB."""
    return max(1024, min(BUFFER_KB_PER_CPU, int(available_kb * MAX_MEMORY_SHARE) // max(1, n_cpus)))


def _available_kb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1])
    return 0


class SchedTrace:
    """A tracefs instance recording the scheduler's events for the run ``record`` (named after its
    prefix). ``start`` makes and arms it (registered first), ``lines`` reads what it holds,
    ``lost_events`` says how many did not fit, ``close`` removes it (and its registration)."""

    def __init__(self, record: RunRecord) -> None:
        self.record = record
        self.root = tracefs_root()
        self.path = self.root / "instances" / f"{record.prefix}-sched"
        self.started = False  # made and armed

    def start(self) -> None:
        """Make the instance and start recording. Raises FeatureError if it exists already (a
        run of the same prefix left it: ``testbed clean``) or the kernel refuses a setting."""
        if self.path.exists():
            raise FeatureError(f"the tracefs instance {self.path} exists already: run testbed clean")
        self.record.add_trace_instance(str(self.path))  # before it exists: a crash between leaves nothing
        self.path.mkdir()
        n_cpus = os.cpu_count() or 1
        try:
            for name, value in (
                ("trace_clock", "mono"),
                ("options/record-tgid", "1"),
                ("buffer_size_kb", str(buffer_kb_per_cpu(n_cpus, _available_kb()))),
                *((f"events/{e}/enable", "1") for e in EVENTS),
                ("tracing_on", "1"),
            ):
                (self.path / name).write_text(value)
        except OSError as e:
            self.close()
            raise FeatureError(f"tracefs refused a setting of {self.path}: {e}") from e
        self.started = True

    def stop(self) -> None:
        """Stop recording (what is held stays readable); nothing if it never started."""
        if self.started:
            (self.path / "tracing_on").write_text("0")

    def lines(self) -> Iterator[str]:
        """The recorded events as the kernel prints them (``trace``), one line each, comments
        (``#``) left out."""
        with open(self.path / "trace") as f:
            for line in f:
                if not line.startswith("#"):
                    yield line

    def lost_events(self) -> int:
        """Events that did not fit in the buffers (each CPU's ``overrun`` and ``dropped events``)."""
        lost = 0
        for stats in (self.path / "per_cpu").glob("cpu*/stats"):
            for m in re.finditer(r"^(?:overrun|dropped events): (\d+)$", stats.read_text(), re.M):
                lost += int(m.group(1))
        return lost

    def close(self) -> None:
        """Remove the instance (its buffers and settings with it) and its registration."""
        remove_trace_instance(str(self.path))
        self.record.forget_trace_instance(str(self.path))
        self.started = False
