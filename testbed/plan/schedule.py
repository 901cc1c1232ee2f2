"""Pipeline schedules as data (after torch.distributed.pipelining's per-rank action tables).

A schedule lists, for every pipeline stage, its compute actions in order: ``F`` (forward) or
``B`` (backward) of microbatch m. The communication is implied: a forward of stage s > 0 first
receives its input from stage s-1 and a forward of a stage before the last sends its output on;
a backward of the last stage starts from the loss, others first receive the activation gradient
from stage s+1, and every backward of a stage s > 0 sends its input gradient back. A bubble is an
empty slot of ``grid``.

GPipe (Huang et al. 2019): all forwards, then all backwards (reverse order).
1F1B (PipeDream-Flush, Narayanan et al. 2021): stage s runs min(S - s, M) warm-up forwards, then
alternates one backward and one forward, then drains the remaining backwards.

The schedules the field runs today list a worker's actions over several virtual stages
(``RankAction``): interleaved 1F1B (``interleaved_1f1b``), ZB-H1 (``zb_h1``) and ZB-V (``zbv``),
whose backward is split into its input and weight parts; ``rank_grid`` simulates them. Unit tests
hold each table to ``torch.distributed.pipelining``'s own (imported only there) and to its
closed-form bubble. ``worker_tables`` gives every schedule's tables in that form (GPipe and 1F1B
with one virtual stage per worker); ``virtual_stages.py`` says which worker holds each virtual
stage and what crosses between them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from testbed.spec.pipeline_schedules import SCHEDULES, rounds, rounds_problem

if TYPE_CHECKING:
    from testbed.spec.experiment import Experiment


@dataclass(frozen=True)
class Action:
    kind: str  # "F" or "B"
    microbatch: int

    def __str__(self) -> str:
        return f"{self.kind}{self.microbatch}"


def gpipe(n_stages: int, n_micro: int) -> list[list[Action]]:
    return [
        [Action("F", m) for m in range(n_micro)] + [Action("B", m) for m in reversed(range(n_micro))]
        for _ in range(n_stages)
    ]


def one_f_one_b(n_stages: int, n_micro: int) -> list[list[Action]]:
    out = []
    for s in range(n_stages):
        warm = min(n_stages - s, n_micro)
        acts = [Action("F", m) for m in range(warm)]
        f, b = warm, 0
        while b < n_micro:
            acts.append(Action("B", b))
            b += 1
            if f < n_micro:
                acts.append(Action("F", f))
                f += 1
        out.append(acts)
    return out


def make_schedule(name: str, n_stages: int, n_micro: int) -> list[list[Action]]:
    """Per-stage action lists. Raises ValueError for an unknown schedule."""
    if name == "gpipe":
        return gpipe(n_stages, n_micro)
    if name == "1f1b":
        return one_f_one_b(n_stages, n_micro)
    raise ValueError(f"unknown schedule {name!r} of one table per stage: use gpipe or 1f1b (worker_tables: all)")


def grid(schedule: list[list[Action]], f_slots: int = 1, b_slots: int = 2) -> list[list[str]]:
    """Simulate the schedule in unit time slots (a forward takes ``f_slots``, a backward ``b_slots``,
    communication free) and return one row per stage: the action in each slot, '' for a bubble
    (``rank_grid``, each stage its own worker)."""
    table = [[RankAction(a.kind, s, a.microbatch) for a in acts] for s, acts in enumerate(schedule)]
    return rank_grid(table, {"F": f_slots, "B": b_slots}, label=lambda a: f"{a.kind}{a.microbatch}")


def format_grid(rows: list[list[str]], width: int = 3) -> str:
    """The grid as text: one line per stage, each slot right-aligned to ``width``, '.' for a bubble."""
    return "\n".join(f"stage {s}: " + " ".join(f"{c or '.':>{width}}" for c in row) for s, row in enumerate(rows))


def bubble_fraction(rows: list[list[str]]) -> float:
    """Idle share of all stage-slots in the simulated grid."""
    cells = [c for row in rows for c in row]
    return sum(1 for c in cells if not c) / len(cells)


# ---- schedules of several virtual stages per worker, and of a split backward --------------------
# A worker (rank) of these schedules holds one or more virtual stages ("chunks") and its table lists
# ``RankAction``s over the global stages: F (forward), B (full backward), I (the backward for the
# input, which the stage before waits for) and W (the backward for the weights, which nothing waits
# for: Qi et al. 2024, "Zero Bubble Pipeline Parallelism", section 2).


@dataclass(frozen=True)
class RankAction:
    """One compute action of a worker: ``kind`` (``RANK_ACTION_KINDS``) of global ``stage`` on
    ``microbatch``."""

    kind: str
    stage: int
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.microbatch}"


class _Table:
    """A worker's table as it is built: its actions in order, and the input backwards whose weight
    part is still to come, oldest first."""

    def __init__(self) -> None:
        self.actions: list[RankAction] = []
        self.listed: dict[tuple[str, int], int] = {}
        self.pending: list[RankAction] = []

    def count(self, kind: str, stage: int) -> int:
        """How many ``kind`` actions of ``stage`` the table lists so far."""
        return self.listed.get((kind, stage), 0)

    def add(self, kind: str, stage: int) -> None:
        """Append ``kind`` of ``stage`` on its next microbatch (an input backward is kept pending)."""
        action = RankAction(kind, stage, self.count(kind, stage))
        self.listed[(kind, stage)] = action.microbatch + 1
        self.actions.append(action)
        if kind == "I":
            self.pending.append(action)

    def weight(self, stage: int | None = None) -> None:
        """Append the weight backward of the oldest pending input backward (of ``stage`` if given)."""
        done = next(a for a in self.pending if stage is None or a.stage == stage)
        self.pending.remove(done)
        self.actions.append(RankAction("W", done.stage, done.microbatch))
        self.listed[("W", done.stage)] = self.count("W", done.stage) + 1


def _looped_worker(r: int, ranks: int, chunks: int, microbatches: int, split_backward: bool) -> list[RankAction]:
    """Worker ``r``'s depth-first interleaved table (Narayanan et al. 2021, section 2.2: chunk c
    of worker r is stage c x ranks + r): its forwards go through its chunks a round of microbatches
    at a time, its backwards through them in reverse; a warm-up of forwards, then one forward and
    one backward each, then the remaining backwards. With ``split_backward`` (ZB-H1's rule, Qi et
    al. 2024, section 3.1: worker r delays its weight backwards by r steps) each backward is its
    input part, and the weight part of the oldest one follows from the worker's (r+1)-th backward
    on; the warm-up is then one forward per worker after it, not two."""
    problem = rounds_problem("zb-h1" if split_backward else "interleaved-1f1b", ranks, microbatches)
    if problem is not None:
        raise ValueError(f"{microbatches} microbatches {problem[0]}: {problem[1]}")
    per_round = microbatches // rounds(ranks, microbatches)
    total = chunks * microbatches  # forwards (and backwards) per worker
    hops = (ranks - 1 - r) * (1 if split_backward else 2)
    warm = min((chunks - 1) * per_round + hops, total)
    fwd_stage = [(k // per_round) % chunks * ranks + r for k in range(total)]
    bwd_stage = [(chunks - 1 - (k // per_round) % chunks) * ranks + r for k in range(total)]
    t = _Table()
    for k in range(warm):
        t.add("F", fwd_stage[k])
    for k in range(total):  # the k-th backward, after forward warm + k where there is one
        if warm + k < total:
            t.add("F", fwd_stage[warm + k])
        t.add("I" if split_backward else "B", bwd_stage[k])
        if split_backward and k >= r:
            t.weight()
    while t.pending:
        t.weight()
    return t.actions


def interleaved_1f1b(ranks: int, chunks: int, microbatches: int) -> list[list[RankAction]]:
    """Interleaved 1F1B (Narayanan et al. 2021, section 2.2), ``chunks`` virtual stages per worker,
    looped: per worker, its actions in order (``_looped_worker``)."""
    return [_looped_worker(r, ranks, chunks, microbatches, split_backward=False) for r in range(ranks)]


def zb_h1(ranks: int, microbatches: int) -> list[list[RankAction]]:
    """ZB-H1 (Qi et al. 2024, section 3.1): 1F1B with each backward split into its input part, in
    1F1B's place, and its weight part, which worker r delays by r steps to fill the drain's bubbles;
    1F1B's peak memory (``_looped_worker``)."""
    return [_looped_worker(r, ranks, 1, microbatches, split_backward=True) for r in range(ranks)]


