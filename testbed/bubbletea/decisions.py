"""BubbleTea's decisions as pure functions (DESIGN.md section 1, item 5): the emulated-GPU time of
prefill and decode, the per-slot bubble predictor a worker keeps, how large a chunk fits a bubble,
what one forward pass holds (``choose_work``: a stopped pass resumed, or chunks of several
requests), the memory budget's admission control, and which worker a request goes to. The
mechanisms that use them: ``prefill.py`` (in the worker), ``dispatcher.py`` (in the runner),
``decode.py`` (on the decode hosts), and the simulator (``sim/bubbletea.py``).
"""

from __future__ import annotations

import heapq
import threading
from collections import defaultdict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from testbed.bubbletea.windows import fits
from testbed.errors import InferenceError
from testbed.plan.memory import decode_step_bytes
from testbed.spec.bubbletea import MIN_CHUNK_TOKENS
from testbed.spec.devices import EMULATED_MACHINE_BALANCE
from testbed.spec.experiment import Experiment
from testbed.spec.model import ModelConfig, decode_flops, prefill_chunk_estimate, prefill_flops


def seconds_per_flop(exp: Experiment) -> float:
    """The emulated GPU's speed, as training's own time model gives it: one stage's forward target
    (``compute.forward_ms``) over that stage's forward FLOPs on one microbatch (its blocks; the
    largest stage). Prefill and decode are timed with the same figure, so they run on the same
    emulated GPU as training."""
    return exp.block_s[0] / exp.model.block_forward_flops(exp.tokens_per_microbatch)


def prefill_seconds(cfg: ModelConfig, start: int, chunk: int, s_per_flop: float) -> float:
    """Emulated seconds to prefill positions start..start+chunk-1 (``spec.model.prefill_flops``)."""
    return prefill_flops(cfg, start, chunk) * s_per_flop


def decode_step_seconds(cfg: ModelConfig, lengths: Sequence[int], s_per_flop: float) -> float:
    """Emulated seconds of one decode step over a batch of requests with ``lengths`` positions
    cached (each feeds the token at that position), by the roofline (``spec.devices.Device.
    machine_balance``): the larger of its FLOPs (``decode_flops``, summed) and the bytes it moves
    (``plan.memory.decode_step_bytes``) at ``EMULATED_MACHINE_BALANCE`` FLOPs' time a byte. In
    decode the bytes are always the larger here; while the weights dominate them, a batch costs
    little more than one request (what continuous batching gains), and once the requests' KV
    caches do, the step grows with the batch. Raises ``InferenceError`` for an empty batch."""
    if not lengths:
        raise InferenceError("a decode step needs at least one request in its batch")
    flops = sum(decode_flops(cfg, n) for n in lengths)
    return max(flops, decode_step_bytes(cfg, lengths) * EMULATED_MACHINE_BALANCE) * s_per_flop


def chunk_that_fits(
    cfg: ModelConfig, start: int, remaining: int, max_chunk: int, room_s: float, s_per_flop: float
) -> int:
    """The largest chunk (tokens) of a prompt, from position ``start`` with ``remaining`` tokens
    left, at most ``max_chunk``, whose prefill takes at most ``room_s`` seconds, to the token, so
    that passes fill a bubble up to its end; 0 when not even MIN_CHUNK_TOKENS (or the rest, if
    shorter) fits, or when ``max_chunk`` is below MIN_CHUNK_TOKENS and the rest is longer. The
    quadratic's root (``spec.model.prefill_chunk_estimate``) lands within a token or two; prefill
    time grows with the chunk, so stepping from there with ``prefill_seconds`` gives the answer a
    bisection would, in a few evaluations instead of about ten (the simulator makes about a
    million such choices a scenario: ``scripts/bench_sim.py``)."""
    return _chunk_and_seconds(cfg, start, remaining, max_chunk, room_s, s_per_flop)[0]


def _chunk_and_seconds(
    cfg: ModelConfig, start: int, remaining: int, max_chunk: int, room_s: float, s_per_flop: float
) -> tuple[int, float]:
    """``chunk_that_fits``'s chunk and its prefill seconds (0 for none), each prefill time
    computed once."""
    lo, hi = min(MIN_CHUNK_TOKENS, remaining), min(remaining, max_chunk)
    if hi <= 0 or lo > hi:
        return 0, 0.0
    hi_s = prefill_flops(cfg, start, hi) * s_per_flop
    if hi_s <= room_s:  # the whole of what may go fits (most passes at the paper's scale): no search
        return hi, hi_s
    # prefill_seconds written out (about a million calls a scenario at the paper's scale); from the
    # estimate down while too long, then up while the next token fits: where even ``lo`` is too
    # long, stepping down ends there, too long, and nothing fits
    estimate = prefill_chunk_estimate(cfg, start, room_s / s_per_flop)
    if estimate < hi:
        n = max(lo, int(estimate))
        n_s = prefill_flops(cfg, start, n) * s_per_flop
    else:  # an unbounded room: as much as the pass takes
        n, n_s = hi, hi_s
    while n > lo and n_s > room_s:
        n -= 1
        n_s = prefill_flops(cfg, start, n) * s_per_flop
    if n_s > room_s:
        return 0, 0.0
    while n < hi:
        nxt_s = prefill_flops(cfg, start, n + 1) * s_per_flop
        if nxt_s > room_s:
            break
        n, n_s = n + 1, nxt_s
    return n, n_s


