"""The fair scheduler's slice of the training threads (``testbed/thread_slice.py``), asked of this
machine's kernel from threads of the test's own, so that the test process keeps its slice."""

from __future__ import annotations

import ctypes
import os
import resource
import struct
import threading
import time
from pathlib import Path

import pytest

from testbed.thread_slice import (
    DEFAULT_SLICE_NS,
    FILL_THREAD_NICE,
    TRAINING_SLICE_NS,
    TRAINING_WAIT_NICE,
    TRAINING_WAIT_RT_PRIORITY,
    WaitSwitch,
    _sched_attr,
    kernel_has_custom_slices,
    request_slice,
    thread_slice_ns,
)

needs_custom_slices = pytest.mark.skipif(
    not kernel_has_custom_slices(), reason="the kernel is older than 6.12: no custom slices to ask for"
)


def in_thread(fn):
    """``fn()``'s result, run in a thread of its own; what it raised, raised again here."""
    out: list = []

    def body():
        try:
            out.append(fn())
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            out.append(e)

    t = threading.Thread(target=body)
    t.start()
    t.join(30)
    assert out, "the thread did not finish within 30 s"
    if isinstance(out[0], BaseException):
        raise out[0]
    return out[0]


@needs_custom_slices
def test_a_thread_gets_the_slice_it_asks_for_and_its_threads_inherit_it():
    """The kernel reports the slice asked for; a thread started afterwards has it too (gloo's threads
    inherit the worker's); asking for the default gives back the kernel's base slice."""
    base = thread_slice_ns()  # this thread's: the kernel's base slice

    def ask():
        got = request_slice(TRAINING_SLICE_NS)
        child = in_thread(thread_slice_ns)
        back = request_slice(DEFAULT_SLICE_NS)
        return got, child, back

    got, child, back = in_thread(ask)
    assert got == TRAINING_SLICE_NS and child == TRAINING_SLICE_NS
    assert back == base and base is not None and base > TRAINING_SLICE_NS
    assert thread_slice_ns() == base  # the caller's thread was not touched


def _policy() -> int:
    """The calling thread's scheduling policy, without the reset-on-fork flag."""
    return os.sched_getscheduler(0) & ~os.SCHED_RESET_ON_FORK


@needs_custom_slices
def test_a_worker_thread_waits_in_the_real_time_class_and_computes_in_the_fair_one():
    """``WaitSwitch``: the short slice at the thread's own nice value for the threads it starts;
    ``SCHED_FIFO`` at ``TRAINING_WAIT_RT_PRIORITY`` while waiting for an input; the fair class
    with the kernel's own slice and the thread's nice once the operation has started; only the
    calling thread's. Where the kernel refuses the real-time class, the short slice at
    ``TRAINING_WAIT_NICE`` instead (``test_a_refused_real_time_class_...``)."""
    base = thread_slice_ns()
    own = os.getpriority(os.PRIO_PROCESS, 0)

    def attrs():
        return _policy(), os.sched_getparam(0).sched_priority, thread_slice_ns(), os.getpriority(os.PRIO_PROCESS, 0)

    def switch():
        s = WaitSwitch()
        started = attrs()  # what its threads inherit
        s.short()
        waiting = attrs()
        s.default()
        return s.granted_rt_priority, s.granted_nice, started, waiting, attrs()

    granted, nice, started, waiting, back = in_thread(switch)
    assert started == (os.SCHED_OTHER, 0, TRAINING_SLICE_NS, own)
    assert back == (os.SCHED_OTHER, 0, base, own)
    if has_cap_sys_nice():  # as root: the real-time class granted, no nice value asked
        assert granted == TRAINING_WAIT_RT_PRIORITY and nice is None
        assert waiting[:2] == (os.SCHED_FIFO, TRAINING_WAIT_RT_PRIORITY)
    else:
        assert granted is None and nice in (None, TRAINING_WAIT_NICE)
        assert waiting == (os.SCHED_OTHER, 0, TRAINING_SLICE_NS, nice if nice is not None else own)
    assert thread_slice_ns() == base and os.getpriority(os.PRIO_PROCESS, 0) == own and _policy() == os.SCHED_OTHER


#: capget(2)/capset(2): _LINUX_CAPABILITY_VERSION_3 and CAP_SYS_NICE (include/uapi/linux/capability.h)
_CAP_VERSION_3, _CAP_SYS_NICE = 0x20080522, 23


