"""summary.json and trace.json from a hand-built run: two stages in two DCs, one replica, one
microbatch, three iterations of which the first is warm-up (times in ms, stored in ns)."""

import json

import pandas as pd
import pytest
from eventrows import event_row

from testbed.results.chrome_trace import chrome_trace
from testbed.results.report import LABEL_WIDTH, SUMMARY_ROWS, format_summary
from testbed.results.summary import MAX_REPRESENTATIVE_OVERRUN, summarize
from testbed.trace import schema as T

MS = 1_000_000
WORKERS = {0: ("east-h0", "east", 0, 0), 1: ("west-h0", "west", 1, 0)}
# extra wait of stage 0 for its gradient, per iteration: iteration durations 85 + x ms
EXTRA_MS = [50, 0, 10]
LOSS = [5.0, 4.0, 3.5]
FWD_MS, BWD_MS, OPT_MS = 10, 20, 4  # padding targets


def op(w, kind, it, mb, start_ms, end_ms, **extra):
    return event_row(w, *WORKERS[w], kind, it, mb, start_ms, end_ms, **extra)


def run_events():
    rows = []
    for it, x in enumerate(EXTRA_MS):
        b = 200 * it
        # real time of worker 1's backward: over its 20 ms target in warm-up and in iteration 2
        w1_bwd_real = {0: 25, 1: 8, 2: 21}[it] * MS
        w0_fwd_real = {0: 30, 1: 9, 2: 10}[it] * MS  # 10 ms: on target, not an overrun
        rows += [
            # stage 0 (east): forward, send the activation, wait for the gradient, backward, step
            op(0, T.FORWARD, it, 0, b, b + 10, real_ns=w0_fwd_real, padded_ns=10 * MS),
            op(0, T.SEND, it, 0, b + 10, b + 11, peer=1, bytes=4096),
            op(0, T.RECV_WAIT, it, 0, b + 11, b + 60 + x, peer=1, bytes=4096),
            op(0, T.BACKWARD, it, 0, b + 60 + x, b + 80 + x, real_ns=15 * MS, padded_ns=20 * MS),
            op(0, T.OPTIMIZER, it, -1, b + 80 + x, b + 85 + x, real_ns=5 * MS, padded_ns=5 * MS),  # over 4 ms
            # stage 1 (west): wait for the activation (posted at +2, arrives at +30), forward, backward
            op(1, T.RECV_WAIT, it, 0, b + 2, b + 30, peer=0, bytes=4096),
            op(1, T.FORWARD, it, 0, b + 30, b + 40, real_ns=4 * MS, padded_ns=10 * MS),
            op(1, T.BACKWARD, it, 0, b + 40, b + 48, real_ns=w1_bwd_real, padded_ns=max(w1_bwd_real, 20 * MS)),
            op(1, T.SEND, it, 0, b + 48, b + 49, peer=0, bytes=4096),
            op(1, T.OPTIMIZER, it, -1, b + 49, b + 52, loss=LOSS[it], real_ns=3 * MS, padded_ns=4 * MS),
        ]
    df = pd.DataFrame(rows, columns=T.COLUMNS)
    for c in (T.BYTES, T.PEER, T.REAL_NS, T.PADDED_NS, T.LOSS):
        df[c] = pd.to_numeric(df[c])
    return df


def config(**over):
    c = {
        "name": "hand",
        "topology": "two_dc",
        "schedule": "gpipe",
        "iterations": 3,
        "warmup_iterations": 1,
        "stages": 2,
        "replicas": 1,
        "microbatches": 1,
        "microbatch_size": 2,
        "model": {"n_layers": 2, "d_model": 16, "n_heads": 2, "seq_len": 8},
        "compute": {"mode": "padded", "forward_ms": FWD_MS, "backward_ms": BWD_MS, "optimizer_ms": OPT_MS},
        "workers": [{"rank": 0}, {"rank": 1}],
    }
    c.update(over)
    return c


def counters():
    rows = [
        (0, "east->west", "1:1", 0, 100_000_000),
        (100 * MS, "east->west", "1:1", 625_000, 100_000_000),
        (200 * MS, "east->west", "1:1", 1_250_000, 100_000_000),
        (100 * MS, "east->west", "1:10", 123, 100_000_000),
    ]
    return pd.DataFrame(rows, columns=[T.T_NS, T.LINK, T.CLASSID, T.TX_BYTES, T.RATE_BPS])


