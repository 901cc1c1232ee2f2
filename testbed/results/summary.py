"""A run's summary (``summary.json``) from its traces: training figures and Atlas's grant figures
(BubbleTea's: ``bubbletea_summary.py``). Names of the figures: ``trace/metrics.py``; definitions:
``analysis.py`` and ``bubbletea/windows.py``."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from testbed.plan.virtual_stages import padding_targets_ms
from testbed.results import analysis as A
from testbed.results import link_counters as L
from testbed.spec.compute import compute_from_dict
from testbed.spec.experiment import tokens_per_iteration
from testbed.spec.pipeline_schedules import chunks_per_worker
from testbed.spec.policy import DEFAULT_POLICY, Policy, UnknownPolicy, parse_policy
from testbed.trace import metrics as M
from testbed.trace import schema as T
from testbed.trace.jsonl import read_jsonl
from testbed.trace.shaping_log import RELAY_LOG
from testbed.trace.startup import FILL_NICE, SLICE_NS, STARTUP_LOG, SWITCH_INTERVAL_US, WAIT_NICE, WAIT_RT_PRIORITY

#: A run whose share of padded operations that overran their target exceeds this is flagged.
MAX_REPRESENTATIVE_OVERRUN = 0.05


def run_policy(config: dict[str, Any]) -> Policy | None:
    """The policy a run folder's ``config.json`` ran (None for a name no longer known)."""
    try:
        return parse_policy(str(config.get("policy", DEFAULT_POLICY)))
    except UnknownPolicy:
        return None


def uses_bubbletea(config: dict[str, Any]) -> bool:
    """Whether a run folder's ``config.json`` ran a BubbleTea policy (False for a name no longer known)."""
    return (policy := run_policy(config)) is not None and policy.bubbletea


def serves_alone(config: dict[str, Any]) -> bool:
    """Whether a run folder's ``config.json`` served prefill alone, with no training (``+prefill-alone``)."""
    return (policy := run_policy(config)) is not None and not policy.training


#: the training figures a run serving prefill alone has none of (its windows are no iterations)
TRAINING_ONLY = (
    M.ITERATION_TIME_S,
    M.ITERATION_TIME_P50_S,
    M.ITERATION_TIME_P95_S,
    M.TOKENS_PER_S,
    M.BUBBLE_FRACTION,
    M.PREDICTION_ERROR,
    M.TRAINING_OPS_WITH_INPUT,
    M.TRAINING_OPS_STARTED_LATE,
    M.START_AFTER_ARRIVAL_P50_MS,
    M.START_AFTER_ARRIVAL_P99_MS,
)


def summarize(
    ev: pd.DataFrame, config: dict[str, Any], env: dict[str, Any], counters: pd.DataFrame, aborted: bool = False
) -> dict[str, Any]:
    """The training figures of a run: ``ev`` its training events, ``config`` its config.json, ``env`` its
    env.json, ``counters`` its link counters; warm-up iterations are left out of every statistic.
    A run serving prefill alone has ``serving_window_s`` (its windows' mean, s), the share of them
    its workers had nothing queued (``queue_empty_share``), its completed windows as iterations,
    and None for the figures of ``TRAINING_ONLY``."""
    out = _summarize(ev, config, env, counters, aborted)
    if serves_alone(config):
        windows = ev.loc[ev[T.KIND] == T.SERVING_WINDOW, T.ITERATION] if not ev.empty else pd.Series(dtype=float)
        out[M.SERVING_WINDOW_S] = out[M.ITERATION_TIME_S]
        out[M.QUEUE_EMPTY_SHARE] = queue_empty_share(ev, config["warmup_iterations"])
        out[M.COMPLETED_ITERATIONS] = int(windows.max() + 1) if len(windows) else 0
        out.update(dict.fromkeys(TRAINING_ONLY))
        out[M.BUBBLE_FRACTION_PER_STAGE] = []
    return out


