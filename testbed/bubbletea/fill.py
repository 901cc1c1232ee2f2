"""Bubbles filled from a thread of their own (BubbleTea): the worker's thread waits for training's
input itself, as without BubbleTea, while the worker's one filling thread (``Filler``) gives
prefill passes the emulated GPU (``prefill.PrefillServer.start_fill``), and is told when the
input came.

One thread for the worker's life, handed one bubble at a time, rather than one started per
bubble: a thread starting takes the CPU (before it has even named itself) that a worker whose
input came meanwhile waits for. Measured in docs/history.md, with the figures."""

from __future__ import annotations

import os
import queue
import sys
import threading
from collections.abc import Callable

from testbed.bubbletea.bubble_end import Arrived, BubbleEnd
from testbed.thread_slice import DEFAULT_SLICE_NS, FILL_THREAD_NICE, slice_or_report
from testbed.trace.task_names import name_this_thread

#: the interpreter's switch interval in a worker with a filling thread (s; Python's own is 5 ms,
#: ``sys.setswitchinterval``): how long a thread that wants the interpreter lock waits before the
#: thread holding it must hand it over. The filling thread runs the interpreter for up to a few
#: ms at a time (it chooses a pass among the queued requests and traces the last), and the
#: worker's main thread, woken by its input meanwhile, slept until the interval had passed
#: (scheduler traces, docs/history.md)
SWITCH_INTERVAL_S = 1e-4


class Fill:
    """One bubble's ``fill(arrived)`` (``PrefillServer.fill_predicted``), run by a ``Filler``:
    ``end(t_ns)`` says training's input arrived at ``t_ns`` and ``wake()`` wakes the filling
    thread to stop its pass there (apart: ``bubble_end.Arrived``; the worker wakes it once the
    operation the input feeds has started); ``settle()`` wakes it, waits until the bubble's fill is
    done and returns whether a pass had the GPU when the input came (training's operation then
    started late by its start minus ``t_ns``, as ``prefill_delay_ns``). Raises again, from
    ``settle``, what the fill raised."""

    def __init__(self, fill: Callable[[BubbleEnd], int | None]) -> None:
        self.arrived = Arrived()
        self._fill = fill
        self._held: int | None = None
        self._error: BaseException | None = None
        self._done = threading.Event()

    def run(self, error: BaseException | None = None) -> None:
        """Run the fill (in the filling thread) and mark it done; with ``error``, raise that instead
        (the thread's own fault: ``Filler``)."""
        try:
            if error is not None:
                raise error
            self._held = self._fill(self.arrived)
        except BaseException as e:  # noqa: BLE001 - raised again in the worker's thread by settle()
            self._error = e
        finally:
            self._done.set()

    def end(self, t_ns: int) -> None:
        self.arrived.end(t_ns)

    def wake(self) -> None:
        self.arrived.wake()

    def settle(self) -> bool:
        self.arrived.wake()
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._held is not None


class Filler:
    """The worker's filling thread, named ``name`` (for the kernel too: ``trace.task_names.FILL``),
    a daemon, one bubble at a time: ``start(fill)`` settles the fill handed before, hands it
    ``fill`` and returns its ``Fill``; ``settle()`` settles the fill handed last, if not yet
    (``Fill.settle``, raising what it raised). ``close()`` settles, then ends the thread; ``start``
    after it raises RuntimeError. Where the kernel refuses the thread's name, every fill raises
    that OSError (from ``Fill.settle``). The thread runs with the kernel's slice at
    ``thread_slice.FILL_THREAD_NICE``; ``nice`` is the nice value it has (its own where the kernel
    refused the lower one; None where setting up the thread failed, which every fill then
    raises), known once the constructor returns. A process-wide setting: the constructor sets
    the interpreter's switch interval to ``SWITCH_INTERVAL_S`` (the worker's main thread then
    takes the lock back within it), and ``close`` sets back the one it found."""

    def __init__(self, name: str) -> None:
        self._fills: queue.SimpleQueue[Fill | None] = queue.SimpleQueue()
        self._last: Fill | None = None
        self._closed = False
        self.nice: int | None = None
        self._switch_interval_before = sys.getswitchinterval()
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        started = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(started,), name=name, daemon=True)
        self._thread.start()
        started.wait()

    def _run(self, started: threading.Event) -> None:
        error: BaseException | None = None
        try:
            name_this_thread(self._thread.name)  # the kernel's name too: a scheduler trace tells it apart
            # not training's shorter slice, but the nice value of the thread whose lock it holds
            slice_or_report(DEFAULT_SLICE_NS, FILL_THREAD_NICE, what=f"the filling thread {self._thread.name}")
            self.nice = os.getpriority(os.PRIO_PROCESS, 0)  # this thread's, on Linux
        except BaseException as e:  # noqa: BLE001 - raised again in the worker's thread by every fill
            error = e
        finally:
            started.set()
        while (fill := self._fills.get()) is not None:
            fill.run(error)

    def start(self, fill: Callable[[BubbleEnd], int | None]) -> Fill:
        self.settle()
        if self._closed:
            raise RuntimeError("the filling thread was closed: no bubble can be handed to it")
        self._last = handed = Fill(fill)
        self._fills.put(handed)
        return handed

    def settle(self) -> None:
        last, self._last = self._last, None
        if last is not None:
            last.settle()

    def close(self) -> None:
        try:
            self.settle()
        finally:
            if not self._closed:
                self._closed = True
                self._fills.put(None)
                sys.setswitchinterval(self._switch_interval_before)
            self._thread.join()
