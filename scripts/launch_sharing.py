#!/usr/bin/env python3
"""A user's own pipelining job under TCP's sharing and under Atlas's, beside the built-in worker.

``examples/pipelining_gpt.py`` (torch.distributed.pipelining, Schedule1F1B over gloo) runs through
``testbed launch`` on the sharing experiment's topology (two_dc_shared: four pipelines of two
stages sharing one 25 Mbit/s link) with the experiment's shapes (layers, width, heads, sequence,
microbatches and their size, iterations and warm-up), under each policy of ``POLICIES``: TCP's
sharing, Atlas's FIFO grants through the hook, the grants with striping, and planned grants (from
the job's second iteration, measured) with striping: Atlas without its DC selection. The built-in worker
runs the same experiment under the same policies with real compute (no padding, as the job has
none). Runs are interleaved (each repeat runs every policy, the job then the worker); the table
gives per policy and side the median iteration time, its spread against itself, the speed-up over
``pp-fair`` next to the larger spread of the two (the noise floor) and, for the job, the hook's
cost as a share of its iterations. Records ``docs/results/launch_sharing.json`` (shown in
docs/your-own-job.md) with ``--record``.

Run as root: .venv/bin/python scripts/launch_sharing.py [--repeat 2] [--out DIR] [--record]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testbed.results.compare import spread
from testbed.results.published import Column, commit, record_result
from testbed.run.interrupts import tears_down_on_signals
from testbed.run.launch import Launcher
from testbed.run.runner import run_experiment
from testbed.run.user_job import Job, launch_job
from testbed.spec.experiment import Experiment
from testbed.spec.experiment_file import load_experiment
from testbed.spec.mesh import Mesh
from testbed.spec.policy import parse_policy
from testbed.trace import metrics as M

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "pipelining_gpt.py"
POLICIES = (
    "pp-fair",
    "pp-fair/sharing=fifo",
    "pp-fair/sharing=fifo/striping=on",
    "pp-fair/sharing=planned/striping=on",
)
COLUMNS = [
    Column("policy", ("{policy}",)),
    Column("side", ("{side}",)),
    Column("iteration s (median)", ("{median_s:.3f}",)),
    Column("spread", ("{spread:.1%}",)),
    Column("over pp-fair", ("{speedup:.3f}x (noise floor {noise_floor:.1%})", "{speedup:.3f}x")),
    Column("hook's share of an iteration", ("{hook_share:.2%}",)),
]


def job_args(exp: Experiment) -> list[str]:
    """The example's arguments for the experiment's shapes."""
    m = exp.model
    return [
        "--dp", str(exp.replicas), "--steps", str(exp.iterations), "--microbatches", str(exp.microbatches),
        "--microbatch-size", str(exp.microbatch_size), "--layers", str(m.n_layers), "--d-model", str(m.d_model),
        "--heads", str(m.n_heads), "--seq-len", str(m.seq_len), "--lr", str(exp.lr),
    ]  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experiment", default="sharing")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("results") / f"launch-sharing-{time.strftime('%Y%m%d-%H%M%S')}")
    ap.add_argument("--record", action="store_true", help="write docs/results/launch_sharing.json")
    args = ap.parse_args()
    at_commit = commit(REPO)
    exp = load_experiment(args.experiment)
    real = exp.with_overrides(compute=replace(exp.compute, mode="real"))
    times: dict[tuple[str, str], list[float]] = {}
    hook: dict[str, list[float]] = {}
    launcher = Launcher(args.out / "launcher.log")
    quiet = lambda line: None  # noqa: E731
    try:
        for k in range(args.repeat):
            for policy in POLICIES:
                label = policy.replace("/", "_")
                job = Job(
                    exp.topology_spec, Mesh(exp.stages, exp.replicas), parse_policy(policy), EXAMPLE,
                    tuple(job_args(exp)), warmup=exp.warmup_iterations, experiment=exp,
                )  # fmt: skip
                s = launch_job(job, args.out / "job" / f"{label}-{k}", progress=quiet)
                times.setdefault((policy, "job"), []).append(s["training"]["iteration_time_s"]["mean"])
                if s.get("hook"):
                    hook.setdefault(policy, []).append(s["hook"]["share_of_job"])
                run = run_experiment(
                    real.with_overrides(policy=policy), args.out / "builtin" / f"{label}-{k}", progress=quiet,
                    launcher=launcher,
                )  # fmt: skip
                times.setdefault((policy, "built-in worker"), []).append(run[M.ITERATION_TIME_S])
                print(f"repeat {k} {policy}: job {times[(policy, 'job')][-1]:.3f} s, built-in "
                      f"{times[(policy, 'built-in worker')][-1]:.3f} s", flush=True)  # fmt: skip
    finally:
        launcher.close()
    rows = []
    for side in ("job", "built-in worker"):
        base = times[(POLICIES[0], side)]
        for policy in POLICIES:
            mine = times[(policy, side)]
            spreads = [x for x in (spread(base), spread(mine)) if x is not None]
            rows.append(
                {
                    "policy": policy,
                    "side": side,
                    "median_s": statistics.median(mine),
                    "spread": spread(mine),
                    "speedup": statistics.median(base) / statistics.median(mine) if policy != POLICIES[0] else None,
                    "noise_floor": max(spreads) if spreads and policy != POLICIES[0] else None,
                    "hook_share": statistics.median(hook[policy]) if side == "job" and policy in hook else None,
                    "runs_s": mine,
                }
            )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "launch_sharing.json").write_text(json.dumps(rows, indent=1))
    for r in rows:
        print(r)
    if args.record:
        command = f"sudo .venv/bin/python scripts/launch_sharing.py --repeat {args.repeat} --record"
        print(record_result(REPO, "launch_sharing", COLUMNS, rows, "scripts/launch_sharing.py", command, at_commit))


if __name__ == "__main__":
    with tears_down_on_signals():  # SIGTERM, SIGHUP and Ctrl-C tear the network down
        main()
