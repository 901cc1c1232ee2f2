"""TTFT against an SLO over the requests a run can judge (results/ttft.py), by hand."""

import math

import pandas as pd
import pytest

from testbed.results.ttft import request_table, slo_attainment

S = 1_000_000_000  # ns per s


def _table():
    assigned = [{"rid": i, "arrival_ns": t * S} for i, t in enumerate([0, 1, 2, 9])]
    # rid 0: 0.5 s; rid 1: 2.5 s; rid 2: no first token; rid 3: arrived 1 s before the end
    first = [
        {"rid": 0, "arrival_ns": 0, "first_token_ns": S // 2},
        {"rid": 1, "arrival_ns": S, "first_token_ns": 7 * S // 2},
    ]
    return request_table(assigned, first, pd.Series([0.25, 1.0, 0.5, 0.5]))


def test_the_table_joins_first_tokens_to_the_assigned_requests_by_id():
    t = _table()
    assert t["rid"].tolist() == [0, 1, 2, 3] and t["alone_s"].tolist() == [0.25, 1.0, 0.5, 0.5]
    assert t["ttft_s"].iloc[:2].tolist() == [0.5, 2.5] and t["ttft_s"].iloc[2:].isna().all()


def test_only_requests_due_within_the_run_are_judged():
    # end at 10 s, SLO 1 s: rid 3 is due at exactly 10 s (judged), all four; met: rid 0 only
    assert slo_attainment(_table(), 1.0, 10 * S) == (0.25, 4)
    # end at 9.5 s: rid 3's deadline (10 s) is past the end: not judged either way
    assert slo_attainment(_table(), 1.0, 19 * S // 2) == (pytest.approx(1 / 3), 3)
    # a 3 s SLO: rid 1 (2.5 s) meets it, rid 2 never had its first token
    assert slo_attainment(_table(), 3.0, 19 * S // 2) == (pytest.approx(2 / 3), 3)


def test_a_scaled_slo_is_one_deadline_per_request():
    t = _table()
    # 3 x alone: 0.75, 3.0, 1.5, 1.5 s; deadlines 0.75, 4, 3.5, 10.5 s; at an end of 10 s rid 3 is not judged
    share, judged = slo_attainment(t, 3 * t["alone_s"], 10 * S)
    assert judged == 3 and share == pytest.approx(2 / 3)  # rid 0 (0.5 <= 0.75) and rid 1 (2.5 <= 3)
    # 2 x alone: deadlines 0.5, 3, 3 and 10 s, all four judged; rid 1 needed 2 s and took 2.5
    assert slo_attainment(t, 2 * t["alone_s"], 10 * S) == (0.25, 4)


def test_no_request_due_gives_none_and_an_unknown_alone_time_is_never_judged():
    assert slo_attainment(_table(), 20.0, 10 * S) == (None, 0)
    t = request_table([{"rid": 0, "arrival_ns": 0}], [], pd.Series(dtype=float))  # alone unknown
    assert math.isnan(t["alone_s"].iloc[0])
    assert slo_attainment(t, 3 * t["alone_s"], 10 * S) == (None, 0)
