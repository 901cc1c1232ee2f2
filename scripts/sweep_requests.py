#!/usr/bin/env python3
"""BubbleTea sweep: utilization, TTFT and training slowdown over the request rate, with repeats.

For each rate and repeat, trains the experiment with ``POLICY`` and with ``POLICY+bubbletea``
(interleaved, as ``testbed compare`` does), with synthetic requests at that rate (fitted to the
Azure LLM inference trace of 2023). Writes ``sweep_requests_runs.csv`` (one row per pair),
``sweep_requests.csv`` (per rate: medians, min and max over the repeats, and the noise floor, the
plain runs' own spread) and ``sweep_requests.png`` (``results/request_sweep.py``), and records the
results page's rows in ``docs/results/request_sweep_<experiment>.json`` (``results/published.py``;
then ``scripts/reference_pages.py`` renders the page; ``--no-record`` leaves both alone). Figures
only; nothing asserted.

Run as root: .venv/bin/python scripts/sweep_requests.py [EXPERIMENT] [--rates 1,4,16] [--repeat 3]
             [--policy atlas] [--iterations 8] [--out DIR] [--reanalyze] [--no-record]

``--reanalyze`` runs nothing: it recomputes every run folder's summary under ``--out`` with this
checkout's analysis (``testbed analyze``'s) and writes the tables and plot again.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import pandas as pd

from testbed.results.published import Column, record_result
from testbed.results.report import finalize
from testbed.results.request_sweep import (
    PAGE_COLUMNS,
    SLO_SHARE,
    page_rows,
    plot_request_sweep,
    slo_operating_point,
    sweep_row,
    sweep_summary,
)
from testbed.run.interrupts import tears_down_on_signals
from testbed.run.runner import run_experiment
from testbed.spec.experiment_file import load_experiment
from testbed.trace import metrics as M

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("experiment", nargs="?", default=None, help="experiment file or shipped name (default: default)")
    ap.add_argument("--rates", default="1,4,16", help="synthetic requests per second (default 1,4,16)")
    ap.add_argument("--repeat", type=int, default=3, help="pairs of runs per rate (default 3)")
    ap.add_argument("--policy", default="atlas", help="network policy, run with and without +bubbletea (default atlas)")
    ap.add_argument("--iterations", type=int, default=8, help="iterations per run (default 8)")
    ap.add_argument(
        "--out",
        type=Path,
        default=Path("results") / f"sweep-requests-{time.strftime('%Y%m%d-%H%M%S')}",
        help="folder for the tables, the plot and the run folders",
    )
    ap.add_argument(
        "--reanalyze", action="store_true", help="recompute the summaries of the run folders under --out; run nothing"
    )
    ap.add_argument("--no-record", action="store_true", help="leave docs/results/request_sweep_*.json as they are")
    args = ap.parse_args()
    if args.repeat < 1:
        ap.error(f"--repeat {args.repeat}: give 1 or more pairs of runs per rate")
    base = load_experiment(args.experiment).with_overrides(iterations=args.iterations)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for rate in (float(r) for r in args.rates.split(",")):
        exp = base.with_overrides(bubbletea=replace(base.bubbletea, request_rate=rate))
        for i in range(args.repeat):
            plain, bt = (
                finalize(args.out / f"{policy}-{rate:g}-{i}")
                if args.reanalyze
                else run_experiment(
                    exp.with_overrides(policy=policy), args.out / f"{policy}-{rate:g}-{i}", progress=lambda line: None
                )
                for policy in (args.policy, f"{args.policy}+bubbletea")
            )
            row = sweep_row(rate, i, plain, bt)
            rows.append(row)
            print(
                f"rate {rate:>6g}/s #{i}: slowdown {row['training_slowdown'] - 1:+.1%}, GPU utilization "
                f"{plain.get('gpu_utilization')} without BubbleTea, {row['gpu_utilization']} with it "
                f"(training's share {row['training_gpu_utilization']}), fill {row['bubble_fill_fraction']}, "
                f"requests {row['requests_completed']}/{row['requests_assigned']}, TTFT p50 {row['ttft_p50_s']} s "
                f"p99 {row['ttft_p99_s']} s, TTFT SLO met {row[M.TTFT_SLO_ATTAINMENT]} (absolute) "
                f"{row[M.TTFT_SCALED_SLO_ATTAINMENT]} (scaled), delayed ops {row['training_ops_delayed_by_prefill']}, "
                f"ops started >1 ms after their input {row[M.TRAINING_OPS_STARTED_LATE]} with BubbleTea, "
                f"{row[M.TRAINING_OPS_STARTED_LATE + '_plain']} without (of {row[M.TRAINING_OPS_WITH_INPUT]})",
                flush=True,
            )
    runs = pd.DataFrame(rows)
    runs.to_csv(args.out / "sweep_requests_runs.csv", index=False)
    summary = sweep_summary(runs)
    summary.to_csv(args.out / "sweep_requests.csv", index=False)
    plot_request_sweep(summary, args.out / "sweep_requests.png", f"BubbleTea on {base.name} ({args.policy})")
    print(summary.to_string(index=False))
    for column, what in ((M.TTFT_SCALED_SLO_ATTAINMENT, "the scaled TTFT SLO"), (M.TTFT_SLO_ATTAINMENT, "ttft_slo_s")):
        point = slo_operating_point(summary, column)
        print(
            f"highest GPU utilization with {SLO_SHARE:.0%} of requests meeting {what}: "
            + (
                f"{point[M.GPU_UTILIZATION]:.3f} at {point['rate_per_s']:g} requests/s ({point['attainment']:.0%} met)"
                if point
                else "none of the rates swept"
            )
        )
    print(f"wrote {args.out / 'sweep_requests.csv'} and {args.out / 'sweep_requests.png'}")
    if not args.no_record:
        columns = [Column(header, cells) for header, cells in PAGE_COLUMNS]
        command = ("scripts/sweep_requests.py " + " ".join(sys.argv[1:])).strip()
        path = record_result(
            REPO,
            f"request_sweep_{base.name}",
            columns,
            page_rows(summary, base.name),
            "scripts/sweep_requests.py",
            command,
        )
        print(f"recorded for the results page in {path}: run scripts/reference_pages.py to show it")


if __name__ == "__main__":
    with tears_down_on_signals():  # SIGTERM, SIGHUP and Ctrl-C tear the network down
        main()
