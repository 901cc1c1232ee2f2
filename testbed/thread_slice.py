"""How soon a training thread whose input has come takes a CPU from a thread of another emulated
GPU: the real-time class while it waits (sched(7), ``SCHED_FIFO``), else the fair scheduler's
slice (Linux's EEVDF; sched_setattr(2), ``sched_runtime`` of a ``SCHED_OTHER`` thread, since
Linux 6.12) and a lower nice value.

Two cores here run six emulated GPUs, each of which would compute on a device of its own. A thread
woken by gloo with its input was left waiting while the thread on its CPU, computing for another
GPU, finished its slice (the kernel's base slice, 1.4 ms on two CPUs) or, once that was spent,
until the next tick (4 ms at HZ=250) or until it blocked; or on one CPU's run queue while the
other was free, which the fair scheduler did not move it to in time (docs/history.md). A thread
in the real-time class takes its CPU from any fair-class thread as it wakes, on its own CPU,
or, where that one runs real-time work of at least its priority, on one that runs none
(kernel/sched/rt.c, ``select_task_rq_rt``). So a training worker's main thread waits for an
operation's input in ``SCHED_FIFO`` at ``TRAINING_WAIT_RT_PRIORITY`` and goes back to the fair
class once the operation has started (``WaitSwitch``): its compute is the fair class's, as
every other GPU's.
It holds the real-time class only while asleep and for the tens of microseconds from the
wake-up to the start (p99 about 0.1 ms here), so it takes nothing from the delay elements or
Atlas's controller (higher priorities) and little from anyone else. A thread it started in
that time would inherit the class; it starts none then (gloo's threads and BubbleTea's
filling thread are started before its first wait). One hazard: gloo's receive buffer, released,
waits for gloo's thread to let go of it with ``sched_yield`` in a loop (gloo/common/memory.h,
``~ShareableNonOwningPtr``), and a real-time thread's yield never gives a fair-class thread
its CPU: released in the real-time class, it spun until the kernel's real-time throttling
(950 ms of each second) let that thread run. The worker releases a receive's works only once
the thread is back in the fair class (``train/input_wait.py``; ``scripts/bench_wait_class.py``
shows the hazard).

Where the real-time class is refused (without ``CAP_SYS_NICE`` or an ``RLIMIT_RTPRIO``), the
thread waits in the fair class instead, with the kernel's shortest slice, ``TRAINING_SLICE_NS``
(a woken thread whose slice is shorter than the running one's takes the CPU at once where it
is owed time: the kernel's ``PREEMPT_SHORT``), and a lower nice value, ``TRAINING_WAIT_NICE``
(a larger weight brings its virtual deadline closer). Either way the worker asks for the short
slice once, which the threads it starts afterwards inherit (gloo's, which deliver its input).
BubbleTea's threads set theirs back to the kernel's (``DEFAULT_SLICE_NS``): they never take a
CPU from training this way. BubbleTea's filling thread, which shares the worker's interpreter
lock with the main thread, has the wait's nice value (``FILL_THREAD_NICE``). The same for every
policy; the worker records what it was given (``startup.jsonl``, the summary's
``training_slice_ms``, ``training_wait_rt_priority``, ``training_wait_nice`` and
``fill_thread_nice``).
"""

from __future__ import annotations

import ctypes
import os
import platform
import re
import struct
import sys
import threading
from pathlib import Path

