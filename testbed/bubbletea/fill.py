"""A bubble filled from a thread of its own (BubbleTea): the worker's thread waits for training's
input itself, as without BubbleTea, while this thread gives prefill passes the emulated GPU
(``prefill.PrefillServer.start_fill``), and is told when the input came."""

from __future__ import annotations

import threading
from collections.abc import Callable

from testbed.bubbletea.bubble_end import Arrived, BubbleEnd
from testbed.trace.task_names import name_this_thread


class Fill:
    """``fill(arrived)`` (``PrefillServer.fill_predicted`` of one bubble) run in a thread of its own
    (named ``name``, for the kernel too: ``trace.task_names.FILL``):
    ``end(t_ns)`` says training's input arrived at ``t_ns`` and ``wake()`` wakes the thread to
    stop its pass there (apart: ``bubble_end.Arrived``; the worker wakes it once the operation the
    input feeds has started); ``settle()`` wakes it, waits until it is done and returns whether a
    pass had the GPU when the input came (training's operation then started late by its start
    minus ``t_ns``, as ``prefill_delay_ns``). Raises again, from ``settle``, what the thread
    raised."""

    def __init__(self, fill: Callable[[BubbleEnd], int | None], name: str = "bubble-fill") -> None:
        self.arrived = Arrived()
        self._held: int | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fill,), name=name, daemon=True)
        self._thread.start()

    def _run(self, fill: Callable[[BubbleEnd], int | None]) -> None:
        try:
            name_this_thread(self._thread.name)  # the kernel's name too: a scheduler trace tells it apart
            self._held = fill(self.arrived)
        except BaseException as e:  # noqa: BLE001 - raised again in the worker's thread by settle()
            self._error = e

    def end(self, t_ns: int) -> None:
        self.arrived.end(t_ns)

    def wake(self) -> None:
        self.arrived.wake()

    def settle(self) -> bool:
        self.arrived.wake()
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._held is not None
