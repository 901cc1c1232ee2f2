"""Pipeline schedules as data: GPipe and 1F1B action lists, the unit-slot grid and its bubbles."""

import itertools

import pytest

from testbed.plan.schedule import (
    Action,
    bubble_fraction,
    format_grid,
    gpipe,
    grid,
    make_schedule,
    one_f_one_b,
    worker_tables,
)

#: the schedules of one virtual stage per worker and a whole backward (``make_schedule``'s)
SCHEDULES = ("gpipe", "1f1b")
SHAPES = [(1, 1), (1, 4), (2, 1), (2, 3), (3, 4), (4, 2), (4, 8), (5, 5)]  # (stages, microbatches)


def spans(rows):
    """{(kind, stage, mb): (first slot, end slot)} read back from a grid; checks each action is one
    contiguous run of cells."""
    out = {}
    for s, row in enumerate(rows):
        for label, cells in itertools.groupby(enumerate(row), key=lambda c: c[1]):
            if not label:
                continue
            slots = [i for i, _ in cells]
            key = (label[0], s, int(label[1:]))
            assert key not in out, f"{label} of stage {s} appears in two separate runs: {row}"
            out[key] = (slots[0], slots[-1] + 1)
    return out


# ---- action lists ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", SCHEDULES)
@pytest.mark.parametrize("n_stages, n_micro", SHAPES)
def test_every_stage_runs_each_f_and_b_once_b_after_f(name, n_stages, n_micro):
    sched = make_schedule(name, n_stages, n_micro)
    assert len(sched) == n_stages
    for s, acts in enumerate(sched):
        assert sorted((a.kind, a.microbatch) for a in acts) == sorted(
            [("F", m) for m in range(n_micro)] + [("B", m) for m in range(n_micro)]
        ), (s, acts)
        pos = {(a.kind, a.microbatch): i for i, a in enumerate(acts)}
        for m in range(n_micro):
            assert pos[("F", m)] < pos[("B", m)], (s, m, acts)
        # forwards in microbatch order (the next stage receives them in that order)
        assert [a.microbatch for a in acts if a.kind == "F"] == list(range(n_micro))


@pytest.mark.parametrize("n_stages, n_micro", SHAPES)
def test_gpipe_all_forwards_then_backwards_in_reverse(n_stages, n_micro):
    for acts in gpipe(n_stages, n_micro):
        assert [str(a) for a in acts] == [f"F{m}" for m in range(n_micro)] + [f"B{m}" for m in reversed(range(n_micro))]


@pytest.mark.parametrize("n_stages, n_micro", SHAPES)
def test_1f1b_warmup_then_alternate_then_drain(n_stages, n_micro):
    for s, acts in enumerate(one_f_one_b(n_stages, n_micro)):
        warm = min(n_stages - s, n_micro)
        kinds = "".join(a.kind for a in acts)
        leading_f = len(kinds) - len(kinds.lstrip("F"))
        assert leading_f == warm, (s, kinds)
        # after warm-up: B and F alternate while forwards remain, then only backwards
        rest = kinds[warm:]
        n_f_left = n_micro - warm
        assert rest == "BF" * n_f_left + "B" * (n_micro - n_f_left), (s, kinds)
        # backwards in microbatch order
        assert [a.microbatch for a in acts if a.kind == "B"] == list(range(n_micro))


def test_1f1b_three_stages_four_microbatches_by_hand():
    got = [" ".join(map(str, acts)) for acts in one_f_one_b(3, 4)]
    assert got == ["F0 F1 F2 B0 F3 B1 B2 B3", "F0 F1 B0 F2 B1 F3 B2 B3", "F0 B0 F1 B1 F2 B2 F3 B3"]


def test_unknown_schedule_raises_value_error_naming_choices():
    with pytest.raises(ValueError) as e:
        make_schedule("interleaved", 2, 2)
    assert "interleaved" in str(e.value)
    for name in SCHEDULES:
        assert name in str(e.value)
    with pytest.raises(ValueError, match="unknown schedule 'dualpipe'.*zbv"):
        worker_tables("dualpipe", 2, 2)


def test_action_str():
    assert str(Action("F", 3)) == "F3" and str(Action("B", 0)) == "B0"


# ---- grid simulation -------------------------------------------------------------------------


def test_gpipe_grid_two_stages_two_microbatches_by_hand():
    rows = grid(gpipe(2, 2))
    assert rows == [["F0", "F1", "", "", "", "B1", "B1", "B0", "B0"], ["", "F0", "F1", "B1", "B1", "B0", "B0", "", ""]]


