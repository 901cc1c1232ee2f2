"""A measured run against the simulator (``testbed sim --validate RUN_DIR``): the run's experiment
and placement (its ``config.json``) simulated, each figure of its ``summary.json`` set beside the
prediction. Error: (measured - predicted) / measured for times and rates, measured - predicted
for fractions (utilization, bubble fraction). Pure (reads two JSON files)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from testbed.errors import SpecError
from testbed.plan.workers import WorkerSpec
from testbed.sim.figures import simulate_policy
from testbed.spec.experiment import Experiment
from testbed.trace import metrics as M

#: figures compared as relative errors, and as absolute differences
RELATIVE = (M.ITERATION_TIME_S, M.TOKENS_PER_S)
ABSOLUTE = (M.GPU_UTILIZATION, M.BUBBLE_FRACTION, M.WAN_UTILIZATION_MEAN)


def validate_run(run_dir: Path) -> dict[str, Any]:
    """``{"run", "policy", "figures": {NAME: {"predicted", "measured", "error"}}}`` for ``run_dir``.
    Raises SpecError naming the file when the folder is not a finished run's."""
    files = {}
    for name in ("config.json", "summary.json"):
        path = run_dir / name
        try:
            files[name] = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise SpecError(
                str(run_dir),
                name,
                str(path),
                f"cannot be read ({e})",
                "give the folder of a finished run (testbed run ... --out DIR)",
            ) from e
    config, summary = files["config.json"], files["summary.json"]
    try:
        exp = Experiment.from_dict(config)
        workers = [WorkerSpec(**w) for w in config["workers"]]
    except (KeyError, TypeError, ValueError) as e:
        raise SpecError(
            str(run_dir / "config.json"), "config.json", "(record)", f"is not a run's record ({e!r})", "rerun it"
        ) from e
    predicted = simulate_policy(exp, workers=workers).to_dict()
    figures = {}
    for name in (*RELATIVE, *ABSOLUTE):
        x, y = predicted.get(name), summary.get(name)
        if x is None or y is None:
            error = None
        elif name in RELATIVE:
            error = (y - x) / y if y else None
        else:
            error = y - x
        figures[name] = {"predicted": x, "measured": y, "error": error}
    return {"run": str(run_dir), "policy": exp.policy.name, "figures": figures}
