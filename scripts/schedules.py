#!/usr/bin/env python3
"""The schedules the field runs today across DCs: per schedule (GPipe, 1F1B, interleaved 1F1B,
ZB-H1, ZB-V) on the shipped experiments, the measured iteration time, bubble fraction and the part
of it the WAN causes, under pp-fair, atlas and atlas+bubbletea, with noise floors; and the same in
the simulator at paper scale for the shipped scenarios.

For each experiment and schedule, one ``compare`` invocation (the three policies interleaved,
``--repeat`` each). The bubble the WAN causes is the measured bubble fraction less the one the
same table leaves with every transfer instant (``sim/figures.wan_free_bubble_fraction``). Atlas's
speed-up over pp-fair is quoted with its noise floor (the larger spread of the two against
themselves); BubbleTea's gain is the GPU utilization prefill adds, its cost the training slowdown
beside its noise floor. A schedule the experiment's layout cannot run (``spec/pipeline_schedules.py``'s
rules) is listed with the reason, never reshaped.

Writes ``schedules.json`` and ``schedules.md`` beside the comparison folders, prints the tables,
and records the results page's tables in ``docs/results/schedules_emulated.json`` and
``docs/results/schedules_paper_scale.json`` (``results/published.py``; then
``scripts/reference_pages.py`` renders the page; ``--no-record`` leaves them alone).

Run as root: .venv/bin/python scripts/schedules.py [--experiments default,four_dc,sharing|none]
             [--schedules gpipe,1f1b,interleaved-1f1b,zb-h1,zbv] [--repeat 2] [--iterations 6]
             [--scenarios all|none|NAME,...] [--out DIR] [--no-record]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testbed.errors import SpecError
from testbed.plan.placement import place
from testbed.plan.run_plan import make_plan
from testbed.results.compare import noise_floor
from testbed.results.published import Column, commit, record_result, table_markdown
from testbed.run.compare import compare
from testbed.run.interrupts import tears_down_on_signals
from testbed.sim.figures import simulate_policy, wan_free_bubble_fraction
from testbed.spec.experiment_file import load_experiment
from testbed.spec.pipeline_schedules import SCHEDULES
from testbed.spec.scenario_file import load_scenario, shipped_scenarios
from testbed.trace import metrics as M

POLICIES = ("pp-fair", "atlas", "atlas+bubbletea")
REPO = Path(__file__).resolve().parents[1]


def emulated(exp, out: Path, repeat: int) -> dict:
    """One experiment under one schedule: each policy's medians and spreads, the WAN-free bubble,
    atlas's speed-up over pp-fair and BubbleTea's gain and slowdown, with their noise floors."""
    result = compare(exp, list(POLICIES), out, repeat, progress=lambda line: None)
    stats = result["stats"]
    row: dict = {"wan_free_bubble": wan_free_bubble_fraction(exp, place(exp))}
    for policy in POLICIES:
        st = stats[policy]
        row[policy] = {
            "iteration_s": st[M.ITERATION_TIME_S]["median"],
            "spread": st[M.ITERATION_TIME_S]["spread"],
            "bubble": st[M.BUBBLE_FRACTION]["median"],
            "training_util": st[M.TRAINING_GPU_UTILIZATION]["median"],
            "util": st[M.GPU_UTILIZATION]["median"],
        }
        row[policy]["wan_bubble"] = row[policy]["bubble"] - row["wan_free_bubble"]
    row["atlas_speedup"] = result["speedup"].get("atlas/pp-fair")
    row["atlas_noise"] = noise_floor(stats, "atlas", "pp-fair")
    bt = result["bubbletea"].get("atlas+bubbletea", {})
    row["bt_slowdown"], row["bt_noise"] = bt.get("training_slowdown"), bt.get("noise_floor")
    row["bt_fill"] = stats["atlas+bubbletea"][M.BUBBLE_FILL_FRACTION]["median"]
    row["bt_gain"] = row["atlas+bubbletea"]["util"] - row["atlas+bubbletea"]["training_util"]
    return row


def paper_scale(scenario: str, schedule: str) -> dict:
    """The simulator's figures of ``scenario`` under ``schedule`` for each policy."""
    sc = load_scenario(scenario)
    exp = sc.experiment().with_overrides(schedule=schedule)
    row: dict = {"wan_free_bubble": wan_free_bubble_fraction(exp, place(exp))}
    # Atlas's DC selection once for both atlas policies (BubbleTea does not move the stages)
    atlas = list(make_plan(exp.with_overrides(policy="atlas")).workers)
    for policy in POLICIES:
        f = simulate_policy(exp, policy, workers=atlas if policy.startswith("atlas") else None)
        row[policy] = {
            "iteration_s": f.iteration_time_s,
            "bubble": f.bubble_fraction,
            "util": f.gpu_utilization,
            "training_util": f.training_gpu_utilization,
        }
    row["atlas_speedup"] = row["pp-fair"]["iteration_s"] / row["atlas"]["iteration_s"]
    row["bt_gain"] = row["atlas+bubbletea"]["util"] - row["atlas+bubbletea"]["training_util"]
    return row


