#!/usr/bin/env python3
"""Training on a WAN that changes, measured beside the simulator's prediction for the same profile.

- ``wan_day`` (the default experiment on three_dc_day: east-central's capacity follows a diurnal
  curve over 120 s, central-west flaps and fails over through east) under ``pp-fair`` and
  ``atlas``: the iteration time per band of east-central's rate and while central-west is down
  (routed around it), each beside the prediction for the phases those iterations began in
  (``testbed plan``'s per-phase prediction: ``make_plan`` on the topology as it is then, placed as
  at the start);
- ``sharing_burst`` (four pipelines sharing a link another tenant squeezes from 25 to 3 Mbit/s
  between 20 s and 50 s) under ``pp-fair`` and ``atlas``: per phase, and whether Atlas's planned
  order on the link differs from the first phase's (``replans.jsonl``);
- the default experiment on the region-based topology ``regions_us_eu`` (three cloud regions, their
  measured RTT and throughput scaled by 0.02) under each policy, beside its prediction.

Each row gives the iterations measured (warm-up left out), their mean, the prediction and the error
(measured - predicted) / measured. Records ``docs/results/wan_changes.json`` (shown in
docs/topologies-and-experiments.md) with ``--record``.

Run as root: .venv/bin/python scripts/wan_changes.py [--out DIR] [--record] [--only wan_day,sharing_burst,regions]
[--runs DIR: the run folders of an earlier call, analysed again]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testbed.plan.profile_phases import experiment_at, profile_phases
from testbed.plan.run_plan import make_plan
from testbed.results.analysis import iteration_times
from testbed.results.published import Column, commit, record_result
from testbed.run.interrupts import tears_down_on_signals
from testbed.run.runner import run_experiment
from testbed.spec.experiment import Experiment
from testbed.spec.experiment_file import load_experiment
from testbed.trace.events import read_events
from testbed.trace.jsonl import read_jsonl
from testbed.trace.shaping_log import PROFILE_STEP, SHAPING_LOG

REPO = Path(__file__).resolve().parents[1]
POLICIES = ("pp-fair", "atlas")
COLUMNS = [
    Column("experiment", ("{experiment}",)),
    Column("policy", ("{policy}",)),
    Column("WAN then", ("{phase}",)),
    Column("iterations", ("{iterations}",)),
    Column("measured s", ("{measured_s:.3f}",)),
    Column("predicted s", ("{predicted_s:.3f}",)),
    Column("error", ("{error:+.1%}",)),
    Column("Atlas's plan", ("{plan_note}",)),
]


def predicted_by_phase(exp: Experiment) -> list[tuple[int, int | None, float | None, dict]]:
    """(start µs, end µs, predicted iteration s or None where a link is down without failover,
    the phase's states) of each phase of one cycle of ``exp``'s profiles."""
    base = make_plan(exp)
    out = []
    for ph in profile_phases(exp.topology_spec):
        if ph.stalled(exp.topology_spec):
            out.append((ph.start_us, ph.end_us, None, ph.states))
            continue
        at = experiment_at(exp, ph.states, list(base.workers))
        out.append((ph.start_us, ph.end_us, make_plan(at, list(base.workers)).predicted_iteration_s, ph.states))
    return out


def phase_of(phases: list, cycle_us: int | None, t_us: float) -> int:
    """The index of the phase ``t_us`` (after the profiles' start) falls in, the cycle looping."""
    if cycle_us:
        t_us %= cycle_us
    return max(i for i, (start, _, _, _) in enumerate(phases) if start <= t_us)


def measured_iterations(run: Path, warmup: int) -> list[tuple[float, float]]:
    """(start s after the profiles' start, duration s) of each measured iteration of ``run``."""
    steps = [r for r in read_jsonl(run / SHAPING_LOG) if r.get("event") == PROFILE_STEP]
    t0 = min(r["due_ns"] - r["profile_t_us"] * 1000 for r in steps)
    it = iteration_times(read_events(run), warmup)
    return [((s - t0) / 1e9, d) for s, d in zip(it["start_ns"], it["duration_s"])]


def group_rows(exp: Experiment, run: Path, policy: str, band) -> list[dict]:
    """Rows of one run: its measured iterations grouped by ``band(states)`` (a label), each group's
    mean beside the mean prediction of the phases its iterations began in."""
    phases = predicted_by_phase(exp.with_overrides(policy=policy))
    looping = [x.profile.period_us for x in exp.topology_spec.links if x.profile and x.profile.period_us]
    cycle = max(looping) if looping else None
    groups: dict[str, list[tuple[float, float | None]]] = {}
    for t, d in measured_iterations(run, exp.warmup_iterations):
        _, _, predicted, states = phases[phase_of(phases, cycle, t * 1e6)]
        groups.setdefault(band(states), []).append((d, predicted))
    replans = read_jsonl(run / "replans.jsonl") if (run / "replans.jsonl").exists() else []
    rows = []
    for label, items in groups.items():
        measured = statistics.fmean(d for d, _ in items)
        preds = [p for _, p in items if p is not None]
        predicted = statistics.fmean(preds) if len(preds) == len(items) else None
        rows.append(
            {
                "experiment": exp.name,
                "policy": policy,
                "phase": label,
                "iterations": len(items),
                "measured_s": measured,
                "predicted_s": predicted,
                "error": (measured - predicted) / measured if predicted else None,
                "plan_note": (
                    f"{len(replans)} re-plans, {statistics.median(r['planning_ms'] for r in replans):.1f} ms each"
                    if replans and policy == "atlas"
                    else None
                ),
            }
        )
    return rows


def day_band(states: dict) -> str:
    if not states["central:west"].up:
        return "central-west down, routed through east"
    rate = states["east:central"].rate_bps / 1e6
    low = min(80, int(rate // 20) * 20)
    return f"east-central {low}-{low + 20} Mbit/s"


def burst_band(states: dict) -> str:
    return f"east-west {states['east:west'].rate_bps / 1e6:g} Mbit/s"


#: where earlier runs are read from instead of running again (``--runs``)
REUSE: Path | None = None


def run_one(exp: Experiment, out: Path, policy: str) -> Path:
    if REUSE is not None:
        return REUSE / f"{exp.name}-{policy}"
    folder = out / f"{exp.name}-{policy}"
    print(f"{exp.name} under {policy} ({exp.iterations} iterations) ...", flush=True)
    run_experiment(exp.with_overrides(policy=policy), folder, progress=lambda _: None)
    return folder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / "results" / f"wan_changes-{time.strftime('%Y%m%d-%H%M%S')}")
    ap.add_argument("--record", action="store_true", help="write docs/results/wan_changes.json")
    ap.add_argument("--only", default="wan_day,sharing_burst,regions")
    ap.add_argument("--runs", type=Path, help="analyse the run folders an earlier call left in DIR instead of running")
    args = ap.parse_args()
    global REUSE
    REUSE = args.runs
    at_commit = commit(REPO)
    only = args.only.split(",")
    rows: list[dict] = []
    if "wan_day" in only:
        exp = load_experiment("wan_day")
        for policy in POLICIES:
            rows += sorted(group_rows(exp, run_one(exp, args.out, policy), policy, day_band), key=lambda r: r["phase"])
    if "sharing_burst" in only:
        exp = load_experiment("sharing_burst")
        for policy in POLICIES:
            folder = run_one(exp, args.out, policy)
            rows += group_rows(exp, folder, policy, burst_band)
            if policy == "atlas" and (folder / "replans.jsonl").exists():
                orders = [r["order"]["east->west"] for r in read_jsonl(folder / "replans.jsonl")]
                print(f"  atlas's order on east->west at each re-plan: {[o[:8] for o in orders]}")
    if "regions" in only:
        exp = load_experiment().with_overrides(topology="regions_us_eu", iterations=8)
        for policy in POLICIES:
            folder = run_one(exp, args.out, policy)
            summary = json.loads((folder / "summary.json").read_text())
            measured, predicted = summary["iteration_time_s"], summary["predicted_iteration_time_s"]
            rows.append(
                {
                    "experiment": "default on regions_us_eu",
                    "policy": policy,
                    "phase": "aws:us-east-1, azure:westus, gcp:europe-west4-a (x 0.02)",
                    "iterations": summary["completed_iterations"] - summary["warmup_iterations"],
                    "measured_s": measured,
                    "predicted_s": predicted,
                    "error": (measured - predicted) / measured,
                }
            )
    for r in rows:
        pred = f"{r['predicted_s']:.3f}" if r["predicted_s"] else "-"
        head = f"{r['experiment']:>26} {r['policy']:>8} {r['phase']:<46}"
        print(f"{head} n={r['iterations']:<3} {r['measured_s']:.3f} s (predicted {pred})")
    if args.record:
        command = "sudo .venv/bin/python scripts/wan_changes.py " + " ".join(sys.argv[1:])
        print(record_result(REPO, "wan_changes", COLUMNS, rows, "scripts/wan_changes.py", command, at_commit))


if __name__ == "__main__":
    with tears_down_on_signals():  # SIGTERM, SIGHUP and Ctrl-C tear the network down
        main()
