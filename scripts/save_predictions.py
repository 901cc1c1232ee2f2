#!/usr/bin/env python3
"""The simulator's predictions saved (``sim/saved_predictions.py``): every shipped experiment and
scenario and 20 random experiments (seed 39) under every policy, written to
``tests/data/saved_predictions.json``, which a unit test checks the experiments and random draws
against; ``--check`` writes nothing and lists every figure that differs from the saved file
(exit 1 where one does), the scenarios included (minutes: the paper-scale simulations). A change
meant to move predictions (a model fix) saves them again and quotes the list in its commit.

Run: .venv/bin/python scripts/save_predictions.py [--check] [--kinds experiment,random,scenario]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testbed.plan.connections import machine_congestion
from testbed.results.published import commit
from testbed.sim.saved_predictions import KINDS, differences, predictions

REPO = Path(__file__).resolve().parents[1]
SAVED = REPO / "tests" / "data" / "saved_predictions.json"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with the saved file, write nothing")
    ap.add_argument("--kinds", default=",".join(KINDS))
    args = ap.parse_args()
    kinds = [k for k in args.kinds.split(",") if k]
    t0 = time.perf_counter()
    now = predictions(kinds)
    print(f"{len(now)} predictions of {', '.join(kinds)} in {time.perf_counter() - t0:.1f} s")
    saved = json.loads(SAVED.read_text())["predictions"] if SAVED.exists() else {}
    diff = differences(saved, now)
    for case, figure, a, b in diff:
        print(f"{case} {figure}: saved {a}, now {b}")
    print(f"{len(diff)} figures differ from {SAVED.relative_to(REPO)}")
    if args.check:
        sys.exit(1 if diff else 0)
    merged = {**{k: v for k, v in saved.items() if k.split(":")[0] not in kinds}, **now}
    # the hosts' congestion control the experiments were predicted under where they name none (this
    # machine's default): the unit test predicts under the same on any machine
    SAVED.write_text(
        json.dumps(
            {"commit": commit(REPO), "congestion": machine_congestion(), "predictions": dict(sorted(merged.items()))},
            indent=1,
        )
        + "\n"
    )
    print(f"saved in {SAVED.relative_to(REPO)}")


if __name__ == "__main__":
    main()
