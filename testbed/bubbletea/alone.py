"""Prefill served alone: what BubbleTea's prefill is set beside (``+prefill-alone``).

The same workers, on the same emulated GPUs, run no training: each serves the requests the
dispatcher gives it through the same ``PrefillServer`` as under BubbleTea, with its whole time one
bubble. Time is cut into windows of the predicted training iteration, the serving run's
counterpart of iterations (warm-up windows are left out of its figures as iterations are); each is
a ``T.SERVING_WINDOW`` event, and a pass still running at a window's end is stopped there and
resumed in the next, as a pass is when training's data arrives. ``compare`` divides a BubbleTea
run's prefill by this run's (``results/compare.py``).
"""

from __future__ import annotations

from testbed.bubbletea.bubble_end import Deadline
from testbed.bubbletea.prefill import PrefillServer
from testbed.trace import schema as T
from testbed.trace.clock import now_ns
from testbed.trace.events import EventWriter

#: how long a worker with nothing to prefill waits before it looks at its inbox again (s)
IDLE_POLL_S = 0.001


def serve_alone(server: PrefillServer, windows: int, window_s: float, ev: EventWriter) -> None:
    """Serve prefill for ``windows`` windows of ``window_s`` seconds each, back to back from now,
    tracing each window as a ``T.SERVING_WINDOW`` event of its index (``T.ITERATION``), with the
    time its worker had no request queued (``T.QUEUE_EMPTY_NS``: a run whose queue runs empty
    measures the request rate, not what the GPUs deliver), and telling
    the dispatcher this worker's load after each (``PrefillServer.report``). Raises ValueError
    for a window that is not positive."""
    if not window_s > 0:
        raise ValueError(f"window_s = {window_s!r}: a serving window must last more than 0 s")
    window_ns = int(window_s * 1e9)
    start = now_ns()
    for k in range(windows):
        t0 = start + k * window_ns
        over = Deadline(t0 + window_ns)
        empty_ns = 0
        while not over.is_set():
            server.fill(T.ALONE_SLOT, t0, over)
            if not over.is_set():  # nothing queued, or nothing the policy starts now: look again shortly
                idle = not server.jobs
                t = now_ns()
                over.wait(IDLE_POLL_S)
                if idle:
                    empty_ns += now_ns() - t
        server.observe(T.ALONE_SLOT, window_s)  # the window was what was predicted: no error to report
        ev.write(T.SERVING_WINDOW, t0, now_ns(), **{T.ITERATION: k, T.MICROBATCH: -1, T.QUEUE_EMPTY_NS: empty_ns})
        server.report(k, window_s)
