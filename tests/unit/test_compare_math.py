"""Aggregation of repeated policy runs: medians, spreads (the noise floor) and speed-ups."""

from __future__ import annotations

import pytest

from testbed.results.compare import BUBBLETEA_FIGURES, FIGURES, aggregate, format_comparison, spread


def summary(t: float) -> dict:
    return {"iteration_time_s": t, "tokens_per_s": 1000 / t, "gpu_utilization": 0.5, "bubble_fraction": 0.5}


def test_spread_is_range_over_median():
    assert spread([1.0, 1.2, 1.1]) == pytest.approx(0.2 / 1.1)
    assert spread([1.0]) is None and spread([None, 2.0]) is None


def test_aggregate_medians_and_speedups():
    runs = {"atlas": [summary(1.0), summary(1.2), summary(1.1)], "pp-fair": [summary(2.0), summary(2.2), summary(2.4)]}
    agg = aggregate(runs)
    assert agg["stats"]["atlas"]["iteration_time_s"]["median"] == pytest.approx(1.1)
    assert agg["stats"]["pp-fair"]["iteration_time_s"]["spread"] == pytest.approx(0.4 / 2.2)
    assert agg["speedup"]["atlas/pp-fair"] == pytest.approx(2.2 / 1.1)  # atlas is twice as fast as pp-fair
    assert agg["speedup"]["pp-fair/atlas"] == pytest.approx(1.1 / 2.2)
    assert set(agg["stats"]["atlas"]) == set(FIGURES + BUBBLETEA_FIGURES)
    assert agg["stats"]["atlas"]["ttft_p50_s"]["median"] is None  # not a BubbleTea run
    text = format_comparison({**agg})
    assert "speed-up of atlas over pp-fair: 2.00x" in text and "18.2%" in text  # pp-fair's spread, 0.4 / 2.2


def test_bubbletea_slowdown_is_quoted_with_the_noise_floor():
    def bt(t: float, ttft: float) -> dict:
        return {**summary(t), "ttft_p50_s": ttft, "requests_completed": 20, "training_ops_delayed_by_prefill": 0}

    runs = {"atlas": [summary(1.00), summary(1.02)], "atlas+bubbletea": [bt(1.01, 0.3), bt(1.03, 0.5)]}
    agg = aggregate(runs)
    d = agg["bubbletea"]["atlas+bubbletea"]
    assert d["training_slowdown"] == pytest.approx(1.02 / 1.01)
    assert d["noise_floor"] == pytest.approx(max(0.02 / 1.01, 0.02 / 1.02))
    assert agg["stats"]["atlas+bubbletea"]["ttft_p50_s"]["median"] == pytest.approx(0.4)
    text = format_comparison(agg)
    assert "training slowdown of atlas+bubbletea over atlas: +1.0% (noise floor 2.0%)" in text
    assert "speed-up of atlas+bubbletea over atlas" not in text  # the slowdown line says it


def test_a_folder_holding_a_run_is_refused(tmp_path):
    """Traces are appended as written: a second run into the same folder would mix events."""
    import pytest

    from testbed.errors import SpecError
    from testbed.run.records import check_fresh_out_dir

    check_fresh_out_dir(tmp_path / "new")  # absent: fine
    check_fresh_out_dir(tmp_path)  # empty: fine
    (tmp_path / "events").mkdir()
    with pytest.raises(SpecError, match="already holds a run"):
        check_fresh_out_dir(tmp_path)


def test_an_ablation_reports_each_parts_own_contribution():
    from testbed.results.compare import run_folder_name

    chain = ["pp-fair", "pp-fair/placement=atlas", "atlas"]
    runs = {
        "pp-fair": [summary(2.0), summary(2.1)],
        "pp-fair/placement=atlas": [summary(1.6), summary(1.7)],
        "atlas": [summary(1.2), summary(1.3)],
    }
    agg = aggregate(runs)
    steps = agg["steps"]
    assert [(s["from"], s["to"]) for s in steps] == list(zip(chain, chain[1:]))
    assert steps[0]["speedup"] == pytest.approx(2.05 / 1.65) and steps[1]["speedup"] == pytest.approx(1.65 / 1.25)
    assert steps[1]["noise_floor"] == pytest.approx(max(0.1 / 1.65, 0.1 / 1.25))
    text = format_comparison({**agg, "ablation": True})
    assert "  pp-fair/placement=atlas   1.242x  (noise floor 6.1%)" in text
    assert f"all parts: atlas over pp-fair: {2.05 / 1.25:.3f}x" in text
    assert "speed-up of" not in text  # the steps say it
    # a policy's parts do not make sub-folders
    assert run_folder_name("pp-fair/placement=atlas", 0, 1) == "pp-fair_placement=atlas"
    assert run_folder_name("atlas", 2, 3) == "atlas-2"


