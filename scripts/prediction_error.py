#!/usr/bin/env python3
"""The cost model's error on every shipped experiment and policy: predicted iteration time
(``plan/cost_model.py``, the grant plan's simulation under grants) against the measured median
of a run, ``(measured - predicted) / measured``. Prints a markdown table (and writes it to
``prediction_error.md`` in ``--out``); nothing asserted.

Run as root: .venv/bin/python scripts/prediction_error.py [--policies pp-fair,dp-wan,atlas] [--iterations 8]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testbed.errors import SpecError
from testbed.run.interrupts import tears_down_on_signals
from testbed.run.runner import run_experiment
from testbed.spec.experiment_file import load_experiment
from testbed.trace import metrics as M

EXPERIMENTS = ("default", "four_dc", "two_dc", "sharing")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experiments", default=",".join(EXPERIMENTS))
    ap.add_argument("--policies", default="pp-fair,dp-wan,atlas")
    ap.add_argument("--iterations", type=int, default=8)
    ap.add_argument("--out", type=Path, default=Path("results") / f"prediction-{time.strftime('%Y%m%d-%H%M%S')}")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = ["| experiment | policy | predicted s | measured s | error |", "|---|---|---|---|---|"]
    for name in args.experiments.split(","):
        for policy in args.policies.split(","):
            exp = load_experiment(name).with_overrides(iterations=args.iterations, policy=policy)
            try:
                s = run_experiment(exp, args.out / f"{name}-{policy}", progress=lambda line: None)
            except SpecError as e:
                rows.append(f"| {name} | {policy} | - | - | infeasible: {e.problem} |")
                continue
            pred, meas = s[M.PREDICTED_ITERATION_TIME_S], s[M.ITERATION_TIME_S]
            rows.append(f"| {name} | {policy} | {pred:.3f} | {meas:.3f} | {(meas - pred) / meas:+.1%} |")
            print(rows[-1], flush=True)
    text = "\n".join(rows)
    (args.out / "prediction_error.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    with tears_down_on_signals():  # SIGTERM, SIGHUP and Ctrl-C tear the network down
        main()
