"""The request-rate sweep's table: rows per pair of runs, medians and ranges per rate, the noise
floor from the plain runs' own spread, and the plot."""

from __future__ import annotations

import pandas as pd
import pytest

from testbed.results.request_sweep import plot_request_sweep, slo_operating_point, sweep_row, sweep_summary


def _summary(it_s: float, util: float, ttft: float) -> dict:
    return {"iteration_time_s": it_s, "gpu_utilization": util, "ttft_p50_s": ttft}


def test_rows_and_their_medians_ranges_and_noise_floor(tmp_path):
    pairs = [  # rate, repeat, plain iteration, BubbleTea iteration, utilization, TTFT p50
        (1.0, 0, 1.00, 1.02, 0.70, 4.0),
        (1.0, 1, 1.04, 1.05, 0.74, 5.0),
        (1.0, 2, 1.02, 1.06, 0.72, 6.0),
        (4.0, 0, 1.00, 1.03, 0.84, 7.0),
    ]
    rows = pd.DataFrame([sweep_row(r, i, _summary(p, 0.5, 0), _summary(b, u, t)) for r, i, p, b, u, t in pairs])
    assert rows.loc[0, "gpu_utilization"] == 0.70 and rows.loc[3, "ttft_p50_s"] == 7.0
    assert rows.loc[0, "training_slowdown"] == pytest.approx(1.02)  # a ratio, as compare's
    assert rows.loc[0, "requests_completed"] is None  # a figure the run did not report stays empty
    s = sweep_summary(rows).set_index("rate_per_s")
    assert s.loc[1.0, "gpu_utilization"] == pytest.approx(0.72)
    assert (s.loc[1.0, "gpu_utilization_min"], s.loc[1.0, "gpu_utilization_max"]) == pytest.approx((0.70, 0.74))
    # compare's definitions: the medians' ratio, and the larger of the two policies' spreads
    assert s.loc[1.0, "training_slowdown"] == pytest.approx(1.05 / 1.02)
    assert (s.loc[1.0, "training_slowdown_min"], s.loc[1.0, "training_slowdown_max"]) == pytest.approx(
        (1.05 / 1.04, 1.06 / 1.02)
    )
    assert s.loc[1.0, "noise_floor"] == pytest.approx(max(0.04 / 1.02, 0.04 / 1.05))
    assert s.loc[1.0, "repeats"] == 3 and s.loc[4.0, "repeats"] == 1
    assert s.loc[4.0, "noise_floor"] is None or s.loc[4.0, "noise_floor"] != s.loc[4.0, "noise_floor"]  # one pair: none
    out = plot_request_sweep(s.reset_index(), tmp_path / "sweep.png", "t")
    assert out.stat().st_size > 10_000


def test_the_operating_point_is_the_most_utilized_rate_that_meets_the_slo():
    summary = pd.DataFrame(
        {
            "rate_per_s": [0.25, 0.5, 1.0, 4.0],
            "gpu_utilization": [0.55, 0.62, 0.70, 0.85],
            "ttft_scaled_slo_attainment": [1.0, 0.92, 0.6, None],
        }
    )
    assert slo_operating_point(summary) == {"rate_per_s": 0.5, "gpu_utilization": 0.62, "attainment": 0.92}
    summary["ttft_scaled_slo_attainment"] = [0.89, 0.5, 0.2, 0.0]
    assert slo_operating_point(summary) is None  # 89% is not 90%


def test_operations_started_late_are_kept_for_both_runs_of_a_pair():
    """The BubbleTea run's count beside the plain run's (``_plain``, the floor), with their medians
    and ranges per rate; a sweep recorded before the figure has it empty."""

    def late(it_s: float, n: int) -> dict:
        return {"iteration_time_s": it_s, "training_ops_started_late": n, "training_ops_with_input": 512}

    rows = pd.DataFrame(
        [sweep_row(4.0, i, late(1.0, p), late(1.01, b)) for i, (p, b) in enumerate(((30, 50), (34, 61), (28, 44)))]
    )
    assert list(rows["training_ops_started_late_plain"]) == [30, 34, 28]
    s = sweep_summary(rows).set_index("rate_per_s")
    assert s.loc[4.0, "training_ops_started_late"] == 50 and s.loc[4.0, "training_ops_started_late_max"] == 61
    assert s.loc[4.0, "training_ops_started_late_plain"] == 30
    assert (s.loc[4.0, "training_ops_started_late_plain_min"], s.loc[4.0, "training_ops_started_late_plain_max"]) == (
        28,
        34,
    )
    old = rows.drop(columns=["training_ops_started_late_plain", "training_ops_started_late"])
    assert sweep_summary(old)["training_ops_started_late_plain"].isna().all()


def test_the_pages_rows_show_a_range_only_where_its_ends_read_differently():
    from testbed.results.published import Column, render_table
    from testbed.results.request_sweep import PAGE_COLUMNS, page_rows

    pairs = [(1.0, 0, 1.00, 1.02, 0.701, 4.0), (1.0, 1, 1.04, 1.05, 0.704, 5.0), (4.0, 0, 1.00, 1.03, 0.84, 7.0)]
    rows = pd.DataFrame([sweep_row(r, i, _summary(p, 0.5, 0), _summary(b, u, t)) for r, i, p, b, u, t in pairs])
    got = page_rows(sweep_summary(rows), "default")
    assert [r["rate"] for r in got] == [1.0, 4.0] and got[0]["experiment"] == "default"
    assert "gpu_min" not in got[0]  # 0.70 either end: shown as one number
    assert got[0]["slowdown_pct_min"] == pytest.approx(100 * (1.05 / 1.04 - 1))
    assert got[1]["noise"] is None and got[1]["scaled_pct"] is None  # one pair; a figure no run gave
    data = {
        "name": "s",
        "command": "c",
        "commit": "x",
        "date": "d",
        "machine": {"cpus": 2, "memory_gib": 1.0, "kernel": "k"},
        "columns": [{"header": h, "cells": list(c)} for h, c in PAGE_COLUMNS],
        "rows": got,
    }
    assert Column(*PAGE_COLUMNS[0]).header == "experiment"
    line = render_table(data).splitlines()[2]
    assert line.startswith("| default | 1 | 0.70 | +1.5% (+1.0 to +2.0%) | 3.9% | 4.5 s |"), line
