"""Late training operations over several comparisons (``scripts/late_counts.py``): each policy's
count per comparison and in all, and whether a policy's rate differs from the baseline's by more
than chance. Pure: reads ``comparison.json`` files as ``run/compare.py`` writes them, and their
runs' ``summary.json`` (``read_comparison``).

A late operation started more than 1 ms after its input arrived (``analysis.start_after_arrival``):
counted from the kernel's waking where the comparisons were traced (``--sched-trace``: the runs'
``M.SCHED_LATE_OPS``), else as the workers saw it (``M.TRAINING_OPS_STARTED_LATE``). The counts
are small (a few of 1,920 a comparison here), so a difference between two policies is judged by
an exact test, not by eye.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from testbed.errors import SpecError
from testbed.invocation import testbed_command
from testbed.results.analysis import LATE_BOUND_TEXT, LATE_START_TEXT
from testbed.results.compare import run_folder_name
from testbed.results.sched_summary import sched_totals
from testbed.trace import metrics as M
from testbed.trace.jsonl import read_json_object

#: the kernel's count (``--sched-trace``) and the workers' own
KERNEL, WORKERS = "kernel", "workers"
#: a policy's figure of its runs: the late operations counted each way
LATE_FIGURE = {KERNEL: M.SCHED_LATE_OPS, WORKERS: M.TRAINING_OPS_STARTED_LATE}
_FIX = "give folders written by testbed compare --out"


def exact_binomial_p(k: int, n: int, p: float) -> float:
    """The two-sided p-value of ``k`` successes in ``n`` Bernoulli trials of probability ``p``:
    the probability, under that binomial, of every outcome no more likely than ``k`` (the rule of
    R's ``binom.test``; Fay, "Two-sided exact tests and matching confidence intervals for discrete
    data", The R Journal 2(1), 2010). Computed in logarithms, for any ``n``; 1.0 where ``n`` is 0.

    Raises ValueError for ``k`` outside 0..n or ``p`` outside [0, 1]."""
    if not 0 <= k <= n or not 0.0 <= p <= 1.0:
        raise ValueError(f"need 0 <= k <= n and 0 <= p <= 1, got k={k}, n={n}, p={p}")
    if p in (0.0, 1.0):  # every trial fails (succeeds): only that outcome is possible
        return 1.0 if k == n * p else 0.0
    log_p, log_q = math.log(p), math.log1p(-p)

    def log_pmf(i: int) -> float:
        return math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * log_p + (n - i) * log_q

    tie = log_pmf(k) + math.log1p(1e-7)  # outcomes as likely as k, up to rounding, count too (R's relErr)
    return min(1.0, sum(math.exp(v) for v in map(log_pmf, range(n + 1)) if v <= tie))


def read_comparison(folder: Path) -> dict[str, Any]:
    """``folder``'s ``comparison.json``, each run's summary taken from its run folder's
    ``summary.json`` where there is one (``compare.run_folder_name``): the same figures, or newer
    ones where ``testbed analyze`` rewrote it after the comparison. Raises SpecError naming the
    file and what is wrong."""
    path = folder / "comparison.json"
    comparison = read_json_object(path, _FIX)
    runs = comparison.get("runs")
    if not isinstance(runs, dict):
        raise SpecError(str(path), "runs", None, "is missing: no comparison's runs", _FIX)
    repeat = comparison.get("repeat")
    if not isinstance(repeat, int):  # no run folders to name: the comparison's copies stand
        return comparison
    for policy, summaries in runs.items():
        for k in range(len(summaries) if isinstance(summaries, list) else 0):
            rewritten = folder / run_folder_name(policy, k, repeat) / "summary.json"
            if rewritten.exists():
                summaries[k] = read_json_object(rewritten, f"rerun {testbed_command()} analyze {rewritten.parent}")
    return comparison


def policy_counts(comparison: dict[str, Any], policy: str, source: str, where: str) -> tuple[int, int]:
    """(late operations, operations with an input) of ``policy``'s runs in one comparison (read
    from ``where``), summed over its repeats, counted by ``source`` (KERNEL or WORKERS). Raises
    SpecError where the comparison did not run ``policy``, or a run lacks a count (KERNEL: the
    comparison was not traced)."""
    runs = comparison["runs"].get(policy)
    if not runs:
        ran = ", ".join(comparison["runs"]) or "none"
        raise SpecError(where, f"runs.{policy}", None, f"is missing (it ran {ran})", "compare the same policies")
    late = ops = 0
    for i, run in enumerate(runs):
        count, n = run.get(LATE_FIGURE[source]), run.get(M.TRAINING_OPS_WITH_INPUT)
        if count is None or n is None:
            field = LATE_FIGURE[source] if count is None else M.TRAINING_OPS_WITH_INPUT
            fix = "count as the workers saw it (--workers), or rerun with --sched-trace"
            raise SpecError(where, f"runs.{policy}[{i}].{field}", None, "is missing", fix if source == KERNEL else _FIX)
        late, ops = late + int(count), ops + int(n)
    return late, ops


def late_over_comparisons(
    comparisons: list[tuple[str, dict[str, Any]]], policies: list[str], baseline: str, source: str = KERNEL
) -> dict[str, Any]:
    """Each policy's late operations over ``comparisons`` ((where it was read, comparison), each
    of which must have run ``baseline`` and every policy, counted by ``source``).

    Returns ``comparisons`` (how many), ``source``, ``baseline`` and ``policies``: per policy,
    baseline first, ``late`` (one count per comparison, in their order), ``late_total``,
    ``ops_total`` (operations with an input), ``late_per_1000_ops``; with KERNEL, ``events_lost``
    (the traces' lost events, summed) and ``queue_cpu_ms_by_role`` (what the CPU of the late
    threads' run queues ran while they waited, ms by role, largest first; None unless every
    run's trace tells it: ``sched_summary.sched_totals``), ``runnable_ms`` (the ms they waited
    for a CPU), ``free_cpu_ms`` (of that, the ms another CPU was free for them) and
    ``late_ops_free_cpu`` (how many had one at some moment before the bound; both None unless
    every run's summary tells them: a trace without the moves between CPUs, or a summary from
    before the figures, which ``testbed analyze`` of the run folder rewrites:
    ``read_comparison``); and for each policy but the baseline
    ``excess_per_comparison`` (its count less the baseline's scaled to its operations, per
    comparison) and ``p_same_rate``: the conditional test of two Poisson rates (Przyborowski and
    Wilenski, Biometrika 31, 1940; R's ``poisson.test``): were both policies' operations late at
    one rate, the policy's count given the two totals would be binomial with its share of the
    operations (``exact_binomial_p``, two-sided). The test takes late operations as independent
    of each other; a burst of them from one stall makes ``p`` too small.

    Raises SpecError (``policy_counts``) for a comparison that cannot be counted, ValueError for
    no comparison or a policy whose runs had no operation with an input."""
    if not comparisons:
        raise ValueError("no comparison to count")
    names = [baseline] + [p for p in policies if p != baseline]
    rows = [{p: policy_counts(c, p, source, where) for p in names} for where, c in comparisons]
    out: dict[str, Any] = {"comparisons": len(rows), "source": source, "baseline": baseline, "policies": {}}
    for p in names:
        late, ops = [r[p][0] for r in rows], sum(r[p][1] for r in rows)
        if not ops:
            raise ValueError(f"no operation with an input in {p}'s runs")
        figures = {"late": late, "late_total": sum(late), "ops_total": ops, "late_per_1000_ops": 1000 * sum(late) / ops}
        if source == KERNEL:
            totals = sched_totals({p: [run for _, c in comparisons for run in c["runs"][p]]})[p]
            figures["events_lost"] = totals[M.SCHED_EVENTS_LOST]
            figures["queue_cpu_ms_by_role"] = totals[M.SCHED_QUEUE_CPU_WHILE_RUNNABLE_MS]
            figures["runnable_ms"] = totals[M.SCHED_LATE_RUNNABLE_MS]
            figures["free_cpu_ms"] = totals[M.SCHED_LATE_FREE_CPU_MS]
            figures["late_ops_free_cpu"] = totals[M.SCHED_LATE_OPS_FREE_CPU]
        out["policies"][p] = figures
    base = out["policies"][baseline]
    for p in names[1:]:
        me = out["policies"][p]
        ratio = me["ops_total"] / base["ops_total"]  # the policy's operations per baseline operation
        me["excess_per_comparison"] = (me["late_total"] - ratio * base["late_total"]) / len(rows)
        n = me["late_total"] + base["late_total"]
        me["p_same_rate"] = exact_binomial_p(me["late_total"], n, ratio / (1 + ratio))
    return out


def format_late_counts(figures: dict[str, Any]) -> str:
    """``late_over_comparisons``'s figures as a markdown table, with (KERNEL) what the CPU of the
    late threads' run queues ran, the five largest roles."""
    how = "from the kernel's waking" if figures["source"] == KERNEL else "as the workers saw them"
    columns = ("policy", "late per comparison", "in all", "of operations", "per 1,000", "excess per comparison")
    lines = [
        f"{figures['comparisons']} comparisons; operations started {LATE_START_TEXT} after their input, counted {how}:",
        "",
        "| " + " | ".join(columns) + " | p (same rate) |",
        "|---" * (len(columns) + 1) + "|",
    ]
    for name, f in figures["policies"].items():
        excess = f"{f['excess_per_comparison']:+.2f}" if "excess_per_comparison" in f else "(baseline)"
        p = f"{f['p_same_rate']:.2g}" if "p_same_rate" in f else ""
        late = ", ".join(map(str, f["late"]))
        cells = (name, late, f["late_total"], f"{f['ops_total']:,}", f"{f['late_per_1000_ops']:.2f}", excess, p)
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    if figures["source"] == KERNEL:
        lines += [
            "",
            "What the CPU of the late threads' run queues ran while they waited (ms, summed; largest five):",
            "",
        ]
        for name, f in figures["policies"].items():
            lost = f" ({f['events_lost']} events lost: counts may be short)" if f["events_lost"] else ""
            by_role = f["queue_cpu_ms_by_role"]
            if by_role is None:
                lines.append(f"- {name}: not told (a trace without the tasks' moves between CPUs){lost}")
                continue
            roles = [(r, ms) for r, ms in by_role.items() if ms > 0][:5]
            shown = ", ".join(f"{r} {ms:.1f}" for r, ms in roles) or "nothing"
            lines.append(f"- {name} ({sum(by_role.values()):.1f} ms): {shown}{lost}")
        lines += [
            "",
            "Another CPU free while they waited for one (idle, or running only SCHED_IDLE work), and how many",
            f"had one at some moment before {LATE_BOUND_TEXT} from their input:",
            "",
        ]
        for name, f in figures["policies"].items():
            if f["free_cpu_ms"] is None or f["late_ops_free_cpu"] is None:
                why = (
                    "a trace without the moves between CPUs, or summaries from before: "
                    f"{testbed_command()} analyze each run"
                )
                lines.append(f"- {name}: not told ({why})")
                continue
            lines.append(
                f"- {name}: {f['free_cpu_ms']:.1f} of {f['runnable_ms']:.1f} ms waiting; "
                f"{f['late_ops_free_cpu']} of {f['late_total']} late operations"
            )
    return "\n".join(lines)
