"""Comparing policies' summaries: medians over repeated runs, each policy's spread against itself (the
noise floor), speed-ups, and BubbleTea's training slowdown. Pure: ``run/compare.py`` runs the
policies and hands their summaries here."""

from __future__ import annotations

import statistics
from typing import Any

from testbed.results.analysis import LATE_START_TEXT
from testbed.results.sched_summary import sched_lines, sched_totals
from testbed.spec.policy import PREFILL_ALONE_SUFFIX, UnknownPolicy, parse_policy
from testbed.trace import metrics as M

FIGURES = (M.ITERATION_TIME_S, M.TOKENS_PER_S, M.GPU_UTILIZATION, M.BUBBLE_FRACTION)
#: BubbleTea's figures, compared when a policy ends in +bubbletea
BUBBLETEA_FIGURES = (
    M.TRAINING_GPU_UTILIZATION,
    M.BUBBLE_FILL_FRACTION,
    M.PREFILL_TOKENS_PER_S,
    M.REQUESTS_COMPLETED,
    M.TTFT_P50_S,
    M.TTFT_P99_S,
    M.TRAINING_OPS_DELAYED_BY_PREFILL,
    M.PREFILL_ALONE_SHARE,
    M.QUEUE_EMPTY_SHARE,
)
#: a run serving prefill alone whose queue was empty longer than this share of its time measured
#: the request rate more than what its GPUs deliver: ``compare`` says so beside the share
MAX_QUEUE_EMPTY_SHARE = 0.05


def run_folder_name(policy: str, k: int, repeat: int) -> str:
    """A policy's run folder in a comparison: its name with the parts' ``/`` as ``_``
    (``pp-fair_placement=atlas``), suffixed ``-k`` for the k-th repeat."""
    name = policy.replace("/", "_")
    return name if repeat == 1 else f"{name}-{k}"


def base_policy(name: str) -> str:
    """The network policy of a policy name (``atlas+bubbletea`` -> ``atlas``)."""
    return parse_policy(name).base


def spread(values: list[float]) -> float | None:
    """(max - min) / median of repeated measurements; None with fewer than two."""
    vals = [v for v in values if v is not None]
    if len(vals) < 2:
        return None
    mid = statistics.median(vals)
    if mid == 0:
        return 0.0 if max(vals) == min(vals) else None
    return (max(vals) - min(vals)) / mid


def noise_floor(stats: dict[str, Any], a: str, b: str) -> float | None:
    """The noise floor of a comparison of policies ``a`` and ``b`` (``aggregate``'s ``stats``): the
    larger spread of their iteration times against themselves; None without repeats."""
    spreads = [x for p in (a, b) if (x := stats[p][M.ITERATION_TIME_S]["spread"]) is not None]
    return max(spreads) if spreads else None


def aggregate(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per policy: the median of each figure over repeats and its spread; the speed-up of every
    policy over every other (median iteration time of the other over its own); ``steps``: the
    speed-up of each policy over the one before it in ``runs``' order (an ablation's parts, one at a
    time), next to the larger spread of the two against themselves (the noise floor); and for each
    ``X+bubbletea`` run beside ``X``, the training slowdown (median iteration time with BubbleTea
    over without) next to the noise floor (the larger spread of the two against themselves), and
    each run's count of operations that started over 1 ms after their input arrived, with and
    without BubbleTea (``M.TRAINING_OPS_STARTED_LATE``: the runs without it are the floor);
    ``sched``: the scheduler traces' figures per policy (``sched_totals``)."""
    stats = {}
    for policy, summaries in runs.items():
        stats[policy] = {
            f: {
                "median": statistics.median(v) if (v := _values(summaries, f)) else None,
                "spread": spread([s.get(f) for s in summaries]),
            }
            for f in FIGURES + BUBBLETEA_FIGURES
        }
    slowdown = {}
    for p in runs:  # names without +bubbletea may be any label (a script comparing experiment variants)
        base = base_policy(p) if p.endswith("+bubbletea") else p
        if p != base and base in runs:
            tp, tb = stats[p][M.ITERATION_TIME_S]["median"], stats[base][M.ITERATION_TIME_S]["median"]
            if tp and tb:
                slowdown[p] = {
                    "training_slowdown": tp / tb,
                    "noise_floor": noise_floor(stats, p, base),
                    M.TRAINING_OPS_STARTED_LATE: {q: _values(runs[q], M.TRAINING_OPS_STARTED_LATE) for q in (p, base)},
                }
    speedup = {}
    for a in runs:
        for b in runs:
            ta, tb = stats[a][M.ITERATION_TIME_S]["median"], stats[b][M.ITERATION_TIME_S]["median"]
            if a != b and ta and tb:
                speedup[f"{a}/{b}"] = tb / ta
    steps = []
    names = list(runs)
    for prev, this in zip(names, names[1:]):
        tp, tt = stats[prev][M.ITERATION_TIME_S]["median"], stats[this][M.ITERATION_TIME_S]["median"]
        steps.append(
            {
                "from": prev,
                "to": this,
                "speedup": tp / tt if tp and tt else None,
                "noise_floor": noise_floor(stats, prev, this),
            }
        )
    return {
        "stats": stats,
        "speedup": speedup,
        "bubbletea": slowdown,
        "steps": steps,
        "prefill_alone": measured_alone_shares(stats),
        "sched": sched_totals(runs),
        M.TIME_DILATION: sorted({float(s.get(M.TIME_DILATION) or 1) for ss in runs.values() for s in ss}),
    }


