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
"""

from __future__ import annotations

from dataclasses import dataclass

from testbed.spec.experiment_fields import SCHEDULES


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
    raise ValueError(f"unknown schedule {name!r}: use one of {', '.join(SCHEDULES)}")


def grid(schedule: list[list[Action]], f_slots: int = 1, b_slots: int = 2) -> list[list[str]]:
    """Simulate the schedule in unit time slots (a forward takes ``f_slots``, a backward ``b_slots``,
    communication free) and return one row per stage: the action in each slot, '' for a bubble."""
    n_stages = len(schedule)
    done: dict[tuple[str, int, int], int] = {}  # (kind, stage, mb) -> end slot
    pos = [0] * n_stages
    free = [0] * n_stages
    rows: list[list[str]] = [[] for _ in range(n_stages)]
    remaining = sum(len(a) for a in schedule)
    while remaining:
        progressed = False
        for s in range(n_stages):
            if pos[s] == len(schedule[s]):
                continue
            a = schedule[s][pos[s]]
            if a.kind == "F":
                dep = done.get(("F", s - 1, a.microbatch)) if s > 0 else 0
            else:
                dep = done.get(("B", s + 1, a.microbatch)) if s < n_stages - 1 else done.get(("F", s, a.microbatch))
            if dep is None:
                continue
            start = max(free[s], dep)
            dur = f_slots if a.kind == "F" else b_slots
            rows[s].extend([""] * (start - len(rows[s])) + [str(a)] * dur)
            free[s] = done[(a.kind, s, a.microbatch)] = start + dur
            pos[s] += 1
            remaining -= 1
            progressed = True
        if not progressed:
            raise ValueError("schedule deadlocks: an action waits on one that never runs")
    width = max(len(r) for r in rows)
    return [r + [""] * (width - len(r)) for r in rows]


def format_grid(rows: list[list[str]]) -> str:
    """The grid as text: one line per stage, '.' for a bubble slot."""
    return "\n".join(f"stage {s}: " + " ".join(f"{c or '.':>3}" for c in row) for s, row in enumerate(rows))


def bubble_fraction(rows: list[list[str]]) -> float:
    """Idle share of all stage-slots in the simulated grid."""
    cells = [c for row in rows for c in row]
    return sum(1 for c in cells if not c) / len(cells)
