"""An experiment nobody chose, end to end (``sim/random_experiments.py``, ``run/random_validation.py``):
the first draw of seed 2026 that this machine can run is written as its two files, loaded back,
run under pp-fair and atlas, and predicted as ``testbed plan`` predicts (the modelled window, the
pipelines in step), within issue 39's largest error on a random experiment, 10% (``BOUND``). At
7dba112 this draw measured +11.9% under pp-fair and +16.7% under atlas, slower than predicted;
since the simulator models BBR's pacing of a message after idle (8bd2251, fea29b8) +1.3% and
+2.7% (docs/results.md, "BBR paces a message after idle"). The atlas run is then set beside its
grant plan by cause (``sim/plan_gap.py``, as ``testbed sim --validate`` prints it): the parts and
the remainder add up to what the run measured beyond its plan."""

from __future__ import annotations

from testbed.run.random_validation import machine_check, run_draw, write_draw
from testbed.sim.plan_gap import CAUSES, format_plan_gap, plan_gap
from testbed.sim.random_experiments import random_experiments
from testbed.spec.experiment_file import load_experiment

SEED = 2026
#: the largest error the test accepts: issue 39's goal for every random experiment
BOUND = 0.10


def test_a_random_experiment_runs_and_is_predicted_within_the_goal(tmp_path, clean_machine, launchers):
    drawn = random_experiments(1, SEED, check=machine_check)
    draw, exp, ratio, quartile = drawn.accepted[0]
    assert quartile == 0 and ratio > 0
    loaded = load_experiment(write_draw(draw, tmp_path / draw.name))
    assert loaded.stages == exp.stages and loaded.topology_spec.links == exp.topology_spec.links
    runs = run_draw(
        loaded, tmp_path / draw.name, iterations=5, launchers=launchers, progress=print, policies=("pp-fair", "atlas")
    )
    for policy, r in runs.items():
        assert r["representative"], (policy, r)
        assert abs(r["error"]) <= BOUND, (policy, r)
    gap = plan_gap(tmp_path / draw.name / "atlas")
    assert gap is not None
    print(format_plan_gap(gap))
    assert [name for name, _ in gap.parts] == [name for name, _ in CAUSES]
    assert abs(sum(s for _, s in gap.parts) + gap.remainder_s - (gap.measured_s - gap.planned_s)) < 1e-9
    assert gap.measured_s == runs["atlas"]["measured_s"]