def test_summarize_by_hand():
    s = summarize(run_events(), config(), {"delay_mechanism": "netem"}, counters())
    # iteration k ends at 200 k + 85 + EXTRA_MS[k] ms; it lasts from the previous iteration's end
    ends = [200 * k + 85 + x for k, x in enumerate(EXTRA_MS)]
    durations = [(ends[k] - ends[k - 1]) / 1e3 for k in (1, 2)]
    mean = sum(durations) / 2
    assert s["iteration_time_s"] == pytest.approx(mean)
    assert s["iteration_time_p50_s"] == pytest.approx(mean)
    assert s["iteration_time_p95_s"] == pytest.approx(durations[0] + 0.95 * (durations[1] - durations[0]))
    tokens = 1 * 1 * 2 * 8  # replicas x microbatches x microbatch_size x seq_len
    assert s["tokens_per_s"] == pytest.approx(tokens / mean)
    # measured window: from the end of warm-up iteration 0 to the end of iteration 2's last step
    wall = ends[2] - ends[0]
    compute = {0: 2 * (10 + 20 + 5), 1: 2 * (10 + 8 + 3)}  # forward + backward + optimizer, per iteration
    util = {w: c / wall for w, c in compute.items()}
    assert s["gpu_utilization"] == pytest.approx((util[0] + util[1]) / 2)
    assert s["bubble_fraction_per_stage"] == pytest.approx([1 - util[0], 1 - util[1]])
    assert s["bubble_fraction"] == pytest.approx(1 - (util[0] + util[1]) / 2)
    assert s["loss_first"] == LOSS[0] and s["loss_last"] == LOSS[-1]
    assert s["completed_iterations"] == 3
    # activation transfer: from the send at +10 (the receive was posted at +2) to its end at +30;
    # the sender's forwards take 10 ms
    assert s["wan_compute_ratio"] == pytest.approx((30 - 10) / 10)
    # measured padded ops: 2 workers x 3 kinds (forward, backward, optimizer) x 2 iterations = 12;
    # three overran (worker 1's backward of iteration 2, 21 > 20 ms; worker 0's optimizer steps,
    # 5 > 4 ms); the warm-up's overruns do not count
    assert s["compute_overrun_fraction"] == pytest.approx(3 / 12)
    assert 3 / 12 > MAX_REPRESENTATIVE_OVERRUN and s["representative"] is False
    # headroom: target over median real time, the smallest over kinds; measured forwards 9, 10, 4, 4
    # (median 6.5 ms, target 10), backwards 15, 15, 8, 21 (median 15 ms, target 20), optimizer
    # steps 5, 5, 3, 3 (median 4 ms, target 4)
    assert s["compute_headroom"] == pytest.approx(min(10 / 6.5, 20 / 15, 4 / 4))
    assert s["wan_utilization_mean"] == pytest.approx(0.5)  # 625 kB per 0.1 s = 50 of 100 Mbit/s
    assert s["policy"] == "pp-fair" and s["topology"] == "two_dc" and s["experiment"] == "hand"
    assert s["schedule"] == "gpipe" and s["workers"] == 2 and s["iterations"] == 3
    assert s["warmup_iterations"] == 1
    assert s["delay_mechanism"] == "netem" and s["aborted"] is False
    json.dumps(s)  # plain JSON types only


def test_summarize_documented_keys():
    s = summarize(run_events(), config(policy="atlas"), {}, counters(), aborted=True)
    for key in (
        "policy",
        "topology",
        "workers",
        "iterations",
        "iteration_time_s",
        "tokens_per_s",
        "gpu_utilization",
        "bubble_fraction",
        "loss_first",
        "loss_last",
        "delay_mechanism",
        "wan_compute_ratio",
        "compute_overrun_fraction",
    ):
        assert key in s, key
    assert s["policy"] == "atlas" and s["delay_mechanism"] is None and s["aborted"] is True


def test_summarize_real_mode_has_no_overrun():
    s = summarize(
        run_events(), config(compute={"mode": "real", "forward_ms": FWD_MS, "backward_ms": BWD_MS}), {}, counters()
    )
    assert s["compute_overrun_fraction"] == 0.0 and s["representative"] is True
    assert s["compute_headroom"] is None