def _zbv_worker(r: int, ranks: int, microbatches: int) -> list[RankAction]:
    """Worker ``r``'s ZB-V table (``zbv``)."""
    n = max(2 * ranks - 1, microbatches)
    first, second = r, 2 * ranks - 1 - r
    t = _Table()

    def backward(stage: int) -> None:  # an input backward and, at once, its weight backward
        t.add("I", stage)
        t.weight(stage)

    for _ in range(2 * (ranks - r) - 1):
        t.add("F", first)
    for _ in range(r):
        t.add("F", second)
        t.add("F", first)
    for _ in range(ranks - r):
        t.add("F", second)
        backward(second)
    while t.count("F", second) < t.count("F", first) or t.count("F", first) < n:
        if t.count("F", first) < n:
            t.add("F", first)
        backward(first)
        t.add("F", second)
        backward(second)
    for _ in range(r):
        t.add("I", first)
        t.add("I", second)
    for _ in range(ranks - r):
        t.add("I", first)
        t.weight(first)
    for stage in (second, first):
        while any(a.stage == stage for a in t.pending):
            t.weight(stage)
    return [a for a in t.actions if a.microbatch < microbatches]


def zbv(ranks: int, microbatches: int) -> list[list[RankAction]]:
    """ZB-V (Qi et al. 2024, section 6): two chunks per worker placed in a V (worker r holds stages
    r and 2 x ranks - 1 - r, so the first and the last stage share worker 0), backwards split into
    input and weight parts. Per worker: 2 (ranks - r) - 1 forwards of its first chunk; r pairs of
    a second-chunk and a first-chunk forward; ranks - r second-chunk forwards, each with its
    backward (input, then weight) at once; then, while forwards remain, a first-chunk forward
    (while any remain) with a first-chunk backward and a second-chunk forward with its backward;
    then the input backwards of both chunks for r steps, and of the first chunk, each with a
    pending weight backward of it, for ranks - r; then the weight backwards left, the second
    chunk's first. The table is built for at least 2 x ranks - 1 microbatches and the actions of
    microbatches beyond ``microbatches`` dropped."""
    return [_zbv_worker(r, ranks, microbatches) for r in range(ranks)]


