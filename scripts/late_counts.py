#!/usr/bin/env python3
"""Late training operations over several ``testbed compare`` folders: each policy's operations that
started more than 1 ms after their input arrived, per comparison and in all, and whether a
policy's rate differs from the baseline's by more than chance (an exact test,
``results/late_counts.py``); with ``--sched-trace`` comparisons, what the CPU of the late threads'
run queues ran, by role. Counted from the kernel's waking unless ``--workers``; every folder must
have run every policy counted.

Run interleaved comparisons of one command, then count them, e.g.::

    for i in 1 2 3 4 5 6; do sudo .venv/bin/testbed compare default --policies atlas,atlas+bubbletea \\
        --repeat 2 --iterations 32 --sched-trace --out results/late-$i; done
    .venv/bin/python scripts/late_counts.py results/late-*

Prints a markdown table; nothing asserted. ``--json`` prints the figures instead.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testbed.errors import TestbedError
from testbed.results.late_counts import KERNEL, WORKERS, format_late_counts, late_over_comparisons, read_comparison


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+", type=Path, help="testbed compare folders (each with comparison.json)")
    ap.add_argument("--baseline", help="the policy the others are judged against (default: the first compared)")
    ap.add_argument("--policies", help="comma-separated (default: every policy of the first folder)")
    ap.add_argument("--workers", action="store_true", help="count as the workers saw it, not from the kernel")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args()
    try:
        comparisons = [(str(f / "comparison.json"), read_comparison(f)) for f in args.folders]
        compared = list(comparisons[0][1]["runs"])
        policies = [p.strip() for p in args.policies.split(",") if p.strip()] if args.policies else compared
        baseline = args.baseline or (policies[0] if policies else "")
        unknown = [p for p in [baseline, *policies] if p not in compared]
        if unknown or not policies:
            sys.exit(
                f"error: {unknown[0] if unknown else args.policies!r} was not compared in "
                f"{comparisons[0][0]}; its policies: {', '.join(compared)}"
            )
        figures = late_over_comparisons(comparisons, policies, baseline, WORKERS if args.workers else KERNEL)
    except (TestbedError, ValueError) as e:
        sys.exit(f"error: {e}")
    print(json.dumps(figures, indent=1) if args.json else format_late_counts(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
