"""The worker's side of BubbleTea: prefill chunks run inside its pipeline bubbles.

A ``PrefillServer`` lives in each training worker beside its stage. The dispatcher sends it
requests over a Unix datagram socket (outside the emulated network); the worker calls ``fill``
at every bubble it knows of: after it has posted the receive that the next schedule action waits
for, it gives forward passes over chunks of one or more queued prompts (``chunk_batch.ChunkBatch``:
real passes of its inference model with each request's KV cache, computed on the low-priority
stream, a process of its own: ``prefill_stream.py``) emulated GPU time, choosing each with
``decisions.choose_work`` (passes predicted to end ``guard`` before the bubble does; with
``fill_every_bubble``, through the whole bubble), from the worker's filling thread (``fill.Filler``) while its
thread waits for the training input (``start_fill``); a pass stops the moment that input
arrives, wherever it is, and resumes in a later bubble. A finished prompt's KV cache
goes, from a thread of the stream's process, over the emulated network (TCP) to the decode host
of the worker's DC (``kv_sender.py``).
"""

from __future__ import annotations

import itertools
from collections import deque

import torch

from testbed.bubbletea.bubble_end import BubbleEnd, hold_gpu
from testbed.bubbletea.decisions import (
    LOOKAHEAD,
    KVBudget,
    NewBatch,
    QueuedPrompt,
    Resume,
    SlotPredictor,
    choose_work,
    prefill_seconds,
)
from testbed.bubbletea.dispatcher_link import PRIOR, DispatcherLink
from testbed.bubbletea.fill import Fill, Filler
from testbed.bubbletea.inference import InferenceModel
from testbed.bubbletea.passes import Job, Pass, keep_stopped
from testbed.bubbletea.prefill_stream import PrefillStream
from testbed.bubbletea.stream_process import Part
from testbed.plan.memory import kv_cache_bytes
from testbed.plan.worker_config import BubbleTeaConfig
from testbed.spec.bubbletea import BubbleTeaSpec
from testbed.trace import schema as T
from testbed.trace import task_names
from testbed.trace.clock import now_ns
from testbed.trace.events import EventWriter


