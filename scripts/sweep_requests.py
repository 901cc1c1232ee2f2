#!/usr/bin/env python3
"""BubbleTea sweep: TTFT, bubble fill and training slowdown over the request rate.

For each rate, trains the experiment with ``POLICY`` and with ``POLICY+bubbletea`` (interleaved, in
one invocation, as ``testbed compare`` does), with synthetic requests at that rate (fitted to the
Azure LLM inference trace of 2023). Writes ``sweep_requests.csv`` (one row per rate) and
``sweep_requests.png`` (TTFT p50/p99, fill fraction and slowdown against the rate), to show where
TTFT and slowdown start to grow. Figures only; nothing asserted.

Run as root: .venv/bin/python scripts/sweep_requests.py [EXPERIMENT] [--rates 1,4,16]
             [--policy atlas] [--iterations 8] [--out DIR]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

import pandas as pd

from testbed.run.interrupts import tears_down_on_signals
from testbed.run.runner import run_experiment
from testbed.spec.experiment_file import load_experiment


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("experiment", nargs="?", default=None, help="experiment file or shipped name (default: default)")
    ap.add_argument("--rates", default="1,4,16", help="synthetic requests per second (default 1,4,16)")
    ap.add_argument("--policy", default="atlas", help="network policy, run with and without +bubbletea (default atlas)")
    ap.add_argument("--iterations", type=int, default=8, help="iterations per run (default 8)")
    ap.add_argument(
        "--out",
        type=Path,
        default=Path("results") / f"sweep-requests-{time.strftime('%Y%m%d-%H%M%S')}",
        help="folder for the table, the plot and the run folders",
    )
    args = ap.parse_args()
    base = load_experiment(args.experiment).with_overrides(iterations=args.iterations)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for rate in (float(r) for r in args.rates.split(",")):
        exp = base.with_overrides(bubbletea=replace(base.bubbletea, request_rate=rate))
        plain = run_experiment(
            exp.with_overrides(policy=args.policy), args.out / f"{args.policy}-{rate:g}", progress=lambda line: None
        )
        bt = run_experiment(
            exp.with_overrides(policy=f"{args.policy}+bubbletea"),
            args.out / f"{args.policy}+bubbletea-{rate:g}",
            progress=lambda line: None,
        )
        row = {
            "rate_per_s": rate,
            "iteration_time_s": plain["iteration_time_s"],
            "iteration_time_bubbletea_s": bt["iteration_time_s"],
            "training_slowdown": bt["iteration_time_s"] / plain["iteration_time_s"],
            **{
                k: bt[k]
                for k in (
                    "gpu_utilization",
                    "training_gpu_utilization",
                    "bubble_fill_fraction",
                    "prefill_tokens_per_s",
                    "requests_assigned",
                    "requests_completed",
                    "ttft_p50_s",
                    "ttft_p99_s",
                    "training_ops_delayed_by_prefill",
                )
            },
        }
        rows.append(row)
        print(
            f"rate {rate:>6g}/s: slowdown {row['training_slowdown'] - 1:+.1%}, GPU utilization "
            f"{row['training_gpu_utilization']:.2f} -> {row['gpu_utilization']:.2f}, "
            f"fill {row['bubble_fill_fraction']:.2f}, "
            f"requests {row['requests_completed']}/{row['requests_assigned']}, TTFT p50 {row['ttft_p50_s']} s "
            f"p99 {row['ttft_p99_s']} s, delayed ops {row['training_ops_delayed_by_prefill']}",
            flush=True,
        )
    df = pd.DataFrame(rows)
    df.to_csv(args.out / "sweep_requests.csv", index=False)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    a.plot(df["rate_per_s"], df["ttft_p50_s"], "o-", label="TTFT p50")
    a.plot(df["rate_per_s"], df["ttft_p99_s"], "s--", label="TTFT p99")
    a.set_xscale("log")
    a.set_xlabel("requests per second")
    a.set_ylabel("seconds")
    a.set_ylim(bottom=0)
    a.legend()
    b.plot(df["rate_per_s"], df["bubble_fill_fraction"], "o-", label="bubble fill fraction")
    b.plot(df["rate_per_s"], df["gpu_utilization"], "s-", label="GPU utilization (training + prefill)")
    b.plot(df["rate_per_s"], df["training_slowdown"] - 1, "^--", label="training slowdown")
    b.set_xscale("log")
    b.set_xlabel("requests per second")
    b.legend(fontsize=8)
    fig.suptitle(f"BubbleTea on {base.name} ({args.policy})")
    fig.tight_layout()
    fig.savefig(args.out / "sweep_requests.png", dpi=110)
    print(f"wrote {args.out / 'sweep_requests.csv'} and {args.out / 'sweep_requests.png'}")


if __name__ == "__main__":
    with tears_down_on_signals():  # SIGTERM, SIGHUP and Ctrl-C tear the network down
        main()
