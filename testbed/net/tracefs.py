"""The kernel's scheduler traced for one run (``testbed run --sched-trace``): a tracefs instance of
the run's own (``<tracefs>/instances/<prefix>-sched``) records every context switch
(``sched_switch``), wake-up (``sched_wakeup``, and ``sched_waking`` by the waker), move of a task to another CPU
(``sched_migrate_task``) and new task (``sched_process_fork``) of the machine, timed on
CLOCK_MONOTONIC
(``trace_clock mono``, the run's clock: ``trace/clock.py``), each line with its task's process id
(``record-tgid``). An instance has its own buffer, clock, options and events, so the machine's own
tracing (the top-level buffer, other instances) is never touched, and removing its directory
removes all of it: the run records it before making it, and ``testbed clean`` removes it after a
crash (``registry.clean_run``). Kernel documentation: Documentation/trace/ftrace.rst (Instances,
trace_clock, record-tgid) and Documentation/trace/events.rst."""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from testbed.errors import FeatureError
from testbed.net.registry import TRACEFS_MOUNTS, RunRecord, remove_trace_instance, trace_instance_name
from testbed.trace.schema import SCHED_MIGRATE_EVENT, SCHED_WAKING_EVENT

#: the events recorded: context switches, wake-ups, wakings (who woke whom), moves between CPUs
#: (which run queue a waiting task is on) and new tasks (each fork and thread start, with its
#: parent: what tells a run's tasks from another's, ``results/sched_trace.run_tasks``)
EVENTS = (
    "sched/sched_switch",
    "sched/sched_wakeup",
    SCHED_WAKING_EVENT,
    SCHED_MIGRATE_EVENT,
    "sched/sched_process_fork",
)
#: each CPU's ring buffer (KiB): a 32-iteration BubbleTea run of the default experiment on 2 cores
#: (1.3 million events, 2.5% of them moves between CPUs) fits with none lost. Once full it keeps
#: what it has and drops the newest events (``overwrite`` off), which are counted
#: (``SchedTrace.lost_events``) and cut from the analysis
BUFFER_KB_PER_CPU = 65536
#: the most the buffers may take of the memory the kernel reports available
MAX_MEMORY_SHARE = 0.125


#: where a run mounts tracefs when none is mounted: the kernel's own mount point for it (since
#: Linux 4.1), where libtracefs and trace-cmd mount it too
TRACEFS_MOUNT_POINT = TRACEFS_MOUNTS[0]


def mounted_tracefs() -> Path | None:
    """The mounted tracefs with the scheduler's events, or None where none is mounted. Raises
    FeatureError naming the fix where one is mounted without those events."""
    for root in TRACEFS_MOUNTS:
        if (root / "instances").is_dir():
            missing = [e for e in EVENTS if not (root / "events" / e / "enable").exists()]
            if missing:
                raise FeatureError(
                    f"tracefs at {root} has no {', '.join(missing)} event: --sched-trace needs a kernel built "
                    "with CONFIG_FTRACE and its scheduler tracepoints; run without --sched-trace"
                )
            return root
    return None


def kernel_has_tracefs(filesystems: Path = Path("/proc/filesystems")) -> bool:
    """Whether this kernel can mount tracefs (it is in ``/proc/filesystems``)."""
    try:
        return any(line.split()[-1:] == ["tracefs"] for line in filesystems.read_text().splitlines())
    except OSError:
        return False


def tracefs_status() -> str:
    """What ``--sched-trace`` would find, in words (``testbed doctor``): where tracefs is mounted,
    or that a run will mount it, or why it cannot. Never mounts anything."""
    try:
        root = mounted_tracefs()
    except FeatureError as e:
        return f"not available ({e})"
    if root is not None:
        return f"available (tracefs at {root})"
    if kernel_has_tracefs() and TRACEFS_MOUNT_POINT.is_dir():
        return f"available (tracefs not mounted: a traced run mounts it at {TRACEFS_MOUNT_POINT} and leaves it)"
    return "not available (this kernel has no tracefs: it needs CONFIG_TRACING)"


@dataclass(frozen=True)
class TracefsMount:
    """The tracefs a traced run reads: its ``root``, and whether the run mounted it there
    (``mounted_by_run``: none was mounted before)."""

    root: Path
    mounted_by_run: bool

    def env(self) -> dict[str, str | bool]:
        """As the run's ``env.json`` records it."""
        return {"tracefs": str(self.root), "tracefs_mounted_by_run": self.mounted_by_run}


