"""From a run folder's traces to ``events.parquet``, ``summary.json``, ``trace.json`` and plots, and the
summary as printed.

Used at the end of every run (also an aborted one) and by ``testbed analyze RUN_DIR``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from testbed.errors import SpecError
from testbed.invocation import testbed_command
from testbed.results import analysis as A
from testbed.results import link_counters as L
from testbed.results.bubbletea_summary import bubbletea_stats
from testbed.results.chrome_trace import chrome_trace
from testbed.results.plots import (
    grant_intervals,
    plot_bubble_predictions,
    plot_link_grants,
    plot_links,
    plot_timeline,
)
from testbed.results.sched_summary import sched_stats
from testbed.results.summary import grant_stats, machine_stats, slice_stats, summarize
from testbed.results.wan_changes import configured_rates, outages, profile_phases
from testbed.spec.units import format_rate
from testbed.trace import metrics as M
from testbed.trace import schema as T
from testbed.trace.events import read_events, read_link_counters
from testbed.trace.frame import in_frame, rows_in_frame, run_dilation, to_emulated_frame
from testbed.trace.jsonl import read_json_object, read_jsonl
from testbed.trace.shaping_log import SHAPING_LOG

#: what ``finalize`` reads of a run's config.json (every run written by ``testbed run`` has them)
CONFIG_FIELDS = (
    "name",
    "topology",
    "schedule",
    "iterations",
    "warmup_iterations",
    "replicas",
    "microbatches",
    "microbatch_size",
    "model",
    "compute",
    "workers",
)


def read_run_config(run_dir: Path) -> dict[str, Any]:
    """A run folder's ``config.json``. Raises SpecError naming the file and what is wrong with it."""
    path = run_dir / "config.json"
    fix = "give a folder written by testbed run (its config.json is the resolved experiment)"
    config = read_json_object(path, fix)
    missing = [k for k in CONFIG_FIELDS if k not in config]
    if missing:
        raise SpecError(str(path), missing[0], None, "is missing", fix)
    return config


def finalize(run_dir: Path, aborted: bool = False) -> dict[str, Any]:
    """Write events.parquet (with idle rows), summary.json, trace.json and the plots; return the summary."""
    config = read_run_config(run_dir)
    env_path = run_dir / "env.json"
    env = json.loads(env_path.read_text()) if env_path.exists() else {}
    ev = read_events(run_dir)
    if not ev.empty:
        ev = ev[ev[T.KIND] != T.IDLE]
        idle = A.idle_gaps(ev)
        full = pd.concat([ev, idle], ignore_index=True) if not idle.empty else ev
        full.to_parquet(run_dir / "events.parquet", index=False)
    counters = read_link_counters(run_dir)
    summary = summarize(A.training_events(ev) if not ev.empty else ev, config, env, counters, aborted)
    summary.update(grant_stats(run_dir))
    summary.update(slice_stats(run_dir))
    summary.update(machine_stats(run_dir))
    summary.update(bubbletea_stats(run_dir, ev, config, summary[M.GPU_UTILIZATION]))
    summary.update(sched_stats(run_dir, ev, config["warmup_iterations"]))
    shaping = read_jsonl(run_dir / SHAPING_LOG) if (run_dir / SHAPING_LOG).exists() else []
    training = A.training_events(ev) if not ev.empty else ev
    summary[M.OUTAGES] = outages(shaping, training, env.get("run_start_ns"))
    summary[M.PROFILE_PHASES] = profile_phases(shaping, training, config["warmup_iterations"])
    k = run_dilation(config)
    summary = to_emulated_frame(summary, k)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    # the plots and the Chrome trace in the emulated frame too (trace/frame.py)
    rates = in_frame(configured_rates(shaping, counters), k)  # the plots draw them where they changed
    ev = in_frame(ev, k)
    if not ev.empty:
        (run_dir / "trace.json").write_text(json.dumps(chrome_trace(ev, rows_in_frame(shaping, k))))
        plot_timeline(ev, run_dir / "timeline.png", config["warmup_iterations"], rates, k)
        plot_bubble_predictions(ev, run_dir / "bubble_prediction.png", config["warmup_iterations"], k)
    plot_links(in_frame(L.link_utilization(counters), k), run_dir / "wan_utilization.png", rates, k)
    if (run_dir / "controller.jsonl").exists() and not ev.empty:
        grants = in_frame(grant_intervals(read_jsonl(run_dir / "controller.jsonl")), k)
        plot_link_grants(grants, ev, run_dir / "link_grants.png", config["warmup_iterations"], k)
    return summary