@dataclass
class KVBudget:
    """Admission control of one worker's emulated GPU memory (bytes): ``device_bytes`` it holds
    besides KV caches (``plan/memory.device_bytes_besides_kv``), ``budget_bytes`` the experiment's
    ``gpu_memory_mb`` (None: no budget, every request admitted). A request is admitted (its first
    chunk may start) only if its whole prompt's KV cache fits beside the caches held; a cache is
    held from then until it has been handed to the decode host. ``peak_bytes``: the most the GPU
    held. Thread-safe (the KV sender releases from its own thread)."""

    device_bytes: int
    budget_bytes: int | None = None
    held_bytes: int = 0
    peak_bytes: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.peak_bytes = max(self.peak_bytes, self.device_bytes + self.held_bytes)

    def admits(self, nbytes: int) -> bool:
        """Whether a cache of ``nbytes`` more fits the budget now."""
        with self._lock:
            return self.budget_bytes is None or self.device_bytes + self.held_bytes + nbytes <= self.budget_bytes

    def hold(self, nbytes: int) -> None:
        with self._lock:
            self.held_bytes += nbytes
            self.peak_bytes = max(self.peak_bytes, self.device_bytes + self.held_bytes)

    def release(self, nbytes: int) -> None:
        with self._lock:
            self.held_bytes -= nbytes

    @property
    def used_bytes(self) -> int:
        """What the GPU holds now: ``device_bytes`` and the caches held."""
        with self._lock:
            return self.device_bytes + self.held_bytes

    def admitted(self, kv_bytes: Iterable[int], limit: int) -> list[int]:
        """Admission control over a queue: the indices, in queue order and at most ``limit``, of the
        requests that may start now, each one's KV cache (``kv_bytes``, bytes; 0 for a request
        admitted before) fitting beside the caches held and those admitted ahead of it here."""
        chosen: list[int] = []
        pending = 0
        for i, cache_bytes in enumerate(kv_bytes):
            if len(chosen) == limit:
                break
            if self.admits(pending + cache_bytes):
                chosen.append(i)
                pending += cache_bytes
        return chosen


#: how many queued requests ``choose_work`` looks at, from the queue's head, to fill a pass (a
#: worker's queue is short; the simulator's may hold thousands at the paper's scale)
LOOKAHEAD = 64


class Prompt(Protocol):
    """What ``choose_work`` reads of a queued request: its next position and the tokens left."""

    @property
    def pos(self) -> int: ...

    @property
    def left(self) -> int: ...


@dataclass(frozen=True)
class QueuedPrompt:
    """A request queued on a worker, for ``choose_work``: its next position and the tokens left."""

    pos: int
    left: int


@dataclass(frozen=True)
class Resume:
    """Resume the stopped chunk batch ``index`` (of the ``stopped`` list ``choose_work`` was given)."""

    index: int


@dataclass(frozen=True)
class NewBatch:
    """Start one forward pass over ``chunks``: (index in the queue, tokens) per request, in queue
    order, ``target_s`` padded seconds in all."""

    chunks: tuple[tuple[int, int], ...]
    target_s: float


