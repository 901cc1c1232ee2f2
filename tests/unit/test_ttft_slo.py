"""TTFT against an SLO over the requests a run can judge (results/ttft.py), by hand."""

import math

import pandas as pd
import pytest

from testbed.results.ttft import arrivals, request_table, slo_attainment

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


def test_a_request_due_after_the_end_is_left_out_even_where_it_met_its_slo():
    # rid 0 had its first token 0.5 s after arriving; with a 20 s SLO it is due at 20 s, after
    # the end at 10 s: judging it would count the fast requests of the last 20 s and not the slow
    assert slo_attainment(_table(), 20.0, 10 * S) == (None, 0)
    assert slo_attainment(_table(), 0.6, 10 * S) == (0.25, 4)  # due at 0.6 s: judged, met


def test_every_arrival_of_the_stream_by_the_end_counts_assigned_or_not():
    stream = pd.DataFrame({"rid": [0, 1, 2], "arrival_s": [0.5, 1.25, 9.0], "prompt_tokens": [300, 2000, 50]})
    t0 = 100 * S
    got = arrivals(stream, t0, t0 + 5 * S, max_prompt_tokens=1024)
    assert got == [
        {"rid": 0, "arrival_ns": t0 + S // 2, "prompt": 300},
        {"rid": 1, "arrival_ns": t0 + 5 * S // 4, "prompt": 1024},  # clipped as dispatched
    ]
    assert arrivals(stream, t0, t0 + 9 * S, None)[-1] == {"rid": 2, "arrival_ns": t0 + 9 * S, "prompt": 50}
    # a request never assigned (no worker had room) and never served is a miss like any other
    table = request_table(
        got, [{"rid": 0, "arrival_ns": t0 + S // 2, "first_token_ns": t0 + S}], pd.Series(dtype=float)
    )
    assert slo_attainment(table, 1.0, t0 + 5 * S) == (0.5, 2)


def test_alone_times_of_another_length_are_refused():
    with pytest.raises(ValueError, match="2 TTFTs alone for 1 requests"):
        request_table([{"rid": 0, "arrival_ns": 0}], [], pd.Series([1.0, 2.0]))


def test_no_request_due_gives_none_and_an_unknown_alone_time_is_never_judged():
    assert slo_attainment(_table(), 20.0, 10 * S) == (None, 0)
    t = request_table([{"rid": 0, "arrival_ns": 0}], [], pd.Series(dtype=float))  # alone unknown
    assert math.isnan(t["alone_s"].iloc[0])
    assert slo_attainment(t, 3 * t["alone_s"], 10 * S) == (None, 0)