def test_summarize_warmup_changes_the_measured_window():
    s = summarize(run_events(), config(warmup_iterations=0), {}, counters())
    ends = [200 * k + 85 + x for k, x in enumerate(EXTRA_MS)]
    durations = [ends[0] / 1e3] + [(ends[k] - ends[k - 1]) / 1e3 for k in (1, 2)]  # iteration 0 from its first op (0)
    assert s["iteration_time_s"] == pytest.approx(sum(durations) / 3)
    # with the warm-up: 2 workers x 3 kinds x 3 iterations = 18 ops; overruns: worker 0's forward of
    # iteration 0 (30 > 10), worker 1's backward of iterations 0 (25) and 2 (21), worker 0's three
    # optimizer steps (5 > 4)
    assert s["compute_overrun_fraction"] == pytest.approx(6 / 18)


def test_summarize_empty_run():
    empty = pd.DataFrame(columns=T.COLUMNS)
    s = summarize(
        empty, config(), {}, pd.DataFrame(columns=[T.T_NS, T.LINK, T.CLASSID, T.TX_BYTES, T.RATE_BPS]), aborted=True
    )
    assert s["iteration_time_s"] is None and s["tokens_per_s"] is None and s["gpu_utilization"] is None
    assert s["bubble_fraction"] is None and s["bubble_fraction_per_stage"] == []
    assert s["loss_first"] is None and s["completed_iterations"] == 0 and s["wan_compute_ratio"] is None
    assert s["wan_utilization_mean"] is None
    format_summary(s)  # prints Nones without failing


def test_format_summary():
    s = summarize(run_events(), config(), {"delay_mechanism": "nfqueue"}, counters())
    text = format_summary(s)
    lines = text.splitlines()
    assert lines[0] == "hand on two_dc: 2 workers, gpipe, 3/3 iterations (1 warm-up)"
    assert any(line.split()[-1] == "nfqueue" and "delay mechanism" in line for line in lines)
    assert f"{s['iteration_time_s']:.4g}" in text
    column = 2 + LABEL_WIDTH + 1  # every value starts there
    for _, label in SUMMARY_ROWS:
        line = next(line for line in lines if line.startswith(f"  {label} "))
        assert line[:column].rstrip() == f"  {label}" and line[column] != " "
    assert "WARNING" in text and "ABORTED" not in text  # 1/8 overran: not representative
    ok = summarize(
        run_events(), config(compute={"mode": "real", "forward_ms": 1, "backward_ms": 2}), {}, counters(), aborted=True
    )
    text = format_summary(ok)
    assert "WARNING" not in text and "ABORTED" in text
    assert "modelled TCP window" not in text  # no prediction: no note
    for error, noted in ((-0.28, True), (0.05, False)):
        assert ("modelled TCP window" in format_summary({**ok, "prediction_error": error})) is noted


