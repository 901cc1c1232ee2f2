"""From a run folder's traces to ``events.parquet``, ``summary.json``, ``trace.json`` and plots.

Used at the end of every run (also an aborted one) and by ``testbed analyze RUN_DIR``.
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from . import analysis as A
from . import trace as T
from .experiment import split_policy

#: A run whose share of padded operations that overran their target exceeds this is flagged.
MAX_REPRESENTATIVE_OVERRUN = 0.05
COLORS = {T.FORWARD: "#4c72b0", T.BACKWARD: "#55a868", T.SEND: "#dd8452", T.RECV_WAIT: "#e5e5e5",
          T.ALLREDUCE: "#c44e52", T.OPTIMIZER: "#8172b3", T.IDLE: "#ffffff", T.PREFILL: "#e7b416"}


def summarize(ev: pd.DataFrame, config: dict, env: dict, counters: pd.DataFrame, aborted: bool = False) -> dict:
    warmup = config["warmup_iterations"]
    if ev.empty:
        it = pd.DataFrame(columns=["duration_s"])
    else:
        it = A.iteration_times(ev, warmup)
    stats = A.iteration_stats(it)
    util = A.worker_utilization(ev, warmup) if not ev.empty else pd.DataFrame(columns=["utilization", T.STAGE])
    bubbles = A.stage_bubbles(util) if not util.empty else pd.DataFrame(columns=[T.STAGE, "bubble_fraction"])
    loss = A.losses(ev) if not ev.empty else pd.Series(dtype=float)
    compute = config["compute"]
    targets = {T.FORWARD: int(compute["forward_ms"] * 1e6), T.BACKWARD: int(compute["backward_ms"] * 1e6)}
    overrun = A.overrun_fraction(ev, targets, warmup) if compute["mode"] == "padded" and not ev.empty else 0.0
    tokens = config["replicas"] * config["microbatches"] * config["microbatch_size"] * config["model"]["seq_len"]
    lu = A.link_utilization(counters)
    return {
        "policy": config.get("policy", "pp-fair"),
        "topology": config["topology"],
        "experiment": config["name"],
        "schedule": config["schedule"],
        "workers": len(config["workers"]),
        "iterations": config["iterations"],
        "completed_iterations": int(loss.index.max() + 1) if len(loss) else 0,
        "warmup_iterations": warmup,
        "iteration_time_s": stats["mean"],
        "iteration_time_p50_s": stats["p50"],
        "iteration_time_p95_s": stats["p95"],
        "tokens_per_s": tokens / stats["mean"] if stats["mean"] else None,
        "gpu_utilization": float(util["utilization"].mean()) if not util.empty else None,
        "bubble_fraction": float(bubbles["bubble_fraction"].mean()) if not bubbles.empty else None,
        "bubble_fraction_per_stage": [float(b) for b in bubbles["bubble_fraction"]],
        "loss_first": float(loss.iloc[0]) if len(loss) else None,
        "loss_last": float(loss.iloc[-1]) if len(loss) else None,
        "backend": env.get("backend", "netns"),
        "delay_mechanism": env.get("delay_mechanism"),
        "wan_compute_ratio": A.nan_to_none(A.wan_compute_ratio(ev, warmup)) if not ev.empty else None,
        "compute_overrun_fraction": overrun,
        "representative": overrun <= MAX_REPRESENTATIVE_OVERRUN,
        "compute_headroom": (A.compute_headroom(ev, targets, warmup)
                             if compute["mode"] == "padded" and not ev.empty else None),
        "wan_utilization_mean": (A.wan_utilization_mean(lu, int(it[T.START_NS].min()), int(it[T.END_NS].max()))
                                 if not lu.empty and not it.empty else None),
        "predicted_iteration_time_s": config.get("predicted_iteration_time_s"),
        "prediction_error": ((stats["mean"] - config["predicted_iteration_time_s"]) / stats["mean"]
                             if stats["mean"] and config.get("predicted_iteration_time_s") else None),
        "aborted": aborted,
    }


def _jsonl(path: Path) -> list[dict]:
    rows = []
    for p in sorted(path.parent.glob(path.name)):
        for line in p.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue  # a torn last line
    return rows


#: a training operation held back longer than this by a running prefill chunk counts as delayed
DELAY_THRESHOLD_NS = 1_000_000


def bubbletea_stats(run_dir: Path, ev: pd.DataFrame, config: dict, training_utilization: float | None) -> dict:
    """GPU utilization with and without prefill, and, under BubbleTea, how the bubbles were filled
    and what the requests saw (definitions in ``bubbles.fill_stats`` and ``decode.py``);
    ``training_utilization`` is the summary's own (training compute only):
    ``bubble_fill_fraction``, ``prefill_tokens_per_s`` (prefilled tokens over the measured
    iterations' wall time), ``requests_assigned``, ``requests_completed`` (first token at a decode
    host), ``requests_decoded``, ``ttft_p50_s``/``ttft_p99_s`` (arrival to first token at the decode
    host, KV transfer included), ``training_ops_delayed_by_prefill`` (forward/backward operations
    whose input had arrived while a chunk ran and which started more than 1 ms later), and the
    bubble profile's prediction error (``bubbles.prediction_error_stats``)."""
    from . import bubbles as B

    warmup = config["warmup_iterations"]
    if ev.empty:
        return {}
    train = A.training_events(ev)
    util = A.worker_utilization(ev, warmup, T.COMPUTE_KINDS + (T.PREFILL,))
    out = {"training_gpu_utilization": training_utilization, "gpu_utilization": float(util["utilization"].mean())}
    if not split_policy(str(config.get("policy", "")))[1]:
        return out
    pre = ev[ev[T.KIND] == T.PREFILL]
    it = A.iteration_times(train, warmup)
    t0, t1 = (int(it[T.START_NS].min()), int(it[T.END_NS].max())) if not it.empty else (0, 0)
    inside = pre[(pre[T.START_NS] >= t0) & (pre[T.END_NS] <= t1)]
    fill = B.fill_stats(train, pre[[T.WORKER, T.START_NS, T.END_NS]], warmup) if not it.empty else {}
    decode_log = _jsonl(run_dir / "requests" / "decode-*.jsonl")
    first = [r for r in decode_log if r.get("event") == "first_token"]
    decoded = [r for r in decode_log if r.get("event") == "decoded"]
    assigned = [r for r in _jsonl(run_dir / "requests" / "dispatch.jsonl") if r.get("event") == "assign"]
    ttft = pd.Series([(r["first_token_ns"] - r["arrival_ns"]) / 1e9 for r in first], dtype=float)
    delays = train[train[T.KIND].isin((T.FORWARD, T.BACKWARD))]
    delays = delays[T.PREFILL_DELAY_NS] if T.PREFILL_DELAY_NS in delays else pd.Series(dtype=float)
    windows = B.bubble_windows(train)
    windows.to_parquet(run_dir / "bubbles.parquet", index=False)   # the bubble profile's raw material
    errors = B.prediction_error_stats(B.prediction_errors(windows, warmup, config["bubbletea"]["profile_iterations"]))
    return {**out,
            "bubble_fill_fraction": fill.get("bubble_fill_fraction"),
            "prefill_tokens_per_s": float(inside[T.TOKENS].sum() / ((t1 - t0) / 1e9)) if t1 > t0 else None,
            "prefill_chunks": int(len(pre)),
            "requests_assigned": len(assigned), "requests_completed": len(first), "requests_decoded": len(decoded),
            "ttft_p50_s": float(ttft.quantile(0.5)) if len(ttft) else None,
            "ttft_p99_s": float(ttft.quantile(0.99)) if len(ttft) else None,
            "training_ops_delayed_by_prefill": int((delays.fillna(0) > DELAY_THRESHOLD_NS).sum()),
            "bubble_prediction_error_p50_ms": errors.get("abs_error_p50_ms"),
            "bubble_prediction_error_p99_ms": errors.get("abs_error_p99_ms"),
            "bubble_over_predicted_share": errors.get("over_predicted_share")}


