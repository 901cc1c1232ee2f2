"""Late operations over several comparisons (``results/late_counts.py``): the exact test against
hand-worked binomials, and the counts from hand-built ``comparison.json`` dictionaries."""

from __future__ import annotations

import math

import pytest

from testbed.errors import SpecError
from testbed.results.late_counts import (
    KERNEL,
    WORKERS,
    exact_binomial_p,
    format_late_counts,
    late_over_comparisons,
    policy_counts,
    read_comparison,
)
from testbed.trace import metrics as M


def test_exact_binomial_p_against_hand_worked_binomials():
    # 9 of 10 at 1/2: the outcomes 0, 1, 9 and 10 are no more likely: (1 + 10 + 10 + 1) / 1024
    assert exact_binomial_p(9, 10, 0.5) == pytest.approx(22 / 1024)
    # the likeliest outcome: every outcome is no more likely than it
    assert exact_binomial_p(5, 10, 0.5) == pytest.approx(1.0)
    # 7 of 20 at 1/2: twice P(X <= 7) (R's binom.test(7, 20): 0.2632)
    assert exact_binomial_p(7, 20, 0.5) == pytest.approx(2 * sum(math.comb(20, i) for i in range(8)) / 2**20)
    assert exact_binomial_p(7, 20, 0.5) == pytest.approx(0.2632, abs=1e-4)
    # not symmetric: 2 of 3 at 0.2, pmf 0.512, 0.384, 0.096, 0.008: outcomes 2 and 3
    assert exact_binomial_p(2, 3, 0.2) == pytest.approx(0.104)
    assert exact_binomial_p(0, 0, 0.5) == 1.0
    assert exact_binomial_p(3, 3, 1.0) == 1.0 and exact_binomial_p(2, 3, 1.0) == 0.0
    # large counts (comb(2000, 1000) is beyond a float): the likeliest outcome, and a far one
    assert exact_binomial_p(1000, 2000, 0.5) == pytest.approx(1.0)
    assert exact_binomial_p(1200, 2000, 0.5) < 1e-15
    for k, n, p in ((4, 3, 0.5), (-1, 3, 0.5), (1, 3, 1.5)):
        with pytest.raises(ValueError, match="0 <= k <= n"):
            exact_binomial_p(k, n, p)


def _run(
    late_kernel: int | None,
    late_workers: int,
    ops: int = 960,
    queue: dict | None = None,
    free: tuple[float, float, int] | None = None,
) -> dict:
    """A run's summary: its late operations counted each way, its operations with an input and
    (traced) what the CPU of its late threads' run queues ran, by role, and (``free``) the ms
    they waited for a CPU, of which another was free, and how many had one past their lateness."""
    return {
        M.SCHED_LATE_OPS: late_kernel,
        M.TRAINING_OPS_STARTED_LATE: late_workers,
        M.TRAINING_OPS_WITH_INPUT: ops,
        **({} if late_kernel is None else {M.SCHED_QUEUE_CPU_WHILE_RUNNABLE_MS: queue or {}}),
        **(
            {}
            if free is None
            else dict(
                zip((M.SCHED_LATE_RUNNABLE_MS, M.SCHED_LATE_FREE_CPU_MS, M.SCHED_LATE_OPS_FREE_CPU), free, strict=True)
            )
        ),
    }


def _comparison(runs: dict[str, list[dict]]) -> dict:
    return {"policies": list(runs), "runs": runs}


def test_policy_counts_sum_the_repeats_from_the_kernel_or_the_workers():
    c = _comparison({"atlas": [_run(2, 1), _run(3, 3)], "pp-fair": [_run(None, 4)]})
    assert policy_counts(c, "atlas", KERNEL, "c") == (5, 1920)
    assert policy_counts(c, "atlas", WORKERS, "c") == (4, 1920)
    assert policy_counts(c, "pp-fair", WORKERS, "c") == (4, 960)
    with pytest.raises(SpecError, match=r"c: runs.pp-fair\[0\].sched_late_ops: None is missing.*--workers"):
        policy_counts(c, "pp-fair", KERNEL, "c")  # not traced
    with pytest.raises(SpecError, match=r"c: runs.atlas\+bubbletea: None is missing \(it ran atlas, pp-fair\)"):
        policy_counts(c, "atlas+bubbletea", WORKERS, "c")
    no_ops = _comparison({"atlas": [{M.TRAINING_OPS_STARTED_LATE: 1}]})
    with pytest.raises(SpecError, match="training_ops_with_input: None is missing"):
        policy_counts(no_ops, "atlas", WORKERS, "c")  # no count of operations: not taken as 0