SUMMARY_ROWS = [
    (M.ITERATION_TIME_S, "iteration time (s, mean)"),
    (M.ITERATION_TIME_P95_S, "iteration time (s, p95)"),
    (M.TOKENS_PER_S, "tokens/s"),
    (M.GPU_UTILIZATION, "GPU utilization (incl. prefill)"),
    (M.BUBBLE_FRACTION, "bubble fraction"),
    (M.WAN_COMPUTE_RATIO, "WAN/compute ratio"),
    (M.LOSS_FIRST, "loss (first)"),
    (M.LOSS_LAST, "loss (last)"),
    (M.COMPUTE_OVERRUN_FRACTION, "compute overrun fraction"),
    (M.COMPUTE_HEADROOM, "compute headroom (target/real)"),
    (M.TRAINING_OPS_STARTED_LATE, f"ops started {A.LATE_START_TEXT} after input"),
    (M.START_AFTER_ARRIVAL_P50_MS, "  start after input p50 (ms)"),
    (M.START_AFTER_ARRIVAL_P99_MS, "  start after input p99 (ms)"),
    (M.PREDICTED_ITERATION_TIME_S, "predicted iteration time (s)"),
    (M.PREDICTION_ERROR, "prediction error (meas-pred)/meas"),
    (M.TIME_DILATION, "time dilation (figures in the emulated frame)"),
    (M.BACKEND, "network backend"),
    (M.DELAY_MECHANISM, "delay mechanism"),
    (M.TRAINING_SLICE_MS, "training threads' CPU slice (ms)"),
    (M.TRAINING_WAIT_RT_PRIORITY, "  SCHED_FIFO priority while waiting for input"),
    (M.TRAINING_WAIT_NICE, "  nice while waiting for input"),
    (M.SWITCH_INTERVAL_US, "  interpreter switch interval (µs)"),
    (M.STARTUP_S, "start-up (s, first forward)"),
    (M.WAN_QUEUE_DROPS, "WAN queue drops (packets)"),
]


