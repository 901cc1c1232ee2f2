#!/usr/bin/env python3
"""Benchmark of time dilation's invariance (issue 44; ``spec/dilation.py``): the same experiments at
k = 1, 2 and 4, each policy run ``--repeat`` times interleaved (``testbed compare``), compared in
the emulated frame (figures printed next to their goals, nothing asserted).

For each experiment and k: the median emulated-frame iteration time, GPU utilization and bubble
fraction of each policy against k = 1's, each difference beside the noise floor (the larger spread
of the two runs' sets against themselves); atlas's speed-up over pp-fair against k = 1's; the
real-time iteration against k times k = 1's; and the HTB rates the kernel read back during the
runs (``link_counters.jsonl``, the links' classes) against the configured rates divided by k.
Goal: every figure within 2% of k = 1's (0.02 for the shares), or within the noise floor where
that is larger.

Run as root: .venv/bin/python scripts/bench_dilation.py [--experiments default,sharing]
[--dilations 1,2,4] [--repeat 2] [--iterations 6] [--congestion reno] [--record]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from testbed.results.analysis import iteration_times
from testbed.results.published import Column, commit, record_result
from testbed.run.compare import compare
from testbed.run.interrupts import tears_down_on_signals
from testbed.spec.experiment_file import load_experiment
from testbed.trace import metrics as M
from testbed.trace.events import read_events
from testbed.trace.jsonl import read_jsonl

GOAL = 0.02
POLICIES = ["pp-fair", "atlas"]
FIGURES = (M.ITERATION_TIME_S, M.GPU_UTILIZATION, M.BUBBLE_FRACTION)

COLUMNS = [
    Column("experiment", ("{experiment}",)),
    Column("k", ("{k:g}",)),
    Column("policy", ("{policy}",)),
    Column(
        "iteration (s, emulated)", ("{iteration_s:.3f} ({iteration_diff:+.1%}; floor {floor:.1%})", "{iteration_s:.3f}")
    ),
    Column("GPU utilization", ("{gpu_utilization:.3f} ({utilization_diff:+.3f})", "{gpu_utilization:.3f}")),
    Column("bubble fraction", ("{bubble_fraction:.3f} ({bubble_diff:+.3f})", "{bubble_fraction:.3f}")),
    Column("atlas over pp-fair", ("{speedup:.3f}x ({speedup_diff:+.1%})", "{speedup:.3f}x")),
    Column("real iteration / (k x k=1's)", ("{real_ratio:.3f}",)),
    Column("HTB rate read back / (rate / k)", ("{htb_ratio:.4f}",)),
]


def real_iteration_s(run: Path, warmup: int) -> float:
    """The run's mean iteration in real time, from its events."""
    return float(iteration_times(read_events(run), warmup)["duration_s"].mean())


def htb_ratio(run: Path, rates_bps: dict[str, float]) -> float | None:
    """The worst ratio, over the links' classes (``1:1``) the link sampler read back, of the rate
    the kernel had to the one configured (``rates_bps``, by ``a->b``); None without samples."""
    path = run / "link_counters.jsonl"
    rows = [r for r in read_jsonl(path) if r.get("classid") == "1:1"] if path.exists() else []
    ratios = [r["rate_bps"] / rates_bps[r["link"]] for r in rows if r.get("link") in rates_bps and r.get("rate_bps")]
    return _worst(ratios)


