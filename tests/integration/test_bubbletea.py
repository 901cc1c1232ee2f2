"""BubbleTea on real training: prefill passes run only inside the waits they fill (receive waits,
the send drain and the all-reduce, each at least once), requests reach the decode hosts,
training's math and pace do not change, and no training operation starts over 1 ms after its
input arrived, with BubbleTea or without."""

from __future__ import annotations

import json
from dataclasses import replace

import pandas as pd
import pytest

from testbed.results.analysis import losses, start_after_arrival
from testbed.spec.experiment_file import load_experiment
from testbed.thread_slice import TRAINING_WAIT_RT_PRIORITY
from testbed.trace import schema as T
from testbed.trace.events import read_events
from testbed.trace.jsonl import read_jsonl

from .conftest import machine_state


def _quiet(line: str) -> None:
    pass


#: how far apart two threads' stamps of one moment may be (ns)
STAMP_ORDER_NS = 200_000


def test_bubbletea_fills_bubbles_without_touching_training(tmp_path, clean_machine, launcher):
    from testbed.bubbletea.decisions import prefill_seconds, seconds_per_flop
    from testbed.run.compare import compare

    before = machine_state()
    # five iterations (seven until fe85386: 54 of 60 requests completed, 5 asked for)
    exp = load_experiment().with_overrides(iterations=5)
    # the served model of the training model's shape, with prompts clipped short so that a 5-iteration
    # run completes several requests (the default's prompts take seconds of bubbles each), and
    # outputs so that several are decoded (a memory-bound decode step takes about 0.2 s here)
    short = replace(exp.bubbletea, request_rate=8.0, max_prompt_tokens=256, max_output_tokens=8, model=None)
    exp = exp.with_overrides(bubbletea=short)
    assert exp.bubbletea.model.n_layers == exp.model.n_layers and exp.bubbletea.model.seq_len == 264
    result = compare(
        exp, ["atlas", "atlas+bubbletea", "atlas+prefill-alone"], tmp_path, progress=_quiet, launcher=launcher
    )
    plain, bt = result["policies"]["atlas"], result["policies"]["atlas+bubbletea"]
    # scheduling prefill beside training must not change the math
    a = losses(read_events(tmp_path / "atlas")).tolist()
    b = losses(read_events(tmp_path / "atlas+bubbletea")).tolist()
    assert len(a) == 5 and a == pytest.approx(b, rel=1e-6)
    # requests were served: prefilled in bubbles, first token at a decode host, decoded
    assert bt["requests_completed"] >= 5 and bt["requests_decoded"] >= 1, bt
    assert bt["ttft_p50_s"] > 0 and bt["prefill_tokens_per_s"] > 0
    # a pass stops the moment training's data has arrived, wherever it is: the prefill stream
    # yields as a low-priority CUDA stream does (bubbletea/prefill_stream.py). The worker's thread
    # waits on gloo's works itself, as without BubbleTea, and tells the thread filling the bubble
    # (PrefillServer.start_fill): the slice running then ends at the arrival, to the clock's
    # reading (after it only when the pass was given the GPU as the data came). The operation
    # then starts after the worker's own bookkeeping
    ev_bt = pd.read_parquet(tmp_path / "atlas+bubbletea" / "events.parquet")
    slices = ev_bt[ev_bt[T.KIND] == T.PREFILL]
    ops = ev_bt[ev_bt[T.KIND].isin([T.FORWARD, T.BACKWARD])]
    held = ops[ops[T.PREFILL_DELAY_NS].fillna(0) > 0]
    ended_after = []
    for r in held.itertuples():
        mine = slices[(slices[T.WORKER] == getattr(r, T.WORKER)) & (slices[T.END_NS] <= getattr(r, T.START_NS))]
        assert not mine.empty, f"{r}: held back with no prefill slice before it"
        last = mine.loc[mine[T.END_NS].idxmax()]  # the slice that held it: the last before it started
        assert last[T.END_NS] >= getattr(r, T.READY_NS), "held back by no running slice"
        ended_after.append(last[T.END_NS] - getattr(r, T.READY_NS))
        if getattr(r, T.ITERATION) >= exp.warmup_iterations:  # warm-up pays first-time costs (28.5 ms seen)
            assert getattr(r, T.START_NS) - last[T.END_NS] <= 25e6, (r, last)
    ended_after = pd.Series(ended_after, dtype=float)
    print("slices' end after the data arrived (ms):", ended_after.div(1e6).describe().round(2).to_dict())
    assert len(ended_after) and ended_after.quantile(0.9) <= 0.1e6
    print("training ops held back by a running chunk (over 1 ms):", bt["training_ops_delayed_by_prefill"])
    # every run counts the operations that started over 1 ms after their input arrived, by one
    # definition (results/analysis.start_after_arrival): the run without BubbleTea is the floor.
    # With the wait in the real-time class (thread_slice.py; as root: granted), none did, with
    # BubbleTea or without (docs/results.md)
    for name, s in (("atlas", plain), ("atlas+bubbletea", bt)):
        late = start_after_arrival(read_events(tmp_path / name), exp.warmup_iterations)
        assert s["training_ops_with_input"] == len(late) > 0 and (late["late_ns"] >= 0).all()
        assert s["training_ops_started_late"] == int((late["late_ns"] > 1e6).sum())
        print(name, "ops started >1 ms after their input:", s["training_ops_started_late"], "of", len(late))
        assert s["training_wait_rt_priority"] == TRAINING_WAIT_RT_PRIORITY, s
        assert s["training_ops_started_late"] == 0, late["late_ns"].nlargest(3).div(1e6).tolist()
    assert bt["gpu_utilization"] > bt["training_gpu_utilization"] and 0 < bt["bubble_fill_fraction"] < 1
    assert "ttft_p50_s" not in plain
    # the filling threads ran at the nice value of the thread whose interpreter lock they share
    from testbed.thread_slice import FILL_THREAD_NICE

    assert bt["fill_thread_nice"] == FILL_THREAD_NICE and "fill_thread_nice" not in plain  # as root: granted
    # and their workers trained with the short switch interval; the run without them, Python's own (5 ms)
    from testbed.bubbletea.fill import SWITCH_INTERVAL_S
    from testbed.trace.startup import STARTUP_LOG, SWITCH_INTERVAL_US

    for name, want_s in (("atlas", 0.005), ("atlas+bubbletea", SWITCH_INTERVAL_S)):
        lines = [r for r in read_jsonl(tmp_path / name / STARTUP_LOG) if r.get("phase") == "process_group"]
        assert len(lines) == exp.stages * exp.replicas, (name, lines)  # one per worker
        assert {r.get(SWITCH_INTERVAL_US) for r in lines} == {round(want_s * 1e6)}, (name, lines)
    assert (plain["switch_interval_us"], bt["switch_interval_us"]) == (5000, round(SWITCH_INTERVAL_S * 1e6))
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
            # the slice's end is stamped by the filling thread once the wait has ended and stamped
            # its own end on the main thread: the two stamps may come in either order (a slice
            # once ended 28 us after its wait, in a fresh clone under the suite's load)
            inside = mine[(mine[T.START_NS] <= s) & (mine[T.END_NS] >= e - STAMP_ORDER_NS)]
            assert len(inside), f"worker {w}: a chunk outside its waits"
            filled.update(inside[T.KIND])
    # every kind, in every run: receive waits, the send drain and the all-reduce (5-20 ms inside a
    # DC, too short for a pass predicted to end in it, but filled since a worker prefills through
    # every bubble: bubbletea.fill_every_bubble)
    assert filled == {T.RECV_WAIT, T.SEND_WAIT, T.ALLREDUCE}, filled
    print("wait kinds filled:", sorted(filled))
    # the summary scores the predictions the workers placed chunks by: every kind of wait carries
    # its live prediction and observed bubble, and the summary's figures come from those
    predicted = waits[waits[T.PREDICTED_BUBBLE_NS].notna()]
    assert set(predicted[T.KIND]) == {T.RECV_WAIT, T.SEND_WAIT, T.ALLREDUCE}
    measured = predicted[predicted[T.ITERATION] >= exp.warmup_iterations]
    error_ms = (measured[T.BUBBLE_NS] - measured[T.PREDICTED_BUBBLE_NS]).abs() / 1e6
    assert bt["bubble_prediction_error_p50_ms"] == pytest.approx(error_ms.quantile(0.5))
    assert 0 <= bt["ttft_within_slo_share"] <= 1 and bt["ttft_slo_s"] == exp.bubbletea.ttft_slo_s
    # a request's first token comes no sooner than its prefill alone would give it (checked per
    # request below), so no more requests meet the SLO than would serving prefill alone
    assert bt["ttft_alone_p50_s"] > 0
    assert bt["ttft_within_slo_share"] <= bt["ttft_slo_reachable_share"] <= 1
    # every padded kind's overruns are counted: prefill slices against their targets, decode steps
    assert bt["prefill_overrun_fraction"] == pytest.approx((pre[T.OVERRUN_NS] > 0).mean())
    assert 0 <= bt["decode_overrun_fraction"] <= 1
    beyond = (measured[T.BUBBLE_NS] - measured[T.PREDICTED_BUBBLE_NS]).clip(lower=0).sum()
    assert bt["bubble_beyond_prediction_share"] == pytest.approx(beyond / measured[T.BUBBLE_NS].sum())
    # the emulated GPU's memory while prefilling: what the workers held, never below their fixed part
    assert bt["peak_gpu_memory_mb"] == pytest.approx(pre[T.MEMORY_BYTES].max() / 2**20)
    assert bt["gpu_memory_mb"] is None  # no budget set: nothing waited for memory
    # prefill against serving it alone: the slices' targets over the training hosts' wall time,
    # close to the utilization prefill added (that counts the slices' padded time, a little more)
    gained = bt["gpu_utilization"] - bt["training_gpu_utilization"]
    assert 0 < bt["prefill_alone_share"] <= gained + 0.01 and bt["prefill_alone_share"] > 0.8 * gained, bt
    assert bt["prefill_alone_tokens_per_s"] == pytest.approx(bt["prefill_tokens_per_s"] / bt["prefill_alone_share"])
    # the predictions the chunks were placed by, drawn against what was observed
    assert (tmp_path / "atlas+bubbletea" / "bubble_prediction.png").stat().st_size > 0
    assert not (tmp_path / "atlas" / "bubble_prediction.png").exists()
    # each completed request's first token came from one worker's prefill of its whole (clipped)
    # prompt, its chunks in order, in passes that may hold other requests' chunks too
    rows = [
        json.loads(x)
        for p in (tmp_path / "atlas+bubbletea" / "requests").glob("decode-*.jsonl")
        for x in p.read_text().splitlines()
    ]
    first = {r["rid"]: r for r in rows if r["event"] == "first_token"}
    done = pre[pre[T.TOKENS] > 0]
    chunks = [(w, *map(int, c.split(":"))) for w, cs in zip(done[T.WORKER], done[T.CHUNKS]) for c in cs.split(";")]
    assert all(t == sum(int(c.split(":")[2]) for c in cs.split(";")) for t, cs in zip(done[T.TOKENS], done[T.CHUNKS]))
    for rid, r in first.items():
        mine = [(w, start, n) for w, q, start, n in chunks if q == rid]
        assert {w for w, _, _ in mine} == {r["worker"]}
        assert [start for _, start, _ in mine] == [sum(n for _, _, n in mine[:i]) for i in range(len(mine))]
        assert sum(n for _, _, n in mine) == r["prompt_tokens"]
        assert r["kv_bytes"] > 0 and r["first_token_ns"] >= r["prefill_end_ns"] >= r["arrival_ns"]
        alone_s = prefill_seconds(exp.bubbletea.model, 0, r["prompt_tokens"], seconds_per_flop(exp))
        assert (r["first_token_ns"] - r["arrival_ns"]) / 1e9 >= alone_s
    per_pass = pd.Series([cs.count(";") + 1 for cs in pre[T.CHUNKS]])
    print("requests per pass:", per_pass.value_counts().to_dict())
    assert (per_pass > 1).any()  # passes batch several requests' chunks (78 of 314 passes seen)
    assert bt["prefill_chunks"] == sum(cs.count(";") + 1 for cs in done[T.CHUNKS])
    # both TTFT SLOs, over every request of the stream due by the end of training (the last
    # prefill can end no later), assigned to a worker or not: met where the first token came
    # within the SLO of the arrival
    dispatch = [
        json.loads(x) for x in (tmp_path / "atlas+bubbletea" / "requests" / "dispatch.jsonl").read_text().splitlines()
    ]
    t0 = next(r["t_ns"] for r in dispatch if r["event"] == "stream_start")
    stream = pd.read_parquet(tmp_path / "atlas+bubbletea" / "requests" / "stream.parquet")
    end_ns = ev[ev[T.KIND] != T.PREFILL][T.END_NS].max()
    clip = exp.bubbletea.max_prompt_tokens
    arrived = [
        {"rid": r, "arrival_ns": t0 + int(a * 1e9), "prompt": min(p, clip or p)}
        for r, a, p in zip(stream["rid"], stream["arrival_s"], stream["prompt_tokens"])
        if t0 + int(a * 1e9) <= end_ns
    ]
    spf = seconds_per_flop(exp)
    for slo, share, judged in (
        (lambda a: exp.bubbletea.ttft_slo_s, "ttft_slo_attainment", "ttft_slo_judged"),
        (
            lambda a: exp.bubbletea.ttft_slo_scale * prefill_seconds(exp.bubbletea.model, 0, a["prompt"], spf),
            "ttft_scaled_slo_attainment",
            "ttft_scaled_slo_judged",
        ),
    ):
        due = [a for a in arrived if a["arrival_ns"] + slo(a) * 1e9 <= end_ns]
        met = [
            a for a in due if a["rid"] in first and first[a["rid"]]["first_token_ns"] - a["arrival_ns"] <= slo(a) * 1e9
        ]
        print(f"{share}: {len(met)} of {len(due)} due ({len(arrived)} arrived)")
        assert bt[judged] == len(due) and bt[share] == (pytest.approx(len(met) / len(due)) if due else None)
    assert bt["ttft_scaled_slo_judged"] > 0  # 3 x the time alone falls within an 8-iteration run for some
    # the same GPUs serving prefill alone, measured: no training, windows of the predicted
    # iteration, requests served through the same path; BubbleTea's prefill set beside it
    alone = result["policies"]["atlas+prefill-alone"]
    assert set(read_events(tmp_path / "atlas+prefill-alone")[T.KIND]) == {T.PREFILL, T.SERVING_WINDOW}
    assert alone["completed_iterations"] == exp.iterations and alone["iteration_time_s"] is None
    assert alone["serving_window_s"] > 0 and alone["training_gpu_utilization"] == 0
    assert alone["requests_completed"] >= 5 and alone["prefill_tokens_per_s"] > 0
    assert alone["gpu_utilization"] == pytest.approx(alone["prefill_alone_share"], abs=0.05)
    # 8 requests/s of 256-token prompts keep these GPUs busy about a third of the time: the queue
    # is empty most of the rest (busy 0.30, seen), and the summary says so
    assert 0.2 < alone["queue_empty_share"] and alone["gpu_utilization"] + alone["queue_empty_share"] <= 1.01
    share = result["prefill_alone"]["atlas+bubbletea"]
    print("BubbleTea's prefill against serving alone (measured):", share, "alone:", alone["gpu_utilization"])
    # where the requests, not the GPUs, set the pace, BubbleTea serves at least most of what the
    # same GPUs serve alone. It served more in some runs (0.97-1.44 of the alone run's tokens/s
    # seen; above 1.3 in three of five runs at 49c55dd and 5cddd23, not established why: its
    # measured window may take in requests left from the warm-up iterations), so no upper bound is
    # asserted; the chunks' tokens are checked against each request's prompt above
    assert 0.7 < share["measured_alone_tokens_share"] and share["queue_empty_share"] == alone["queue_empty_share"]
    assert machine_state() == before