#: printed when present: the machines of a remote run, the Atlas controller's and BubbleTea's figures
EXTRA_ROWS = [
    (M.MACHINES, "machines (DCs)"),
    (M.CLOCK_OFFSET_UNCERTAINTY_MS, "  clock offsets' uncertainty (ms)"),
    (M.GRANTS, "Atlas grants"),
    (M.GRANT_LATENCY_P50_MS, "grant latency p50 (ms)"),
    (M.GRANT_LATENCY_P99_MS, "grant latency p99 (ms)"),
    (M.GRANT_APPLY_P50_MS, "  decision to applied p50 (ms)"),
    (M.GRANT_APPLY_P99_MS, "  decision to applied p99 (ms)"),
    (M.GRANT_ROUND_TRIP_P50_MS, "  decision to relay's answer p50 (ms)"),
    (M.GRANT_ROUND_TRIP_P99_MS, "  decision to relay's answer p99 (ms)"),
    (M.HANDOVER_GAP_P50_MS, "handover gap p50 (ms)"),
    (M.GRANT_HOLD_P50_MS, "grant hold p50 (ms)"),
    (M.GRANTS_RELEASED_BY_DEADLINE, "grants released by deadline"),
    (M.LINK_BUSY_DURING_GRANTS, "link busy during grants"),
    (M.SERVING_WINDOW_S, "serving window (s, prefill alone)"),
    (M.QUEUE_EMPTY_SHARE, "  share with nothing queued"),
    (M.TRAINING_GPU_UTILIZATION, "training GPU utilization"),
    (M.BUBBLE_FILL_FRACTION, "bubble fill fraction"),
    (M.FILL_THREAD_NICE, "filling thread's nice"),
    (M.PREFILL_TOKENS_PER_S, "prefill tokens/s"),
    (M.REQUESTS_COMPLETED, "requests completed"),
    (M.TTFT_P50_S, "TTFT p50 (s)"),
    (M.TTFT_P99_S, "TTFT p99 (s)"),
    (M.DISPATCH_DELAY_P50_MS, "  of it, arrival to dispatch p50 (ms)"),
    (M.DISPATCH_DELAY_P99_MS, "  of it, arrival to dispatch p99 (ms)"),
    (M.TTFT_WITHIN_SLO_SHARE, "share of requests within the TTFT SLO"),
    (M.TTFT_ALONE_P50_S, "TTFT p50 serving prefill alone (s)"),
    (M.TTFT_SLO_REACHABLE_SHARE, "share within the SLO serving prefill alone"),
    (M.TTFT_SLO_S, "TTFT SLO (s)"),
    (M.TTFT_SLO_ATTAINMENT, "TTFT SLO met (of requests due in the run)"),
    (M.TTFT_SLO_JUDGED, "requests due within the run (TTFT SLO)"),
    (M.TTFT_SLO_SCALE, "TTFT SLO scale (x TTFT alone)"),
    (M.TTFT_SCALED_SLO_ATTAINMENT, "scaled TTFT SLO met (of requests due)"),
    (M.TTFT_SCALED_SLO_JUDGED, "requests due within the run (scaled SLO)"),
    (M.PREFILL_OVERRUN_FRACTION, "prefill overrun fraction"),
    (M.DECODE_OVERRUN_FRACTION, "decode overrun fraction"),
    (M.DECODE_MEAN_BATCH, "decode batch (mean, per request step)"),
    (M.PEAK_GPU_MEMORY_MB, "peak GPU memory (MiB)"),
    (M.GPU_MEMORY_MB, "GPU memory budget (MiB)"),
    (M.TRAINING_OPS_DELAYED_BY_PREFILL, "training ops delayed by prefill"),
    (M.PREFILL_HOLD_P99_MS, "  their delay p99 (ms)"),
    (M.TRAINING_OPS_LATE_WITHOUT_PREFILL, "ops late without prefill"),
    (M.START_AFTER_ARRIVAL_P99_MS_WITHOUT_PREFILL, "  their delay p99 (ms)"),
    (M.BUBBLE_PREDICTION_ERROR_P50_MS, "bubble prediction error p50 (ms)"),
    (M.SCHED_LATE_OPS, "late ops from the waking"),
    (M.SCHED_LATE_UNSEEN_MS, "  before it was seen (ms)"),
    (M.SCHED_LATE_RUNNING_MS, "  their thread on a CPU (ms)"),
    (M.SCHED_LATE_RUNNABLE_MS, "  waiting for a CPU (ms)"),
    (M.SCHED_LATE_FREE_CPU_MS, "    another CPU free (ms)"),
    (M.SCHED_LATE_OPS_FREE_CPU, "    ops with one free before the bound"),
    (M.SCHED_LATE_SLEEPING_MS, "  asleep (ms)"),
    (M.SCHED_LATE_UNKNOWN_MS, "  not in the trace (ms)"),
    (M.SCHED_EVENTS_LOST, "  sched events lost"),
]


#: the labels of the summary's rows that are not one figure each
STAGE_BUBBLES_LABEL = "bubble fraction per stage"
CPUS_RAN_LABEL = "  CPUs ran meanwhile (ms)"
QUEUE_CPU_RAN_LABEL = "    of which their queue CPU"
#: the width of the summary's label column: its longest label
LABEL_WIDTH = max(
    len(label)
    for label in [label for _, label in SUMMARY_ROWS + EXTRA_ROWS]
    + [STAGE_BUBBLES_LABEL, CPUS_RAN_LABEL, QUEUE_CPU_RAN_LABEL]
)


