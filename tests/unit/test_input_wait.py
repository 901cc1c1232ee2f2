"""A training thread's wait for its input (``testbed/train/input_wait.py``): the works it waited
on are released only once the thread is back in the fair class, on the normal path and on an
error, with this machine's kernel switching a thread of the test's own (as root: into
``SCHED_FIFO``)."""

from __future__ import annotations

import os

import pytest

from testbed.thread_slice import TRAINING_WAIT_RT_PRIORITY, WaitSwitch
from testbed.train.input_wait import InputWait
from tests.unit.test_thread_slice import has_cap_sys_nice, in_thread


class Work:
    """A stand-in for a gloo work: records the scheduling policy of the thread that releases it."""

    def __init__(self, released: list[int]) -> None:
        self._released = released

    def __del__(self) -> None:
        self._released.append(os.sched_getscheduler(0))


def test_the_works_are_released_once_the_thread_is_back_in_the_fair_class():
    """``begin`` holds the works and puts the thread in its waiting class (as root
    ``SCHED_FIFO``); ``started`` switches it back, then releases them."""

    def wait():
        released: list[int] = []
        switch = WaitSwitch()
        inputs = InputWait(switch)
        inputs.begin([Work(released), Work(released)])  # the caller keeps no reference, as a worker
        waiting = os.sched_getscheduler(0)
        inputs.started()
        return switch.granted_rt_priority, waiting, released, os.sched_getscheduler(0)

    granted, waiting, released, after = in_thread(wait)
    if has_cap_sys_nice():
        assert granted == TRAINING_WAIT_RT_PRIORITY and waiting == os.SCHED_FIFO
    assert released == [os.SCHED_OTHER, os.SCHED_OTHER] and after == os.SCHED_OTHER


def test_an_error_while_waiting_releases_the_works_in_the_fair_class_and_propagates():
    """An exception leaving the ``with`` block between ``begin`` and ``started`` (a peer gone, a
    signal) switches the thread back before the works go; the exception is not swallowed."""

    def wait():
        released: list[int] = []
        switch = WaitSwitch()
        with pytest.raises(RuntimeError, match="peer gone"), InputWait(switch) as inputs:
            inputs.begin([Work(released)])
            raise RuntimeError("peer gone")
        return switch.granted_rt_priority, released, os.sched_getscheduler(0)

    granted, released, after = in_thread(wait)
    if has_cap_sys_nice():
        assert granted == TRAINING_WAIT_RT_PRIORITY
    assert released == [os.SCHED_OTHER] and after == os.SCHED_OTHER


def test_a_priority_outside_sched_fifos_range_is_refused_by_name():
    with pytest.raises(ValueError, match="wait_rt_priority 0: SCHED_FIFO takes 1-99"):
        WaitSwitch(wait_rt_priority=0)