#: the shortest slice the kernel grants (ns; sched_setattr(2): 0.1 ms to 100 ms)
TRAINING_SLICE_NS = 100_000
#: ``request_slice``'s argument for the kernel's own base slice
DEFAULT_SLICE_NS = 0
#: the real-time priority (``SCHED_FIFO``) a training thread waits for its input at
#: (``WaitSwitch``): the lowest, below Atlas's grant loop (``CONTROL_RT_PRIORITY``)
#: and the NFQUEUE delay element (``net/nfq_delay.c``), whose work feeds the wait. Needs
#: ``CAP_SYS_NICE`` (root) or an ``RLIMIT_RTPRIO`` of at least this, else the thread waits in the
#: fair class (``TRAINING_WAIT_NICE``)
TRAINING_WAIT_RT_PRIORITY = 1
#: the nice value a training thread waits for its input with where the real-time class is
#: refused (``WaitSwitch``): a weight 9.3
#: times nice 0's (kernel/sched/core.c, ``sched_prio_to_weight``: 9548 against 1024); lowering a
#: nice value needs ``CAP_SYS_NICE`` (root) or an ``RLIMIT_NICE`` of at least 30, else the thread
#: waits at its own. Asked only where the slice was (``WaitSwitch``): not on a kernel before 6.6,
#: whose ``/proc`` reports no slice
TRAINING_WAIT_NICE = -10
#: the nice value of BubbleTea's filling thread (``bubbletea/fill.py``), with the kernel's slice. A
#: thread of the worker, it holds the worker's interpreter lock while it runs, and the worker's
#: main thread, woken by gloo with its input, needs that lock before its operation can start.
#: At nice 0 the kernel left it on a run queue behind the other emulated GPUs' threads, holding
#: the lock, while the main thread slept (3.8 ms in one late operation; scheduler traces, docs/history.md
#: "Late"); at the wait's nice value it runs again about as soon as the main thread would have,
#: and a training thread woken meanwhile, in the real-time class (or, where refused, with the
#: short slice), still takes the CPU from it.
#: Refused, as the wait's, without ``CAP_SYS_NICE``: the thread keeps its own
FILL_THREAD_NICE = TRAINING_WAIT_NICE

#: sched_setattr's system call number, by machine (arch/x86/entry/syscalls/syscall_64.tbl;
#: include/uapi/asm-generic/unistd.h for arm64), for a 64-bit interpreter (None: not known here)
_NR = {"x86_64": 314, "aarch64": 274}.get(platform.machine()) if struct.calcsize("P") == 8 else None
#: struct sched_attr (include/uapi/linux/sched/types.h, SCHED_ATTR_SIZE_VER1: 56 bytes): size,
#: policy, flags, nice, priority, runtime, deadline, period, util_min, util_max
_SCHED_ATTR = struct.Struct("IIQiIQQQII")
_SLICE_LINE = re.compile(rb"^se\.slice\s*:\s*(\d+)", re.MULTILINE)
_LIBC = ctypes.CDLL(None, use_errno=True)


def thread_slice_ns(tid: int | None = None, pid: int | None = None) -> int | None:
    """The fair-scheduler slice (ns) the kernel reports for thread ``tid`` (None: the calling
    thread) of process ``pid`` (None: this one), from ``/proc/<pid>/task/<tid>/sched``; None
    where it reports none (a kernel before EEVDF, 6.6) or the thread is gone."""
    tid = tid if tid is not None else threading.get_native_id()
    pid = pid if pid is not None else os.getpid()
    try:
        text = Path(f"/proc/{pid}/task/{tid}/sched").read_bytes()
    except OSError:
        return None
    found = _SLICE_LINE.search(text)
    return int(found.group(1)) if found else None


def _sched_attr(slice_ns: int, nice: int | None = None) -> ctypes.Array:
    """A ``struct sched_attr`` asking ``SCHED_OTHER`` with a slice of ``slice_ns`` (0: the kernel's),
    at ``nice`` (None: the calling thread's own, ``getpriority``: the calling thread's, on Linux).
    A thread in another class (``SCHED_IDLE``) asks before it changes class."""
    nice = nice if nice is not None else os.getpriority(os.PRIO_PROCESS, 0)
    packed = _SCHED_ATTR.pack(_SCHED_ATTR.size, os.SCHED_OTHER, 0, nice, 0, slice_ns, 0, 0, 0, 0)
    return ctypes.create_string_buffer(packed, _SCHED_ATTR.size)