def test_late_over_comparisons_totals_excess_and_the_exact_test():
    bt = "atlas+bubbletea"
    cs = [
        ("c0", _comparison({"atlas": [_run(1, 1), _run(1, 1)], bt: [_run(3, 2, queue={"decode": 2.0}), _run(2, 2)]})),
        ("c1", _comparison({"atlas": [_run(0, 0), _run(2, 2)], bt: [_run(4, 4, queue={"x": 4.0}), _run(0, 0)]})),
    ]
    for (_, c), free in zip(cs, ((2.0, 1.0, 1), (3.0, 0.5, 0)), strict=True):
        for run in c["runs"][bt]:
            # only BubbleTea's summaries tell the free CPU
            run.update(dict(zip((M.SCHED_LATE_RUNNABLE_MS, M.SCHED_LATE_FREE_CPU_MS, M.SCHED_LATE_OPS_FREE_CPU), free)))
    f = late_over_comparisons(cs, ["atlas", bt], "atlas")
    assert f["comparisons"] == 2 and f["source"] == KERNEL
    a, b = f["policies"]["atlas"], f["policies"][bt]
    assert a["late"] == [2, 2] and a["late_total"] == 4 and a["ops_total"] == 3840 and a["events_lost"] == 0
    assert b["late"] == [5, 4] and b["late_total"] == 9 and b["late_per_1000_ops"] == pytest.approx(9000 / 3840)
    assert b["excess_per_comparison"] == pytest.approx((9 - 4) / 2)
    assert b["p_same_rate"] == pytest.approx(exact_binomial_p(9, 13, 0.5))
    assert list(b["queue_cpu_ms_by_role"].items()) == [("x", 4.0), ("decode", 2.0)]  # largest first
    assert "excess_per_comparison" not in a
    text = format_late_counts(f)
    assert "| atlas | 2, 2 | 4 | 3,840 | 1.04 | (baseline) |  |" in text
    assert f"| {bt} | 5, 4 | 9 | 3,840 | 2.34 | +2.50 | {exact_binomial_p(9, 13, 0.5):.2g} |" in text
    assert f"- {bt} (6.0 ms): x 4.0, decode 2.0" in text
    # (2 runs x (2.0, 1.0, 1)) + (2 runs x (3.0, 0.5, 0))
    assert (b["runnable_ms"], b["free_cpu_ms"], b["late_ops_free_cpu"]) == (10.0, 3.0, 2)
    assert a["free_cpu_ms"] is None and a["late_ops_free_cpu"] is None
    assert f"- {bt}: 3.0 of 10.0 ms waiting; 2 of 9 late operations" in text
    assert "had one at some moment before 1 ms from their input:" in text
    assert "- atlas: not told (a trace without the moves between CPUs, or summaries from before: testbed" in text


def test_late_over_comparisons_scales_the_baseline_to_the_policys_operations():
    cs = [("c", _comparison({"atlas": [_run(None, 2, ops=1000)], "dp-wan": [_run(None, 3, ops=500)]}))]
    f = late_over_comparisons(cs, ["dp-wan"], "atlas", WORKERS)
    d = f["policies"]["dp-wan"]
    assert d["excess_per_comparison"] == pytest.approx(3 - 2 * 0.5)  # atlas's 2 in twice the operations
    assert d["p_same_rate"] == pytest.approx(exact_binomial_p(3, 5, 1 / 3))
    assert "queue_cpu_ms_by_role" not in d and "run queues" not in format_late_counts(f)


def test_late_over_comparisons_refuses_what_it_cannot_judge():
    with pytest.raises(ValueError, match="no comparison"):
        late_over_comparisons([], ["pp-fair"], "atlas")
    untraced = [("c", _comparison({"atlas": [_run(None, 1)], "pp-fair": [_run(None, 2)]}))]
    with pytest.raises(SpecError, match="sched_late_ops"):
        late_over_comparisons(untraced, ["pp-fair"], "atlas")
    empty = [("c", _comparison({"atlas": [_run(0, 0, ops=0)], "pp-fair": [_run(0, 0)]}))]
    with pytest.raises(ValueError, match="no operation with an input in atlas's runs"):
        late_over_comparisons(empty, ["pp-fair"], "atlas")