def choose_work(
    stopped: list[float],
    queued: Sequence[Prompt],
    cfg: ModelConfig,
    predicted_s: float | None,
    elapsed_s: float,
    guard_s: float,
    max_chunk: int,
    s_per_flop: float,
    every_bubble: bool = False,
) -> Resume | NewBatch | None:
    """What a worker runs now, ``elapsed_s`` into a bubble predicted ``predicted_s`` long.

    ``stopped``: the padded seconds each pass stopped in an earlier bubble still needs (training's
    data arrived first), oldest first; ``queued``: the requests in no stopped pass (``QueuedPrompt``,
    or any object with their ``pos`` and ``left``).
    A stopped batch goes first if its rest ends ``guard_s`` before the bubble does (``Resume``);
    else one forward pass (``NewBatch``) over chunks of several requests, taken in queue order
    (any request whose chunk fits, not only the head): each the largest that fits what is left of
    the bubble and of the pass's ``max_chunk`` tokens (``chunk_that_fits``), their seconds added
    (a prompt's FLOPs do not depend on how it is batched); None when nothing fits. The batching
    of chunked prefill under a token budget follows Sarathi-Serve (Agrawal et al. 2024, OSDI,
    "Taming Throughput-Latency Tradeoff in LLM Inference with Sarathi-Serve"), whose budget also
    mixes several requests' chunks in one pass.

    ``every_bubble`` (training preempts a pass at once: ``prefill_stream.py``): where nothing fits
    what is left of a predicted bubble, or the bubble has outlasted its prediction, the oldest
    stopped pass is resumed, else a pass is started as if the bubble had room for ``max_chunk``
    tokens; training stops it when its data arrives, and a later bubble resumes it."""
    for i, left_s in enumerate(stopped):
        if may_start(predicted_s, elapsed_s, left_s, guard_s):
            return Resume(i)
    if predicted_s is None:
        return None
    if queued:
        head_s = head_pass_s(queued[0], cfg, predicted_s, elapsed_s, guard_s, max_chunk, s_per_flop)
        if head_s is not None:
            return NewBatch(((0, max_chunk),), head_s)
    work = _new_batch(queued, cfg, predicted_s - elapsed_s - guard_s, max_chunk, s_per_flop)
    if work is not None and may_start(predicted_s, elapsed_s, work.target_s, guard_s):
        return work
    if not every_bubble:
        return None
    if stopped:
        return Resume(0)
    return _new_batch(queued, cfg, float("inf"), max_chunk, s_per_flop)


def head_pass_s(
    head: Prompt,
    cfg: ModelConfig,
    predicted_s: float,
    elapsed_s: float,
    guard_s: float,
    max_chunk: int,
    s_per_flop: float,
) -> float | None:
    """The seconds of the pass ``choose_work`` starts, with no stopped pass, where the queue's
    ``head`` alone fills it: ``max_chunk`` of its tokens (``NewBatch(((0, max_chunk),), s)``), as
    the largest chunk that fits (``chunk_that_fits``) leaves the pass no room for another request's.
    None where the head has fewer tokens left, or that chunk does not fit ``elapsed_s`` into a
    bubble predicted ``predicted_s`` long with ``guard_s`` spare: ``choose_work`` then looks further.
    The simulator's passes are mostly such (``sim/bubbletea.py``, a million a scenario at the
    paper's scale: ``scripts/paper_scale.py``), so it asks this first."""
    if head.left < max_chunk or max_chunk < MIN_CHUNK_TOKENS:
        return None
    chunk_s = prefill_flops(cfg, head.pos, max_chunk) * s_per_flop
    if chunk_s <= predicted_s - elapsed_s - guard_s and may_start(predicted_s, elapsed_s, chunk_s, guard_s):
        return chunk_s
    return None


def _new_batch(
    queued: Sequence[Prompt], cfg: ModelConfig, room: float, max_chunk: int, s_per_flop: float
) -> NewBatch | None:
    """One pass over chunks of ``queued``, in queue order, each the largest that fits ``room``
    seconds less the chunks before it and the pass's ``max_chunk`` tokens less theirs; None when
    none fits. Past the first request, the scan stops where the room left is shorter than any chunk
    can be (one token at position 0: prefill time grows with the start and the chunk), an answer
    the requests after it would give one by one."""
    budget, total = max_chunk, 0.0
    chunks: list[tuple[int, int]] = []
    floor_s = -1.0  # the shortest chunk's seconds, once a second request is looked at
    for i, q in enumerate(queued):
        if i:
            if floor_s < 0:
                floor_s = prefill_flops(cfg, 0, 1) * s_per_flop
            if room - total < floor_s:
                break
        n, n_s = _chunk_and_seconds(cfg, q.pos, q.left, budget, room - total, s_per_flop)
        if n:
            chunks.append((i, n))
            total += n_s
            budget -= n
        if budget < MIN_CHUNK_TOKENS:
            break
    return NewBatch(tuple(chunks), total) if chunks else None