def _set_attr(attr: ctypes.Array) -> None:
    """sched_setattr(2) of the calling thread; raises OSError where the kernel refuses it."""
    if _LIBC.syscall(_NR, 0, attr, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"sched_setattr: {os.strerror(err)}")


def request_slice(slice_ns: int, nice: int | None = None) -> int | None:
    """Ask for a fair-scheduler slice of ``slice_ns`` (``DEFAULT_SLICE_NS``: the kernel's own) for
    the calling thread, at ``nice`` (None: keeping its own nice value); threads and processes it
    starts later inherit both. Returns the slice the kernel then reports (``thread_slice_ns``): a
    kernel without custom slices (before 6.12) accepts the call and keeps its own, so the caller
    sees what it got. Returns None, asking nothing, on a machine whose system call number is not
    known here. Raises OSError where the kernel refuses the call (a lower nice value without
    ``CAP_SYS_NICE``: EPERM)."""
    if _NR is None:
        return None
    _set_attr(_sched_attr(slice_ns, nice))
    return thread_slice_ns()


class WaitSwitch:
    """How the calling thread waits for an operation's input, and computes once it has started.
    The constructor asks for ``short_ns`` once (``slice_or_report``; ``granted_ns``, what the
    kernel reported, None where refused or not known), which the threads it starts afterwards
    inherit, and whether the kernel grants the real-time class at ``wait_rt_priority``
    (``granted_rt_priority``: None where refused, without ``CAP_SYS_NICE`` or an
    ``RLIMIT_RTPRIO``, which it prints). Then one system call each: ``short()`` before the
    thread waits for an input, ``SCHED_FIFO`` at that priority, or where refused the short
    slice at ``wait_nice`` (``granted_nice``: asked only then; None where not asked, or
    refused, the thread then waiting at its own nice); ``default()`` once
    the operation has started, back to the fair class with the kernel's slice and the
    thread's own nice, so that its compute is the fair class's and not the one cut short by
    the next wake-up. Nothing is switched where neither the real-time class nor the slice was
    granted. Release gloo's works of the wait only after ``default()`` (module docstring:
    gloo's buffer spins with ``sched_yield``: ``train/input_wait.InputWait``). Raises
    ValueError for a ``wait_rt_priority`` outside ``SCHED_FIFO``'s range (1-99 on Linux).
    Without ``SCHED_RESET_ON_FORK``: only ``CAP_SYS_NICE`` may clear that flag again
    (sched(7)), so a thread granted the class by its ``RLIMIT_RTPRIO`` could not go back with
    the flag cleared, and keeping it would take the short slice from the threads it starts."""

    def __init__(
        self,
        short_ns: int = TRAINING_SLICE_NS,
        wait_nice: int = TRAINING_WAIT_NICE,
        wait_rt_priority: int = TRAINING_WAIT_RT_PRIORITY,
    ) -> None:
        own_nice = os.getpriority(os.PRIO_PROCESS, 0)
        inherited = _sched_attr(short_ns, own_nice)  # what the threads started now inherit
        self._default = _sched_attr(DEFAULT_SLICE_NS, own_nice)
        self._short = _sched_attr(short_ns, wait_nice)
        lowest, highest = os.sched_get_priority_min(os.SCHED_FIFO), os.sched_get_priority_max(os.SCHED_FIFO)
        if not lowest <= wait_rt_priority <= highest:
            raise ValueError(f"wait_rt_priority {wait_rt_priority}: SCHED_FIFO takes {lowest}-{highest}")
        self._fifo = os.SCHED_FIFO, os.sched_param(wait_rt_priority)
        self.granted_ns = slice_or_report(short_ns)
        self.granted_rt_priority: int | None = None
        self.granted_nice: int | None = None
        try:
            os.sched_setscheduler(0, *self._fifo)  # asked once here: refused without the privilege
            self.granted_rt_priority = wait_rt_priority
        except PermissionError as e:
            print(
                f"an input is waited for in the fair class, not SCHED_FIFO {wait_rt_priority}: {e}",
                file=sys.stderr,
                flush=True,
            )
        if self.granted_ns is None:
            if self.granted_rt_priority is not None:
                _to_fair_at_own_nice()
            return
        if self.granted_rt_priority is None:
            try:
                _set_attr(self._short)  # refused without CAP_SYS_NICE
                self.granted_nice = os.getpriority(os.PRIO_PROCESS, 0)
            except OSError as e:
                print(f"an input is waited for at nice {own_nice}: {e}", file=sys.stderr, flush=True)
                self._short = inherited
        _set_attr(inherited)

    def short(self) -> None:
        if self.granted_rt_priority is not None:
            os.sched_setscheduler(0, *self._fifo)
        elif self.granted_ns is not None:
            _set_attr(self._short)

    def default(self) -> None:
        if self.granted_ns is not None:
            _set_attr(self._default)
        elif self.granted_rt_priority is not None:
            _to_fair_at_own_nice()