def test_chrome_trace_one_process_per_dc_and_x_events_in_us():
    ev = run_events()
    tr = chrome_trace(ev)
    json.dumps(tr)
    events = tr["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert procs == {0: "DC east", 1: "DC west"}
    threads = {(e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert threads == {(0, 0), (1, 1)}
    xs = [e for e in events if e["ph"] == "X"]
    assert len(xs) == len(ev)
    assert {e["pid"] for e in xs} == {0, 1}
    assert all(e["pid"] == e["tid"] for e in xs)  # worker 0 in east (pid 0), worker 1 in west (pid 1)
    # worker 1's forward of iteration 1: 200 + 30 ms from the first event (0), 10 ms long
    f = [e for e in xs if e["tid"] == 1 and e["cat"] == T.FORWARD and e["args"]["iteration"] == 1]
    assert len(f) == 1
    assert f[0]["ts"] == pytest.approx(230_000.0) and f[0]["dur"] == pytest.approx(10_000.0)
    assert f[0]["name"] == "forward mb0"
    opt = [e for e in xs if e["cat"] == T.OPTIMIZER]
    assert {e["name"] for e in opt} == {"optimizer"}  # no microbatch (-1) in the name
    assert min(e["ts"] for e in xs) == 0.0


def test_chrome_trace_origin_is_the_first_event():
    ev = run_events()
    ev[T.START_NS] += 5_000 * MS
    ev[T.END_NS] += 5_000 * MS
    xs = [e for e in chrome_trace(ev)["traceEvents"] if e["ph"] == "X"]
    assert min(e["ts"] for e in xs) == 0.0
    assert max(e["ts"] + e["dur"] for e in xs) == pytest.approx((400 + 85 + EXTRA_MS[2]) * 1000.0)


def test_a_run_folder_config_that_testbed_run_did_not_write_is_named(tmp_path):
    """``testbed analyze`` on a damaged config.json: a SpecError naming the file, never a traceback."""
    from testbed.errors import SpecError
    from testbed.results.report import read_run_config

    path = tmp_path / "config.json"
    for text, problem in (
        ('{"experiment": {"stages": 3,', "is not valid JSON"),
        ("[1, 2]", "is not a JSON object"),
        ("{}", "is missing"),
    ):
        path.write_text(text)
        with pytest.raises(SpecError, match=problem) as e:
            read_run_config(tmp_path)
        assert e.value.source == str(path) and "testbed run" in e.value.fix


def test_ttft_alone_is_each_prompt_in_one_pass_at_the_runs_time_per_flop(tmp_path):
    from dataclasses import replace

    from testbed.bubbletea.decisions import prefill_seconds
    from testbed.plan.placement import place
    from testbed.plan.worker_config import BubbleTeaConfig, TrainingConfig, WorkerConfig, write_worker_config
    from testbed.results.bubbletea_summary import ttft_alone_s
    from testbed.spec.experiment_file import load_experiment
    from testbed.spec.model import ModelConfig

    assigned = [{"rid": 0, "prompt": 500}, {"rid": 1, "prompt": 16}]
    assert ttft_alone_s(tmp_path, assigned).empty  # no worker_config.json: nothing to say
    exp = load_experiment().with_overrides(policy="atlas+bubbletea")
    model = ModelConfig(n_layers=2, d_model=32, n_heads=2, seq_len=600)
    bt = BubbleTeaConfig(replace(exp.bubbletea, model=model), 1e-9, "/run/x/w{rank}.sock", "/run/x/bt.sock", {})
    cfg = WorkerConfig(TrainingConfig.of(exp, "/data/c.txt", 1), tuple(place(exp)), "r", "tcp://x:1", 9.0, None, bt)
    write_worker_config(tmp_path / "worker_config.json", cfg)
    got = ttft_alone_s(tmp_path, assigned).tolist()
    assert got == [prefill_seconds(model, 0, n, 1e-9) for n in (500, 16)]
    # attention makes the long prompt dearer per token: without it the ratio would be 30.6
    assert got[0] > 2 * 500 / 16 * got[1]
    write_worker_config(tmp_path / "worker_config.json", replace(cfg, bubbletea=None))
    assert ttft_alone_s(tmp_path, assigned).empty  # a run without BubbleTea


def test_a_run_serving_prefill_alone_has_windows_not_iterations(tmp_path):
    """``+prefill-alone``: three 100 ms serving windows (the first warm-up) of two workers that
    prefill 60 and 40 ms of each; no training figure, the windows as iterations, and the
    prefill's share of the wall time as its GPU utilization."""
    rows = []
    for k in range(3):
        b = 100 * k
        for w, busy in ((0, 60), (1, 40)):
            rows += [
                op(w, T.PREFILL, k, -1, b + 5, b + 5 + busy, target_ns=busy * MS, tokens=64),
                op(w, T.SERVING_WINDOW, k, -1, b, b + 100, queue_empty_ns=(100 - busy) * MS if w else 0),
            ]
    ev = pd.DataFrame(rows, columns=T.COLUMNS)
    for c in (T.TARGET_NS, T.QUEUE_EMPTY_NS):
        ev[c] = pd.to_numeric(ev[c])
    cfg = config(policy="atlas+prefill-alone", bubbletea={})
    s = summarize(ev[ev[T.KIND] != T.PREFILL], cfg, {}, counters())
    assert s["serving_window_s"] == pytest.approx(0.1) and s["completed_iterations"] == 3
    assert s["queue_empty_share"] == pytest.approx(2 * 60 / 400)  # worker 1 idled 60 ms a window, empty
    for key in ("iteration_time_s", "tokens_per_s", "bubble_fraction", "prediction_error"):
        assert s[key] is None, key
    from testbed.results.bubbletea_summary import bubbletea_stats

    (tmp_path / "requests").mkdir()
    (tmp_path / "requests" / "dispatch.jsonl").write_text(
        "".join(
            json.dumps({"event": "assign", "rid": rid, "arrival_ns": a, "assigned_ns": a + d, "worker": 0}) + "\n"
            for rid, a, d in ((0, 10 * MS, 2 * MS), (1, 50 * MS, 10 * MS))
        )
    )
    bt = bubbletea_stats(tmp_path, ev, cfg, s["gpu_utilization"])
    assert bt["requests_assigned"] == 2
    assert bt["dispatch_delay_p50_ms"] == pytest.approx(6.0) and bt["dispatch_delay_p99_ms"] == pytest.approx(9.92)
    assert bt["gpu_utilization"] == pytest.approx((0.6 + 0.4) / 2) and bt["training_gpu_utilization"] == 0
    assert bt["prefill_alone_share"] == pytest.approx(0.5)  # 2 x (60 + 40) ms of 2 x 200 ms
    assert bt["prefill_tokens_per_s"] == pytest.approx(4 * 64 / 0.2)
    assert bt["bubble_fill_fraction"] is None  # no training: no bubbles


def test_the_training_slice_is_the_longest_any_worker_reported_and_none_if_one_reported_none(tmp_path):
    """``slice_stats``: from the workers' ``process_group`` lines of ``startup.jsonl`` (ms; the
    wait's real-time priority, the lowest, and nice value, the highest); None where a worker
    reported none, and for a run that recorded none."""
    from testbed.results.summary import slice_stats
    from testbed.trace.startup import SLICE_NS, SWITCH_INTERVAL_US, WAIT_NICE, WAIT_RT_PRIORITY, mark_startup

    nothing = {
        "training_slice_ms": None,
        "training_wait_rt_priority": None,
        "training_wait_nice": None,
        "switch_interval_us": None,
    }
    assert slice_stats(tmp_path) == nothing  # no start-up log
    mark_startup(tmp_path, "run_start")
    mark_startup(tmp_path, "forked", 0)
    assert slice_stats(tmp_path) == nothing  # a run from before the slice
    first = {SLICE_NS: 100_000, WAIT_RT_PRIORITY: 3, WAIT_NICE: -10, SWITCH_INTERVAL_US: 100}
    mark_startup(tmp_path, "process_group", 0, **first)
    second = {SLICE_NS: 1_400_000, WAIT_RT_PRIORITY: 1, WAIT_NICE: -5, SWITCH_INTERVAL_US: 5000}
    mark_startup(tmp_path, "process_group", 1, **second)
    assert slice_stats(tmp_path) == {
        "training_slice_ms": pytest.approx(1.4),
        "training_wait_rt_priority": 1,  # the lowest priority, the highest nice value: the weakest
        "training_wait_nice": -5,
        "switch_interval_us": 5000,
    }
    mark_startup(tmp_path, "process_group", 2, **{SLICE_NS: None, WAIT_NICE: None})  # no interval: from before it
    assert slice_stats(tmp_path) == nothing


def test_the_filling_threads_nice_is_the_highest_a_bubbletea_worker_reported(tmp_path):
    """``slice_stats``: BubbleTea's filling threads' nice value, the highest of the workers' (a
    worker refused the lower one reports its own), and absent where no worker reported one (a
    run without BubbleTea)."""
    from testbed.results.summary import slice_stats
    from testbed.trace.startup import FILL_NICE, SLICE_NS, WAIT_NICE, mark_startup

    mark_startup(tmp_path, "process_group", 0, **{SLICE_NS: 100_000, WAIT_NICE: -10})
    assert "fill_thread_nice" not in slice_stats(tmp_path)
    mark_startup(tmp_path, "process_group", 1, **{SLICE_NS: 100_000, WAIT_NICE: -10, FILL_NICE: -10})
    assert slice_stats(tmp_path)["fill_thread_nice"] == -10
    mark_startup(tmp_path, "process_group", 2, **{SLICE_NS: 100_000, WAIT_NICE: -10, FILL_NICE: 0})
    assert slice_stats(tmp_path)["fill_thread_nice"] == 0