@pytest.mark.parametrize("name", SCHEDULES)
@pytest.mark.parametrize("n_stages, n_micro", SHAPES)
@pytest.mark.parametrize("f_slots, b_slots", [(1, 2), (2, 3), (1, 1)])
def test_grid_respects_dependencies(name, n_stages, n_micro, f_slots, b_slots):
    rows = grid(make_schedule(name, n_stages, n_micro), f_slots, b_slots)
    assert len({len(r) for r in rows}) == 1, "rows padded to one width"
    sp = spans(rows)
    assert len(sp) == 2 * n_stages * n_micro
    for (kind, s, m), (start, end) in sp.items():
        assert end - start == (f_slots if kind == "F" else b_slots), (kind, s, m)
        if kind == "F" and s > 0:
            assert start >= sp[("F", s - 1, m)][1], f"F{m} of stage {s} starts before stage {s - 1}'s F{m} ends"
        if kind == "B" and s < n_stages - 1:
            assert start >= sp[("B", s + 1, m)][1], f"B{m} of stage {s} starts before stage {s + 1}'s B{m} ends"
        if kind == "B":
            assert start >= sp[("F", s, m)][1], f"B{m} of stage {s} before its own F{m}"
    # each stage runs its actions in the listed order
    for s, acts in enumerate(make_schedule(name, n_stages, n_micro)):
        starts = [sp[(a.kind, s, a.microbatch)][0] for a in acts]
        assert starts == sorted(starts)
    # greedy: the grid's last column is used by some stage (no trailing all-bubble column)
    assert any(r[-1] for r in rows)


def test_grid_detects_deadlock():
    # stage 1 waits for F1 of stage 0 before running F0, but stage 0 waits for stage 1's B0
    bad = [
        [Action("F", 0), Action("B", 0), Action("F", 1), Action("B", 1)],
        [Action("F", 1), Action("F", 0), Action("B", 0), Action("B", 1)],
    ]
    with pytest.raises(ValueError, match="deadlock"):
        grid(bad)


def gpipe_bubble_by_hand(n_stages: int, n_micro: int, f: int, b: int) -> float:
    """GPipe with forwards of f slots and backwards of b slots, communication free: stage s's F_m
    ends at (s + m + 1) f, so the last stage's forwards end at (S + M - 1) f; its backwards then
    start and stage s's last backward ends (S - 1 - s + M) b later, so the makespan (stage 0) is
    (M + S - 1)(f + b). Each stage computes M (f + b) of it: bubble = 1 - M / (M + S - 1)."""
    makespan = (n_micro + n_stages - 1) * (f + b)
    busy = n_micro * (f + b)
    return (makespan - busy) / makespan


@pytest.mark.parametrize("n_stages, n_micro", SHAPES)
@pytest.mark.parametrize("f_slots, b_slots", [(1, 2), (2, 3)])
def test_gpipe_bubble_fraction_matches_derivation(n_stages, n_micro, f_slots, b_slots):
    rows = grid(gpipe(n_stages, n_micro), f_slots, b_slots)
    expected = gpipe_bubble_by_hand(n_stages, n_micro, f_slots, b_slots)
    assert len(rows[0]) == (n_micro + n_stages - 1) * (f_slots + b_slots)
    assert bubble_fraction(rows) == pytest.approx(expected)
    # the closed form (S - 1) / (M + S - 1)
    assert expected == pytest.approx((n_stages - 1) / (n_micro + n_stages - 1))


@pytest.mark.parametrize("n_stages, n_micro", SHAPES)
def test_1f1b_has_gpipes_bubble_fraction(n_stages, n_micro):
    g = grid(gpipe(n_stages, n_micro))
    o = grid(one_f_one_b(n_stages, n_micro))
    assert bubble_fraction(o) == pytest.approx(bubble_fraction(g))
    assert len(o[0]) == len(g[0])


def test_bubble_fraction_counts_empty_cells():
    assert bubble_fraction([["F0", ""], ["", ""]]) == 0.75
    assert bubble_fraction([["F0", "B0"]]) == 0.0


def test_format_grid_dots_for_bubbles():
    text = format_grid(grid(gpipe(2, 2)))
    lines = text.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("stage 0: ") and lines[1].startswith("stage 1: ")
    assert lines[0].split()[2:] == ["F0", "F1", ".", ".", ".", "B1", "B1", "B0", "B0"]
    assert lines[1].split()[2:] == [".", "F0", "F1", "B1", "B1", "B0", "B0", ".", "."]
    # cells are aligned: every line has the same length
    assert len(lines[0]) == len(lines[1])