def ensure_tracefs() -> TracefsMount:
    """The mounted tracefs, mounted at ``TRACEFS_MOUNT_POINT`` first where none is (and left
    mounted, as libtracefs and trace-cmd leave it: a fresh machine mounts none), with whether this
    call mounted it (recorded in the run's ``env.json``). Raises FeatureError,
    naming the fix, where the kernel has no tracefs, refuses the mount, or lacks the scheduler's
    events."""
    root = mounted_tracefs()
    if root is not None:
        return TracefsMount(root, False)
    if not kernel_has_tracefs():
        raise FeatureError(
            "this kernel has no tracefs (not in /proc/filesystems): --sched-trace reads the kernel's "
            "scheduler events there and needs a kernel built with CONFIG_TRACING; run without --sched-trace"
        )
    cmd = ["mount", "-t", "tracefs", "nodev", str(TRACEFS_MOUNT_POINT)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise FeatureError(f"could not run {' '.join(cmd)}: {e}; run without --sched-trace") from e
    if done.returncode != 0:
        raise FeatureError(
            f"tracefs is not mounted and mounting it failed ({' '.join(cmd)}: {done.stderr.strip()}): "
            "--sched-trace needs root (CAP_SYS_ADMIN); run without --sched-trace"
        )
    root = mounted_tracefs()
    if root is None:
        raise FeatureError(
            f"tracefs mounted at {TRACEFS_MOUNT_POINT} has no instances/ folder: --sched-trace needs a "
            "kernel from Linux 4.1 on; run without --sched-trace"
        )
    return TracefsMount(root, True)


def buffer_kb_per_cpu(n_cpus: int, available_kb: int) -> int:
    """Each CPU's ring buffer (KiB): ``BUFFER_KB_PER_CPU``, less where all of them together would
    take more than ``MAX_MEMORY_SHARE`` of ``available_kb``, but at least 1 MiB (so on a machine
    with under 8 MiB available per CPU, more than that share)."""
    return max(1024, min(BUFFER_KB_PER_CPU, int(available_kb * MAX_MEMORY_SHARE) // max(1, n_cpus)))


def _available_kb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1])
    return 0


class SchedTrace:
    """A tracefs instance recording the scheduler's events for the run ``record`` (named after its
    prefix). ``start`` makes and arms it (registered first), ``trace_file`` opens what it holds,
    ``lost_events`` says how many did not fit, ``close`` removes it (and then its registration).
    Raises FeatureError where tracefs cannot be mounted (``ensure_tracefs``)."""

    def __init__(self, record: RunRecord) -> None:
        self.record = record
        self.root = ensure_tracefs().root
        self.path = self.root / "instances" / trace_instance_name(record.prefix)
        self.made = False  # this object made the instance (only then does it remove it)

    def start(self) -> None:
        """Make the instance and start recording. Raises FeatureError, the instance removed again,
        if it exists already (made by something else: it is left alone) or the kernel refuses it
        or a setting, naming which."""
        if self.path.exists():
            raise FeatureError(
                f"the tracefs instance {self.path} exists already and this run did not make it: remove it "
                f"(rmdir {self.path}) if nothing uses it, or run without --sched-trace"
            )
        self.record.add_trace_instance(str(self.path))  # before it exists: a crash between leaves nothing
        settings = (
            ("trace_clock", "mono"),
            ("options/record-tgid", "1"),
            ("options/overwrite", "0"),
            ("buffer_size_kb", str(buffer_kb_per_cpu(os.cpu_count() or 1, _available_kb()))),
            *((f"events/{e}/enable", "1") for e in EVENTS),
            ("tracing_on", "1"),
        )
        name, value = "(the instance's directory)", "mkdir"
        try:
            self.path.mkdir()
            self.made = True
            for name, value in settings:
                (self.path / name).write_text(value)
        except OSError as e:
            self.close()
            raise FeatureError(
                f"tracefs refused {value!r} for {name} of {self.path}: {e.strerror or e}; run without --sched-trace "
                "(in a container, tracefs may be read-only)"
            ) from e

    def stop(self) -> None:
        """Stop recording (what is held stays readable); nothing if it was not made."""
        if self.made:
            (self.path / "tracing_on").write_text("0")

    def trace_file(self) -> TextIO:
        """What the instance holds, as the kernel prints it (``trace``), open for reading: close it
        (a ``with`` block) before ``close``, which the kernel refuses while it is open."""
        return open(self.path / "trace")

    def lost_events(self) -> int:
        """Events that did not fit in the buffers (each CPU's ``overrun`` and ``dropped events``)."""
        lost = 0
        for stats in (self.path / "per_cpu").glob("cpu*/stats"):
            for m in re.finditer(r"^(?:overrun|dropped events): (\d+)$", stats.read_text(), re.M):
                lost += int(m.group(1))
        return lost

    def close(self) -> bool:
        """Remove the instance (its buffers and settings with it), then its registration. Returns
        False, the registration kept for ``testbed clean``, if the kernel refuses (a reader holds
        one of its files open)."""
        if self.made:
            try:
                remove_trace_instance(str(self.path), self.record.prefix)
            except OSError:
                return False
            self.made = False
        self.record.forget_trace_instance(str(self.path))
        return True
