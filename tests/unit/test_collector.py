"""The garbage collector held off while simulations run (``plan/collector.py``): back as it was
when the last ends, also where they overlap in threads or raise."""

from __future__ import annotations

import gc
import threading

import pytest

from testbed.plan.collector import collector_paused


@pytest.fixture
def collector_state():
    was = gc.isenabled()
    yield
    (gc.enable if was else gc.disable)()


@pytest.mark.parametrize("enabled", [True, False])
def test_a_pause_puts_the_collector_back_as_it_was_also_on_an_error(enabled, collector_state):
    (gc.enable if enabled else gc.disable)()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled() is enabled
    with pytest.raises(RuntimeError), collector_paused():
        raise RuntimeError
    assert gc.isenabled() is enabled


def test_pauses_overlapping_in_threads_leave_the_collector_on(collector_state):
    """Thread A pauses; B begins inside A's pause and ends after it: the collector is off until B
    ends, then on (B alone would have found it off)."""
    gc.enable()
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def a():
        with collector_paused():
            a_in.set()
            b_in.wait(5)
        a_out.set()

    def b():
        a_in.wait(5)
        with collector_paused():
            b_in.set()
            a_out.wait(5)
            seen["after a"] = gc.isenabled()

    threads = [threading.Thread(target=f) for f in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == {"after a": False}
    assert gc.isenabled()