def emulated_table(results: dict) -> tuple[list[Column], list[dict]]:
    """A row per experiment and schedule: iteration time per policy (with its spread), the bubble and
    its WAN part under pp-fair and atlas, atlas's speed-up (noise), BubbleTea's fill, gain and
    slowdown (noise)."""
    columns = [
        Column("experiment", ("{experiment}",)),
        Column("schedule", ("`{schedule}`: {skipped}", "`{schedule}`")),
        Column("pp-fair s (spread)", ("{pp_s:.3f} ({pp_spread:.1%})", "{pp_s:.3f}")),
        Column("atlas s (spread)", ("{at_s:.3f} ({at_spread:.1%})", "{at_s:.3f}")),
        Column("bubble pp-fair / atlas", ("{pp_bubble:.2f} / {at_bubble:.2f}",)),
        Column("of it the WAN's", ("{pp_wan:.2f} / {at_wan:.2f}",)),
        Column("atlas over pp-fair (noise)", ("{speedup:.3f}x ({noise:.1%})", "{speedup:.3f}x")),
        Column("BubbleTea: idle filled, GPU util added", ("{fill:.0%}, +{gain:.2f}",)),
        Column("training slowdown (noise)", ("{slowdown:.3f}x ({bt_noise:.1%})", "{slowdown:.3f}x")),
    ]
    return columns, table_rows(
        results,
        "experiment",
        lambda r: {
            "pp_s": r["pp-fair"]["iteration_s"],
            "pp_spread": r["pp-fair"]["spread"],
            "at_s": r["atlas"]["iteration_s"],
            "at_spread": r["atlas"]["spread"],
            "pp_bubble": r["pp-fair"]["bubble"],
            "at_bubble": r["atlas"]["bubble"],
            "pp_wan": r["pp-fair"]["wan_bubble"],
            "at_wan": r["atlas"]["wan_bubble"],
            "speedup": r["atlas_speedup"],
            "noise": r["atlas_noise"],
            "fill": r["bt_fill"],
            "gain": r["bt_gain"],
            "slowdown": r["bt_slowdown"],
            "bt_noise": r["bt_noise"],
        },
    )


def paper_table(results: dict) -> tuple[list[Column], list[dict]]:
    """A row per scenario and schedule: the simulated iteration per policy, the bubble and its WAN
    part, atlas's speed-up and the GPU utilization BubbleTea's prefill adds."""
    columns = [
        Column("scenario", ("{scenario}",)),
        Column("schedule", ("`{schedule}`: {skipped}", "`{schedule}`")),
        Column("pp-fair s", ("{pp_s:.2f}",)),
        Column("atlas s", ("{at_s:.2f}",)),
        Column("bubble pp-fair / atlas", ("{pp_bubble:.2f} / {at_bubble:.2f}",)),
        Column("WAN-free bubble", ("{free:.2f}",)),
        Column("atlas over pp-fair", ("{speedup:.3f}x",)),
        Column("GPU util BubbleTea adds", ("+{gain:.2f}",)),
    ]
    return columns, table_rows(
        results,
        "scenario",
        lambda r: {
            "pp_s": r["pp-fair"]["iteration_s"],
            "at_s": r["atlas"]["iteration_s"],
            "pp_bubble": r["pp-fair"]["bubble"],
            "at_bubble": r["atlas"]["bubble"],
            "free": r["wan_free_bubble"],
            "speedup": r["atlas_speedup"],
            "gain": r["bt_gain"],
        },
    )


