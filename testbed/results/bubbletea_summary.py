"""BubbleTea's part of a run's summary (``summary.json``): GPU utilization with prefill, how the
bubbles were filled, what the requests saw, and how long training operations waited after their
input arrived. Names of the figures: ``trace/metrics.py``; definitions: ``bubbletea/windows.py``,
``results/ttft.py`` and the functions below."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from testbed.bubbletea import windows as B
from testbed.bubbletea.decisions import prefill_seconds
from testbed.bubbletea.profile import live_prediction_errors, prediction_error_stats
from testbed.plan.worker_config import read_worker_config
from testbed.results import analysis as A
from testbed.results.summary import uses_bubbletea
from testbed.results.ttft import arrivals, request_table, slo_attainment
from testbed.spec.bubbletea import BubbleTeaSpec
from testbed.trace import metrics as M
from testbed.trace import schema as T
from testbed.trace.jsonl import read_jsonl


def bubbletea_stats(run_dir: Path, ev: pd.DataFrame, config: dict, training_utilization: float | None) -> dict:
    """GPU utilization with and without prefill, and, under BubbleTea, how the bubbles were filled
    and what the requests saw (definitions in ``bubbletea.windows.fill_stats`` and ``bubbletea/decode.py``);
    ``training_utilization`` is the summary's own (training compute only):
    ``bubble_fill_fraction``, ``prefill_tokens_per_s`` (prefilled tokens over the measured
    iterations' wall time), ``prefill_alone_share`` and ``prefill_alone_tokens_per_s``
    (defined in ``trace/metrics.py``), ``requests_assigned``, ``requests_completed`` (first token at a decode
    host), ``requests_decoded``, ``ttft_p50_s``/``ttft_p99_s`` (arrival to first token at the decode
    host, KV transfer included), ``dispatch_delay_p50_ms``/``_p99_ms`` (arrival to assignment,
    over the requests assigned), ``ttft_within_slo_share`` (of the requests assigned, those whose
    first token came within ``ttft_slo_s``), ``ttft_alone_p50_s`` and ``ttft_slo_reachable_share``
    (the same requests on GPUs serving prefill alone, ``ttft_alone_s``), ``ttft_slo_attainment`` and
    ``ttft_scaled_slo_attainment`` with how many requests each judged (against ``ttft_slo_s`` and
    ``ttft_slo_scale`` x the TTFT alone, over the requests whose deadline fell within the run:
    ``results/ttft.py``), ``prefill_overrun_fraction`` and
    ``decode_overrun_fraction`` (prefill slices and decode steps whose real time exceeded their
    padded target), ``decode_mean_batch`` (continuous batching, ``trace/metrics.py``),
    ``peak_gpu_memory_mb`` (the most a training host's emulated GPU held while
    prefilling, KV caches admitted included) beside ``gpu_memory_mb``,
    ``training_ops_delayed_by_prefill`` (forward/backward operations
    of the measured iterations whose input had arrived while a pass had the GPU and which started
    more than 1 ms later) with ``prefill_hold_p99_ms``, the same of the operations whose input
    arrived while no pass ran (``training_ops_late_without_prefill``,
    ``start_after_arrival_p99_ms_without_prefill``; ``analysis.start_after_arrival``: the run
    without BubbleTea has the floor), and the
    error of the bubbles the workers' slot predictors predicted as they placed chunks, against the
    bubbles observed (``bubbletea.profile.live_prediction_errors``, ``prediction_error_stats``),
    with the share of those waits' time past their predicted end (``bubble_beyond_prediction_share``)."""
    warmup = config["warmup_iterations"]
    if ev.empty:
        return {}
    train = A.training_events(ev)
    util = A.worker_utilization(ev, warmup, T.COMPUTE_KINDS + (T.PREFILL,))
    out = {M.TRAINING_GPU_UTILIZATION: training_utilization, M.GPU_UTILIZATION: float(util["utilization"].mean())}
    if not uses_bubbletea(config):
        return out
    pre = ev[ev[T.KIND] == T.PREFILL]
    it = A.iteration_times(train, warmup)
    t0, t1 = (int(it[T.START_NS].min()), int(it[T.END_NS].max())) if not it.empty else (0, 0)
    inside = pre[(pre[T.START_NS] >= t0) & (pre[T.END_NS] <= t1)]
    fill = B.fill_stats(train, pre[[T.WORKER, T.START_NS, T.END_NS]], warmup) if not it.empty else {}
    wall_s = (t1 - t0) / 1e9
    alone_share = (
        float(inside[T.TARGET_NS].sum() / 1e9 / (len(config["workers"]) * wall_s))
        if wall_s > 0 and T.TARGET_NS in inside
        else None
    )
    tokens_per_s = float(inside[T.TOKENS].sum() / wall_s) if wall_s > 0 else None
    decode_log = read_jsonl(run_dir / "requests", "decode-*.jsonl")
    first = [r for r in decode_log if r.get("event") == "first_token"]
    decoded = [r for r in decode_log if r.get("event") == "decoded"]
    assigned = [r for r in read_jsonl(run_dir / "requests" / "dispatch.jsonl") if r.get("event") == "assign"]
    dispatch_ms = pd.Series([(r["assigned_ns"] - r["arrival_ns"]) / 1e6 for r in assigned], dtype=float)
    slo_s = config["bubbletea"].get("ttft_slo_s", BubbleTeaSpec().ttft_slo_s)
    slo_scale = config["bubbletea"].get("ttft_slo_scale", BubbleTeaSpec().ttft_slo_scale)
    end_ns = int(train[T.END_NS].max()) if len(train) else 0  # no prefill after training ends
    arrived = arrived_requests(run_dir, config, end_ns)
    both = ttft_alone_s(run_dir, assigned + arrived)  # the run's served model read once for both
    alone = both.iloc[: len(assigned)]
    requests = request_table(arrived, first, both.iloc[len(assigned) :].reset_index(drop=True))
    ttft = requests["ttft_s"].dropna()  # every first token is of a request that arrived
    attained, judged = slo_attainment(requests, slo_s, end_ns)
    scaled, scaled_judged = slo_attainment(requests, slo_scale * requests["alone_s"], end_ns)
    late = A.start_after_arrival(train, warmup)
    held, unheld = late.loc[late["held"], "late_ns"], late.loc[~late["held"], "late_ns"]
    windows = B.bubble_windows(train)
    windows.to_parquet(run_dir / "bubbles.parquet", index=False)  # the bubble profile's raw material
    errors = prediction_error_stats(live_prediction_errors(ev, warmup))  # the predictor that placed the chunks
    return {
        **out,
        M.BUBBLE_FILL_FRACTION: fill.get("bubble_fill_fraction"),
        M.PREFILL_TOKENS_PER_S: tokens_per_s,
        M.PREFILL_ALONE_SHARE: alone_share,
        M.PREFILL_ALONE_TOKENS_PER_S: tokens_per_s / alone_share if alone_share and tokens_per_s is not None else None,
        M.PREFILL_CHUNKS: int(pre.loc[pre[T.TOKENS] > 0, T.CHUNKS].str.count(";").add(1).sum())
        if T.CHUNKS in pre and len(pre)
        else int(len(pre)),  # a run recorded before passes held several requests: one chunk a slice
        M.REQUESTS_ASSIGNED: len(assigned),
        M.REQUESTS_COMPLETED: len(first),
        M.REQUESTS_DECODED: len(decoded),
        M.TTFT_P50_S: float(ttft.quantile(0.5)) if len(ttft) else None,
        M.TTFT_P99_S: float(ttft.quantile(0.99)) if len(ttft) else None,
        M.DISPATCH_DELAY_P50_MS: float(dispatch_ms.quantile(0.5)) if len(dispatch_ms) else None,
        M.DISPATCH_DELAY_P99_MS: float(dispatch_ms.quantile(0.99)) if len(dispatch_ms) else None,
        M.TTFT_WITHIN_SLO_SHARE: float((ttft <= slo_s).sum() / len(assigned)) if assigned else None,
        M.TTFT_SLO_S: slo_s,
        M.TTFT_ALONE_P50_S: float(alone.quantile(0.5)) if len(alone) else None,
        M.TTFT_SLO_REACHABLE_SHARE: float((alone <= slo_s).mean()) if len(alone) else None,
        M.TTFT_SLO_ATTAINMENT: attained,
        M.TTFT_SLO_JUDGED: judged,
        M.TTFT_SLO_SCALE: slo_scale,
        M.TTFT_SCALED_SLO_ATTAINMENT: scaled,
        M.TTFT_SCALED_SLO_JUDGED: scaled_judged,
        M.PREFILL_OVERRUN_FRACTION: prefill_overrun_fraction(pre),
        M.PEAK_GPU_MEMORY_MB: float(pre[T.MEMORY_BYTES].max() / 2**20)
        if len(pre) and T.MEMORY_BYTES in pre and pre[T.MEMORY_BYTES].notna().any()
        else None,
        M.GPU_MEMORY_MB: config.get("gpu_memory_mb"),
        M.DECODE_OVERRUN_FRACTION: sum(r.get("decode_overrun_steps", 0) for r in decoded) / steps
        if (steps := sum(max(0, r["output_tokens"] - 1) for r in decoded))
        else None,
        M.DECODE_MEAN_BATCH: sum(r["decode_mean_batch"] * (r["output_tokens"] - 1) for r in batched) / steps
        if (batched := [r for r in decoded if r.get("decode_mean_batch") is not None])
        and (steps := sum(r["output_tokens"] - 1 for r in batched))
        else None,
        M.TRAINING_OPS_DELAYED_BY_PREFILL: int((held > A.LATE_START_NS).sum()),
        M.PREFILL_HOLD_P99_MS: float(held.quantile(0.99) / 1e6) if len(held) else None,
        M.TRAINING_OPS_LATE_WITHOUT_PREFILL: int((unheld > A.LATE_START_NS).sum()),
        M.START_AFTER_ARRIVAL_P99_MS_WITHOUT_PREFILL: float(unheld.quantile(0.99) / 1e6) if len(unheld) else None,
        M.BUBBLE_PREDICTION_ERROR_P50_MS: errors.get("abs_error_p50_ms"),
        M.BUBBLE_PREDICTION_ERROR_P99_MS: errors.get("abs_error_p99_ms"),
        M.BUBBLE_OVER_PREDICTED_SHARE: errors.get("over_predicted_share"),
        M.BUBBLE_BEYOND_PREDICTION_SHARE: errors.get("beyond_prediction_share"),
    }


def prefill_overrun_fraction(pre: pd.DataFrame) -> float | None:
    """The share of prefill slices that overran: that waited, past the GPU time they gave, for the
    CPU to compute their pass's blocks (``T.OVERRUN_NS``); in a run recorded before the prefill
    stream (trace schema 1), those whose real time exceeded their target. None without slices."""
    if not len(pre) or T.TARGET_NS not in pre:
        return None
    if T.OVERRUN_NS in pre and pre[T.OVERRUN_NS].notna().any():
        return float((pre[T.OVERRUN_NS].fillna(0) > 0).mean())
    return float((pre[T.REAL_NS] > pre[T.TARGET_NS]).mean())


def arrived_requests(run_dir: Path, config: dict, end_ns: int) -> list[dict]:
    """Every request of the run's stream that arrived by ``end_ns``, assigned to a worker or not
    (``results/ttft.arrivals``); the assignments, for a run folder whose dispatcher did not log
    the stream's start."""
    log = read_jsonl(run_dir / "requests" / "dispatch.jsonl")
    start = next((r["t_ns"] for r in log if r.get("event") == "stream_start"), None)
    if start is None or not (run_dir / "requests" / "stream.parquet").exists():
        return [r for r in log if r.get("event") == "assign"]
    stream = pd.read_parquet(run_dir / "requests" / "stream.parquet")
    return arrivals(stream, start, end_ns, config["bubbletea"].get("max_prompt_tokens"))


def ttft_alone_s(run_dir: Path, assigned: list[dict]) -> pd.Series:
    """Each of the ``assigned`` requests' TTFT on an emulated GPU serving prefill alone (s,
    ``M.TTFT_ALONE_P50_S``): its prompt in one pass of the served model at the run's emulated time
    per FLOP (both from the run's ``worker_config.json``), as the dispatcher counts a worker's
    backlog. Empty for a run folder without BubbleTea's part there."""
    path = run_dir / "worker_config.json"
    bt = read_worker_config(path).bubbletea if path.exists() else None
    if bt is None or bt.spec.model is None:
        return pd.Series(dtype=float)
    return pd.Series([prefill_seconds(bt.spec.model, 0, a["prompt"], bt.s_per_flop) for a in assigned], dtype=float)