def test_a_run_driven_by_an_azure_trace_file(tmp_path, clean_machine):
    """``testbed run --requests FILE`` in the Azure LLM inference trace's CSV format, as a user
    runs it: the run's stream is the file's requests in arrival order, prompts are given to the
    workers unclipped, and requests are served; a trace whose longest prompt the served model
    cannot hold is refused before anything is built, naming the column and the fix. The run is
    the sharing experiment's under dp-wan (its DCs have a decode host beside dp-wan's pipelines),
    whose all-reduce crosses the WAN and lasts hundreds of ms: the test asserts that it was
    filled, where atlas's, inside a DC, is too short for a chunk in most of its occurrences."""
    import datetime as dt

    from .conftest import run_cli

    before = machine_state()
    prompts = [120, 300, 64, 2500, 200, 90]  # 2,500: longer than the 1,536 prompts were once clipped to
    t0 = dt.datetime(2023, 11, 16, 18, 15, 46, 680590)
    rows = [
        f"{(t0 + dt.timedelta(seconds=0.25 * i)).isoformat(sep=' ')},{prompts[i % len(prompts)]},{8 + i % 3}"
        for i in range(24)
    ]
    trace = tmp_path / "trace.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(reversed(rows)) + "\n")  # out of order
    out = tmp_path / "run"
    # four iterations of about 5 s, the fewest that serve requests: they start after the experiment's
    # bubbletea.profile_iterations (3), and all 24 have arrived 6 s later (five until this was set)
    args = ("--requests", str(trace), "--iterations", "4", "--out", str(out))
    r = run_cli("run", "sharing", "--policy", "dp-wan+bubbletea", *args)
    assert r.returncode == 0, r.stderr[-3000:]
    ev = pd.read_parquet(out / "events.parquet")
    reduce = ev[ev[T.KIND] == T.ALLREDUCE]
    filled = [
        (w, s)
        for w, s, e in zip(*(ev[ev[T.KIND] == T.PREFILL][c] for c in (T.WORKER, T.START_NS, T.END_NS)))
        if ((reduce[T.WORKER] == w) & (reduce[T.START_NS] <= s) & (reduce[T.END_NS] >= e)).any()
    ]
    assert filled, "no prefill inside an all-reduce wait"
    print("prefill slices inside all-reduce waits:", len(filled))
    stream = pd.read_parquet(out / "requests" / "stream.parquet")
    assert stream["prompt_tokens"].tolist() == [prompts[i % len(prompts)] for i in range(24)]  # sorted by arrival
    assert stream["arrival_s"].diff().dropna().round(6).eq(0.25).all()
    assigned = [json.loads(x) for x in (out / "requests" / "dispatch.jsonl").read_text().splitlines()]
    assigned = [a for a in assigned if a["event"] == "assign"]
    assert assigned and all(a["prompt"] == prompts[a["rid"] % len(prompts)] for a in assigned)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["requests_completed"] >= 1 and summary["ttft_p50_s"] > 0, summary
    assert json.loads((out / "config.json").read_text())["bubbletea"]["requests"] == str(trace)

    rows[5] = f"{(t0 + dt.timedelta(seconds=1.25)).isoformat(sep=' ')},20000,8"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    r = run_cli("run", "--policy", "atlas+bubbletea", "--requests", str(trace), "--out", str(tmp_path / "refused"))
    assert r.returncode != 0
    assert "ContextTokens" in r.stderr and "20000" in r.stderr and "bubbletea.model.seq_len >= 20256" in r.stderr, (
        r.stderr
    )
    assert machine_state() == before