def measured_alone_shares(stats: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """For each ``X+bubbletea`` beside ``X+prefill-alone`` (their medians, ``stats`` as ``aggregate``
    builds it): its prefill as a share of the same GPUs' serving prefill alone, measured
    (``M.MEASURED_ALONE_TOKENS_SHARE``, ``M.MEASURED_ALONE_GPU_TIME_SHARE``; None where a median is
    missing or 0), the alone run's name (``alone``) and how long its queue was empty
    (``M.QUEUE_EMPTY_SHARE``, its median)."""
    out = {}
    for p in stats:
        try:
            pol = parse_policy(p)
        except UnknownPolicy:  # a label of a script's own (``aggregate``'s runs may be named anyhow)
            continue
        alone = pol.base + PREFILL_ALONE_SUFFIX
        if not (pol.bubbletea and pol.training and alone in stats):
            continue

        def ratio(figure: str, p: str = p, alone: str = alone) -> float | None:
            a, b = stats[p][figure]["median"], stats[alone][figure]["median"]
            return a / b if a is not None and b else None

        out[p] = {
            "alone": alone,
            M.QUEUE_EMPTY_SHARE: stats[alone][M.QUEUE_EMPTY_SHARE]["median"],
            M.MEASURED_ALONE_TOKENS_SHARE: ratio(M.PREFILL_TOKENS_PER_S),
            M.MEASURED_ALONE_GPU_TIME_SHARE: ratio(M.PREFILL_ALONE_SHARE),
        }
    return out


def _split_pair(pair: str, names: dict[str, Any]) -> tuple[str, str]:
    """``A/B`` back into its two policy names where the names hold ``/`` themselves."""
    for a in names:
        if pair.startswith(a + "/") and pair[len(a) + 1 :] in names:
            return a, pair[len(a) + 1 :]
    raise ValueError(f"not a pair of compared policies: {pair}")


def _values(summaries: list[dict[str, Any]], figure: str) -> list[float]:
    return [s[figure] for s in summaries if s.get(figure) is not None]


def _counts_text(values: list[float]) -> str:
    """Repeated counts as "median (min-max)", or "-" without any."""
    if not values:
        return "-"
    mid = f"{statistics.median(values):.0f}"
    return mid if len(values) == 1 else f"{mid} ({min(values):.0f}-{max(values):.0f})"


def _median_text(figures: dict[str, Any], figure: str, fmt: str) -> str:
    """A figure's median as ``fmt`` formats it, or "-" where there is none."""
    v = figures[figure]["median"]
    return format(v, fmt) if v is not None else "-"


def format_comparison(result: dict[str, Any]) -> str:
    """The comparison as text: a row per policy; then, for an ablation, each step's own speed-up
    next to its noise floor, else the speed-up of every policy over every other."""
    stats = result["stats"]
    w = max(18, *(len(p) for p in stats))
    head = (
        f"{'policy':<{w}} {'iteration s':>12} {'tokens/s':>10} {'GPU util':>9} {'bubble':>7}  spread (iteration time)"
    )
    lines = [head]
    dilations = [k for k in result.get(M.TIME_DILATION, []) if k != 1]
    if dilations:
        lines.insert(
            0, f"(every figure in the emulated frame: the runs went {', '.join(f'{k:g}' for k in dilations)}x slower)"
        )
    for policy, st in stats.items():
        sp = st[M.ITERATION_TIME_S]["spread"]
        lines.append(
            f"{policy:<{w}} {_median_text(st, M.ITERATION_TIME_S, '12.3f')} "
            f"{_median_text(st, M.TOKENS_PER_S, '10.0f')} "
            f"{_median_text(st, M.GPU_UTILIZATION, '9.3f')} {_median_text(st, M.BUBBLE_FRACTION, '7.3f')}  "
            f"{'n/a (use --repeat)' if sp is None else f'{sp:.1%}'}"
        )
    if result.get("ablation"):
        lines.append("each part's own contribution (speed-up over the step before; noise floor: the larger spread):")
        for step in result["steps"]:
            sp = "-" if step["speedup"] is None else f"{step['speedup']:.3f}x"
            noise = "n/a (use --repeat)" if step["noise_floor"] is None else f"{step['noise_floor']:.1%}"
            lines.append(f"  {step['to']:<{w}} {sp:>8}  (noise floor {noise})")
        first, last = next(iter(stats)), list(stats)[-1]
        if f"{last}/{first}" in result["speedup"]:
            lines.append(f"all parts: {last} over {first}: {result['speedup'][f'{last}/{first}']:.3f}x")
    else:
        for pair, s in result["speedup"].items():
            a, b = pair.split("/", 1) if pair.count("/") == 1 else _split_pair(pair, stats)
            if base_policy(a) != base_policy(b):
                lines.append(f"speed-up of {a} over {b}: {s:.2f}x")
    bt = [p for p in stats if parse_policy(p).bubbletea]
    if bt:
        lines.append(
            f"{'BubbleTea':<18} {'train util':>10} {'fill':>6} {'prefill tok/s':>13} {'requests':>8} "
            f"{'TTFT p50':>9} {'TTFT p99':>9} {'delayed ops':>11}"
        )
        for p in bt:
            st = stats[p]
            lines.append(
                f"{p:<18} {_median_text(st, M.TRAINING_GPU_UTILIZATION, '10.3f')} "
                f"{_median_text(st, M.BUBBLE_FILL_FRACTION, '6.3f')} "
                f"{_median_text(st, M.PREFILL_TOKENS_PER_S, '13.0f')} {_median_text(st, M.REQUESTS_COMPLETED, '8.0f')} "
                f"{_median_text(st, M.TTFT_P50_S, '9.3f')} {_median_text(st, M.TTFT_P99_S, '9.3f')} "
                f"{_median_text(st, M.TRAINING_OPS_DELAYED_BY_PREFILL, '11.0f')}"
            )
        for p, d in result.get("prefill_alone", {}).items():
            tok, gpu = d[M.MEASURED_ALONE_TOKENS_SHARE], d[M.MEASURED_ALONE_GPU_TIME_SHARE]
            lines.append(
                f"prefill of {p} as a share of {d['alone']} (measured): "
                f"{'-' if tok is None else f'{tok:.1%}'} of its tokens/s, "
                f"{'-' if gpu is None else f'{gpu:.1%}'} of its emulated GPU time"
            )
            empty = d[M.QUEUE_EMPTY_SHARE]
            if empty is not None and empty > MAX_QUEUE_EMPTY_SHARE:
                lines.append(
                    f"  but {d['alone']}'s queue was empty {empty:.1%} of its time: it measured the request rate "
                    "more than what the GPUs deliver; raise --request-rate (or --iterations) for that"
                )
        for p, d in result.get("bubbletea", {}).items():
            noise = "n/a (use --repeat)" if d["noise_floor"] is None else f"{d['noise_floor']:.1%}"
            lines.append(
                f"training slowdown of {p} over {base_policy(p)}: "
                f"{d['training_slowdown'] - 1:+.1%} (noise floor {noise})"
            )
            late = d.get(M.TRAINING_OPS_STARTED_LATE)
            if late and any(late.values()):
                lines.append(
                    f"  operations started {LATE_START_TEXT} after their input arrived: {p} {_counts_text(late[p])}, "
                    f"{base_policy(p)} {_counts_text(late[base_policy(p)])} (the floor)"
                )
    lines += sched_lines(result["sched"])
    return "\n".join(lines)
