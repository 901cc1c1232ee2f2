#!/usr/bin/env python3
"""Benchmark of start-up: the time from the `testbed run` command to the end of the first forward,
on the default experiment (goal: at most 5 s) and under atlas (goal: at most 8 s), median of N
warm-cache runs (one more run first warms the page cache and the capacity cache, uncounted), with
the median time from the command to each start-up phase. Figures printed, nothing asserted.

Run as root: .venv/bin/python scripts/bench_startup.py [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testbed.results.analysis import startup_phases
from testbed.run.interrupts import tears_down_on_signals
from testbed.trace.events import read_events
from testbed.trace.jsonl import read_jsonl
from testbed.trace.startup import STARTUP_LOG, STARTUP_PHASES

GOALS_S = {"pp-fair": 5.0, "atlas": 8.0}
TESTBED = [sys.executable, "-m", "testbed.cli"]


def one_run(policy: str, out: Path) -> dict[str, float]:
    proc = subprocess.run(
        [*TESTBED, "run", "--policy", policy, "--iterations", "3", "--out", str(out)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise SystemExit(f"testbed run --policy {policy} failed:\n{proc.stderr[-2000:]}")
    return startup_phases(read_jsonl(out / STARTUP_LOG), read_events(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="counted runs per policy (default 5)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        for policy, goal in GOALS_S.items():
            one_run(policy, Path(tmp) / f"{policy}-warm")
            runs = [one_run(policy, Path(tmp) / f"{policy}-{k}") for k in range(args.runs)]
            first = [r["first_forward"] for r in runs]
            print(
                f"{policy}: command to the end of the first forward: median {statistics.median(first):.2f} s "
                f"(min {min(first):.2f}, max {max(first):.2f}; goal <= {goal:g} s) over {args.runs} runs"
            )
            for phase in (*STARTUP_PHASES, "first_forward"):
                values = [r[phase] for r in runs if phase in r]
                if values:
                    print(f"  {phase:<18} {statistics.median(values):6.2f} s")


if __name__ == "__main__":
    with tears_down_on_signals():  # SIGTERM, SIGHUP and Ctrl-C tear the network down
        main()