def queue_empty_share(ev: pd.DataFrame, warmup: int) -> float | None:
    """Of a prefill-alone run's measured serving windows (index >= ``warmup``), summed over workers,
    the share in which the worker had no request queued (``T.QUEUE_EMPTY_NS``); None without any."""
    if ev.empty or T.QUEUE_EMPTY_NS not in ev:
        return None
    w = ev[(ev[T.KIND] == T.SERVING_WINDOW) & (ev[T.ITERATION] >= warmup)]
    span = (w[T.END_NS] - w[T.START_NS]).sum()
    return float(w[T.QUEUE_EMPTY_NS].fillna(0).sum() / span) if span > 0 else None


def _summarize(
    ev: pd.DataFrame, config: dict[str, Any], env: dict[str, Any], counters: pd.DataFrame, aborted: bool
) -> dict[str, Any]:
    warmup = config["warmup_iterations"]
    if ev.empty:
        it = pd.DataFrame(columns=["duration_s"])
    else:
        it = A.iteration_times(ev, warmup)
    stats = A.iteration_stats(it)
    util = A.worker_utilization(ev, warmup) if not ev.empty else pd.DataFrame(columns=["utilization", T.STAGE])
    bubbles = A.stage_bubbles(util) if not util.empty else pd.DataFrame(columns=[T.STAGE, "bubble_fraction"])
    loss = A.losses(ev) if not ev.empty else pd.Series(dtype=float)
    compute = compute_from_dict(config["compute"])
    chunks = chunks_per_worker(config.get("schedule", "1f1b"), config.get("virtual_stages"))
    targets_ms = padding_targets_ms(compute.forward_ms, compute.backward_ms, compute.optimizer_target_ms, chunks)
    targets = {k: int(v * 1e6) for k, v in targets_ms.items()}
    overrun = A.overrun_fraction(ev, targets, warmup) if compute.padded and not ev.empty else 0.0
    tokens = tokens_per_iteration(
        config["replicas"], config["microbatches"], config["microbatch_size"], config["model"]["seq_len"]
    )
    lu = L.link_utilization(counters)
    drops = L.queue_drops(counters)
    return {
        M.POLICY: config.get("policy", DEFAULT_POLICY),
        M.PLAN: config.get("plan", "the experiment's own layout"),
        M.TOPOLOGY: config["topology"],
        M.EXPERIMENT: config["name"],
        M.SCHEDULE: config["schedule"],
        M.WORKERS: len(config["workers"]),
        M.ITERATIONS: config["iterations"],
        M.COMPLETED_ITERATIONS: int(loss.index.max() + 1) if len(loss) else 0,
        M.WARMUP_ITERATIONS: warmup,
        M.ITERATION_TIME_S: stats["mean"],
        M.ITERATION_TIME_P50_S: stats["p50"],
        M.ITERATION_TIME_P95_S: stats["p95"],
        M.TOKENS_PER_S: tokens / stats["mean"] if stats["mean"] else None,
        M.GPU_UTILIZATION: float(util["utilization"].mean()) if not util.empty else None,
        M.BUBBLE_FRACTION: float(bubbles["bubble_fraction"].mean()) if not bubbles.empty else None,
        M.BUBBLE_FRACTION_PER_STAGE: [float(b) for b in bubbles["bubble_fraction"]],
        M.LOSS_FIRST: float(loss.iloc[0]) if len(loss) else None,
        M.LOSS_LAST: float(loss.iloc[-1]) if len(loss) else None,
        M.BACKEND: env.get("backend", "netns"),
        M.DELAY_MECHANISM: env.get("delay_mechanism"),
        M.WAN_COMPUTE_RATIO: A.nan_to_none(A.wan_compute_ratio(ev, warmup)) if not ev.empty else None,
        M.COMPUTE_OVERRUN_FRACTION: overrun,
        **A.late_start_figures(A.start_after_arrival(ev, warmup)),
        M.REPRESENTATIVE: overrun <= MAX_REPRESENTATIVE_OVERRUN,
        M.COMPUTE_HEADROOM: (A.compute_headroom(ev, targets, warmup) if compute.padded and not ev.empty else None),
        M.WAN_UTILIZATION_MEAN: (
            L.wan_utilization_mean(lu, int(it[T.START_NS].min()), int(it[T.END_NS].max()))
            if not lu.empty and not it.empty
            else None
        ),
        M.WAN_QUEUE_DROPS: sum(drops.values()) if drops is not None else None,
        M.WAN_QUEUE_DROPS_BY_LINK: {link: n for link, n in (drops or {}).items() if n},
        M.WAN_QUEUE_BACKLOG_MAX_BYTES: L.queue_backlog_max_bytes(counters),
        M.PREDICTED_ITERATION_TIME_S: config.get("predicted_iteration_time_s"),
        M.PREDICTION_ERROR: (
            (stats["mean"] - config["predicted_iteration_time_s"]) / stats["mean"]
            if stats["mean"] and config.get("predicted_iteration_time_s")
            else None
        ),
        M.STARTUP_S: A.startup_s(ev, env.get("run_start_ns")) if not ev.empty else None,
        M.ABORTED: aborted,
    }


