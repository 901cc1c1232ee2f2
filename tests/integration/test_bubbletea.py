"""BubbleTea on real training: prefill chunks run only inside the waits they fill (receive waits,
the send drain, the all-reduce; each at least once), requests reach the decode hosts, and
training's math and pace do not change."""

from __future__ import annotations

import json
from dataclasses import replace

import pandas as pd
import pytest

from testbed.results.analysis import losses
from testbed.spec.experiment_file import load_experiment
from testbed.trace import schema as T
from testbed.trace.events import read_events

from .conftest import machine_state


def _quiet(line: str) -> None:
    pass


def test_bubbletea_fills_bubbles_without_touching_training(tmp_path, clean_machine):
    from testbed.run.compare import compare

    before = machine_state()
    exp = load_experiment().with_overrides(iterations=7)
    exp = exp.with_overrides(bubbletea=replace(exp.bubbletea, request_rate=8.0))
    result = compare(exp, ["atlas", "atlas+bubbletea"], tmp_path, progress=_quiet)
    plain, bt = result["policies"]["atlas"], result["policies"]["atlas+bubbletea"]
    # scheduling prefill beside training must not change the math
    a = losses(read_events(tmp_path / "atlas")).tolist()
    b = losses(read_events(tmp_path / "atlas+bubbletea")).tolist()
    assert len(a) == 7 and a == pytest.approx(b, rel=1e-6)
    # requests were served: prefilled in bubbles, first token at a decode host, decoded
    assert bt["requests_completed"] >= 5 and bt["requests_decoded"] >= 1, bt
    assert bt["ttft_p50_s"] > 0 and bt["prefill_tokens_per_s"] > 0
    assert bt["training_ops_delayed_by_prefill"] == 0, bt
    assert bt["gpu_utilization"] > bt["training_gpu_utilization"] and 0 < bt["bubble_fill_fraction"] < 1
    assert "ttft_p50_s" not in plain
    # every chunk ran inside a bubble its worker was waiting in: a receive wait, the send drain or
    # the all-reduce; and each kind of wait was filled at least once
    ev = pd.read_parquet(tmp_path / "atlas+bubbletea" / "events.parquet")
    pre = ev[ev[T.KIND] == T.PREFILL]
    waits = ev[ev[T.KIND].isin([T.RECV_WAIT, T.SEND_WAIT, T.ALLREDUCE])]
    assert len(pre) >= 5
    filled = set()
    for w, chunks in pre.groupby(T.WORKER):
        mine = waits[waits[T.WORKER] == w]
        for s, e in zip(chunks[T.START_NS], chunks[T.END_NS]):
            inside = mine[(mine[T.START_NS] <= s) & (mine[T.END_NS] >= e)]
            assert len(inside), f"worker {w}: a chunk outside its waits"
            filled.update(inside[T.KIND])
    assert filled == {T.RECV_WAIT, T.SEND_WAIT, T.ALLREDUCE}, filled
    # the summary scores the predictions the workers placed chunks by: every kind of wait carries
    # its live prediction and observed bubble, and the summary's figures come from those
    predicted = waits[waits[T.PREDICTED_BUBBLE_NS].notna()]
    assert set(predicted[T.KIND]) == {T.RECV_WAIT, T.SEND_WAIT, T.ALLREDUCE}
    measured = predicted[predicted[T.ITERATION] >= exp.warmup_iterations]
    error_ms = (measured[T.BUBBLE_NS] - measured[T.PREDICTED_BUBBLE_NS]).abs() / 1e6
    assert bt["bubble_prediction_error_p50_ms"] == pytest.approx(error_ms.quantile(0.5))
    assert 0 <= bt["ttft_within_slo_share"] <= 1 and bt["ttft_slo_s"] == exp.bubbletea.ttft_slo_s
    # every padded kind's overruns are counted: prefill slices against their targets, decode steps
    assert bt["prefill_overrun_fraction"] == pytest.approx((pre[T.REAL_NS] > pre[T.TARGET_NS]).mean())
    assert 0 <= bt["decode_overrun_fraction"] <= 1
    # the emulated GPU's memory while prefilling: what the workers held, never below their fixed part
    assert bt["peak_gpu_memory_mb"] == pytest.approx(pre[T.MEMORY_BYTES].max() / 2**20)
    assert bt["gpu_memory_mb"] is None  # no budget set: nothing waited for memory
    # each completed request's first token came from one worker's prefill of its whole (clipped) prompt
    rows = [
        json.loads(x)
        for p in (tmp_path / "atlas+bubbletea" / "requests").glob("decode-*.jsonl")
        for x in p.read_text().splitlines()
    ]
    first = {r["rid"]: r for r in rows if r["event"] == "first_token"}
    for rid, r in first.items():
        mine = pre[pre["rid"] == rid]
        assert set(mine[T.WORKER]) == {r["worker"]} and int(mine["tokens"].sum()) == r["prompt_tokens"]
        assert r["kv_bytes"] > 0 and r["first_token_ns"] >= r["prefill_end_ns"] >= r["arrival_ns"]
    assert machine_state() == before