def table_rows(results: dict, label: str, cells) -> list[dict]:
    """A row per (``label``: experiment or scenario) and schedule: ``cells(result)``, or the reason
    the schedule was skipped."""
    return [
        {label: name, "schedule": schedule, **({"skipped": r["skipped"]} if "skipped" in r else cells(r))}
        for name, per in results.items()
        for schedule, r in per.items()
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experiments", default="default,four_dc,sharing", help="shipped experiments to run, or none")
    ap.add_argument("--schedules", default=",".join(SCHEDULES))
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--iterations", type=int, default=6)
    ap.add_argument("--scenarios", default="all", help="shipped scenarios to simulate: all, none or NAME,...")
    ap.add_argument("--out", type=Path, default=Path("results") / f"schedules-{time.strftime('%Y%m%d-%H%M%S')}")
    ap.add_argument("--no-record", action="store_true", help="leave docs/results/schedules_*.json as they are")
    args = ap.parse_args()
    at_commit = commit(REPO)  # the runs' commit, before a recorded table changes the tree
    args.out.mkdir(parents=True, exist_ok=True)
    schedules = args.schedules.split(",")
    emulator: dict = {}
    for name in [] if args.experiments == "none" else args.experiments.split(","):
        emulator[name] = {}
        for schedule in schedules:
            t = time.monotonic()
            try:
                exp = load_experiment(name).with_overrides(iterations=args.iterations, schedule=schedule)
            except SpecError as e:
                emulator[name][schedule] = {"skipped": f"{e.field} {e.value} {e.problem}"}
                print(f"{name} {schedule}: skipped: {e}", flush=True)
                continue
            emulator[name][schedule] = emulated(exp, args.out / name / schedule, args.repeat)
            r = emulator[name][schedule]
            print(
                f"{name} {schedule}: pp-fair {r['pp-fair']['iteration_s']:.3f} s, "
                f"atlas {r['atlas']['iteration_s']:.3f} s "
                f"({r['atlas_speedup']:.3f}x), bubble {r['pp-fair']['bubble']:.2f}/{r['atlas']['bubble']:.2f} "
                f"(WAN-free {r['wan_free_bubble']:.2f}), BubbleTea fill {r['bt_fill']}, "
                f"slowdown {r['bt_slowdown']} [{time.monotonic() - t:.0f} s]",
                flush=True,
            )
    scenarios = (
        shipped_scenarios()
        if args.scenarios == "all"
        else []
        if args.scenarios == "none"
        else args.scenarios.split(",")
    )
    paper: dict = {}
    for name in scenarios:
        paper[name] = {}
        for schedule in schedules:
            t = time.monotonic()
            try:
                paper[name][schedule] = paper_scale(name, schedule)
            except SpecError as e:
                paper[name][schedule] = {"skipped": f"{e.field} {e.value} {e.problem}"}
                print(f"{name} {schedule}: skipped: {e}", flush=True)
                continue
            r = paper[name][schedule]
            print(
                f"{name} {schedule}: pp-fair {r['pp-fair']['iteration_s']:.2f} s, "
                f"atlas {r['atlas']['iteration_s']:.2f} s "
                f"({r['atlas_speedup']:.3f}x), bubble {r['pp-fair']['bubble']:.2f}/{r['atlas']['bubble']:.2f} "
                f"(WAN-free {r['wan_free_bubble']:.2f}), BubbleTea +{r['bt_gain']:.2f} [{time.monotonic() - t:.0f} s]",
                flush=True,
            )
    (args.out / "schedules.json").write_text(json.dumps({"emulator": emulator, "paper_scale": paper}, indent=1))
    tables = []
    if emulator:
        tables.append(table_markdown(*emulated_table(emulator)))
    if paper:
        tables.append(table_markdown(*paper_table(paper)))
    (args.out / "schedules.md").write_text("\n\n".join(tables) + "\n")
    print("\n\n".join(tables))
    if not args.no_record:
        command = ("scripts/schedules.py " + " ".join(sys.argv[1:])).strip()
        if emulator:
            path = record_result(
                REPO,
                "schedules_emulated",
                *emulated_table(emulator),
                "scripts/schedules.py",
                command,
                at_commit=at_commit,
            )
            print(f"recorded in {path}")
        if paper:
            path = record_result(
                REPO, "schedules_paper_scale", *paper_table(paper), "scripts/schedules.py", command, at_commit=at_commit
            )
            print(f"recorded in {path}")
        print("run scripts/reference_pages.py to show them on the results page")


if __name__ == "__main__":
    with tears_down_on_signals():  # SIGTERM, SIGHUP and Ctrl-C tear the network down
        main()