def slice_stats(run_dir: Path) -> dict:
    """The training threads' CPU slice and how their main threads waited for an input
    (``thread_slice.py``): the longest slice (ms), the lowest real-time priority and the highest
    nice value a worker reported on its ``process_group`` line of ``startup.jsonl``; each None
    where any worker reported none, or none was recorded (a run from before it); the longest
    interpreter switch interval (µs, ``M.SWITCH_INTERVAL_US``), the same way. With the highest
    nice value of BubbleTea's filling threads, where workers reported one (``M.FILL_THREAD_NICE``)."""
    path = run_dir / STARTUP_LOG
    rows = [r for r in (read_jsonl(path) if path.exists() else []) if r.get("phase") == "process_group"]
    rows = [r for r in rows if r.get(T.WORKER) is not None]

    def weakest(
        field: str, of: Callable[[list], Any] = max
    ) -> Any:  # None where any worker reported none, or no worker
        values = [r.get(field) for r in rows]
        return of(values) if values and None not in values else None

    slice_ns = weakest(SLICE_NS)
    fills = [r[FILL_NICE] for r in rows if r.get(FILL_NICE) is not None]
    return {
        M.TRAINING_SLICE_MS: slice_ns / 1e6 if slice_ns is not None else None,
        M.TRAINING_WAIT_RT_PRIORITY: weakest(WAIT_RT_PRIORITY, min),
        M.TRAINING_WAIT_NICE: weakest(WAIT_NICE),
        M.SWITCH_INTERVAL_US: weakest(SWITCH_INTERVAL_US),
        **({M.FILL_THREAD_NICE: max(fills)} if fills else {}),
    }


def grant_stats(run_dir: Path) -> dict:
    """Atlas controller figures from controller.jsonl (``analysis.grant_figures``), whether the
    controller failed during the run, and across machines its relays' counts (``relay.jsonl``)."""
    path = run_dir / "controller.jsonl"
    if not path.exists():
        return {}
    out = {**A.grant_figures(read_jsonl(path)), M.CONTROLLER_FAILED: (run_dir / "controller_failed").exists()}
    relays = run_dir / RELAY_LOG
    if relays.exists():
        counts = [r for r in read_jsonl(relays) if r.get("event") in ("relay_counts", "relay_end")]
        skip = ("event", "machine", "t_ns")
        last = {r["machine"]: r for r in sorted(counts, key=lambda r: r["t_ns"])}  # each relay's latest
        out[M.CONTROL_RELAYS] = {m: {k: v for k, v in r.items() if k not in skip} for m, r in sorted(last.items())}
    return out


def machine_stats(run_dir: Path) -> dict:
    """``--backend remote``: the machines the run spanned, with their DCs (``topology.json``'s
    inventory), and the largest uncertainty of their clock offsets (``clock_offsets.json``); empty
    for a run on one machine."""
    clock_path, topo_path = run_dir / "clock_offsets.json", run_dir / "topology.json"
    if not clock_path.exists() or not topo_path.exists():
        return {}
    inventory = json.loads(topo_path.read_text()).get("inventory") or {}
    clock = json.loads(clock_path.read_text())["machines"]
    worst = max((est["uncertainty_ns"] for c in clock.values() for est in c.values()), default=None)
    return {
        M.MACHINES: {m["name"]: m["dcs"] for m in inventory.get("machines", [])},
        M.CLOCK_OFFSET_UNCERTAINTY_MS: worst / 1e6 if worst is not None else None,
    }