def grant_stats(run_dir: Path) -> dict:
    """Atlas controller figures from controller.jsonl (``analysis.grant_figures``) and whether the
    controller failed during the run."""
    path = run_dir / "controller.jsonl"
    if not path.exists():
        return {}
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue  # a torn last line (controller killed mid-write)
    return {**A.grant_figures(rows), "controller_failed": (run_dir / "controller_failed").exists()}


def chrome_trace(ev: pd.DataFrame, shaping: list[dict] | None = None) -> dict:
    """Chrome trace format (chrome://tracing, Perfetto): one process per DC, one thread per worker;
    live shaping changes (Atlas grants) as instant events on the sending DC's process."""
    out = []
    dcs = {dc: i for i, dc in enumerate(dict.fromkeys(ev[T.DC]))}
    for dc, pid in dcs.items():
        out.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": f"DC {dc}"}})
    for (w, dc, stage, replica), _ in ev.groupby([T.WORKER, T.DC, T.STAGE, T.REPLICA]):
        out.append({"name": "thread_name", "ph": "M", "pid": dcs[dc], "tid": int(w),
                    "args": {"name": f"worker {w} (stage {stage}, replica {replica})"}})
    t0 = int(ev[T.START_NS].min())
    for r in ev.itertuples(index=False):
        row = r._asdict()
        out.append({"name": f"{row[T.KIND]} mb{row[T.MICROBATCH]}" if row[T.MICROBATCH] >= 0 else row[T.KIND],
                    "cat": row[T.KIND], "ph": "X", "pid": dcs[row[T.DC]], "tid": int(row[T.WORKER]),
                    "ts": (row[T.START_NS] - t0) / 1e3, "dur": (row[T.END_NS] - row[T.START_NS]) / 1e3,
                    "args": {"iteration": int(row[T.ITERATION])}})
    for change in shaping or []:
        if change.get("event") != "change" or change["t_ns"] < t0:
            continue
        dc = change["netns"].split("-", 1)[1].rsplit("-", 1)[0]  # <prefix>-<dc>-r
        out.append({"name": f"{change['classid']} {change['ifname']} -> {change['rate_bps'] / 1e6:g} Mbit/s",
                    "cat": "shaping", "ph": "i", "s": "p", "pid": dcs.get(dc, 0), "ts": (change["t_ns"] - t0) / 1e3})
    return {"traceEvents": out, "displayTimeUnit": "ms"}