def _row(label: str, v: Any) -> str:
    """One line of the summary: ``label`` padded to ``LABEL_WIDTH``, then ``v`` (floats to 4
    significant digits; a mapping as ``key: value; ...``, lists joined by commas)."""
    if isinstance(v, dict):
        v = "; ".join(f"{k}: {', '.join(map(str, x)) if isinstance(x, list) else x}" for k, x in v.items())
    return f"  {label:<{LABEL_WIDTH}} {v:.4g}" if isinstance(v, float) else f"  {label:<{LABEL_WIDTH}} {v}"


#: a prediction error (|measured - predicted| / measured) above which the summary says where the
#: prediction came from: the modelled window is off by up to 29% on this kernel (docs/results.md, "The
#: simulator against measured runs"), the measured paths by up to 7.2%
PREDICTION_NOTE_ABOVE = 0.10


def format_summary(s: dict[str, Any]) -> str:
    lines = [
        f"{s[M.EXPERIMENT]} on {s[M.TOPOLOGY]}: {s[M.WORKERS]} workers, {s[M.SCHEDULE]}, "
        f"{s[M.COMPLETED_ITERATIONS]}/{s[M.ITERATIONS]} iterations ({s[M.WARMUP_ITERATIONS]} warm-up)"
    ]
    for key, label in SUMMARY_ROWS:
        lines.append(_row(label, s.get(key)))
    lines.append(_row(STAGE_BUBBLES_LABEL, ", ".join(f"{b:.3f}" for b in s[M.BUBBLE_FRACTION_PER_STAGE])))
    for key, label in EXTRA_ROWS:
        v = s.get(key)
        if v is not None:
            lines.append(_row(label, v))
    if s.get(M.SCHED_TRACE_ERROR):
        lines.append(f"  scheduler trace not read: {s[M.SCHED_TRACE_ERROR]}")
    if s.get(M.SCHED_CPU_WHILE_RUNNABLE_MS):
        ran = s[M.SCHED_CPU_WHILE_RUNNABLE_MS].items()
        lines.append(_row(CPUS_RAN_LABEL, ", ".join(f"{role} {ms:.1f}" for role, ms in ran)))
    if s.get(M.SCHED_QUEUE_CPU_WHILE_RUNNABLE_MS):
        ran = s[M.SCHED_QUEUE_CPU_WHILE_RUNNABLE_MS].items()
        lines.append(_row(QUEUE_CPU_RAN_LABEL, ", ".join(f"{role} {ms:.1f}" for role, ms in ran)))
    if not s[M.REPRESENTATIVE]:
        lines.append("  WARNING: more than 5% of operations overran their compute target: not representative")
    error = s.get(M.PREDICTION_ERROR)
    if error is not None and abs(error) > PREDICTION_NOTE_ABOVE:
        lines.append(
            "  note: the prediction is the cost model's, made before the run with its modelled TCP window; "
            f"a run with --profile-wan, checked with `{testbed_command()} sim --validate RUN_DIR`, is predicted from "
            'its measured paths (docs/results.md, "The simulator against measured runs")'
        )
    measured = s[M.COMPLETED_ITERATIONS] - s[M.WARMUP_ITERATIONS]
    if 0 < measured < 3:
        lines.append(f"  note: statistics from only {measured} measured iteration(s)")
    for o in s.get(M.OUTAGES) or []:
        took = f"{o['duration_s']:.2f} s" if o["duration_s"] is not None else "until the end"
        resumed = f", training resumed {o['resume_ms']:.0f} ms after its return" if o["resume_ms"] is not None else ""
        lines.append(f"  outage of {o['link']} at {o['down_s']:.1f} s for {took}{resumed}")
    phases = s.get(M.PROFILE_PHASES) or []
    if phases:
        lines.append("  iteration time per profile phase:")
    for p in phases:
        links = ", ".join(
            f"{k} {'down' if v['rate_bps'] == 0 else format_rate(v['rate_bps'])} {v['delay_us'] / 1000:g} ms"
            for k, v in p["links"].items()
        )
        t = f"{p['iteration_time_s']:.3f} s over {p['iterations']}" if p["iteration_time_s"] is not None else "none"
        lines.append(f"    from {p['start_s']:.1f} s ({links}): {t}")
    if s[M.ABORTED]:
        lines.append("  the run was ABORTED: figures cover the completed part")
    return "\n".join(lines)
