"""Compare policies on one experiment: each policy runs on the same topology, workload and seed in
one invocation (repeats interleaved: A B A B ...), so that a speed-up is quoted next to the
spread of each policy against itself (the noise floor, ``results/compare.py``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from testbed.errors import SpecError
from testbed.plan.what_if import best_plan as best_plan_of
from testbed.results.compare import aggregate, run_folder_name
from testbed.run.backends import runs_here
from testbed.run.launch import Launcher
from testbed.run.records import check_fresh_out_dir
from testbed.run.runner import check_runnable, run_experiment
from testbed.spec.experiment import Experiment


def _layout(exp: Experiment, best: bool) -> tuple[Experiment, str | None]:
    if not best:
        return exp, None
    return best_plan_of(exp, exp.topology_spec)


def compare(
    exp: Experiment,
    policies: list[str],
    out_dir: Path,
    repeat: int = 1,
    delay_mechanism: str = "auto",
    progress: Callable[[str], None] = print,
    force: bool = False,
    ablation: bool = False,
    best_plan: bool = False,
    sched_trace: bool = False,
    launcher: Launcher | None = None,
    **backend: Any,
) -> dict[str, Any]:
    """Run every policy ``repeat`` times, interleaved; write and return ``comparison.json``:
    ``policies`` maps each policy to its (first run's) summary, ``runs`` to every summary.
    ``backend``: ``backend=``/``inventory=`` for run_experiment; ``force`` as there; ``ablation``:
    the policies are an ablation chain (the report shows each step's own contribution); ``best_plan``:
    each policy runs the planner's fastest layout of the same global batch (``what_if.best_plan``);
    ``sched_trace``: every run records the scheduler (``run_experiment``); ``launcher``: the worker
    launcher to run them with (the caller's to close), else one of the comparison's own."""
    if ablation and best_plan:
        raise SpecError(
            "--plan",
            "(option)",
            "best",
            "gives each step of an ablation its own layout, so the steps would not differ by one part",
            "run the ablation on the experiment's own layout, or compare policies with --plan best",
        )
    chosen = {p: _layout(exp.with_overrides(policy=p), best_plan) for p in policies}
    check_fresh_out_dir(out_dir)
    for policy in policies:  # refuse an impossible policy before the others have run
        check_runnable(chosen[policy][0], backend.get("backend", "netns"), force)
    for k in range(repeat):
        for policy in policies:
            check_fresh_out_dir(out_dir / run_folder_name(policy, k, repeat))
    runs: dict[str, list[dict[str, Any]]] = {p: [] for p in policies}
    # one worker launcher for every run: torch is imported and warmed up once per comparison
    here = runs_here(backend.get("backend", "netns"))
    own = Launcher(out_dir / "launcher.log") if here and launcher is None else None
    launcher = (launcher or own) if here else None
    try:
        for k in range(repeat):
            for policy in policies:
                run_dir = out_dir / run_folder_name(policy, k, repeat)
                progress(f"--- {policy} (run {k + 1}/{repeat}) -> {run_dir}")
                runs[policy].append(
                    run_experiment(
                        chosen[policy][0],
                        run_dir,
                        delay_mechanism=delay_mechanism,
                        progress=progress,
                        launcher=launcher,
                        force=force,
                        plan_note=chosen[policy][1],
                        sched_trace=sched_trace,
                        **backend,
                    )
                )
    finally:
        if own is not None:
            own.close()
    result = {
        "experiment": exp.name,
        "topology": exp.topology,
        "repeat": repeat,
        "ablation": ablation,
        "policies": {p: s[0] for p, s in runs.items()},
        "runs": runs,
        **aggregate(runs),
    }
    (out_dir / "comparison.json").write_text(json.dumps(result, indent=1))
    return result