def _to_fair_at_own_nice() -> None:
    """The calling thread back to ``SCHED_OTHER`` at its own nice value with the kernel's slice,
    where the kernel knows no custom slice (sched_setscheduler(2))."""
    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))


def kernel_has_custom_slices(release: str | None = None) -> bool:
    """Whether a kernel of ``release`` (``platform.release()``: this one's) is 6.12 or later, where
    a ``SCHED_OTHER`` thread's ``sched_runtime`` sets its slice; what ``request_slice`` reports
    is the measure, this the expectation (tests)."""
    found = re.match(r"(\d+)\.(\d+)", release if release is not None else platform.release())
    return found is not None and (int(found.group(1)), int(found.group(2))) >= (6, 12)


def slice_or_report(slice_ns: int, nice: int | None = None, what: str = "this thread") -> int | None:
    """``request_slice``, with a refusal printed to stderr (the process's log, naming ``what``)
    rather than raised: a ``nice`` refused for want of the privilege (EPERM) is left out (the
    slice is asked at the thread's own nice value); a refused slice leaves the thread with the
    slice it had, and the caller records None. The nice value the thread then has is
    ``os.getpriority(os.PRIO_PROCESS, 0)`` (on Linux, the calling thread's)."""
    if nice is not None:
        try:
            return request_slice(slice_ns, nice)
        except PermissionError as e:  # EPERM: a lower nice value without CAP_SYS_NICE
            own = os.getpriority(os.PRIO_PROCESS, 0)
            print(f"{what} stays at nice {own}, not {nice}: {e}", file=sys.stderr, flush=True)
        except OSError as e:
            print(f"{what}: the CPU slice stays {thread_slice_ns()} ns: {e}", file=sys.stderr, flush=True)
            return None
    try:
        return request_slice(slice_ns)
    except OSError as e:
        print(f"{what}: the CPU slice stays {thread_slice_ns()} ns: {e}", file=sys.stderr, flush=True)
        return None


#: the real-time priority of the run's control processes: Atlas's grant loop
#: (``atlas/controller_process.py``) and, across machines, the control relays
#: (``net/remote/control_relay.py``); below the NFQUEUE delay element's 10 (delay first, grants next)
CONTROL_RT_PRIORITY = 5


def control_priority(nice: int = -10) -> None:
    """This process, one of the run's control processes, must not wait behind the workers on a busy
    machine: ``SCHED_FIFO`` at ``CONTROL_RT_PRIORITY`` (a control process blocks between messages
    and timers, so it cannot starve the machine), else ``nice``, else as it is."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(CONTROL_RT_PRIORITY))
    except (OSError, AttributeError):
        try:
            os.setpriority(os.PRIO_PROCESS, 0, nice)
        except OSError:
            pass