def test_read_comparison_names_the_file_and_the_fault(tmp_path):
    with pytest.raises(SpecError, match="cannot be read"):
        read_comparison(tmp_path)
    (tmp_path / "comparison.json").write_text("{")
    with pytest.raises(SpecError, match="is not valid JSON"):
        read_comparison(tmp_path)
    (tmp_path / "comparison.json").write_text("[1, 2]")
    with pytest.raises(SpecError, match="is not a JSON object"):
        read_comparison(tmp_path)
    (tmp_path / "comparison.json").write_text('{"policies": ["atlas"]}')
    with pytest.raises(SpecError, match="runs: None is missing"):
        read_comparison(tmp_path)


def test_read_comparison_takes_each_runs_summary_from_its_folder_where_there_is_one(tmp_path):
    """A run folder's ``summary.json`` (rewritten by ``testbed analyze``) replaces the copy the
    comparison made; a run without a folder keeps the copy; a bad one is named."""
    import json

    c = {"repeat": 2, "runs": {"atlas": [_run(1, 1), _run(2, 2)], "pp-fair/striping=on": [_run(3, 3), _run(4, 4)]}}
    (tmp_path / "comparison.json").write_text(json.dumps(c))
    (tmp_path / "atlas-1").mkdir()
    (tmp_path / "atlas-1" / "summary.json").write_text(json.dumps(_run(5, 5, free=(2.0, 1.0, 1))))
    (tmp_path / "pp-fair_striping=on-0").mkdir()
    (tmp_path / "pp-fair_striping=on-0" / "summary.json").write_text(json.dumps(_run(6, 6)))
    runs = read_comparison(tmp_path)["runs"]
    assert [r[M.SCHED_LATE_OPS] for r in runs["atlas"]] == [1, 5]
    assert runs["atlas"][1][M.SCHED_LATE_OPS_FREE_CPU] == 1
    assert [r[M.SCHED_LATE_OPS] for r in runs["pp-fair/striping=on"]] == [6, 4]
    (tmp_path / "atlas-1" / "summary.json").write_text("{")
    with pytest.raises(SpecError, match=r"atlas-1/summary.json.*is not valid JSON.*testbed analyze"):
        read_comparison(tmp_path)
    # one run a policy: folders named without a repeat's suffix
    once = tmp_path / "once"
    (once / "atlas").mkdir(parents=True)
    (once / "comparison.json").write_text(json.dumps({"repeat": 1, "runs": {"atlas": [_run(1, 1)]}}))
    (once / "atlas" / "summary.json").write_text(json.dumps(_run(7, 7)))
    assert read_comparison(once)["runs"]["atlas"][0][M.SCHED_LATE_OPS] == 7


def test_the_script_prints_the_table_of_compare_folders(tmp_path):
    """``scripts/late_counts.py`` on two compare folders prints each policy's counts and the
    test; a folder without ``comparison.json``, or a policy not compared, is a clear error."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "late_counts.py"
    bt = "atlas+bubbletea"
    for i, late in enumerate(((1, 3), (2, 4))):
        (tmp_path / f"c{i}").mkdir()
        c = _comparison({"atlas": [_run(late[0], late[0])], bt: [_run(late[1], late[1], queue={"decode": 1.5})]})
        (tmp_path / f"c{i}" / "comparison.json").write_text(json.dumps(c))
    folders = [str(tmp_path / "c0"), str(tmp_path / "c1")]
    out = subprocess.run([sys.executable, str(script), *folders], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert f"| {bt} | 3, 4 | 7 | 1,920 | 3.65 | +2.00 | {exact_binomial_p(7, 10, 0.5):.2g} |" in out.stdout
    bad = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True)
    assert bad.returncode == 1 and f"{tmp_path / 'comparison.json'}: (file)" in bad.stderr
    other = subprocess.run(
        [sys.executable, str(script), *folders, "--baseline", "pp-fair"], capture_output=True, text=True
    )
    assert (
        other.returncode == 1
        and "'pp-fair' was not compared" in other.stderr
        and "atlas, atlas+bubbletea" in other.stderr
    )


def test_a_trace_without_the_run_queues_is_told_not_counted_as_nothing():
    run = {**_run(2, 2), M.SCHED_QUEUE_CPU_WHILE_RUNNABLE_MS: None, M.SCHED_EVENTS_LOST: 3}
    f = late_over_comparisons([("c", _comparison({"atlas": [run], "pp-fair": [_run(1, 1)]}))], ["pp-fair"], "atlas")
    assert f["policies"]["atlas"]["queue_cpu_ms_by_role"] is None and f["policies"]["atlas"]["events_lost"] == 3
    text = format_late_counts(f)
    assert "- atlas: not told (a trace without the tasks' moves between CPUs) (3 events lost" in text
