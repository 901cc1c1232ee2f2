"""Compare policies on one experiment: each policy runs on the same topology, workload and seed in
one invocation (repeats interleaved: A B A B ...), so that a speed-up is quoted next to the
spread of each policy against itself (the noise floor)."""
from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Callable

from .experiment import Experiment
from .runner import run_experiment

FIGURES = ("iteration_time_s", "tokens_per_s", "gpu_utilization", "bubble_fraction")
#: BubbleTea's figures, compared when a policy ends in +bubbletea
BUBBLETEA_FIGURES = ("training_gpu_utilization", "bubble_fill_fraction", "prefill_tokens_per_s", "requests_completed",
                     "ttft_p50_s", "ttft_p99_s", "training_ops_delayed_by_prefill")


def spread(values: list[float]) -> float | None:
    """(max - min) / median of repeated measurements; None with fewer than two."""
    vals = [v for v in values if v is not None]
    if len(vals) < 2:
        return None
    mid = statistics.median(vals)
    if mid == 0:
        return 0.0 if max(vals) == min(vals) else None
    return (max(vals) - min(vals)) / mid


def aggregate(runs: dict[str, list[dict]]) -> dict:
    """Per policy: the median of each figure over repeats and its spread; the speed-up of every
    policy over every other (median iteration time of the other over its own); and for each
    ``X+bubbletea`` run beside ``X``, the training slowdown (median iteration time with BubbleTea
    over without) next to the noise floor (the larger spread of the two against themselves)."""
    stats = {}
    for policy, summaries in runs.items():
        stats[policy] = {f: {"median": statistics.median(v) if (v := [s.get(f) for s in summaries
                                                                     if s.get(f) is not None]) else None,
                             "spread": spread([s.get(f) for s in summaries])}
                         for f in FIGURES + BUBBLETEA_FIGURES}
    slowdown = {}
    for p in runs:
        base = p.removesuffix("+bubbletea")
        if p != base and base in runs:
            tp, tb = stats[p]["iteration_time_s"]["median"], stats[base]["iteration_time_s"]["median"]
            if tp and tb:
                noise = [x for x in (stats[p]["iteration_time_s"]["spread"], stats[base]["iteration_time_s"]["spread"])
                         if x is not None]
                slowdown[p] = {"training_slowdown": tp / tb, "noise_floor": max(noise) if noise else None}
    speedup = {}
    for a in runs:
        for b in runs:
            ta, tb = stats[a]["iteration_time_s"]["median"], stats[b]["iteration_time_s"]["median"]
            if a != b and ta and tb:
                speedup[f"{a}/{b}"] = tb / ta
    return {"stats": stats, "speedup": speedup, "bubbletea": slowdown}


def compare(exp: Experiment, policies: list[str], out_dir: Path, repeat: int = 1, delay_mechanism: str = "auto",
            progress: Callable[[str], None] = print, **backend) -> dict:
    """Run every policy ``repeat`` times, interleaved; write and return ``comparison.json``:
    ``policies`` maps each policy to its (first run's) summary, ``runs`` to every summary.
    ``backend``: ``backend=``/``inventory=`` for run_experiment."""
    from .runner import check_fresh_out_dir, check_runnable
    from .topology import load_topology

    check_fresh_out_dir(out_dir)
    topo = load_topology(exp.topology)
    for policy in policies:          # refuse an impossible policy before the others have run
        check_runnable(exp.with_overrides(policy=policy), topo, backend.get("backend", "netns"))
    for k in range(repeat):
        for policy in policies:
            check_fresh_out_dir(out_dir / (policy if repeat == 1 else f"{policy}-{k}"))
    runs: dict[str, list[dict]] = {p: [] for p in policies}
    for k in range(repeat):
        for policy in policies:
            run_dir = out_dir / (policy if repeat == 1 else f"{policy}-{k}")
            progress(f"--- {policy} (run {k + 1}/{repeat}) -> {run_dir}")
            runs[policy].append(run_experiment(exp.with_overrides(policy=policy), run_dir,
                                               delay_mechanism=delay_mechanism, progress=progress, **backend))
    result = {"experiment": exp.name, "topology": exp.topology, "repeat": repeat,
              "policies": {p: s[0] for p, s in runs.items()}, "runs": runs, **aggregate(runs)}
    (out_dir / "comparison.json").write_text(json.dumps(result, indent=1))
    return result


def format_comparison(result: dict) -> str:
    stats = result["stats"]
    head = f"{'policy':<18} {'iteration s':>12} {'tokens/s':>10} {'GPU util':>9} {'bubble':>7}  spread (iteration time)"
    lines = [head]
    for policy, st in stats.items():
        def cell(f, fmt):
            v = st[f]["median"]
            return format(v, fmt) if v is not None else "-"
        sp = st["iteration_time_s"]["spread"]
        lines.append(f"{policy:<18} {cell('iteration_time_s', '12.3f')} {cell('tokens_per_s', '10.0f')} "
                     f"{cell('gpu_utilization', '9.3f')} {cell('bubble_fraction', '7.3f')}  "
                     f"{'n/a (use --repeat)' if sp is None else f'{sp:.1%}'}")
    for pair, s in result["speedup"].items():
        a, b = pair.split("/")
        if a.removesuffix("+bubbletea") != b.removesuffix("+bubbletea"):
            lines.append(f"speed-up of {a} over {b}: {s:.2f}x")
    bt = [p for p in stats if p.endswith("+bubbletea")]
    if bt:
        lines.append(f"{'BubbleTea':<18} {'train util':>10} {'fill':>6} {'prefill tok/s':>13} {'requests':>8} "
                     f"{'TTFT p50':>9} {'TTFT p99':>9} {'delayed ops':>11}")
        for p in bt:
            st = stats[p]

            def c(f, fmt):
                v = st[f]["median"]
                return format(v, fmt) if v is not None else "-"
            lines.append(f"{p:<18} {c('training_gpu_utilization', '10.3f')} {c('bubble_fill_fraction', '6.3f')} "
                         f"{c('prefill_tokens_per_s', '13.0f')} {c('requests_completed', '8.0f')} "
                         f"{c('ttft_p50_s', '9.3f')} {c('ttft_p99_s', '9.3f')} "
                         f"{c('training_ops_delayed_by_prefill', '11.0f')}")
        for p, d in result.get("bubbletea", {}).items():
            noise = "n/a (use --repeat)" if d["noise_floor"] is None else f"{d['noise_floor']:.1%}"
            lines.append(f"training slowdown of {p} over {p.removesuffix('+bubbletea')}: "
                         f"{d['training_slowdown'] - 1:+.1%} (noise floor {noise})")
    return "\n".join(lines)
