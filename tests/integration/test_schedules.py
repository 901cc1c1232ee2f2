"""The schedules of several virtual stages and of a split backward (interleaved 1F1B, ZB-H1, ZB-V)
on real training across emulated DCs: each trains with one process's losses on two_dc and three_dc
under TCP sharing and under Atlas's grants, every action of its table traced; the simulator
predicts each one's run (``sim --validate``) within 10%; BubbleTea fills what ZB-H1 leaves idle."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from testbed.plan.schedule import stage_homes, worker_tables
from testbed.results.analysis import losses
from testbed.run.runner import run_experiment
from testbed.sim.validate import MEASURED_LINKS, validate_run
from testbed.spec.compute import ComputeModel
from testbed.spec.experiment_file import load_experiment
from testbed.trace import schema as T
from testbed.trace.events import read_events
from tests.support.reference import reference_losses

NEW = ("interleaved-1f1b", "zb-h1", "zbv")
#: each topology's stages and a model whose blocks split into every schedule's virtual stages
LAYOUTS = {"two_dc": (2, 4), "three_dc": (3, 6)}


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


@pytest.mark.parametrize("policy", ["pp-fair", "atlas"])
@pytest.mark.parametrize("topology", list(LAYOUTS))
@pytest.mark.parametrize("schedule", NEW)
def test_each_schedule_trains_with_one_processs_losses(tmp_path, clean_machine, schedule, topology, policy):
    exp = experiment(schedule, topology, policy)
    exp = exp.with_overrides(compute=ComputeModel(mode="real"))  # the math, quickly
    summary = run_experiment(exp, tmp_path, progress=_quiet)
    ev = read_events(tmp_path)
    got, want = losses(ev).tolist(), reference_losses(exp, 3)
    assert len(got) == 3 and got == pytest.approx(want, rel=1e-4), (got, want)
    assert summary["completed_iterations"] == 3 and not summary["aborted"]
    # every worker ran its table's actions in its order, each traced with its virtual stage (and a
    # split backward's part)
    homes = stage_homes(exp.schedule, exp.stages, exp.chunks)
    tables = worker_tables(exp.schedule, exp.stages, exp.microbatches, exp.chunks)
    part = {"F": None, "B": None, "I": T.INPUT_PART, "W": T.WEIGHT_PART}
    config = json.loads((tmp_path / "config.json").read_text())
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


@pytest.mark.parametrize("schedule", NEW)
def test_the_simulator_predicts_each_schedules_run(tmp_path, clean_machine, schedule):
    """Padded compute on three_dc under Atlas, its WAN profiled: ``sim --validate`` within 10%."""
    exp = experiment(schedule, "three_dc", "atlas", iterations=5)
    run_experiment(exp, tmp_path, progress=_quiet, profile_wan=True)
    got = validate_run(tmp_path)
    assert got["links"] == MEASURED_LINKS
    figure = got["figures"]["iteration_time_s"]
    print(schedule, figure)
    assert abs(figure["error"]) <= 0.10, figure
