#!/usr/bin/env python3
"""Every policy on one machine against two (stand-in) machines: the default experiment (three_dc:
east and central on one machine, west on the other) and the sharing experiment (two_dc_shared: one
DC per machine), each policy ``--repeat`` times on each backend, interleaved (``testbed compare``).

The stand-in machines are an SSH lab on this box (``testbed/net/remote/lab.py``: sshd instances
in their own namespaces, one clock shifted 1000 s): the same cores, one bridge between the
machines. Its figures describe that lab; docs/backends.md says what a real network would add.

Each row: the experiment, the policy, the backend, the median iteration time and its spread over
the repeats (the noise floor), GPU utilization, Atlas's grant latency (a transfer ready to its
grant applied), decision to applied (p50, p99), across machines the round trip to the relay, the
largest uncertainty of the clock offsets, and BubbleTea's TTFT. Records
``docs/results/remote_vs_local.json`` (shown in docs/backends.md) with ``--record``.

Run as root: .venv/bin/python scripts/remote_vs_local.py [--repeat 2] [--out DIR] [--record]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testbed.net.remote.lab import SshLab  # noqa: E402
from testbed.results.published import Column, commit, record_result  # noqa: E402
from testbed.run.compare import compare  # noqa: E402
from testbed.run.interrupts import tears_down_on_signals  # noqa: E402
from testbed.spec.experiment_file import load_experiment  # noqa: E402
from testbed.trace import metrics as M  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
#: (experiment file, its policies, the DCs of each stand-in machine)
CASES = (
    ("workloads/default.yaml", ("pp-fair", "dp-wan", "atlas"), [["east", "central"], ["west"]]),
    ("workloads/sharing.yaml", ("pp-fair", "dp-wan", "atlas", "atlas+bubbletea"), [["east"], ["west"]]),
)
FIGURES = {
    "iteration_s": M.ITERATION_TIME_S,
    "utilization": M.GPU_UTILIZATION,
    "latency_ms": M.GRANT_LATENCY_P50_MS,
    "apply_p50_ms": M.GRANT_APPLY_P50_MS,
    "apply_p99_ms": M.GRANT_APPLY_P99_MS,
    "round_trip_p50_ms": M.GRANT_ROUND_TRIP_P50_MS,
    "clock_ms": M.CLOCK_OFFSET_UNCERTAINTY_MS,
    "ttft_s": M.TTFT_P50_S,
}
COLUMNS = [
    Column("experiment", ("{experiment}",)),
    Column("policy", ("{policy}",)),
    Column("machines", ("{machines}",)),
    Column("iteration s (spread)", ("{iteration_s:.3f} ({spread:.1%})",)),
    Column("GPU util.", ("{utilization:.3f}",)),
    Column("grant latency p50 ms", ("{latency_ms:.2f}",)),
    Column("decision to applied p50 / p99 ms", ("{apply_p50_ms:.3f} / {apply_p99_ms:.3f}",)),
    Column("relay round trip p50 ms", ("{round_trip_p50_ms:.3f}",)),
    Column("clock offsets ± ms", ("{clock_ms:.3f}",)),
    Column("TTFT p50 s", ("{ttft_s:.2f}",)),
]


def rows_of(result: dict, experiment: str, machines: int) -> list[dict]:
    """One row per policy of a comparison: each figure's median over the repeats."""
    out = []
    for policy, runs in result["runs"].items():
        row = {"experiment": experiment, "policy": policy, "machines": machines}
        for key, metric in FIGURES.items():
            values = sorted(v for s in runs if (v := s.get(metric)) is not None)
            row[key] = values[len(values) // 2] if values else None
        times = [s[M.ITERATION_TIME_S] for s in runs if s.get(M.ITERATION_TIME_S)]
        row["spread"] = (max(times) - min(times)) / min(times) if len(times) > 1 else None
        out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=2, help="runs per policy and backend (default 2)")
    ap.add_argument("--out", type=Path, default=REPO / "results" / f"remote_vs_local-{time.strftime('%Y%m%d-%H%M%S')}")
    ap.add_argument("--record", action="store_true", help="write docs/results/remote_vs_local.json")
    args = ap.parse_args()
    at_commit = commit(REPO)
    rows: list[dict] = []
    for path, policies, groups in CASES:
        exp = load_experiment(REPO / path)
        out = args.out / exp.name
        result = compare(exp, list(policies), out / "one-machine", args.repeat, progress=print)
        rows += rows_of(result, exp.name, 1)
        with SshLab(groups, out / "lab", shifts=[0, 1000]) as lab:
            inv = lab.write_inventory(out / "inventory.yaml", groups)
            result = compare(
                exp, list(policies), out / "two-machines", args.repeat, progress=print, backend="remote", inventory=inv
            )
        rows += rows_of(result, exp.name, 2)
    for row in rows:
        print(row)
    if args.record:
        command = "sudo .venv/bin/python scripts/remote_vs_local.py " + " ".join(sys.argv[1:])
        print(record_result(REPO, "remote_vs_local", COLUMNS, rows, "scripts/remote_vs_local.py", command, at_commit))


if __name__ == "__main__":
    with tears_down_on_signals():  # SIGTERM, SIGHUP and Ctrl-C tear the networks and the lab down
        main()
