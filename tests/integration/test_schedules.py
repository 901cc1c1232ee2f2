"""The schedules of several virtual stages and of a split backward (interleaved 1F1B, ZB-H1, ZB-V)
on real training across emulated DCs: each trains with one process's losses on two_dc under TCP
sharing and on three_dc under Atlas's grants, every action of its table traced; the simulator
predicts each one's run (``sim --validate``) within 10%; BubbleTea fills what ZB-H1 leaves idle."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from testbed.plan.schedule import worker_tables
from testbed.plan.virtual_stages import stage_homes
from testbed.results.analysis import losses
from testbed.run.runner import run_experiment
from testbed.sim.validate import MEASURED_LINKS, MODELLED_WINDOW, validate_run
from testbed.spec.compute import ComputeModel
from testbed.spec.experiment_file import load_experiment
from testbed.trace import schema as T
from testbed.trace.events import read_events
from tests.support.reference import reference_losses

NEW = ("interleaved-1f1b", "zb-h1", "zbv")
#: each topology's stages and a model whose blocks split into every schedule's virtual stages
LAYOUTS = {"two_dc": (2, 4), "three_dc": (3, 6)}
# the slowdown BubbleTea may add beyond a narrow floor: twice the largest docs/results.md records
# under the new schedules (+0.5%)
SLOWDOWN_BOUND = 0.01


def _quiet(line: str) -> None:
    pass


def experiment(schedule: str, topology: str, policy: str, **kw):
    stages, layers = LAYOUTS[topology]
    exp = load_experiment()
    return exp.with_overrides(
        topology=topology,
        stages=stages,
        replicas=2,
        schedule=schedule,
        policy=policy,
        model=replace(exp.model, n_layers=layers),
        **{"iterations": 3, "warmup_iterations": 1, **kw},
    )


def check_training(exp, run_dir, iterations: int) -> None:
    """The run's losses are one process's, and every worker ran its table's actions in its order,
    each traced with its virtual stage (and a split backward's part)."""
    ev = read_events(run_dir)
    got, want = losses(ev).tolist(), reference_losses(exp, iterations)
    assert len(got) == iterations and got == pytest.approx(want, rel=1e-4), (got, want)
    homes = stage_homes(exp.schedule, exp.stages, exp.chunks)
    tables = worker_tables(exp.schedule, exp.stages, exp.microbatches, exp.chunks)
    part = {"F": None, "B": None, "I": T.INPUT_PART, "W": T.WEIGHT_PART}
    config = json.loads((run_dir / "config.json").read_text())
    for w in config["workers"]:
        mine = ev[(ev[T.WORKER] == w["rank"]) & (ev[T.ITERATION] == 1) & ev[T.KIND].isin([T.FORWARD, T.BACKWARD])]
        mine = mine.sort_values(T.START_NS)
        traced = [
            (k[0].upper(), int(v), int(m), p if isinstance(p, str) else None)
            for k, v, m, p in zip(mine[T.KIND], mine[T.VIRTUAL_STAGE], mine[T.MICROBATCH], mine[T.PART])
        ]
        listed = [("F" if a.kind == "F" else "B", a.stage, a.microbatch, part[a.kind]) for a in tables[w["stage"]]]
        assert traced == listed
        assert {v for _, v, _, _ in traced} == {v for v, h in enumerate(homes) if h == w["stage"]}


@pytest.mark.parametrize("topology, policy", [("three_dc", "atlas")])
@pytest.mark.parametrize("schedule", NEW)
def test_each_schedule_trains_with_one_processs_losses(tmp_path, clean_machine, launcher, schedule, topology, policy):
    """Real compute (the math, quickly); two_dc under pp-fair is the next test's. three_dc under
    pp-fair (the same placement as atlas's, the links shared by TCP instead of granted) ran until
    33fad16, two_dc under atlas until 99b4ea5: the math does not depend on how a link is shared
    (29 s and 21 s of the suite)."""
    exp = experiment(schedule, topology, policy)
    exp = exp.with_overrides(compute=ComputeModel(mode="real"))
    summary = run_experiment(exp, tmp_path, progress=_quiet, launcher=launcher)
    assert summary["completed_iterations"] == 3 and not summary["aborted"]
    check_training(exp, tmp_path, 3)


@pytest.mark.parametrize("schedule", NEW)
def test_each_schedule_on_two_dc_is_predicted(tmp_path, clean_machine, launcher, schedule):
    """Padded compute on two_dc under pp-fair (interleaving's boundary from the last worker back to
    the first crosses the link again): one process's losses, and ``sim --validate`` within 10%.
    ZB-H1's run profiles its WAN first (``--profile-wan``: 11 s a run) and is predicted on the
    measured paths; the others on the modelled window, as ``testbed plan`` predicts (-2.3% and
    -2.9% at 7a7b80b). Profiling three_dc's six path directions takes 34 s a run; under Atlas on
    two_dc the simulator misses interleaving's by 13% (docs/results.md, "Schedules across DCs")."""
    profiled = schedule == "zb-h1"
    exp = experiment(schedule, "two_dc", "pp-fair", iterations=4)
    run_experiment(exp, tmp_path, progress=_quiet, profile_wan=profiled, launcher=launcher)
    check_training(exp, tmp_path, 4)
    got = validate_run(tmp_path)
    assert got["links"] == (MEASURED_LINKS if profiled else MODELLED_WINDOW)
    figure = got["figures"]["iteration_time_s"]
    print(schedule, figure)
    assert abs(figure["error"]) <= 0.10, figure


def test_bubbletea_fills_what_zb_h1_leaves_idle(tmp_path, clean_machine, launcher):
    """ZB-H1 on the default experiment under Atlas, with and without BubbleTea, each three times
    (interleaved): requests served, at least half of the idle time the table leaves filled, no
    training operation started over 1 ms after its input arrived, and training slowed by no more
    than the larger of the noise floor (the larger spread of each policy against itself) and
    ``SLOWDOWN_BOUND``. CI at 9f5101d measured +0.43% against a 0.04% floor and a rerun +0.43%
    against 0.20%, no operation late in either: a small slowdown this test does not explain;
    docs/results.md ("Schedules across DCs") records up to +0.5%, two of them outside their
    floors. Three runs, not two: with noise alone of 0.65% a run (this VM's floor was 1.03% on
    2026-12-07), two runs a policy exceed the bound 4.2% of the time, three 1.7% (normal draws,
    10^6 trials); a fresh clone's two measured +1.78% against a 1.50% floor that day."""
    from testbed.run.compare import compare

    exp = load_experiment().with_overrides(iterations=5, schedule="zb-h1")
    # short prompts and outputs, as test_bubbletea's, so that a short run completes several requests
    short = replace(exp.bubbletea, request_rate=8.0, max_prompt_tokens=256, max_output_tokens=8, model=None)
    exp = exp.with_overrides(bubbletea=short)
    result = compare(exp, ["atlas", "atlas+bubbletea"], tmp_path, repeat=3, progress=_quiet, launcher=launcher)
    bt = result["stats"]["atlas+bubbletea"]
    print({k: v["median"] for k, v in bt.items() if v["median"] is not None})
    assert bt["requests_completed"]["median"] >= 5
    assert bt["bubble_fill_fraction"]["median"] >= 0.5
    slowdown = result["bubbletea"]["atlas+bubbletea"]
    print("training slowdown", slowdown)
    assert slowdown["training_ops_started_late"]["atlas+bubbletea"] == [0, 0, 0], slowdown
    assert slowdown["training_slowdown"] - 1 <= max(slowdown["noise_floor"], SLOWDOWN_BOUND), slowdown
