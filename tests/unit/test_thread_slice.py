"""The fair scheduler's slice of the training threads (``testbed/thread_slice.py``), asked of this
machine's kernel from threads of the test's own, so that the test process keeps its slice."""

from __future__ import annotations

import threading

import pytest

from testbed.thread_slice import (
    DEFAULT_SLICE_NS,
    TRAINING_SLICE_NS,
    SliceSwitch,
    kernel_has_custom_slices,
    request_slice,
    thread_slice_ns,
)

needs_custom_slices = pytest.mark.skipif(
    not kernel_has_custom_slices(), reason="the kernel is older than 6.12: no custom slices to ask for"
)


def in_thread(fn):
    """``fn()``'s result, run in a thread of its own."""
    out: list = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join(10)
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


@needs_custom_slices
def test_a_worker_thread_switches_between_the_short_slice_and_the_kernels():
    """``SliceSwitch``: short while waiting for an input, the kernel's own once the operation has
    started; only the calling thread's."""
    base = thread_slice_ns()

    def switch():
        s = SliceSwitch()
        s.short()
        short = thread_slice_ns()
        s.default()
        return short, thread_slice_ns()

    assert in_thread(switch) == (TRAINING_SLICE_NS, base)
    assert thread_slice_ns() == base


@needs_custom_slices
def test_bubbleteas_filling_thread_sets_the_kernels_slice_back():
    """A worker's filling thread, started by a thread with training's slice, runs with the kernel's
    own: BubbleTea never takes a CPU from training by a shorter slice."""
    from testbed.bubbletea.fill import Filler

    base = thread_slice_ns()

    def start():
        request_slice(TRAINING_SLICE_NS)
        filler = Filler("tb-w9-fill")
        try:
            seen: list[int | None] = []
            filler.start(lambda arrived: seen.append(thread_slice_ns()) or None).settle()
            return seen
        finally:
            filler.close()

    assert in_thread(start) == [base]


@pytest.mark.parametrize(
    ("release", "has"),
    [("6.18.44-fc-v1272", True), ("6.12.0", True), ("6.11.9-amd64", False), ("5.10.0-30-amd64", False), ("x", False)],
)
def test_which_kernels_have_custom_slices(release, has):
    assert kernel_has_custom_slices(release) is has
