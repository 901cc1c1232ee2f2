"""The simulator against the emulator on experiments nobody chose (``scripts/prediction_error.py
--random N --seed S``): N random valid experiments (``sim/random_experiments.py``), each written as
its two files and run under every policy of ``POLICIES``, each run set beside the simulator
predicting as ``testbed plan`` does (the modelled window, the pipelines in step:
``validate_run(measured_links=False, measured_starts=False)``).

A draw is rejected, and counted with its reason, where this machine cannot run it representatively:
before the runs, where a policy's plan is refused (``machine_check``); after them, where a run's
compute overran its padding targets (``representative`` false in its summary) or a run failed
(the sweep goes on). A policy that cannot run a draw at all (dp-wan needs whole pipelines in a
DC) is listed as infeasible for it. A run whose folder already holds a ``summary.json`` is not run again, so an
interrupted sweep goes on where it stopped.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import yaml

from testbed.errors import SpecError, TestbedError
from testbed.plan.placement import decode_hosts
from testbed.plan.run_plan import RunPlan, make_plan
from testbed.results.published import Column, record_result
from testbed.run.fit import check_compute_load, check_connection_window, check_iteration_time, check_memory
from testbed.run.launch import Launchers
from testbed.run.runner import run_experiment
from testbed.sim.random_experiments import Draw, random_experiments
from testbed.sim.validate import error_distribution, validate_run
from testbed.spec.experiment import Experiment
from testbed.spec.experiment_file import load_experiment
from testbed.trace import metrics as M

#: the policies every draw runs under, the baseline first
POLICIES = ("pp-fair", "dp-wan", "atlas", "atlas+bubbletea")
#: the recorded tables (``docs/results/<name>.json``)
RUNS_TABLE, SUMMARY_TABLE, REJECTED_TABLE = (
    "prediction_error_random",
    "prediction_error_random_summary",
    "prediction_error_random_rejected",
)
RUN_COLUMNS = [
    Column("draw", ("{draw}",)),
    Column("ratio quartile", ("{quartile}",)),
    Column("planned ratio", ("{ratio:.3f}",)),
    Column("policy", ("{policy}",)),
    Column("iteration s: predicted", ("{predicted_s:.3f}", "-")),
    Column("measured", ("{measured_s:.3f}", "-")),
    Column("error", ("{error:+.1%}", "infeasible: {infeasible}", "failed: {failed}")),
    Column("GPU utilization: predicted", ("{gpu_predicted:.3f}", "-")),
    Column("measured", ("{gpu_measured:.3f}", "-")),
    Column("atlas over pp-fair: predicted", ("{speedup_predicted:.2f}x", "")),
    Column("measured", ("{speedup_measured:.2f}x", "")),
]
SUMMARY_COLUMNS = [
    Column("figure", ("{figure}",)),
    Column("runs", ("{n}",)),
    Column("median error (size)", ("{median:.1%}", "-")),
    Column("p90", ("{p90:.1%}", "-")),
    Column("largest", ("{largest:.1%}", "-")),
    Column("goal", ("{goal}",)),
]
REJECTED_COLUMNS = [Column("draw", ("{draw}",)), Column("when", ("{when}",)), Column("why", ("{why}",))]
#: issue 39's goals per policy: median, 90th percentile and largest |error|; the speed-up's error
GOALS = "median <= 3%, p90 <= 6%, largest <= 10%"
SPEEDUP_GOAL = "every draw within 5%"


def policy_plan(exp: Experiment, policy: str) -> RunPlan:
    """``exp``'s plan under ``policy``. Raises SpecError where the policy cannot run it at all (its
    placement, or BubbleTea's decode hosts): infeasible for that policy, whatever the machine."""
    plan = make_plan(exp.with_overrides(policy=policy))
    if plan.experiment.policy.bubbletea:
        decode_hosts(exp.topology_spec, list(plan.workers))
    return plan


