#!/usr/bin/env python3
"""Atlas's ablation table: from pp-fair to atlas one part at a time (``spec/policy.py``'s
``ABLATION``: largest DCs first, Atlas's DC selection, striping, FIFO grants, planned grants), on the
default experiment, four_dc and the sharing-bound experiment, with medians and noise floors.

For each experiment, one ``compare --ablation`` invocation (runs interleaved, ``--repeat`` each).
Writes ``ablation.md`` (one table per experiment: median iteration time, its spread against
itself, each step's speed-up over the step before with the larger of the two spreads as its noise
floor) and ``ablation.json`` next to the comparison folders; prints the tables; and records the
table the results page shows in ``docs/results/ablation.json`` (``results/published.py``; then
``scripts/reference_pages.py`` renders the page; ``--no-record`` leaves both alone). The issue's
targets are printed beside the figures; nothing is asserted.

Run as root: .venv/bin/python scripts/ablation.py [--experiments default,four_dc,sharing] [--repeat 3]
             [--iterations 8] [--out DIR] [--no-record]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testbed.results.published import Column, commit, record_result
from testbed.run.compare import compare
from testbed.run.interrupts import tears_down_on_signals
from testbed.spec.experiment_file import load_experiment
from testbed.spec.policy import ABLATION
from testbed.trace import metrics as M

#: the Atlas issue's targets (not done-criteria), printed beside the figures
TARGETS = {
    "sharing": "planned grants >= 1.2x over TCP fair sharing at the same placement and striping",
    "default": "atlas >= 1.2x over pp-fair and >= 1.5x over dp-wan",
}


def table(name: str, result: dict) -> str:
    stats, steps = result["stats"], {s["to"]: s for s in result["steps"]}
    lines = [
        f"### {name}",
        "",
        "| step | policy | iteration s (median) | spread | speed-up over the step before | noise floor |",
        "|---|---|---|---|---|---|",
    ]
    for i, policy in enumerate(ABLATION):
        st = stats[policy][M.ITERATION_TIME_S]
        spread = "-" if st["spread"] is None else f"{st['spread']:.1%}"
        step = steps.get(policy)
        sp = "-" if not step or step["speedup"] is None else f"{step['speedup']:.3f}x"
        noise = "-" if not step or step["noise_floor"] is None else f"{step['noise_floor']:.1%}"
        lines.append(f"| {i} | `{policy}` | {st['median']:.3f} | {spread} | {sp} | {noise} |")
    total = result["speedup"].get(f"{ABLATION[-1]}/{ABLATION[0]}")
    if total:
        lines.append("")
        lines.append(f"all parts (atlas over pp-fair): {total:.3f}x")
    if name in TARGETS:
        lines.append(f"target: {TARGETS[name]}")
    return "\n".join(lines)


#: each step of ``ABLATION`` as the results page names it
STEP_LABELS = (
    "`pp-fair` (file order)",
    "+ largest DCs first",
    "+ Atlas's DC selection",
    "+ striping",
    "+ FIFO grants",
    "+ planned grants (= `atlas`)",
)
REPO = Path(__file__).resolve().parents[1]


def page_table(results: dict, topologies: dict[str, str]) -> tuple[list[Column], list[dict]]:
    """The results page's table: a row per step (each experiment's median iteration time, and its
    speed-up over the step before with the noise floor), then all parts' speed-up."""
    columns = [Column("step", ("{step}",))]
    rows: list[dict] = [{"step": label} for label in STEP_LABELS] + [{"step": "all parts"}]
    for name, result in results.items():
        header = name if topologies[name] == name else f"{name} ({topologies[name]})"
        columns += [
            Column(header, (f"{{{name}_s:.3f}} s",)),
            Column("speed-up (noise)", (f"{{{name}_speedup:.3f}}x ({{{name}_noise:.1%}})", f"{{{name}_speedup:.3f}}x")),
        ]
        steps = {s["to"]: s for s in result["steps"]}
        for row, policy in zip(rows, ABLATION):
            row[f"{name}_s"] = result["stats"][policy][M.ITERATION_TIME_S]["median"]
            if policy in steps:
                row[f"{name}_speedup"] = steps[policy]["speedup"]
                row[f"{name}_noise"] = steps[policy]["noise_floor"]
        rows[-1][f"{name}_speedup"] = result["speedup"].get(f"{ABLATION[-1]}/{ABLATION[0]}")
    return columns, rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experiments", default="default,four_dc,sharing")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=8)
    ap.add_argument("--out", type=Path, default=Path("results") / f"ablation-{time.strftime('%Y%m%d-%H%M%S')}")
    ap.add_argument("--no-record", action="store_true", help="leave docs/results/ablation.json as it is")
    args = ap.parse_args()
    at_commit = commit(REPO)  # the runs' commit, before a recorded table changes the tree
    assert len(STEP_LABELS) == len(ABLATION), "a step of ABLATION has no label on the results page"
    args.out.mkdir(parents=True, exist_ok=True)
    tables, results, topologies = [], {}, {}
    for name in args.experiments.split(","):
        exp = load_experiment(name).with_overrides(iterations=args.iterations)
        topologies[name] = exp.topology_spec.name
        result = compare(exp, list(ABLATION), args.out / name, args.repeat, progress=lambda line: None, ablation=True)
        results[name] = {"stats": result["stats"], "steps": result["steps"], "speedup": result["speedup"]}
        tables.append(table(name, result))
        print(tables[-1], flush=True)
    (args.out / "ablation.md").write_text("\n\n".join(tables) + "\n")
    (args.out / "ablation.json").write_text(json.dumps(results, indent=1))
    print(f"tables in {args.out / 'ablation.md'}")
    if not args.no_record:
        command = "scripts/ablation.py " + " ".join(sys.argv[1:])
        path = record_result(
            REPO,
            "ablation",
            *page_table(results, topologies),
            "scripts/ablation.py",
            command.strip(),
            at_commit=at_commit,
        )
        print(f"recorded for the results page in {path}: run scripts/reference_pages.py to show it")


if __name__ == "__main__":
    with tears_down_on_signals():  # SIGTERM, SIGHUP and Ctrl-C tear the network down
        main()
