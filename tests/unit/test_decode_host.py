"""Continuous batching on a decode host: requests whose caches have arrived decode together, up to
``max_decode_batch`` at a time; one that finishes leaves the batch and a waiting one joins."""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace

import pytest
import torch

from testbed.bubbletea.decode import DecodeHost
from testbed.bubbletea.inference import InferenceModel, prefill_chunk, prompt_tokens_for
from testbed.spec.bubbletea import BubbleTeaSpec
from testbed.spec.model import ModelConfig

CFG = ModelConfig(n_layers=2, d_model=32, n_heads=4, seq_len=64)
SEED = 3


def _decoded(path, n, timeout_s=20.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        done = {r["rid"]: r for r in rows if r["event"] == "decoded"}
        if len(done) >= n:
            return done
        time.sleep(0.02)
    raise AssertionError(f"only {len(done)} of {n} requests decoded in {timeout_s} s")


@pytest.mark.parametrize(
    ("max_batch", "want"),
    [
        # all queued before the first step: 3 decode together, then 2, then 1
        (8, {1: 3.0, 2: 2.5, 3: 1.75}),
        # at most 2: request 3 joins once request 1 has left (after 2 steps)
        (2, {1: 2.0, 2: 2.0, 3: 1.25}),
    ],
)
def test_requests_decode_together_and_join_as_others_leave(tmp_path, max_batch, want):
    spec = replace(BubbleTeaSpec(), model=CFG, max_decode_batch=max_batch)
    host = DecodeHost(spec, 1e-12, True, SEED, tmp_path, "dc", "127.0.0.1")
    model = InferenceModel(CFG, SEED)
    outputs = {1: 3, 2: 5, 3: 9, 4: 1}  # output tokens: 2, 4, 8 and 0 decode steps
    for rid, out in outputs.items():
        cache, logits = prefill_chunk(model, prompt_tokens_for(rid, 10 + rid, 0), None)
        header = {"rid": rid, "first_token": int(torch.argmax(logits)), "output_tokens": out}
        host.jobs.put((header, cache.to_bytes()))
    policy = os.sched_getscheduler(0)
    decoding = host.start_decoding()
    done = _decoded(tmp_path / "requests" / "decode-dc.jsonl", 4)
    # the steps run in SCHED_IDLE, on CPU time training leaves; the thread that started them keeps its class
    assert os.sched_getscheduler(decoding.native_id) == os.SCHED_IDLE
    assert os.sched_getscheduler(0) == policy
    assert {rid: done[rid]["decode_mean_batch"] for rid in want} == pytest.approx(want)
    assert done[4]["decode_mean_batch"] is None  # one output token: made by the prefill, no step
    assert all(done[r]["output_tokens"] == outputs[r] for r in outputs)
    assert all(0 <= done[r]["decode_overrun_steps"] <= outputs[r] - 1 for r in outputs)


def test_a_decode_host_needs_a_resolved_model(tmp_path):
    with pytest.raises(ValueError, match="no resolved model"):
        DecodeHost(BubbleTeaSpec(), 1e-12, True, SEED, tmp_path, "dc", "127.0.0.1")
