"""``testbed run --sched-trace`` on a real run: the kernel's scheduler recorded in a tracefs
instance of the run's own, every process and thread the testbed starts named for it, each late
operation's time accounted for; and the instance removed at the end, or by ``testbed clean``
after its run was killed. The traced run starts where a fresh machine does, with no tracefs
mounted (in a private mount namespace, ``unshare -m``): the run mounts it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest

from testbed.net.registry import stale_runs
from testbed.results.analysis import LATE_START_NS, measured, training_events
from testbed.results.input_arrival import input_arrivals_ns
from testbed.results.sched_summary import LATE_STARTS_FILE, SCHED_INFO_FILE
from testbed.results.sched_trace import run_tasks, worker_pids
from testbed.spec.addressing import new_run_prefix
from testbed.trace import schema as T

from .conftest import REPO, run_cli

#: a command's prefix that runs it in a private mount namespace with no tracefs mounted, as on a
#: fresh machine (whose kernel mounts none; debugfs, whose tracing/ folder mounts one, goes too)
WITHOUT_TRACEFS = [
    "unshare",
    "--mount",
    "--propagation",
    "private",
    "sh",
    "-c",
    'for m in /sys/kernel/debug/tracing /sys/kernel/tracing /sys/kernel/debug; do while mountpoint -q "$m"; '
    'do umount -l "$m" || exit 1; done; done; exec "$@"',
    "sh",
]


def _host_mounts() -> str:
    return open("/proc/self/mountinfo").read()


def test_a_traced_run_names_its_tasks_and_accounts_for_each_late_start(tmp_path, clean_machine):
    out = tmp_path / "run"
    mounts = _host_mounts()
    cmd = [sys.executable, "-m", "testbed.cli", "run", "--policy", "atlas+bubbletea", "--iterations", "4"]
    r = subprocess.run(
        WITHOUT_TRACEFS + cmd + ["--sched-trace", "--out", str(out)], capture_output=True, text=True, cwd=REPO
    )
    assert r.returncode == 0, r.stderr[-3000:]
    # the run mounted tracefs where none was, and said so; in its own mount namespace, not here
    env = json.loads((out / "env.json").read_text())
    assert env["tracefs_mounted_by_run"] is True and env["tracefs"] == "/sys/kernel/tracing", env
    assert _host_mounts() == mounts
    sched = pd.read_parquet(out / T.SCHED_FILE)
    assert list(sched.columns) == T.SCHED_COLUMNS and len(sched) > 1000
    assert (sched[T.EVENT] == T.SCHED_WAKEUP).any() and sched[T.T_NS].is_monotonic_increasing
    workers = json.loads((out / "config.json").read_text())["workers"]
    info = json.loads((out / SCHED_INFO_FILE).read_text())
    assert info["lost_events"] == 0 and info["cpus"] == os.cpu_count() and len(info["run_pids"]) >= 2
    # each worker's main thread, found among the tasks the run's processes made while it traced
    members = run_tasks(sched, info["run_pids"])
    assert sorted(worker_pids(sched, members)) == sorted(w["rank"] for w in workers)
    names = set(sched[T.NEXT_COMM])
    # the decode hosts' steps (SCHED_IDLE) named apart from their other threads; as root: granted
    for name in ("tb-atlas", "tb-decode", "tb-decode-step", "tb-dispatch", "tb-sampler"):
        assert name in names, (name, sorted(n for n in names if n.startswith("tb-")))
    # BubbleTea's prefill streams (SCHED_IDLE), the threads filling bubbles; the streams' KV senders
    # run only once a request's prefill is done, which 4 iterations may not reach
    for suffix in ("-pf", "-fill"):
        assert any(n.startswith("tb-w") and n.endswith(suffix) for n in names), suffix
    assert (
        any(n.startswith("nfq_delay") for n in names)
        or json.loads((out / "env.json").read_text())["delay_mechanism"] == "netem"
    )
    # the trace is on the run's clock: it covers the training's events
    ev = pd.read_parquet(out / "events.parquet")
    assert sched[T.T_NS].min() < ev[T.START_NS].min() + 5e9 and sched[T.T_NS].max() > ev[T.END_NS].max() - 1e9
    summary = json.loads((out / "summary.json").read_text())
    assert summary["sched_events_lost"] == 0, summary
    late = pd.read_csv(out / LATE_STARTS_FILE)
    # counted from the kernel's wake-up of the thread, which is never after the thread saw its input:
    # every operation the worker saw late is among them, and maybe more
    assert len(late) == summary["sched_late_ops"] and (late["arrival_ns"] <= late["ready_ns"]).all()
    seen_late = int((late["start_ns"] - late["ready_ns"] > LATE_START_NS).sum())
    assert seen_late == summary["training_ops_started_late"] <= len(late)
    assert late["unseen_ms"].sum() == pytest.approx(summary["sched_late_unseen_ms"])
    # gloo's waking of the worker's thread is found for many receives (those whose last stripe the
    # thread slept through: 54-63% in 32-iteration runs): each input's arrival, before it saw it
    assert T.SCHED_WAKING_EVENT in info["events"]
    train = measured(training_events(ev), summary["warmup_iterations"])
    ops = train[train[T.KIND].isin((T.FORWARD, T.BACKWARD)) & train[T.READY_NS].notna()]
    arrival = input_arrivals_ns(ops, ev, sched, worker_pids(sched, members))
    ready = ops[T.READY_NS].to_numpy(dtype="int64")
    assert (arrival <= ready).all() and (arrival < ready).mean() > 0.25, (arrival < ready).mean()
    waits = ev[ev[T.KIND] == T.RECV_WAIT].set_index(T.READY_NS)[T.LAST_WAIT_NS]
    assert (arrival >= waits.loc[ready].to_numpy()).all()
    for row in late.itertuples():  # every late operation's wait is accounted for, state by state
        accounted = row.running + row.runnable + row.sleeping + row.unknown
        assert accounted == pytest.approx(row.late_ms, abs=0.002), row
    # the kernel's moves between CPUs are recorded (on more than one CPU), so the CPU whose run
    # queue each late thread waited on is known: part of what all CPUs ran while it waited
    assert T.SCHED_MIGRATE_EVENT in info["events"]
    if os.cpu_count() > 1:
        assert (sched[T.EVENT] == T.SCHED_MIGRATE).any()
    queue, every = summary["sched_queue_cpu_while_runnable_ms"], summary["sched_cpu_while_runnable_ms"]
    assert set(queue) <= set(every) and all(ms <= every[role] + 1e-6 for role, ms in queue.items())
    if summary["sched_late_runnable_ms"] > 0:
        assert sum(queue.values()) == pytest.approx(summary["sched_late_runnable_ms"], rel=0.01)
    # another CPU free while they waited: never more than the wait, from within it
    assert (late["free_cpu_ms"] <= late["runnable"] + 1e-6).all()
    # (NaN where no other CPU was free: compared row by row, not after dropping them, which would
    # leave an empty column set against a full one)
    assert (late["free_from_ms"].isna() | (late["free_from_ms"] <= late["late_ms"])).all()
    assert summary["sched_late_free_cpu_ms"] == pytest.approx(late["free_cpu_ms"].sum())
    assert summary["sched_late_ops_free_cpu"] == int((late["free_from_ms"] < LATE_START_NS / 1e6).sum())
    assert "late ops from the waking" in r.stdout


def test_testbed_clean_removes_the_instance_of_a_killed_run(tmp_path, clean_machine):
    # a process that makes a run's tracefs instance, registered, then is killed with -9
    code = (
        "import sys, time\n"
        "from testbed.net.registry import RunRecord\n"
        "from testbed.net.tracefs import SchedTrace\n"
        "t = SchedTrace(RunRecord.new(sys.argv[1], out_dir=sys.argv[2]))\n"
        "t.start()\n"
        "print(t.path, flush=True)\n"
        "time.sleep(60)\n"
    )
    prefix = new_run_prefix()
    proc = subprocess.Popen(
        [sys.executable, "-c", code, prefix, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    path = proc.stdout.readline().strip()
    assert path.endswith(f"instances/{prefix}-sched") and os.path.isdir(path)
    assert open(os.path.join(path, "trace_clock")).read().split("[")[1].startswith("mono")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    time.sleep(0.1)
    assert prefix in [rec.prefix for rec in stale_runs()]
    with open(os.path.join(path, "trace")):  # a reader holds it: the kernel refuses to remove it
        r = run_cli("clean", "--run", prefix)
    assert r.returncode == 1 and "could not remove tracefs instance" in r.stdout, r.stdout + r.stderr
    assert os.path.isdir(path) and prefix in [rec.prefix for rec in stale_runs()]  # kept for the next clean
    r = run_cli("clean", "--run", prefix)
    assert r.returncode == 0, r.stderr
    assert "1 tracefs instance(s)" in r.stdout and not os.path.exists(path)


def test_tracefs_is_mounted_where_none_is_and_left_mounted():
    code = (
        "from testbed.net.tracefs import ensure_tracefs, mounted_tracefs, tracefs_status\n"
        "assert mounted_tracefs() is None\n"
        "print(tracefs_status())\n"
        "print(ensure_tracefs())\n"
        "print(ensure_tracefs())\n"
        "print(tracefs_status())\n"
    )
    r = subprocess.run(WITHOUT_TRACEFS + [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    before, first, second, after = r.stdout.splitlines()
    assert "a traced run mounts it at /sys/kernel/tracing" in before
    assert "mounted_by_run=True" in first and "mounted_by_run=False" in second  # kept mounted
    assert after == "available (tracefs at /sys/kernel/tracing)"