def plot_timeline(ev: pd.DataFrame, path: Path, warmup: int) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    last = int(ev[ev[T.KIND] == T.OPTIMIZER][T.ITERATION].max()) if (ev[T.KIND] == T.OPTIMIZER).any() else warmup + 1
    first = max(warmup, last - 1)           # the last two iterations: BubbleTea's stream is running by then
    ev = ev[(ev[T.ITERATION] >= first) & (ev[T.ITERATION] <= first + 1)]
    if ev.empty:
        return
    t0 = ev[T.START_NS].min()
    workers = sorted(ev[T.WORKER].unique())
    fig, ax = plt.subplots(figsize=(14, 0.5 * len(workers) + 1.5))
    for kind, color in COLORS.items():
        if kind in (T.IDLE, T.SEND):
            continue
        k = ev[ev[T.KIND] == kind]
        if k.empty:
            continue
        ax.barh(k[T.WORKER], (k[T.END_NS] - k[T.START_NS]) / 1e6, left=(k[T.START_NS] - t0) / 1e6, color=color,
                edgecolor="black", linewidth=0.3, label=kind, height=0.8)
        if kind in (T.FORWARD, T.BACKWARD):
            for r in k.itertuples():
                ax.text((getattr(r, T.START_NS) - t0) / 1e6 + 1, getattr(r, T.WORKER), str(getattr(r, T.MICROBATCH)),
                        va="center", fontsize=6)
    labels = ev.groupby(T.WORKER)[[T.STAGE, T.REPLICA, T.DC]].first()
    ax.set_yticks(workers, [f"w{w} s{labels.loc[w, T.STAGE]} r{labels.loc[w, T.REPLICA]} {labels.loc[w, T.DC]}"
                            for w in workers])
    ax.invert_yaxis()
    ax.set_xlabel(f"time (ms) from the start of iteration {first}")
    ax.set_title("pipeline timeline (numbers: microbatch; prefill chunks in yellow under BubbleTea)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12 - 0.6 / len(workers)), fontsize=7, ncol=5, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_links(lu: pd.DataFrame, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if lu.empty:
        return
    fig, ax = plt.subplots(figsize=(12, 4))
    idle = []
    for link, g in lu.groupby(T.LINK):
        if (g["bps"] <= 0).all():
            idle.append(link)
            continue
        ax.plot(g["t_s"], g["utilization"], label=link, linewidth=0.8)
    if idle:
        ax.text(0.01, 0.95, "no traffic: " + ", ".join(idle), transform=ax.transAxes, fontsize=7, va="top")
    ax.set_xlabel("time (s) since the first sample (the network was up; workers were starting)")
    ax.set_ylabel("share of link rate")
    ax.set_ylim(0, 1.1)
    ax.set_title("WAN link utilization")
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def finalize(run_dir: Path, exp=None, aborted: bool = False) -> dict:
    """Write events.parquet (with idle rows), summary.json, trace.json and the plots; return the summary."""
    config = json.loads((run_dir / "config.json").read_text())
    env_path = run_dir / "env.json"
    env = json.loads(env_path.read_text()) if env_path.exists() else {}
    ev = T.read_events(run_dir)
    if not ev.empty:
        ev = ev[ev[T.KIND] != T.IDLE]
        idle = A.idle_gaps(ev)
        full = pd.concat([ev, idle], ignore_index=True) if not idle.empty else ev
        full.to_parquet(run_dir / "events.parquet", index=False)
    counters = T.read_link_counters(run_dir)
    summary = summarize(A.training_events(ev) if not ev.empty else ev, config, env, counters, aborted)
    summary.update(grant_stats(run_dir))
    summary.update(bubbletea_stats(run_dir, ev, config, summary["gpu_utilization"]))
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    if not ev.empty:
        shaping_path = run_dir / "shaping.jsonl"
        shaping = [json.loads(line) for line in shaping_path.read_text().splitlines()] if shaping_path.exists() else []
        (run_dir / "trace.json").write_text(json.dumps(chrome_trace(ev, shaping)))
        plot_timeline(ev, run_dir / "timeline.png", config["warmup_iterations"])
    plot_links(A.link_utilization(counters), run_dir / "wan_utilization.png")
    return summary


SUMMARY_ROWS = [("iteration_time_s", "iteration time (s, mean)"), ("iteration_time_p95_s", "iteration time (s, p95)"),
                ("tokens_per_s", "tokens/s"), ("gpu_utilization", "GPU utilization (incl. prefill)"),
                ("bubble_fraction", "bubble fraction"), ("wan_compute_ratio", "WAN/compute ratio"),
                ("loss_first", "loss (first)"), ("loss_last", "loss (last)"),
                ("compute_overrun_fraction", "compute overrun fraction"),
                ("compute_headroom", "compute headroom (target/real)"),
                ("predicted_iteration_time_s", "predicted iteration time (s)"),
                ("prediction_error", "prediction error (meas-pred)/meas"), ("backend", "network backend"),
                ("delay_mechanism", "delay mechanism")]


#: printed when present: the Atlas controller's and BubbleTea's figures
EXTRA_ROWS = [("grants", "Atlas grants"), ("grant_latency_p50_ms", "grant latency p50 (ms)"),
              ("grant_latency_p99_ms", "grant latency p99 (ms)"), ("handover_gap_p50_ms", "handover gap p50 (ms)"),
              ("training_gpu_utilization", "training GPU utilization"),
              ("bubble_fill_fraction", "bubble fill fraction"), ("prefill_tokens_per_s", "prefill tokens/s"),
              ("requests_completed", "requests completed"), ("ttft_p50_s", "TTFT p50 (s)"),
              ("ttft_p99_s", "TTFT p99 (s)"), ("training_ops_delayed_by_prefill", "training ops delayed by prefill"),
              ("bubble_prediction_error_p50_ms", "bubble prediction error p50 (ms)")]


def format_summary(s: dict) -> str:
    lines = [f"{s['experiment']} on {s['topology']}: {s['workers']} workers, {s['schedule']}, "
             f"{s['completed_iterations']}/{s['iterations']} iterations ({s['warmup_iterations']} warm-up)"]
    for key, label in SUMMARY_ROWS:
        v = s.get(key)
        lines.append(f"  {label:<28} {v:.4g}" if isinstance(v, float) else f"  {label:<28} {v}")
    lines.append(f"  {'bubble fraction per stage':<28} " + ", ".join(f"{b:.3f}" for b in s["bubble_fraction_per_stage"]))
    for key, label in EXTRA_ROWS:
        v = s.get(key)
        if v is not None:
            lines.append(f"  {label:<28} {v:.4g}" if isinstance(v, float) else f"  {label:<28} {v}")
    if not s["representative"]:
        lines.append("  WARNING: more than 5% of operations overran their compute target: not representative")
    measured = s["completed_iterations"] - s["warmup_iterations"]
    if 0 < measured < 3:
        lines.append(f"  note: statistics from only {measured} measured iteration(s)")
    if s["aborted"]:
        lines.append("  the run was ABORTED: figures cover the completed part")
    return "\n".join(lines)