class PrefillServer:
    """A worker's prefill: ``spec`` the experiment's BubbleTea section, ``s_per_flop`` the emulated
    GPU's speed, ``inbox`` and ``dispatcher`` the Unix sockets requests come in on and profiles go
    out to, ``decode_addr`` the decode host of the worker's DC (None: caches are not sent),
    ``prior`` the schedule's predicted bubble of each slot (``SlotPredictor``), ``budget`` the
    emulated GPU's memory and its admission control (``KVBudget``; None: no budget), ``corpus``
    the text prompts are taken from (``inference.prompt_tokens_from``; None: random byte ids, as
    a trace gives only lengths: ``prompt_tokens_for``)."""

    def __init__(
        self,
        spec: BubbleTeaSpec,
        s_per_flop: float,
        seed: int,
        rank: int,
        ev: EventWriter,
        inbox: str,
        dispatcher: str,
        decode_addr: str | None,
        padded: bool,
        prior: dict[str, float] | None = None,
        budget: KVBudget | None = None,
        corpus: torch.Tensor | None = None,
    ) -> None:
        self.cfg = spec.model
        self.model = InferenceModel(self.cfg, seed)
        self.s_per_flop, self.seed, self.rank, self.ev, self.padded = s_per_flop, seed, rank, ev, padded
        self.guard_s = spec.guard_ms / 1000
        self.max_chunk, self.every = spec.max_chunk_tokens, spec.fill_every_bubble
        self.predictor = SlotPredictor(spec.profile_iterations, prior)
        self.budget = budget or KVBudget(0)
        self.corpus = corpus
        self.jobs: deque[Job] = deque()
        #: passes stopped at a layer boundary, oldest first (their jobs are in ``jobs`` too)
        self.stopped: list[Pass] = []
        self._passes = itertools.count()
        self.stream = PrefillStream(self.model, decode_addr, task_names.STREAM.format(rank=rank))
        self._released = 0  # KV cache bytes the stream had handed off when last looked at
        self.link = DispatcherLink(inbox, dispatcher)
        self.iteration = 0
        #: each slot's prediction when its latest wait began (``observe`` hands it back)
        self._predicted: dict[str, float | None] = {}
        #: the worker's filling thread (its ``nice`` is recorded on the worker's start-up line)
        self.filler = Filler(task_names.FILL.format(rank=rank))  # after the stream's fork: not in it

    @classmethod
    def for_worker(
        cls, bt: BubbleTeaConfig, seed: int, rank: int, dc: str, ev: EventWriter, padded: bool, corpus: torch.Tensor
    ) -> PrefillServer:
        """Worker ``rank``'s server (in DC ``dc``) under ``bt``; prompts from ``corpus``. The worker
        calls ``announce`` once it has joined the process group."""
        budget = KVBudget(bt.device_bytes_of(rank), bt.gpu_memory_bytes)
        args = (bt.inbox_of(rank), bt.dispatcher, bt.decode_hosts.get(dc), padded, bt.prior_of(rank), budget, corpus)
        return cls(bt.spec, bt.s_per_flop, seed, rank, ev, *args)

    def announce(self, prior_iteration_s: float) -> None:
        """With a prior, tell the dispatcher at once, so that the stream may start before the first
        iteration; called once the worker has joined the process group, so that no request arrives
        while the group is still forming (seconds across machines: ``--backend remote``)."""
        if self.predictor.ready:
            self.report(-1, prior_iteration_s)

    # --------------------------------------------------------------- requests in
    def poll_inbox(self) -> None:
        """Take the requests come in; a ``prior`` message (the runner's, when a link profile changed
        the WAN: ``run/link_replan.py``) gives the bubble predictor a new start instead."""
        for msg in self.link.requests():
            if PRIOR in msg:
                self.predictor.reprior(msg[PRIOR])
            else:
                self.jobs.append(Job.of_request(msg, self.seed, self.corpus))

    # --------------------------------------------------------------- the bubbles
    def bubble_to_fill(self, slot: str) -> float | None:
        """The predicted bubble before ``slot`` (s; recorded for ``observe``) where ``fill`` would
        run anything in it if it began now: a request queued (or a stopped pass's), the inbox read
        first; else None. Where it is None no thread fills the bubble (``train/worker.py``): a
        request that comes during it waits for the next one."""
        self.settle()
        self.poll_inbox()
        self._predicted[slot] = predicted = self.predictor.predict(slot)
        return predicted if self.jobs else None

    def start_fill(self, predicted: float, prev_end_ns: int) -> Fill:
        """``fill_predicted`` of a bubble from the worker's filling thread (``fill.Filler``), while the caller waits for
        training's input itself (no thread between the input and the operation it feeds): the
        caller says when the input arrived with ``Fill.end`` and wakes the thread with
        ``Fill.wake`` once its operation has started. Every call of the server but
        ``observe`` (which that thread never touches) first waits for that thread to be done
        (``settle``)."""
        return self.filler.start(lambda arrived: self.fill_predicted(predicted, prev_end_ns, arrived))

    def settle(self) -> None:
        """Wake the thread that filled a bubble (``start_fill``), ended, and wait until it is done."""
        self.filler.settle()

    def fill(self, slot: str, prev_end_ns: int, arrived: BubbleEnd) -> int | None:
        """``fill_predicted`` of the bubble before ``slot`` where ``bubble_to_fill`` says there is
        anything to run in it (else None, at once)."""
        predicted = self.bubble_to_fill(slot)
        return None if predicted is None else self.fill_predicted(predicted, prev_end_ns, arrived)

    def fill_predicted(self, predicted: float, prev_end_ns: int, arrived: BubbleEnd) -> int | None:
        """Run prefill chunks in a bubble predicted to last ``predicted`` s (``bubble_to_fill``'s),
        which began at ``prev_end_ns`` (the end of this worker's previous compute) and ends when
        ``arrived`` is set (training's input). It looks whether the input has arrived before
        choosing each pass and again once it is chosen (choosing takes time), and starts none if
        it has. Returns when the bubble ended if a pass had the GPU then (else None). A slice
        stopped by the input is traced through ``EventWriter.defer``: the worker writes it once
        its operation has started."""
        ready_ns = None
        while self.jobs and not arrived.is_set():
            work = self._next_pass(predicted, (now_ns() - prev_end_ns) / 1e9)
            if work is None:
                break
            if arrived.is_set():  # the data came while the pass was chosen: training goes first
                arrived.until_woken()
                self._not_run(work)
                break
            ready_ns = self._run_pass(work, arrived)
            for job in work.jobs:
                if job.pos == job.tokens.numel():
                    self.jobs.remove(job)
                    self.stream.finish(job.rid, job.handoff_header(self.rank, now_ns()), job.kv_bytes)  # KV cache out
            if ready_ns is not None:
                break
        return ready_ns

    def _next_pass(self, predicted_s: float, elapsed_s: float) -> Pass | None:
        """The forward pass to run now (``decisions.choose_work``): a stopped one resumed, or a new
        one over chunks of the queued requests in no stopped pass. Admission control: a request
        not yet started waits while its KV cache would not fit beside those admitted (taken in
        queue order, each counting against the next)."""
        self._sync_budget()
        busy = {id(j) for p in self.stopped for j in p.jobs}
        idle = [j for j in self.jobs if id(j) not in busy]
        kv_bytes = (0 if j.kv_bytes else kv_cache_bytes(self.cfg, j.tokens.numel()) for j in idle)
        free = [idle[i] for i in self.budget.admitted(kv_bytes, LOOKAHEAD)]
        stopped = [p.left_s for p in self.stopped]
        queued = [QueuedPrompt(j.pos, j.tokens.numel() - j.pos) for j in free]
        work = choose_work(
            stopped, queued, self.cfg, predicted_s, elapsed_s, self.guard_s, self.max_chunk, self.s_per_flop, self.every
        )
        if isinstance(work, Resume):
            return self.stopped.pop(work.index)
        if not isinstance(work, NewBatch):
            return None
        jobs, tokens = [free[i] for i, _ in work.chunks], [n for _, n in work.chunks]
        parts = [Part(j.rid, j.pos, j.tokens[j.pos : j.pos + n].numpy().tobytes()) for j, n in zip(jobs, tokens)]
        slot = self.stream.add(parts)
        if slot is None:  # every slot of the stream in use: only stopped passes go on
            return None
        for job in jobs:
            if not job.kv_bytes:  # admitted: its cache is held until handed to the decode host
                job.kv_bytes = kv_cache_bytes(self.cfg, job.tokens.numel())
                self.budget.hold(job.kv_bytes)
        return Pass(slot, jobs, tokens, work.target_s, next(self._passes))

    def _not_run(self, work: Pass) -> None:
        """``work`` was chosen but training's data came before it had the GPU: a stopped pass goes
        back among ``stopped``; a new one the stream forgets (its requests stay queued)."""
        if work.slices:
            keep_stopped(self.stopped, work)
        else:
            self.stream.drop(work.slot)

    def _run_pass(self, work: Pass, arrived: BubbleEnd) -> int | None:
        """Give a forward pass (new or stopped) emulated GPU time until it has had ``work.target_s``
        in all and the prefill stream has computed its blocks, or until training's data arrives:
        then its GPU time ends at the arrival (``arrived.t_ns``), wherever the pass is
        (``prefill_stream.py``: training's stream preempts prefill's; this thread waits on
        ``arrived``, woken by the worker once its operation has started, and does nothing more
        until then: ``BubbleEnd.until_woken``); a stopped pass is kept in ``stopped`` for a later
        bubble, and its slice's event is deferred (``fill``). Without padding a pass needs no GPU
        time beyond its real compute. Returns when the data arrived, if it did."""
        t0 = now_ns()
        stream, slot = self.stream, work.slot
        stream.run(slot)
        due_ns = int(work.left_s * 1e9) if self.padded else 0
        layers0 = stream.layers_done(slot)
        ready_ns, waited_ns = hold_gpu(t0 + due_ns, lambda: stream.computed(slot), arrived)
        if ready_ns is not None:
            arrived.until_woken()
            if ready_ns <= t0:  # it came as the pass was given: it had no GPU time
                self._not_run(work)
                return None
        for job in work.jobs:
            job.first_start_ns = job.first_start_ns or t0
        t1 = now_ns() if ready_ns is None else ready_ns
        stream.check()
        paid_ns = min(t1 - t0, due_ns)
        work.paid_s = work.target_s if paid_ns == due_ns else work.paid_s + paid_ns / 1e9
        real_ns, layers = stream.real_ns(slot), stream.layers_done(slot)
        done = layers == stream.n_layers and work.left_s == 0.0
        self._sync_budget()
        trace = self.ev.write if ready_ns is None else self.ev.defer  # stopped: training first
        trace(
            T.PREFILL,
            t0,
            t1,
            **{T.ITERATION: self.iteration, T.MICROBATCH: -1},
            padded_ns=t1 - t0,
            target_ns=paid_ns,
            **{T.OVERRUN_NS: max(0, t1 - waited_ns) if waited_ns is not None else 0},
            blocks=layers - layers0,
            memory_bytes=self.budget.used_bytes,
            **work.end_slice(real_ns, done),
        )
        if not done:
            keep_stopped(self.stopped, work)
            return ready_ns
        for job, n in zip(work.jobs, work.tokens):  # the stream holds their caches
            job.pos += n
        stream.done(slot)
        return ready_ns

    def observe(self, slot: str, bubble_s: float) -> dict[str, int]:
        """Record the bubble ``slot``'s wait turned out to be (s); returns the wait event's fields
        for the prediction the chunks were placed by and the bubble observed (``T.PREDICTED_BUBBLE_NS``,
        absent when nothing was predicted, and ``T.BUBBLE_NS``): the summary's prediction error."""
        self.predictor.observe(slot, bubble_s)
        predicted = self._predicted.pop(slot, None)
        fields = {T.BUBBLE_NS: int(bubble_s * 1e9)}
        if predicted is not None:
            fields[T.PREDICTED_BUBBLE_NS] = int(predicted * 1e9)
        return fields

    def backlog_s(self) -> float:
        return sum(prefill_seconds(self.cfg, j.pos, j.tokens.numel() - j.pos, self.s_per_flop) for j in self.jobs)

    def report(self, iteration: int, iteration_s: float) -> None:
        """Tell the dispatcher this worker's predicted bubbles and queued prefill (after each iteration)."""
        self.settle()
        self.iteration = iteration + 1
        self.link.send(
            {
                "ev": "profile",
                "rank": self.rank,
                "it": iteration,
                "bubble_s": self.predictor.per_iteration_s(),
                "largest_s": self.predictor.largest_s(),
                "iteration_s": iteration_s,
                "backlog_s": self.backlog_s(),
                "ready": self.predictor.ready,
            }
        )

    # --------------------------------------------------------------- KV cache out
    def _sync_budget(self) -> None:
        """Release from the budget the KV caches the stream has handed off since last looked at."""
        released = self.stream.released_bytes()
        self.budget.release(released - self._released)
        self._released = released

    def close(self, timeout_s: float = 30.0) -> None:
        """Send what is finished, then stop (requests still queued are dropped: never completed)."""
        self.filler.close()
        self.stream.close(timeout_s)
        self._sync_budget()
        self.link.close()
