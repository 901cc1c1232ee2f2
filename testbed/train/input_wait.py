"""A training worker's wait for an operation's input: in the real-time class while it waits
(``thread_slice.WaitSwitch``), back in the fair class once the operation has started, and the
receive's gloo works released only then. Released while the thread is still real-time, gloo's
receive buffer waits for gloo's own thread to drop its reference by calling ``sched_yield`` in a
loop (gloo/common/memory.h, ``~ShareableNonOwningPtr``), which never gives the CPU to a
fair-class thread: the release spun until the kernel's real-time throttling let that thread
run (950 ms of each second; ``scripts/bench_wait_class.py``)."""

from __future__ import annotations

from types import TracebackType
from typing import Any

from testbed.thread_slice import WaitSwitch


class InputWait:
    """The calling thread's waits for its inputs, through ``switch`` (the thread's own
    ``WaitSwitch``). ``begin(works)`` before it waits on ``works`` (a receive's gloo works, or
    anything whose release must wait): they are held and the thread switched to its waiting
    class; ``started()`` once the operation they feed has started: the thread back in the fair
    class, then the works released. Used as a context manager around the training loop, an
    exception leaving it does the same, so that no error path releases a work in the real-time
    class."""

    def __init__(self, switch: WaitSwitch) -> None:
        self._switch = switch
        self._works: list[Any] = []

    def begin(self, works: list[Any]) -> None:
        self._works.extend(works)
        self._switch.short()

    def started(self) -> None:
        self._switch.default()
        self._works.clear()

    def __enter__(self) -> InputWait:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        if kind is not None:
            self.started()