def test_bubbletea_prefill_is_divided_by_the_same_policy_serving_prefill_alone():
    def bt(tokens_per_s: float, share: float, t: float | None = 1.0) -> dict:
        figures = {"prefill_tokens_per_s": tokens_per_s, "prefill_alone_share": share}
        return {**summary(1.0), "iteration_time_s": t, **figures}

    runs = {
        "atlas": [summary(1.0)],
        "atlas+bubbletea": [bt(800, 0.4), bt(900, 0.45)],
        "atlas+prefill-alone": [
            {**bt(2000, 0.9, None), "queue_empty_share": 0.08},
            {**bt(2000, 0.9, None), "queue_empty_share": 0.1},
        ],
        "pp-fair+bubbletea": [bt(500, 0.3)],  # no pp-fair+prefill-alone: no share
    }
    agg = aggregate(runs)
    d = agg["prefill_alone"]
    assert set(d) == {"atlas+bubbletea"} and d["atlas+bubbletea"]["alone"] == "atlas+prefill-alone"
    assert d["atlas+bubbletea"]["measured_alone_tokens_share"] == pytest.approx(850 / 2000)
    assert d["atlas+bubbletea"]["measured_alone_gpu_time_share"] == pytest.approx(0.425 / 0.9)
    text = format_comparison(agg)
    assert "prefill of atlas+bubbletea as a share of atlas+prefill-alone (measured): 42.5% of its tokens/s" in text
    assert "training slowdown of atlas+prefill-alone" not in text  # it trains nothing
    # its queue ran empty 9% of the time: it measured the request rate, and the comparison says so
    assert "queue was empty 9.0% of its time" in text and "raise --request-rate" in text
    assert aggregate({"a label": [summary(1.0)]})["prefill_alone"] == {}  # labels of a script's own


def test_operations_started_late_are_set_beside_the_runs_without_bubbletea():
    """Each run's count of operations that started over 1 ms after their input arrived, with and
    without BubbleTea (the floor), as median (min-max); no line where the runs do not have it."""

    def late(t: float, n: int) -> dict:
        return {**summary(t), "training_ops_started_late": n}

    runs = {
        "atlas": [late(1.00, 9), late(1.02, 13)],
        "atlas+bubbletea": [late(1.01, 14), late(1.03, 10), late(1.0, 12)],
    }
    agg = aggregate(runs)
    assert agg["bubbletea"]["atlas+bubbletea"]["training_ops_started_late"] == {
        "atlas+bubbletea": [14, 10, 12],
        "atlas": [9, 13],
    }
    text = format_comparison(agg)
    assert (
        "operations started >1 ms after their input arrived: atlas+bubbletea 12 (10-14), atlas 11 (9-13) (the floor)"
        in text
    )
    plain = {"atlas": [summary(1.0)], "atlas+bubbletea": [summary(1.01)]}
    assert "operations started" not in format_comparison(aggregate(plain))


def test_scheduler_traces_are_summed_over_each_policys_runs():
    """Runs made with --sched-trace: each policy's late operations' states and what the CPUs ran
    meanwhile, summed over its runs (stored in the comparison), roles by share, largest first; no
    line without a trace."""

    def traced(n: int, runnable: float, cpu: dict[str, float], queue: dict[str, float] | None = None) -> dict:
        return {
            **summary(1.0),
            "sched_late_ops": n,
            "sched_late_unseen_ms": 0.25 * n,
            "sched_late_running_ms": 0.5,
            "sched_late_runnable_ms": runnable,
            "sched_late_sleeping_ms": 0.0,
            "sched_cpu_while_runnable_ms": cpu,
            "sched_queue_cpu_while_runnable_ms": queue,
            "sched_events_lost": 0,
        }

    runs = {
        "atlas": [traced(2, 3.0, {"other workers": 4.0, "delay element": 2.0}), traced(1, 1.0, {"idle": 2.0})],
        "pp-fair": [summary(2.0)],
        # traces that tell the run queue each late thread waited on
        "dp-wan": [
            traced(1, 2.0, {"other workers": 3.0, "controller": 1.0}, {"other workers": 1.0, "controller": 1.0}),
            traced(1, 1.0, {"delay element": 2.0}, {"delay element": 1.0}),
        ],
        # one run's trace tells the run queue, the other's does not: no queue figure for the policy
        "atlas+bubbletea": [traced(1, 1.0, {"idle": 1.0}, {"idle": 1.0}), traced(1, 1.0, {"idle": 1.0})],
    }
    agg = aggregate(runs)
    assert agg["sched"]["atlas"]["sched_late_ops"] == 3 and "pp-fair" not in agg["sched"]
    assert agg["sched"]["atlas"]["sched_late_runnable_ms"] == 4.0
    assert agg["sched"]["atlas"]["sched_late_unseen_ms"] == 0.75
    # a summary from before the figure was: not told, rather than 0
    old = {k: v for k, v in traced(1, 1.0, {"idle": 1.0}).items() if k != "sched_late_unseen_ms"}
    old_runs = {"atlas": [old, traced(1, 1.0, {"idle": 1.0})]}
    old_agg = aggregate(old_runs)
    assert old_agg["sched"]["atlas"]["sched_late_unseen_ms"] is None
    assert "before the thread saw it" not in format_comparison({**old_agg, "runs": old_runs})
    assert list(agg["sched"]["atlas"]["sched_cpu_while_runnable_ms"].items()) == [
        ("other workers", 4.0),
        ("delay element", 2.0),
        ("idle", 2.0),
    ]
    text = format_comparison({**agg, "runs": runs})
    assert (
        "scheduler trace of atlas (2 runs, 0 events lost): 3 operations started >1 ms after their input arrived "
        "(gloo's waking of their thread where the trace tells it), 0.8 ms of it before the thread saw it; "
        "their threads waited 4.0 ms for a CPU, "
        "ran 1.0 ms, slept 0.0 ms" in text
    )
    assert "the CPUs ran meanwhile (8.0 ms): other workers 50%, delay element 25%, idle 25%" in text
    assert "scheduler trace of pp-fair" not in text
    assert agg["sched"]["atlas"]["sched_queue_cpu_while_runnable_ms"] is None  # not told by its traces
    queue = "the CPU whose run queue each waited on ran (3.0 ms): other workers 33%, controller 33%, delay element 33%"
    assert queue in text
    assert agg["sched"]["atlas+bubbletea"]["sched_queue_cpu_while_runnable_ms"] is None
    assert text.count("the CPU whose run queue each waited on ran") == 1