def _effective_caps() -> tuple[ctypes.Array, ctypes.Array]:
    """capget(2) of the calling thread: (header, data), data's words 0 and 3 the effective set."""
    libc = ctypes.CDLL(None, use_errno=True)
    header = (ctypes.c_uint32 * 2)(_CAP_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable, for capabilities 0-31 then 32-63
    assert libc.capget(header, data) == 0, os.strerror(ctypes.get_errno())
    return header, data


def has_cap_sys_nice() -> bool:
    """Whether the kernel grants the calling thread any nice value: ``CAP_SYS_NICE`` in its
    effective set, in the initial user namespace (the one the kernel checks a nice value in; a
    container's own namespace may show the capability, yet be refused)."""
    initial = Path("/proc/self/uid_map").read_text().split() == ["0", "0", "4294967295"]
    return initial and bool(_effective_caps()[1][0] & (1 << _CAP_SYS_NICE))


def _drop_cap_sys_nice() -> None:
    """Drop ``CAP_SYS_NICE`` from the calling thread's effective set (capabilities are per thread
    in the kernel; capset(2) called directly changes only the caller's), as a worker not run as
    root has it."""
    header, data = _effective_caps()
    data[0] &= ~(1 << _CAP_SYS_NICE)
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.capset(header, data) == 0, os.strerror(ctypes.get_errno())


def refusal_of(nice: int):
    """The marks of a test of the kernel refusing ``nice``: custom slices, and an ``RLIMIT_NICE``
    that does not grant ``nice`` anyway. (The test drops ``CAP_SYS_NICE``, which needs no
    privilege; a thread without it is refused all the same.)"""
    marks = [
        needs_custom_slices,
        pytest.mark.skipif(
            resource.getrlimit(resource.RLIMIT_NICE)[0] >= 20 - nice, reason="RLIMIT_NICE grants the nice value anyway"
        ),
    ]

    def marked(test):
        for mark in marks:
            test = mark(test)
        return test

    return marked


@pytest.mark.skipif(
    resource.getrlimit(resource.RLIMIT_RTPRIO)[0] >= TRAINING_WAIT_RT_PRIORITY,
    reason="RLIMIT_RTPRIO grants the real-time class anyway",
)
@refusal_of(TRAINING_WAIT_NICE)
def test_a_refused_real_time_class_and_wait_nice_leave_the_thread_waiting_at_its_own_nice(capfd):
    """Without ``CAP_SYS_NICE`` the kernel refuses both the real-time class and the wait's lower
    nice value: the thread waits in the fair class with the short slice at its own nice, says
    so, and records None for both."""
    own = os.getpriority(os.PRIO_PROCESS, 0)

    def switch():
        _drop_cap_sys_nice()
        s = WaitSwitch()
        s.short()
        short = _policy(), thread_slice_ns(), os.getpriority(os.PRIO_PROCESS, 0)
        s.default()
        granted = s.granted_ns, s.granted_rt_priority, s.granted_nice
        return granted, short, (_policy(), thread_slice_ns(), os.getpriority(os.PRIO_PROCESS, 0))

    granted, short, back = in_thread(switch)
    assert granted == (TRAINING_SLICE_NS, None, None)
    assert short == (os.SCHED_OTHER, TRAINING_SLICE_NS, own) and back == (os.SCHED_OTHER, thread_slice_ns(), own)
    err = capfd.readouterr().err
    assert f"in the fair class, not SCHED_FIFO {TRAINING_WAIT_RT_PRIORITY}" in err
    assert f"waited for at nice {own}" in err


@pytest.mark.skipif(not has_cap_sys_nice(), reason="the real-time class is granted only with CAP_SYS_NICE here")
def test_a_thread_without_cap_sys_nice_leaves_the_real_time_class_again():
    """A thread in the real-time class that has no ``CAP_SYS_NICE`` (as one granted it by an
    ``RLIMIT_RTPRIO`` alone, which this machine's root cannot raise to test) goes back to the
    fair class with ``default()``: no reset-on-fork flag, which only ``CAP_SYS_NICE`` may clear,
    stands in the way. The capability is dropped while the thread waits."""
    own = os.getpriority(os.PRIO_PROCESS, 0)

    def switch():
        s = WaitSwitch()
        s.short()
        waiting = _policy(), os.sched_getparam(0).sched_priority
        _drop_cap_sys_nice()
        s.default()
        return s.granted_rt_priority, waiting, (_policy(), thread_slice_ns(), os.getpriority(os.PRIO_PROCESS, 0))

    base = thread_slice_ns()
    granted, waiting, back = in_thread(switch)
    assert granted == TRAINING_WAIT_RT_PRIORITY and waiting == (os.SCHED_FIFO, TRAINING_WAIT_RT_PRIORITY)
    assert back == (os.SCHED_OTHER, base, own)


def _fill_thread_attributes(drop_cap_sys_nice: bool = False) -> tuple[int | None, list]:
    """(``Filler.nice``, [(slice, nice)] its thread had while it filled a bubble), the filler
    started from a thread with training's slice (and, ``drop_cap_sys_nice``, without
    ``CAP_SYS_NICE``, which the filling thread inherits)."""
    from testbed.bubbletea.fill import Filler

    def start():
        if drop_cap_sys_nice:
            _drop_cap_sys_nice()
        request_slice(TRAINING_SLICE_NS)
        filler = Filler("tb-w9-fill")
        nice = filler.nice  # known once the constructor returns: its thread has set itself up
        try:
            seen: list = []

            def fill(arrived):
                seen.append((thread_slice_ns(), os.getpriority(os.PRIO_PROCESS, 0)))

            filler.start(fill).settle()
            return nice, seen
        finally:
            filler.close()

    return in_thread(start)


@needs_custom_slices
def test_bubbleteas_filling_thread_sets_the_kernels_slice_back_at_the_fill_nice():
    """A worker's filling thread, started by a thread with training's slice, runs with the kernel's
    own (BubbleTea never takes a CPU from training by a shorter slice), at ``FILL_THREAD_NICE`` where the
    kernel grants it (as root), and says which nice value it has."""
    base, own = thread_slice_ns(), os.getpriority(os.PRIO_PROCESS, 0)
    nice, seen = _fill_thread_attributes()
    assert seen == [(base, nice)]
    assert nice in (FILL_THREAD_NICE, own)
    if has_cap_sys_nice():  # the lower nice value granted
        assert nice == FILL_THREAD_NICE
    assert thread_slice_ns() == base and os.getpriority(os.PRIO_PROCESS, 0) == own


@refusal_of(FILL_THREAD_NICE)
def test_a_refused_fill_nice_leaves_the_filling_thread_at_its_own_with_the_kernels_slice(capfd):
    """Without ``CAP_SYS_NICE`` the kernel refuses the filling thread's lower nice value: it runs
    with the kernel's slice at its own nice, says so, and reports its own nice."""
    base, own = thread_slice_ns(), os.getpriority(os.PRIO_PROCESS, 0)
    nice, seen = _fill_thread_attributes(drop_cap_sys_nice=True)
    assert nice == own and seen == [(base, own)]
    assert f"stays at nice {own}, not {FILL_THREAD_NICE}" in capfd.readouterr().err


@needs_custom_slices
def test_bubbleteas_prefill_stream_sets_the_kernels_slice_back_before_its_sender_thread():
    """The prefill stream, a process forked from a thread with training's slice, sets the
    kernel's own back before it starts its KV sender's thread, which inherits it. (The kernel's
    ``/proc`` shows no slice for the main thread once it is ``SCHED_IDLE``; such a thread never
    takes a CPU from training at its wake-up, whatever its slice.)"""
    from testbed.bubbletea.inference import InferenceModel
    from testbed.bubbletea.prefill_stream import PrefillStream
    from testbed.spec.model import ModelConfig

    base = thread_slice_ns()
    model = InferenceModel(ModelConfig(n_layers=2, d_model=16, n_heads=2, seq_len=32), 0)

    def start():  # the stream ends with the thread that forked it (PR_SET_PDEATHSIG): all in it
        request_slice(TRAINING_SLICE_NS)
        stream = PrefillStream(model, None)
        try:
            deadline = time.monotonic() + 10
            while os.sched_getscheduler(stream.pid) != os.SCHED_IDLE and time.monotonic() < deadline:
                time.sleep(0.01)  # the sender's thread is started before the switch to SCHED_IDLE
            assert os.sched_getscheduler(stream.pid) == os.SCHED_IDLE, "the stream never reached SCHED_IDLE"
            tids = [int(t) for t in os.listdir(f"/proc/{stream.pid}/task") if int(t) != stream.pid]
            return [thread_slice_ns(tid, stream.pid) for tid in tids]
        finally:
            stream.close()

    slices = in_thread(start)
    assert slices and set(slices) == {base}  # the KV sender's


def test_the_sched_attr_asked_for_has_the_kernels_layout():
    """``struct sched_attr`` as include/uapi/linux/sched/types.h lays it out, on any kernel: 56
    bytes (``SCHED_ATTR_SIZE_VER1``), the size first, the policy at 4, the nice value at 16,
    ``sched_runtime`` (the slice) at 24, nothing after it set."""
    raw = _sched_attr(123_456, TRAINING_WAIT_NICE).raw
    assert len(raw) == 56
    assert struct.unpack_from("=II", raw, 0) == (56, os.SCHED_OTHER)
    assert struct.unpack_from("=i", raw, 16) == (TRAINING_WAIT_NICE,)
    assert struct.unpack_from("=Q", raw, 24) == (123_456,)
    assert raw[8:16] == bytes(8) and raw[20:24] == bytes(4) and raw[32:] == bytes(24)


@pytest.mark.parametrize(
    ("release", "has"),
    [("6.18.44-fc-v1272", True), ("6.12.0", True), ("6.11.9-amd64", False), ("5.10.0-30-amd64", False), ("x", False)],
)
def test_which_kernels_have_custom_slices(release, has):
    assert kernel_has_custom_slices(release) is has
