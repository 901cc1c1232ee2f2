#!/usr/bin/env python3
"""Sensitivity sweep: iteration time per policy over WAN one-way delay and rate.

Every WAN link of the experiment's topology is set to each (delay, rate) in turn; each policy trains
the same experiment there. Writes ``sweep.csv`` (one row per run) and ``sweep.png`` (iteration time
against delay, one line per policy and rate), like the sensitivity figures of geo-distributed
training papers. Figures only; nothing asserted.

Run as root: .venv/bin/python scripts/sweep_wan.py [--delays 10ms,40ms] [--rates 50mbit,200mbit]
             [--policies pp-fair,dp-wan,atlas] [--iterations 5] [--out DIR]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd
import yaml

from testbed.run.interrupts import tears_down_on_signals
from testbed.run.runner import run_experiment
from testbed.spec.experiment_file import load_experiment
from testbed.spec.units import parse_duration_us, parse_rate_bps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("experiment", nargs="?", default=None, help="experiment file or shipped name (default: default)")
    ap.add_argument("--delays", default="10ms,40ms", help="one-way delays to set on every WAN link (default 10ms,40ms)")
    ap.add_argument("--rates", default="50mbit,200mbit", help="WAN link rates (default 50mbit,200mbit)")
    ap.add_argument("--policies", default="pp-fair,dp-wan,atlas", help="policies to run at each point")
    ap.add_argument("--iterations", type=int, default=5, help="iterations per run (default 5)")
    ap.add_argument(
        "--out",
        type=Path,
        default=Path("results") / f"sweep-{time.strftime('%Y%m%d-%H%M%S')}",
        help="folder for sweep.csv, sweep.png and the run folders",
    )
    args = ap.parse_args()
    base = load_experiment(args.experiment).with_overrides(iterations=args.iterations)
    topo = base.topology_spec
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for delay in args.delays.split(","):
        for rate in args.rates.split(","):
            spec = {
                "name": f"{topo.name}-{delay}-{rate}",
                "dcs": [{"name": d.name, "hosts": d.hosts} for d in topo.dcs],
                "links": [{"between": [link.a, link.b], "rate": rate, "delay": delay} for link in topo.links],
            }
            path = args.out / f"topology-{delay}-{rate}.yaml"
            path.write_text(yaml.safe_dump(spec))
            for policy in args.policies.split(","):
                run_dir = args.out / f"{policy}-{delay}-{rate}"
                s = run_experiment(
                    base.with_overrides(topology=str(path), policy=policy), run_dir, progress=lambda line: None
                )
                rows.append(
                    {
                        "policy": policy,
                        "delay_ms": parse_duration_us(delay) / 1000,
                        "rate_mbit": parse_rate_bps(rate) / 1e6,
                        "iteration_time_s": s["iteration_time_s"],
                        "gpu_utilization": s["gpu_utilization"],
                        "wan_compute_ratio": s["wan_compute_ratio"],
                        "predicted_iteration_time_s": s["predicted_iteration_time_s"],
                        "run_dir": str(run_dir),
                    }
                )
                print(
                    f"{policy:>8} delay {delay:>6} rate {rate:>8}: iteration {s['iteration_time_s']:.3f} s "
                    f"(predicted {s['predicted_iteration_time_s']:.3f} s), GPU utilization {s['gpu_utilization']:.2f}",
                    flush=True,
                )
    df = pd.DataFrame(rows)
    df.to_csv(args.out / "sweep.csv", index=False)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for (policy, rate), g in df.groupby(["policy", "rate_mbit"]):
        ax.plot(g["delay_ms"], g["iteration_time_s"], marker="o", label=f"{policy} @ {rate:g} Mbit/s")
    ax.set_xlabel("WAN one-way delay (ms)")
    ax.set_ylabel("iteration time (s)")
    ax.set_ylim(bottom=0)
    ax.set_title(f"{base.name}: iteration time vs WAN delay and rate")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out / "sweep.png", dpi=110)
    print(f"sweep.csv and sweep.png in {args.out}")


if __name__ == "__main__":
    with tears_down_on_signals():  # SIGTERM, SIGHUP and Ctrl-C tear the network down
        main()
