"""The schedules of several virtual stages per worker and of a split backward (``plan/schedule.py``:
interleaved 1F1B, ZB-H1, ZB-V) against ``torch.distributed.pipelining``'s own tables: the same
per-worker order of actions for the same sizes (torch is imported here only, never by the schedule
module)."""

from __future__ import annotations

import pytest
from torch.distributed.pipelining import schedules as S

from testbed.plan.schedule import RankAction, bubble_fraction, interleaved_1f1b, rank_grid, rounds, zb_h1, zbv


def torch_table(cls: type, ranks: int, local_stages: int, microbatches: int) -> list[list[RankAction]]:
    """``cls``'s per-rank compute actions (its bubbles, None, left out), worked out the way its
    constructor does for every rank, without the stages and process group a real run needs."""
    sched = object.__new__(cls)
    sched.pp_group_size, sched.n_local_stages, sched._n_microbatches = ranks, local_stages, microbatches
    sched.num_stages = ranks * local_stages
    sched.number_of_rounds = rounds(ranks, microbatches)
    sched.microbatches_per_round = microbatches // sched.number_of_rounds
    return [
        [RankAction(a.computation_type.value, a.stage_index, a.microbatch_index) for a in ops if a is not None]
        for ops in (sched._calculate_single_rank_operations(r) for r in range(ranks))
    ]


SIZES = [(2, 2), (2, 4), (3, 3), (3, 6), (4, 4), (4, 8), (4, 12), (2, 8)]


@pytest.mark.parametrize("ranks, microbatches", SIZES)
@pytest.mark.parametrize("chunks", [2, 3])
def test_interleaved_1f1b_is_torchs_table(ranks, microbatches, chunks):
    assert interleaved_1f1b(ranks, chunks, microbatches) == torch_table(
        S.ScheduleInterleaved1F1B, ranks, chunks, microbatches
    )


@pytest.mark.parametrize("ranks, microbatches", SIZES)
def test_zb_h1_is_torchs_interleaved_zero_bubble_table_with_one_chunk(ranks, microbatches):
    assert zb_h1(ranks, microbatches) == torch_table(S.ScheduleInterleavedZeroBubble, ranks, 1, microbatches)


@pytest.mark.parametrize("ranks, microbatches", [*SIZES, (4, 3), (3, 2)])
def test_zbv_is_torchs_table(ranks, microbatches):
    assert zbv(ranks, microbatches) == torch_table(S.ScheduleZBVZeroBubble, ranks, 2, microbatches)


@pytest.mark.parametrize("table", [interleaved_1f1b(3, 2, 6), zb_h1(4, 8), zbv(3, 6)])
def test_every_stage_runs_every_microbatch_once_of_each_kind(table):
    actions = [a for acts in table for a in acts]
    assert len(actions) == len(set(actions))
    stages = {a.stage for a in actions}
    for kinds in ({"F", "B"}, {"F", "I", "W"}):
        if {a.kind for a in actions} == kinds:
            for stage in stages:
                for kind in kinds:
                    assert sorted(a.microbatch for a in actions if a.stage == stage and a.kind == kind) == list(
                        range(max(a.microbatch for a in actions) + 1)
                    )


@pytest.mark.parametrize("ranks, microbatches", [(2, 4), (3, 6), (4, 8), (4, 12), (3, 9)])
def test_the_simulated_bubbles_are_the_closed_forms(ranks, microbatches):
    """Unit slots (a forward 1, a full backward 2, its input and weight parts 1 each; communication
    free): interleaving v chunks leaves (p-1)/(vM + p-1) idle (Narayanan et al. 2021, section 2.2);
    ZB-H1's delayed weight backwards cut 1F1B's 3(p-1) idle slots a worker to p-1, (p-1)/(3M + p-1)
    (Qi et al. 2024, section 3.1, with T_F = T_B = T_W); ZB-V's worker r waits r slots for the first
    forward and p-1-r at the end, p-1 in all over its 6M (two chunks), for M >= 2p-1."""
    p, m = ranks, microbatches
    for v in (1, 2, 3):
        assert bubble_fraction(rank_grid(interleaved_1f1b(p, v, m))) == pytest.approx((p - 1) / (v * m + p - 1))
    assert bubble_fraction(rank_grid(zb_h1(p, m))) == pytest.approx((p - 1) / (3 * m + p - 1))
    assert bubble_fraction(rank_grid(zbv(p, m))) == pytest.approx((p - 1) / (6 * m + p - 1))


def test_microbatches_the_rounds_do_not_divide_are_refused_with_the_fix():
    assert interleaved_1f1b(4, 2, 10)  # 2 rounds of 5: torch's flexible rounds
    with pytest.raises(ValueError, match=r"9 microbatches over 4 stages make 2 rounds under zb-h1.*use 8 or 10"):
        zb_h1(4, 9)
