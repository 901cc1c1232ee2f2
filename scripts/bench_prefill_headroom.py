#!/usr/bin/env python3
"""Benchmark: does this CPU keep up with the emulated GPU's prefill, chunk position by position?

A worker gives a prefill pass emulated GPU time (its padded target: the pass's FLOPs at the
training targets' seconds per FLOP, ``bubbletea.decisions.prefill_seconds``) while a thread
computes its blocks for real (``bubbletea/prefill_stream.py``). Where the real compute takes
longer than the target, the pass overruns, and on a machine shared by every worker the extra CPU
time is taken from training. For the experiment's served model this times one pass of
``max_chunk_tokens`` tokens of one prompt at several positions, with a KV cache of that many
positions before it, on one thread, and prints real over target (goal: at most 1; the training
operations' own ratio, their headroom, is printed beside it as the anchor). With N workers on C
cores, each worker's stream gets about C / N of a core, so the ratio that keeps up there is
about C / N. It then times ``decisions.choose_work`` over queues of 1 to 200 requests (it looks
at the first ``LOOKAHEAD``): the worker's own time to choose each pass. Figures printed, nothing
asserted.

Run: .venv/bin/python scripts/bench_prefill_headroom.py [EXPERIMENT] [--positions 0,500,1000,2000,4000]
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from testbed.bubbletea.chunk_batch import ChunkBatch
from testbed.bubbletea.decisions import LOOKAHEAD, QueuedPrompt, choose_work, prefill_seconds, seconds_per_flop
from testbed.bubbletea.inference import InferenceModel, prefill_chunk, prompt_tokens_for
from testbed.spec.experiment_file import load_experiment


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("experiment", nargs="?", default=None)
    ap.add_argument("--positions", default="0,500,1000,2000,4000")
    ap.add_argument("--repeat", type=int, default=5, help="passes timed per position (the median is printed)")
    args = ap.parse_args()
    torch.set_num_threads(1)  # as a worker's stream runs
    exp = load_experiment(args.experiment)
    cfg, chunk, spf = exp.bubbletea.model, exp.bubbletea.max_chunk_tokens, seconds_per_flop(exp)
    model = InferenceModel(cfg, exp.seed)
    print(
        f"{exp.name}: served model {cfg.n_layers} layers, width {cfg.d_model}, context {cfg.seq_len}; "
        f"passes of {chunk} tokens; {len(exp.topology_spec.dcs)} DCs, {os.cpu_count()} cores here"
    )
    print(f"{'position':>9} {'target ms':>10} {'real ms':>9} {'real/target':>12}  (goal <= 1)")
    for pos in (int(p) for p in args.positions.split(",")):
        if pos + chunk > cfg.seq_len:
            print(f"{pos:>9}  beyond the served model's context ({cfg.seq_len})")
            continue
        tokens = prompt_tokens_for(1, pos + chunk, exp.seed)
        cache = prefill_chunk(model, tokens[:pos], None)[0] if pos else None
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            batch = ChunkBatch(model, [(tokens[pos:], cache)])
            while not batch.done:
                batch.step()
            batch.result()
            times.append(time.perf_counter() - t0)
        real = sorted(times)[len(times) // 2]
        target = prefill_seconds(cfg, pos, chunk, spf)
        print(f"{pos:>9} {target * 1e3:>10.1f} {real * 1e3:>9.1f} {real / target:>12.2f}")
    # choosing a pass (in the worker's own thread, between passes, while a bubble lasts)
    print(f"{'queued':>9} {'choose_work ms':>15}  (the worker's own time a pass; anchor: the issue's 1 ms)")
    for n in (1, 16, 64, 200):
        queued = [QueuedPrompt(0, 1000 + 37 * i) for i in range(n)][:LOOKAHEAD]
        t0, k = time.perf_counter(), 200
        for i in range(k):
            choose_work([], queued, cfg, 0.02 + 0.2 * (i % 2), 0.0, 0.003, chunk, spf, True)
        print(f"{n:>9} {(time.perf_counter() - t0) / k * 1e3:>15.3f}")
    print(
        f"anchor: training's padded targets, forward {exp.compute.forward_ms:g} ms and backward "
        f"{exp.compute.backward_ms:g} ms a microbatch (compute_headroom in a run's summary gives their real share)"
    )


if __name__ == "__main__":
    main()
