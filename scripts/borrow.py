#!/usr/bin/env python3
"""Held classes that may borrow idle capacity, against held classes that may not, under ``atlas``.

``atlas_borrow`` (an Experiment field) decides the held classes' HTB ceil while another pipeline
holds a WAN link: ``false`` caps them at their floor (non-work-conserving); ``true`` lets them
borrow up to the link rate whatever the granted class leaves idle (the granted class first, by
HTB priority). For each experiment the two variants run interleaved (off, on, off, on, ...) on one
worker launcher; the table gives each variant's median iteration time, its spread against itself,
the speed-up of borrowing next to the larger spread (the noise floor), and how busy the link was
during grants. Writes ``borrow.md`` and ``borrow.json`` in ``--out``; nothing is asserted.

Run as root: .venv/bin/python scripts/borrow.py [--experiments sharing,default] [--repeat 3]
             [--iterations 8] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testbed.results.compare import aggregate
from testbed.run.interrupts import tears_down_on_signals
from testbed.run.launch import Launcher
from testbed.run.runner import run_experiment
from testbed.spec.experiment_file import load_experiment
from testbed.trace import metrics as M

VARIANTS = {"no borrowing": False, "borrowing": True}


def _median(runs: list[dict], figure: str) -> float | None:
    values = [r[figure] for r in runs if r.get(figure) is not None]
    return statistics.median(values) if values else None


def table(name: str, result: dict) -> str:
    lines = [
        f"### {name} (atlas)",
        "",
        "| held classes | iteration s (median) | spread | link busy during grants | grants released by deadline |",
        "|---|---|---|---|---|",
    ]
    for label in VARIANTS:
        it = result["stats"][label][M.ITERATION_TIME_S]
        spread = "-" if it["spread"] is None else f"{it['spread']:.1%}"
        busy = _median(result["runs"][label], M.LINK_BUSY_DURING_GRANTS)
        deadline = _median(result["runs"][label], M.GRANTS_RELEASED_BY_DEADLINE)
        lines.append(
            f"| {label} | {it['median']:.3f} | {spread} | {'-' if busy is None else f'{busy:.0%}'} "
            f"| {'-' if deadline is None else f'{deadline:g}'} |"
        )
    step = result["steps"][0]
    noise = "-" if step["noise_floor"] is None else f"{step['noise_floor']:.1%}"
    lines += ["", f"borrowing over no borrowing: {step['speedup']:.3f}x (noise floor {noise})"]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experiments", default="sharing,default")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=8)
    ap.add_argument("--out", type=Path, default=Path("results") / f"borrow-{time.strftime('%Y%m%d-%H%M%S')}")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    tables, results = [], {}
    launcher = Launcher(args.out / "launcher.log")
    try:
        for name in args.experiments.split(","):
            base = load_experiment(name).with_overrides(iterations=args.iterations, policy="atlas")
            runs: dict[str, list[dict]] = {label: [] for label in VARIANTS}
            for k in range(args.repeat):
                for label, borrow in VARIANTS.items():
                    run_dir = args.out / name / f"{label.replace(' ', '-')}-{k}"
                    exp = base.with_overrides(atlas_borrow=borrow)
                    runs[label].append(run_experiment(exp, run_dir, progress=lambda line: None, launcher=launcher))
            result = {"experiment": name, "repeat": args.repeat, "runs": runs, **aggregate(runs)}
            results[name] = {"stats": result["stats"], "steps": result["steps"]}
            tables.append(table(name, result))
            print(tables[-1], flush=True)
    finally:
        launcher.close()
    (args.out / "borrow.md").write_text("\n\n".join(tables) + "\n")
    (args.out / "borrow.json").write_text(json.dumps(results, indent=1))
    print(f"tables in {args.out / 'borrow.md'}")


if __name__ == "__main__":
    with tears_down_on_signals():  # SIGTERM, SIGHUP and Ctrl-C tear the network down
        main()