def machine_check(exp: Experiment) -> None:
    """Raise SpecError where this machine cannot run ``exp`` representatively under a policy of
    ``POLICIES`` that can run it (``check_memory``, ``check_iteration_time``,
    ``check_connection_window``, ``check_compute_load``)."""
    for policy in POLICIES:
        try:
            plan = policy_plan(exp, policy)
        except SpecError:
            continue
        check_memory(plan)
        check_iteration_time(plan)
        check_connection_window(plan)
        check_compute_load(plan)


def write_draw(draw: Draw, folder: Path) -> Path:
    """The draw's experiment and topology files in ``folder``; returns the experiment's."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / draw.experiment["topology"]).write_text(yaml.safe_dump(draw.topology, sort_keys=False))
    path = folder / f"{draw.name}.yaml"
    path.write_text(yaml.safe_dump(draw.experiment, sort_keys=False))
    return path


def run_draw(
    exp: Experiment,
    folder: Path,
    iterations: int,
    run_missing: bool = True,
    launchers: Launchers | None = None,
    progress: Any = print,
    policies: tuple[str, ...] = POLICIES,
) -> dict[str, dict[str, Any]]:
    """Each of ``policies``' run of ``exp`` in ``folder/<policy>``, validated: {policy: row fields}.
    A run already there (its ``summary.json``) is validated, not run again; one that is not is run
    (with a launcher of ``launchers``, where given), or with ``run_missing`` False, listed as
    failed."""
    out: dict[str, dict[str, Any]] = {}
    for policy in policies:
        run_dir = folder / policy.replace("+", "-")
        e = exp.with_overrides(policy=policy, iterations=iterations, warmup_iterations=1)
        try:
            policy_plan(e, policy)
        except SpecError as err:
            out[policy] = {"infeasible": f"{err.field} {err.problem}"}
            continue
        if not (run_dir / "summary.json").exists():
            if not run_missing:
                out[policy] = {"failed": "not run (revalidating the runs there)", "representative": False}
                continue
            try:
                launcher = launchers.get() if launchers is not None else None
                run_experiment(e, run_dir, progress=lambda line: None, launcher=launcher)
            except TestbedError as err:  # the sweep goes on; the draw is rejected after the runs
                out[policy] = {"failed": str(err).splitlines()[0][:300], "representative": False}
                progress(f"{exp.name} {policy}: failed: {out[policy]['failed']}")
                continue
        summary = json.loads((run_dir / "summary.json").read_text())
        f = validate_run(run_dir, measured_links=False, measured_starts=False)["figures"]
        it, gpu = f[M.ITERATION_TIME_S], f[M.GPU_UTILIZATION]
        if it["error"] is None:  # an aborted run: no iteration measured
            out[policy] = {"failed": "no iteration measured (the run was aborted)", "representative": False}
            progress(f"{exp.name} {policy}: failed: {out[policy]['failed']}")
            continue
        out[policy] = {
            "predicted_s": it["predicted"],
            "measured_s": it["measured"],
            "error": it["error"],
            "gpu_predicted": gpu["predicted"],
            "gpu_measured": gpu["measured"],
            "representative": summary.get(M.REPRESENTATIVE, True),
            "overrun": summary.get(M.COMPUTE_OVERRUN_FRACTION) or 0.0,
        }
        progress(
            f"{exp.name} {policy}: predicted {it['predicted']:.3f} s, measured {it['measured']:.3f} s, "
            f"error {it['error']:+.1%}"
        )
    return out


def run_random(
    n: int,
    seed: int,
    iterations: int,
    out: Path,
    repo: Path,
    record: bool = True,
    at_commit: str | None = None,
    revalidate: bool = False,
) -> None:
    """Draw, run, validate and report ``n`` random experiments of ``seed`` (module docstring);
    records the three tables under ``repo`` unless ``record`` is False, as made at ``at_commit``
    (``published.record_result``). ``revalidate``: draw nothing and run nothing; the draws of an
    earlier sweep in ``out`` (its ``random_summary.json``) and their runs, set beside the
    simulator as it is now (a model fix weighed on runs already made)."""
    if revalidate:
        earlier = json.loads((out / "random_summary.json").read_text())
        seen: dict[str, tuple[int, float]] = {}
        for row in earlier["runs"]:
            seen.setdefault(row["draw"], (int(row["quartile"]) - 1, float(row["ratio"])))
        drawn = [(name, load_experiment(out / name / f"{name}.yaml"), q, r) for name, (q, r) in seen.items()]
        rejected = [r for r in earlier["rejected"] if r["when"] == "before the runs"]
        print(f"seed {seed}: revalidating the {len(drawn)} draws in {out} (nothing is run)", flush=True)
    else:
        draws = random_experiments(n, seed, check=machine_check)
        print(
            f"seed {seed}: {len(draws.accepted)} draws; before them {draws.invalid} candidates the validators "
            f"refused and {draws.single_dc} that fit one DC were redrawn, {len(draws.rejected)} rejected for "
            "this machine",
            flush=True,
        )
        rejected = [{"draw": d.name, "when": "before the runs", "why": why} for d, why in draws.rejected]
        drawn = [
            (d.name, load_experiment(write_draw(d, out / d.name)), quartile, ratio)
            for d, _, ratio, quartile in draws.accepted
        ]
    rows: list[dict[str, Any]] = []
    errors: dict[str, list[float]] = {p: [] for p in POLICIES}
    speedups: list[float] = []
    with Launchers(out / "launcher.log") as launchers:  # one worker launcher for the sweep's runs
        ran = [
            (name, quartile, ratio, run_draw(exp, out / name, iterations, not revalidate, launchers))
            for name, exp, quartile, ratio in drawn
        ]
    for name, quartile, ratio, runs in ran:
        overran = [
            f"{p}: run failed: {r['failed']}"
            if "failed" in r
            else f"{p}: compute overran {r['overrun']:.0%} of operations"
            for p, r in runs.items()
            if not r.get("representative", True)
        ]
        if overran:
            rejected.append({"draw": name, "when": "after the runs", "why": "; ".join(overran)})
        base, atlas = runs["pp-fair"], runs["atlas"]
        if "error" in base and "error" in atlas:
            atlas["speedup_predicted"] = base["predicted_s"] / atlas["predicted_s"]
            atlas["speedup_measured"] = base["measured_s"] / atlas["measured_s"]
            if not overran:
                speedups.append((atlas["speedup_measured"] - atlas["speedup_predicted"]) / atlas["speedup_measured"])
        for policy, r in runs.items():
            rows.append({"draw": name, "quartile": quartile + 1, "ratio": ratio, "policy": policy, **r})
            if not overran and "error" in r:
                errors[policy].append(r["error"])
    summary = [{"figure": f"iteration time, {p}", **error_distribution(e), "goal": GOALS} for p, e in errors.items()]
    summary.append({"figure": "atlas over pp-fair (speed-up)", **error_distribution(speedups), "goal": SPEEDUP_GOAL})
    for s in summary:
        print(
            f"{s['figure']}: {s['n']} runs, median {s['median']:.1%}, p90 {s['p90']:.1%}, largest {s['largest']:.1%} "
            f"({s['goal']})"
        )
    for r in rejected:
        print(f"rejected {r['draw']} ({r['when']}): {r['why']}")
    (out / "random_summary.json").write_text(
        json.dumps({"seed": seed, "runs": rows, "summary": summary, "rejected": rejected}, indent=1, default=str)
    )
    if record:
        command = f"scripts/prediction_error.py --random {n} --seed {seed} --iterations {iterations} --out {out}"
        command += " --revalidate" if revalidate else ""
        for name, columns, table in (
            (RUNS_TABLE, RUN_COLUMNS, rows),
            (SUMMARY_TABLE, SUMMARY_COLUMNS, [{k: _nan_none(v) for k, v in s.items()} for s in summary]),
            (REJECTED_TABLE, REJECTED_COLUMNS, rejected),
        ):
            path = record_result(repo, name, columns, table, "scripts/prediction_error.py", command, at_commit)
            print(f"recorded in {path}")


def _nan_none(v: Any) -> Any:
    return None if isinstance(v, float) and math.isnan(v) else v