class SlotPredictor:
    """A worker's bubble profile, kept as it runs: for each slot (the schedule action a wait
    precedes, ``F2``/``B0``), the minimum of its last ``window`` observed bubbles (a bubble
    predicted too long delays training; too short only wastes some of it); before the slot has
    been seen, its ``prior`` (the schedule's predicted bubble, ``plan/bubble_timeline.py``), so
    that prefill can start in a run's first iteration, refined from the first observation on.
    Without a prior a slot is predicted only once seen ``window`` times. Durations in seconds."""

    def __init__(self, window: int, prior: dict[str, float] | None = None) -> None:
        self.window = window
        self.prior = dict(prior or {})
        self.seen: dict[object, deque[float]] = defaultdict(lambda: deque(maxlen=window))

    def observe(self, slot: object, bubble_s: float) -> None:
        self.seen[slot].append(max(0.0, bubble_s))

    def reprior(self, prior: dict[str, float]) -> None:
        """Start again from ``prior`` (the WAN changed: a link profile's step), forgetting the
        bubbles observed under the WAN before, as a run's first iteration starts from its prior."""
        self.prior = dict(prior)
        self.seen.clear()

    def predict(self, slot: object) -> float | None:
        """The slot's predicted bubble (s), or None while it has neither a prior nor ``window``
        observations."""
        s = self.seen.get(slot)
        if s and (slot in self.prior or len(s) == self.window):
            return min(s)
        if not s and isinstance(slot, str) and slot in self.prior:
            return self.prior[slot]
        return None

    def _slots(self) -> set[object]:
        return set(self.seen) | set(self.prior)

    def per_iteration_s(self) -> float:
        """Predicted bubble time per iteration over every known slot."""
        return sum(p for slot in self._slots() if (p := self.predict(slot)) is not None)

    def largest_s(self) -> float:
        return max((p for slot in self._slots() if (p := self.predict(slot)) is not None), default=0.0)

    @property
    def ready(self) -> bool:
        """Whether it predicts any slot (a prior, or ``window`` observations of one)."""
        return any(self.predict(slot) is not None for slot in self._slots())


def may_start(predicted_s: float | None, elapsed_s: float, chunk_s: float, guard_s: float) -> bool:
    """A worker starts a chunk only inside a predicted bubble and only if the chunk is predicted to
    end ``guard_s`` before the bubble does (``windows.fits``)."""
    return predicted_s is not None and fits(predicted_s, elapsed_s, chunk_s, guard_s)


@dataclass
class WorkerLoad:
    """What the dispatcher knows of one worker: its predicted bubble seconds per iteration, its
    largest bubble, the iteration time, and the prefill seconds it still has queued."""

    bubble_per_iteration_s: float = 0.0
    largest_bubble_s: float = 0.0
    iteration_s: float = 0.0
    backlog_s: float = 0.0


def can_take(w: WorkerLoad, smallest_chunk_s: float, guard_s: float) -> bool:
    """Whether a worker may be given requests: its iteration is known and its largest predicted
    bubble holds the smallest chunk plus the guard."""
    return w.iteration_s > 0 and w.largest_bubble_s >= smallest_chunk_s + guard_s


def prefill_finish_s(w: WorkerLoad) -> float:
    """Seconds until a worker has prefilled what it has queued: its backlog over its bubble seconds
    per second of training."""
    return w.backlog_s / (w.bubble_per_iteration_s / w.iteration_s)


def choose_worker(loads: dict[int, WorkerLoad], smallest_chunk_s: float, guard_s: float) -> int | None:
    """The worker a new request goes to (all its chunks stay there: its KV cache lives there): the
    one that would finish its queued prefill soonest (``prefill_finish_s``), among workers that
    may take requests (``can_take``); ties to the lowest rank. None when no worker may."""
    best, best_t = None, float("inf")
    for rank in sorted(loads):
        w = loads[rank]
        if not can_take(w, smallest_chunk_s, guard_s):
            continue
        t = prefill_finish_s(w)
        if t < best_t:
            best, best_t = rank, t
    return best


class SoonestWorker:
    """``choose_worker``'s choice kept up to date as backlogs change, for a caller that says which
    workers' backlogs changed between choices (``changed``; the simulator's dispatcher: thousands
    of workers and of requests, ``sim/bubbletea.py``): the workers that may take requests (fixed
    from the start) in a heap of (``prefill_finish_s``, rank), those that changed read again at the
    next choice, an entry outdated by a later change skipped when it surfaces. The same worker
    as ``choose_worker`` on the same loads (a unit test holds them together)."""

    def __init__(self, loads: dict[int, WorkerLoad], smallest_chunk_s: float, guard_s: float) -> None:
        self.loads = loads
        self.finish_s = {r: prefill_finish_s(w) for r, w in loads.items() if can_take(w, smallest_chunk_s, guard_s)}
        self.heap = sorted((t, r) for r, t in self.finish_s.items())
        self.dirty: set[int] = set()  # changed since the last choice

    def choose(self) -> int | None:
        """``choose_worker``'s choice on the loads as they are now."""
        for r in self.dirty:
            t = prefill_finish_s(self.loads[r])
            if t != self.finish_s[r]:
                self.finish_s[r] = t
                heapq.heappush(self.heap, (t, r))
        self.dirty.clear()
        while self.heap:
            t, r = self.heap[0]
            if self.finish_s[r] == t:
                return r
            heapq.heappop(self.heap)
        return None

    def changed(self, rank: int) -> None:
        """Worker ``rank``'s load has changed (read again at the next choice)."""
        if rank in self.finish_s:
            self.dirty.add(rank)
