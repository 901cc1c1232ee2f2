"""BubbleTea in the simulator: prefill of inference requests placed in the predicted bubbles of a
simulated iteration, with BubbleTea's own decisions (``bubbletea/decisions.py``: the emulated
GPU's seconds per FLOP, the chunk that fits a window less the guard, the worker a request goes to)
and its request stream (``bubbletea/stream.request_stream``: the experiment's trace file, or the
synthetic stream fitted to the Azure 2023 trace).

The windows: each training worker's bubbles over the iteration (``plan/bubble_timeline.py``) and
the gradient all-reduce after the pipeline (the GPU waits on the network then), the same every
iteration. Requests arrive over ``iterations`` iterations; each goes, when it arrives, to the worker
that would finish its queued prefill soonest (``choose_worker``, kept up to date as
``SoonestWorker``), and its chunks fill that worker's windows in forward passes as the workers
choose them (``choose_work``: chunks of several requests in one pass, within
``max_chunk_tokens``), a pass only where it ends ``guard_ms`` before the window does. Prefill starts
only at a window's start or after the previous chunk (a request arriving inside a window waits
for the next one: a small pessimism for TTFT). TTFT here: arrival to the end of the prompt's
prefill (the hand-off and the first decode step are not modelled).

Pure (numpy through the request stream).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from testbed.bubbletea.decisions import (
    LOOKAHEAD,
    NewBatch,
    SoonestWorker,
    WorkerLoad,
    choose_work,
    head_pass_s,
    prefill_seconds,
    seconds_per_flop,
)
from testbed.bubbletea.stream import request_stream
from testbed.plan.allreduce import allreduce_s
from testbed.plan.run_plan import RunPlan
from testbed.spec.bubbletea import MIN_CHUNK_TOKENS, longest_prompt, served_model

#: a figure is made over this many iterations of requests at most (the first one's requests find
#: empty queues), fewer when they would bring more than ``REQUESTS`` requests, but never under
#: ``MIN_ITERATIONS``
ITERATIONS, MIN_ITERATIONS, REQUESTS = 20, 3, 20_000


class _Queued:
    """A request queued on a simulated worker: its arrival (s), next position and tokens left (a
    ``decisions.Prompt``, updated in place as its chunks are prefilled)."""

    __slots__ = ("arrival_s", "pos", "left")

    def __init__(self, arrival_s: float, pos: int, left: int) -> None:
        self.arrival_s, self.pos, self.left = arrival_s, pos, left


@dataclass(frozen=True)
class PrefillFigures:
    """BubbleTea's figures over the simulated iterations: requests that arrived and whose prefill
    ended, prompt tokens prefilled per second, the training workers' utilization with prefill
    counted busy, TTFT p50 and p99 (s; None when no request was served), and the prefill throughput
    as a share of what the same GPUs give serving prefill alone (no training)."""

    requests: int
    served: int
    prefill_tokens_per_s: float
    gpu_utilization_with_prefill: float
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    share_of_prefill_alone: float


def prefill_in_bubbles(
    plan: RunPlan, iteration_s: float, busy_s: float, iterations: int | None = None
) -> PrefillFigures:
    """BubbleTea's figures for the run ``plan`` (its experiment, placement and bubbles: see the
    module doc): ``iteration_s``
    the simulated iteration (s), ``busy_s`` a training worker's busy seconds in it (mean),
    ``iterations`` of requests (default: see ``ITERATIONS``). Raises ValueError when the schedule
    cannot complete (``bubble_timeline``) and SpecError for a request rate the stream refuses."""
    exp, workers = plan.experiment, list(plan.workers)
    bt = exp.bubbletea
    if iterations is None:
        iterations = max(MIN_ITERATIONS, min(ITERATIONS, math.ceil(REQUESTS / (bt.request_rate * iteration_s))))
    cfg, guard_s, spf = served_model(bt, exp.model), bt.guard_ms / 1000, seconds_per_flop(exp)
    max_chunk = bt.max_chunk_tokens
    head_only: tuple[tuple[int, int], ...] = ((0, max_chunk),)  # a pass of the queue's head alone (``head_pass_s``)
    assert plan.bubbles is not None  # a plan under BubbleTea has them
    pipe_s, bubbles = plan.bubbles
    smallest = prefill_seconds(cfg, 0, MIN_CHUNK_TOKENS, spf)
    windows: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for b in bubbles:
        windows.setdefault((b.stage, b.replica), []).append((b.start_s, b.start_s + b.duration_s))
    reduce_s = allreduce_s(exp, exp.topology_spec, workers)
    for w in workers:
        mine = windows.setdefault((w.stage, w.replica), [])
        if reduce_s > 0:  # the GPU waits on the network during the all-reduce
            if mine and abs(mine[-1][1] - pipe_s) < 1e-12:
                mine[-1] = (mine[-1][0], pipe_s + reduce_s)
            else:
                mine.append((pipe_s, pipe_s + reduce_s))
        # within the iteration (the pipeline's end plus the all-reduce may pass an extrapolated one)
        mine = [(a, min(b, iteration_s)) for a, b in mine if a < iteration_s]
        windows[(w.stage, w.replica)] = [x for x in mine if x[1] - x[0] >= smallest + guard_s]
    keys = sorted(windows)
    load = {
        k: WorkerLoad(sum(b - a for a, b in windows[k]), max((b - a for a, b in windows[k]), default=0.0), iteration_s)
        for k in keys
    }
    rank = {k: i for i, k in enumerate(keys)}
    clip = min(longest_prompt(bt), cfg.seq_len - 1)  # as the dispatcher clips, within the context
    requests = [
        replace(r, prompt_tokens=min(r.prompt_tokens, clip))
        for r in request_stream(exp, iterations * iteration_s)
        if r.arrival_s < iterations * iteration_s
    ]
    queue: dict[tuple[int, int], list[_Queued]] = {k: [] for k in keys}
    slots = sorted(
        (i * iteration_s + a, i * iteration_s + b, k) for i in range(iterations) for k in keys for a, b in windows[k]
    )
    ttft: list[float] = []
    prefilled, prefill_busy_s, next_req = 0, 0.0, 0
    by_rank = {i: k for k, i in rank.items()}
    # the same loads, as the dispatcher keys them, and its choice kept as they change
    soonest = SoonestWorker({rank[x]: load[x] for x in keys}, smallest, guard_s)
    for start, end, k in slots:
        while next_req < len(requests) and requests[next_req].arrival_s <= start:
            r = requests[next_req]
            next_req += 1
            chosen = soonest.choose()
            if chosen is None:
                continue
            queue[by_rank[chosen]].append(_Queued(r.arrival_s, 0, r.prompt_tokens))
            load[by_rank[chosen]].backlog_s += prefill_seconds(cfg, 0, r.prompt_tokens, spf)
            soonest.changed(chosen)
        t = start
        waiting, held = queue[k], load[k]
        while waiting:
            # choose_work's most common answer asked first, without building it (a million a scenario)
            pass_s = head_pass_s(waiting[0], cfg, end - start, t - start, guard_s, max_chunk, spf)
            if pass_s is not None:
                chunks = head_only
            else:
                work = choose_work([], waiting[:LOOKAHEAD], cfg, end - start, t - start, guard_s, max_chunk, spf)
                if not isinstance(work, NewBatch):
                    break
                chunks, pass_s = work.chunks, work.target_s
            t += pass_s
            prefill_busy_s += pass_s
            held.backlog_s = max(0.0, held.backlog_s - pass_s)
            for i, n in reversed(chunks):  # from the back, so that a removal keeps the others' indices
                item = waiting[i]
                item.pos += n
                item.left -= n
                prefilled += n
                if not item.left:
                    ttft.append(t - item.arrival_s)
                    del waiting[i]
        if t > start:  # its backlog changed (read at the next choice, after this window)
            soonest.changed(rank[k])
    span = iterations * iteration_s
    # the same GPUs serving this stream's prompts alone, each in one pass: tokens over their seconds
    alone_s = sum(prefill_seconds(cfg, 0, r.prompt_tokens, spf) for r in requests)
    alone = len(keys) * sum(r.prompt_tokens for r in requests) / alone_s if alone_s else float("inf")
    q = sorted(ttft)
    return PrefillFigures(
        len(requests),
        len(ttft),
        prefilled / span,
        min(1.0, (busy_s * iterations + prefill_busy_s / len(keys)) / span),
        q[len(q) // 2] if q else None,
        q[min(len(q) - 1, int(0.99 * len(q)))] if q else None,
        prefilled / span / alone,
    )