#: unit-slot durations of each kind for ``rank_grid``: a forward 1, a full backward 2, its input and
#: weight parts 1 each (the equal times under which Qi et al. 2024 state their bubbles)
UNIT_SLOTS = {"F": 1, "B": 2, "I": 1, "W": 1}


def rank_grid(
    table: list[list[RankAction]], slots: dict[str, int] | None = None, label: Callable[[RankAction], str] = str
) -> list[list[str]]:
    """Simulate a worker table in unit time slots (``slots`` per kind, default ``UNIT_SLOTS``;
    communication free) and return one row per worker: each action's ``label`` in each slot it
    takes, '' for a bubble.
    A forward of stage s waits for stage s-1's of its microbatch, a backward (full or input part)
    of stage s for stage s+1's (the last stage's for its own forward), a weight part for its input
    part. Raises ValueError when the table deadlocks."""
    slots = slots or UNIT_SLOTS
    last = max(a.stage for acts in table for a in acts)
    done: dict[tuple[str, int, int], int] = {}  # (kind, stage, microbatch) -> end slot

    def ready(a: RankAction) -> int | None:
        if a.kind == "F":
            return done.get(("F", a.stage - 1, a.microbatch)) if a.stage > 0 else 0
        if a.kind == "W":
            return done.get(("I", a.stage, a.microbatch))
        if a.stage == last:
            return done.get(("F", a.stage, a.microbatch))
        return done.get((a.kind, a.stage + 1, a.microbatch), done.get(("B", a.stage + 1, a.microbatch)))

    pos, free = [0] * len(table), [0] * len(table)
    rows: list[list[str]] = [[] for _ in table]
    remaining = sum(len(acts) for acts in table)
    while remaining:
        progressed = False
        for r, acts in enumerate(table):
            if pos[r] == len(acts):
                continue
            a = acts[pos[r]]
            dep = ready(a)
            if dep is None:
                continue
            start = max(free[r], dep)
            rows[r].extend([""] * (start - len(rows[r])) + [label(a)] * slots[a.kind])
            free[r] = done[(a.kind, a.stage, a.microbatch)] = start + slots[a.kind]
            pos[r] += 1
            remaining -= 1
            progressed = True
        if not progressed:
            raise ValueError("schedule deadlocks: an action waits on one that never runs")
    width = max(len(r) for r in rows)
    return [r + [""] * (width - len(r)) for r in rows]


def worker_tables(schedule: str, stages: int, microbatches: int, chunks: int = 1) -> list[list[RankAction]]:
    """Every worker's compute actions in order, over the virtual stages (``RankAction``), for
    ``schedule`` (``SCHEDULES``) with ``chunks`` virtual stages per worker (``interleaved-1f1b``;
    ``zbv`` has two, the others one). Raises ValueError for an unknown schedule, or microbatches
    that the rounds of an interleaved or ZB-H1 table do not divide."""
    if schedule in ("gpipe", "1f1b"):
        return [
            [RankAction(a.kind, s, a.microbatch) for a in acts]
            for s, acts in enumerate(make_schedule(schedule, stages, microbatches))
        ]
    if schedule == "interleaved-1f1b":
        return interleaved_1f1b(stages, chunks, microbatches)
    if schedule == "zb-h1":
        return zb_h1(stages, microbatches)
    if schedule == "zbv":
        return zbv(stages, microbatches)
    raise ValueError(f"unknown schedule {schedule!r}: use one of {', '.join(SCHEDULES)}")


def experiment_tables(exp: Experiment) -> list[list[RankAction]]:
    """``worker_tables`` of ``exp``'s schedule, stages, microbatches and chunks."""
    return worker_tables(exp.schedule, exp.stages, exp.microbatches, exp.chunks)