def _worst(ratios: list[float | None]) -> float | None:
    """The ratio farthest from 1 (None where there is none)."""
    known = [x for x in ratios if x is not None]
    return max(known, key=lambda x: abs(x - 1)) if known else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experiments", default="default,sharing")
    ap.add_argument("--dilations", default="1,2,4")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--iterations", type=int, default=6)
    ap.add_argument(
        "--congestion", help="the hosts' TCP congestion control for every experiment (default: the topology's)"
    )
    ap.add_argument("--record", action="store_true", help="write docs/results/dilation[_CONGESTION].json")
    args = ap.parse_args()
    at_commit = commit(REPO)
    ks = [float(k) for k in args.dilations.split(",")]
    print(f"goal: every emulated-frame figure within {GOAL:.0%} of k = {ks[0]:g}'s, or its noise floor")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-dilation-") as tmp:
        for name in args.experiments.split(","):
            base = load_experiment(name).with_overrides(iterations=args.iterations)
            if args.congestion:
                base = replace(base, topology_spec=replace(base.topology_spec, tcp_congestion=args.congestion))
            first: dict[str, dict] = {}
            for k in ks:
                exp = base.with_overrides(time_dilation=k)
                out = Path(tmp) / f"{name}-k{k:g}"
                result = compare(exp, POLICIES, out, repeat=args.repeat, progress=lambda _: None)
                rates = {
                    f"{a}->{b}": x.rate_bps / k for x in base.topology_spec.links for a, b in ((x.a, x.b), (x.b, x.a))
                }
                stats = result["stats"]
                speedup = result["speedup"].get("atlas/pp-fair")
                for policy in POLICIES:
                    st = stats[policy]
                    runs = sorted(out.glob(f"{policy}*"))
                    real = statistics.median(real_iteration_s(r, base.warmup_iterations) for r in runs)
                    row = {
                        "experiment": name,
                        "k": k,
                        "policy": policy,
                        "iteration_s": st[M.ITERATION_TIME_S]["median"],
                        "gpu_utilization": st[M.GPU_UTILIZATION]["median"],
                        "bubble_fraction": st[M.BUBBLE_FRACTION]["median"],
                        "spread": st[M.ITERATION_TIME_S]["spread"],
                        "speedup": speedup if policy == "atlas" else None,
                        "real_s": real,
                        "htb_ratio": _worst([htb_ratio(r, rates) for r in runs]),
                    }
                    if k == ks[0]:
                        first[policy] = row
                    else:
                        ref = first[policy]
                        row["iteration_diff"] = row["iteration_s"] / ref["iteration_s"] - 1
                        row["utilization_diff"] = row["gpu_utilization"] - ref["gpu_utilization"]
                        row["bubble_diff"] = row["bubble_fraction"] - ref["bubble_fraction"]
                        row["floor"] = max(x for x in (row["spread"], ref["spread"], 0.0) if x is not None)
                        row["real_ratio"] = row["real_s"] / (k / ks[0] * ref["real_s"])
                        if row["speedup"] is not None and ref["speedup"] is not None:
                            row["speedup_diff"] = row["speedup"] / ref["speedup"] - 1
                        ok = abs(row["iteration_diff"]) <= max(GOAL, row["floor"])
                        ok &= abs(row["utilization_diff"]) <= GOAL and abs(row["bubble_diff"]) <= GOAL
                        row["within_goal"] = ok
                    rows.append(row)
                    print(json.dumps(row, default=str), flush=True)
    print()
    for r in rows:
        verdict = "" if "within_goal" not in r else ("  within the goal" if r["within_goal"] else "  OUTSIDE the goal")
        diff = f" ({r['iteration_diff']:+.1%}, floor {r['floor']:.1%})" if "iteration_diff" in r else ""
        sp = f" atlas/pp-fair {r['speedup']:.3f}x" if r["speedup"] else ""
        print(
            f"{r['experiment']:>8} k={r['k']:g} {r['policy']:>7}: {r['iteration_s']:.3f} s{diff}, util "
            f"{r['gpu_utilization']:.3f}, bubbles {r['bubble_fraction']:.3f}{sp}, HTB {r['htb_ratio']}{verdict}"
        )
    if args.record:
        command = "sudo .venv/bin/python scripts/bench_dilation.py " + " ".join(sys.argv[1:])
        name = "dilation" + (f"_{args.congestion}" if args.congestion else "")
        print(record_result(REPO, name, COLUMNS, rows, "scripts/bench_dilation.py", command, at_commit))


if __name__ == "__main__":
    with tears_down_on_signals():  # SIGTERM, SIGHUP and Ctrl-C tear the network down
        main()
