"""The scheduler trace read against late operations (``results/sched_trace.py``) and the task names
it relies on (``trace/task_names.py``), on hand-written kernel lines."""

from __future__ import annotations

import json
import threading

import pandas as pd
import pytest
from eventrows import MS, event_row

from testbed.net.tracefs import kernel_has_tracefs
from testbed.results.cpu_timeline import CpuTimeline
from testbed.results.sched_summary import (
    LATE_STARTS_FILE,
    SCHED_INFO_FILE,
    cause_totals,
    sched_lines,
    sched_stats,
    sched_totals,
    write_sched_trace,
)
from testbed.results.sched_trace import (
    FREE_ROLES,
    late_start_causes,
    parse_sched_lines,
    relative_role,
    run_tasks,
    worker_pids,
)
from testbed.trace import schema as T
from testbed.trace.task_names import name_this_thread, role_of


def switch(t_s: str, cpu: int, prev: tuple[str, int, int], state: str, nxt: tuple[str, int]) -> str:
    """A ``sched_switch`` line as tracefs prints it with record-tgid: (comm, pid, tgid) of the task
    switched from, its state, (comm, pid) of the task switched to."""
    comm, pid, tgid = prev
    return (
        f"{comm:>16}-{pid:<7} ({tgid:>7}) [{cpu:03d}] d..2. {t_s}: sched_switch: prev_comm={comm} prev_pid={pid} "
        f"prev_prio=120 prev_state={state} ==> next_comm={nxt[0]} next_pid={nxt[1]} next_prio=120"
    )


def wakeup(t_s: str, cpu: int, waker: tuple[str, int, int], woken: tuple[str, int]) -> str:
    comm, pid, tgid = waker
    return (
        f"{comm:>16}-{pid:<7} ({tgid:>7}) [{cpu:03d}] dNs4. {t_s}: sched_wakeup: comm={woken[0]} pid={woken[1]} "
        f"prio=120 target_cpu={cpu:03d}"
    )


IDLE0, IDLE1 = ("swapper/0", 0, 0), ("swapper/1", 0, 0)
W0, W0_GLOO, W1, DELAY = ("tb-w0", 100, 100), ("tb-w0", 101, 100), ("tb-w1", 200, 200), ("nfq_delay-3f2a1", 300, 300)
LINES = [
    "# tracer: nop",
    switch("1.000000", 0, IDLE0, "R", W0[:2]),
    switch("1.000000", 1, IDLE1, "R", W1[:2]),
    switch("1.001000", 0, W0, "S", W0_GLOO[:2]),  # worker 0's main thread sleeps (waits on gloo)
    wakeup("1.002000", 0, W0_GLOO, W0[:2]),  # gloo wakes it: runnable
    switch("1.002000", 0, W0_GLOO, "R+", DELAY[:2]),  # the delay element takes the CPU
    switch("1.003000", 1, W1, "R+", ("gloo_tcp_loop", 201)),  # a thread of worker 1's that names itself
    "          <idle>-0       (-------) [000] d..2. 1.003000: sched_stat_runtime: not read",
    switch("1.004000", 0, DELAY, "S", W0[:2]),  # worker 0 runs at last
    switch("1.003500", 1, ("gloo_tcp_loop", 201, 200), "S", W1[:2]),
    switch("1.005000", 1, W1, "S", IDLE1[:2]),
    # worker 0 forks its prefill stream, which runs once under the worker's name before naming itself
    switch("1.006000", 1, IDLE1, "R", ("tb-w0", 400)),
    switch("1.006500", 1, ("tb-w0", 400, 400), "S", IDLE1[:2]),
]


def test_parsed_lines_keep_switches_and_wakeups_with_each_tasks_process():
    df = parse_sched_lines(LINES)
    assert list(df.columns) == T.SCHED_COLUMNS
    # comments and other events left out
    assert list(df[T.EVENT]) == [T.SCHED_SWITCH] * 3 + [T.SCHED_WAKEUP] + [T.SCHED_SWITCH] * 7
    assert df[T.T_NS].iloc[2] == 1_001_000_000 and df[T.T_NS].iloc[-1] == 1_006_500_000
    gloo = df.iloc[2]
    assert (gloo[T.NEXT_PID], gloo[T.NEXT_TGID], gloo[T.NEXT_COMM], gloo[T.PREV_STATE]) == (101, 100, "tb-w0", "S")
    woken = df.iloc[3]
    assert (woken[T.NEXT_PID], woken[T.PREV_PID], woken[T.CPU]) == (100, 101, 0)
    assert df.iloc[4][T.NEXT_COMM] == "nfq_delay-3f2a1" and df.iloc[4][T.NEXT_TGID] == 300
    assert worker_pids(df) == {0: 100, 1: 200}  # not the forked process switched to once


def _late_op_events() -> pd.DataFrame:
    """Worker 0's forward whose input came at 1001.5 ms and which started at 1004.5 ms (3 ms late),
    one on time, and one of the warm-up."""
    ev = pd.DataFrame(
        [
            event_row(0, "h0", "east", 1, 0, T.FORWARD, 1, 0, 1004.5, 1010.0, ready_ns=int(1001.5 * MS)),
            event_row(0, "h0", "east", 1, 0, T.FORWARD, 1, 1, 1020.0, 1030.0, ready_ns=int(1019.5 * MS)),  # on time
            event_row(1, "h1", "east", 0, 0, T.FORWARD, 0, 0, 900.0, 910.0, ready_ns=int(800 * MS)),  # warm-up
        ],
        columns=T.COLUMNS,
    )
    ev[T.READY_NS] = pd.to_numeric(ev[T.READY_NS])
    return ev


def test_a_late_operation_slept_then_waited_behind_the_delay_element_and_another_worker():
    ops, by_role = late_start_causes(_late_op_events(), parse_sched_lines(LINES), warmup=1)
    assert len(ops) == 1
    row = ops.iloc[0]
    assert (row[T.WORKER], row[T.MICROBATCH], row["late_ms"]) == (0, 0, pytest.approx(3.0))
    # 1001.5-1002 asleep, 1002-1004 on the run queue, 1004-1004.5 on the CPU
    assert (row["sleeping"], row["runnable"], row["running"], row["unknown"]) == pytest.approx((0.5, 2.0, 0.5, 0))
    cpu = dict(zip(by_role["role"], by_role["cpu_ms"]))
    assert cpu == pytest.approx({"delay element": 2.0, "other workers": 1.5, "other workers' threads": 0.5})
    totals = cause_totals(ops, by_role)
    assert totals["sched_late_ops"] == 1 and totals["sched_late_runnable_ms"] == pytest.approx(2.0)
    assert totals["sched_cpu_while_runnable_ms"] == pytest.approx(
        {"delay element": 2.0, "other workers": 1.5, "other workers' threads": 0.5}
    )
    # a trace without the moves between CPUs does not tell which run queue the thread was on
    assert by_role["queue_cpu_ms"].isna().all() and totals["sched_queue_cpu_while_runnable_ms"] is None


def migrate(
    t_s: str, cpu: int, running: tuple[str, int, int], moved: tuple[str, int], orig: int, dest: int | None = None
) -> str:
    """A ``sched_migrate_task`` line printed on ``cpu`` (``running`` the task that ran there): task
    ``moved`` moved from CPU ``orig`` to ``dest`` (default: ``cpu``)."""
    comm, pid, tgid = running
    return (
        f"{comm:>16}-{pid:<7} ({tgid:>7}) [{cpu:03d}] d..2. {t_s}: sched_migrate_task: comm={moved[0]} "
        f"pid={moved[1]} prio=120 orig_cpu={orig} dest_cpu={cpu if dest is None else dest}"
    )


def test_the_cpu_whose_run_queue_a_late_thread_waited_on_is_followed_through_its_moves():
    """Worker 0 is woken onto CPU 0's queue, where the delay element runs; 1.5 ms later the kernel
    moves it to CPU 1's, where worker 1 runs, and it runs there 0.5 ms later. Both CPUs' time
    while it waited counts in ``cpu_ms``; only its queue's in ``queue_cpu_ms``."""
    lines = [
        switch("1.000000", 0, IDLE0, "R", W0[:2]),
        switch("1.000000", 1, IDLE1, "R", W1[:2]),
        switch("1.001000", 0, W0, "S", DELAY[:2]),
        wakeup("1.002000", 0, DELAY, W0[:2]),
        migrate("1.003500", 1, W1, W0[:2], orig=0),
        switch("1.004000", 1, W1, "R+", W0[:2]),
        switch("1.005000", 0, DELAY, "S", IDLE0[:2]),
    ]
    sched = parse_sched_lines(lines)
    assert list(sched[T.EVENT]).count(T.SCHED_MIGRATE) == 1
    moved = sched[sched[T.EVENT] == T.SCHED_MIGRATE].iloc[0]
    assert (moved[T.CPU], moved[T.NEXT_PID], moved[T.PREV_PID], moved[T.NEXT_TGID]) == (1, 100, 200, 100)
    ops, by_role = late_start_causes(_late_op_events(), sched, warmup=1, n_cpus=2, queues=True)
    row = ops.iloc[0]
    assert (row["sleeping"], row["runnable"], row["running"], row["unknown"]) == pytest.approx((0.5, 2.0, 0.5, 0))
    cpu = dict(zip(by_role["role"], by_role["cpu_ms"]))
    on_queue = dict(zip(by_role["role"], by_role["queue_cpu_ms"]))
    assert cpu == pytest.approx({"delay element": 2.0, "other workers": 2.0})
    assert on_queue == pytest.approx({"delay element": 1.5, "other workers": 0.5})
    totals = cause_totals(ops, by_role)
    assert totals["sched_queue_cpu_while_runnable_ms"] == {"delay element": 1.5, "other workers": 0.5}


def test_a_thread_moved_as_it_is_woken_waits_on_the_wakeups_cpu_and_a_running_one_is_not_moved():
    """The kernel moves a sleeping task as it wakes it (the move printed on the waker's CPU, before
    the wake-up): worker 0 sleeps, is moved to CPU 1 and woken there, and waits behind worker 1;
    a move seen while it runs (which the kernel never makes) leaves its timeline alone."""
    lines = [
        switch("1.000000", 0, IDLE0, "R", W0[:2]),
        switch("1.000000", 1, IDLE1, "R", W1[:2]),
        switch("1.001000", 0, W0, "S", DELAY[:2]),
        migrate("1.001900", 0, DELAY, W0[:2], orig=0, dest=1),
        wakeup("1.002000", 1, DELAY, W0[:2]),
        switch("1.004000", 1, W1, "R+", W0[:2]),
        migrate("1.004200", 0, DELAY, W0[:2], orig=1),  # while it runs: not followed
        switch("1.005000", 0, DELAY, "S", IDLE0[:2]),
    ]
    sched = parse_sched_lines(lines)
    moved = sched[sched[T.EVENT] == T.SCHED_MIGRATE]
    assert list(moved[T.CPU]) == [1, 0]  # the destination, not the CPU that printed the line
    ops, by_role = late_start_causes(_late_op_events(), sched, warmup=1, n_cpus=2, queues=True)
    row = ops.iloc[0]
    # asleep until the wake-up at 1.002 (the move before it does not make it runnable), then
    # runnable on CPU 1's queue until 1.004, then running: the later move changes nothing
    assert (row["sleeping"], row["runnable"], row["running"], row["unknown"]) == pytest.approx((0.5, 2.0, 0.5, 0))
    on_queue = dict(zip(by_role["role"], by_role["queue_cpu_ms"]))
    assert on_queue == pytest.approx({"delay element": 0.0, "other workers": 2.0})


STREAM1 = ("tb-w1-pf", 250, 250)


@pytest.mark.parametrize(
    ("cpu1", "free_ms", "free_from_ms", "counted"),
    [
        # worker 1's prefill stream (SCHED_IDLE) from 1.0015, idle from 1.003, worker 1 again at 1.0045
        ([("1.001500", W1, STREAM1), ("1.003000", STREAM1, IDLE1), ("1.004500", IDLE1, W1)], 2.0, 0.5, 1),
        # worker 1 until 1.003, idle until 1.0035: free only from 1.5 ms after the input
        ([("1.003000", W1, IDLE1), ("1.003500", IDLE1, W1)], 0.5, 1.5, 0),
    ],
)
def test_a_thread_left_queued_while_another_cpu_idles_or_runs_sched_idle_work(cpu1, free_ms, free_from_ms, counted):
    """Worker 0's input comes at 1.0015; it waits on CPU 0's queue behind the delay element from
    1.002 to 1.004 (3 ms late) while CPU 1 is free for it (worker 1's stream, then idle) 2 ms from
    1.002, or 0.5 ms from 1.003: counted only where a CPU was free before 1 ms after the input."""
    lines = [
        switch("1.000000", 0, IDLE0, "R", W0[:2]),
        switch("1.000000", 1, IDLE1, "R", W1[:2]),
        switch("1.001000", 0, W0, "S", DELAY[:2]),
        wakeup("1.002000", 0, DELAY, W0[:2]),
        *(switch(t, 1, prev, "S", nxt[:2]) for t, prev, nxt in cpu1),
        switch("1.004000", 0, DELAY, "S", W0[:2]),
    ]
    ops, by_role = late_start_causes(_late_op_events(), parse_sched_lines(lines), warmup=1, n_cpus=2, queues=True)
    row = ops.iloc[0]
    assert (row["free_cpu_ms"], row["free_from_ms"]) == pytest.approx((free_ms, free_from_ms))
    totals = cause_totals(ops, by_role)
    assert totals["sched_late_free_cpu_ms"] == pytest.approx(free_ms) and totals["sched_late_ops_free_cpu"] == counted
    # without the moves between CPUs the queue, and so the other CPUs, are not known
    ops, by_role = late_start_causes(_late_op_events(), parse_sched_lines(lines), warmup=1, n_cpus=2)
    assert ops["free_cpu_ms"].isna().all() and ops["free_from_ms"].isna().all()
    assert cause_totals(ops, by_role)["sched_late_ops_free_cpu"] is None
    assert sched_lines({"atlas": sched_totals({"atlas": [totals]})["atlas"]})[1] == (
        f"  another CPU was free (idle, or running only SCHED_IDLE work) {free_ms:.1f} ms of their wait; "
        f"{counted} of the 1 had one before 1 ms from their input"
    )


def test_free_time_is_the_union_over_the_other_cpus_not_their_sum():
    """Two other CPUs idle at once count once; the thread's own queue's CPU, idle from 1.0005,
    does not count."""
    lines = [
        switch("1.000000", 0, IDLE0, "R", W0[:2]),
        switch("1.000000", 1, IDLE1, "R", W1[:2]),
        switch("1.000000", 2, ("swapper/2", 0, 0), "R", DELAY[:2]),
        switch("1.000500", 0, W0, "S", IDLE0[:2]),
        switch("1.001000", 1, W1, "S", IDLE1[:2]),  # CPU 1 idle from 1.001
        switch("1.001500", 2, DELAY, "S", ("swapper/2", 0)),  # CPU 2 idle from 1.0015
        switch("1.002500", 1, IDLE1, "R", W1[:2]),  # CPU 1 busy again at 1.0025
    ]
    sw = parse_sched_lines(lines)
    cpus = CpuTimeline(sw[sw[T.EVENT] == T.SCHED_SWITCH], 3)

    def free(comm: str, pid: int, tgid: int) -> bool:
        return relative_role(comm, pid, tgid, 0, {100: 0, 200: 1}) in FREE_ROLES

    # [1.000, 1.003): CPU 1 idle 1.001-1.0025, CPU 2 idle 1.0015-1.003: at least one 1.001-1.003
    assert cpus.spans_where(int(1.000e9), int(1.003e9), free, besides=0) == [(int(1.001e9), int(1.003e9))]


def test_the_free_roles_are_those_of_sched_idle_work_and_idle_cpus():
    """Each role counted free is one ``relative_role`` gives (to worker 0): an idle CPU, the
    decode steps' thread, the streams' computing threads; not a decode host's other threads nor
    a stream's KV sender, which keep the normal policy."""
    from testbed.trace import task_names

    def role(comm: str, pid: int, tgid: int) -> str:
        return relative_role(comm, pid, tgid, 0, {100: 0, 200: 1})

    free = {role("swapper/1", 0, 0), role(task_names.DECODE_STEP, 501, 500), role("tb-w0-pf", 300, 300)}
    free |= {role("tb-w1-pf", 400, 400)}
    assert free == FREE_ROLES
    kept = {role(task_names.DECODE, 500, 500), role("tb-w0-pf-kv", 301, 300), role("tb-w1-pf-kv", 401, 400)}
    assert kept == {"decode", "own kv sender", "other workers' kv senders"} and not kept & FREE_ROLES


@pytest.mark.parametrize("with_moves", [True, False])
def test_a_run_folders_trace_gives_queue_figures_only_where_the_moves_were_recorded(tmp_path, with_moves):
    """``sched_stats`` on a run folder: a trace whose ``sched.json`` lists the moves between CPUs
    gives the queue CPU's figures and ``queue_cpu_ms:`` columns; one made before they were
    recorded (no ``events``) gives None and no such column, the rest unchanged."""
    events = ["sched/sched_switch", "sched/sched_wakeup", T.SCHED_MIGRATE_EVENT, "sched/sched_process_fork"]
    write_sched_trace(tmp_path, LINES, 0, [100, 200, 300], events)  # the run's: every task of LINES
    if not with_moves:
        info = json.loads((tmp_path / SCHED_INFO_FILE).read_text())
        del info["events"]
        (tmp_path / SCHED_INFO_FILE).write_text(json.dumps(info))
    stats = sched_stats(tmp_path, _late_op_events(), warmup=1)
    assert stats["sched_late_ops"] == 1 and stats["sched_late_runnable_ms"] == pytest.approx(2.0)
    late = pd.read_csv(tmp_path / LATE_STARTS_FILE)
    assert late["cpu_ms: delay element"].iloc[0] == pytest.approx(2.0)
    if with_moves:  # woken onto CPU 0's queue, where the delay element ran
        assert stats["sched_queue_cpu_while_runnable_ms"] == pytest.approx(
            {"delay element": 2.0, "other workers": 0.0, "other workers' threads": 0.0}
        )
        assert late["queue_cpu_ms: delay element"].iloc[0] == pytest.approx(2.0)
    else:
        assert stats["sched_queue_cpu_while_runnable_ms"] is None
        assert not any(c.startswith("queue_cpu_ms") for c in late.columns)


def waking(t_s: str, cpu: int, waker: tuple[str, int, int], woken: tuple[str, int]) -> str:
    """A ``sched_waking`` line, printed by the waker itself."""
    return wakeup(t_s, cpu, waker, woken).replace("sched_wakeup:", "sched_waking:")


def test_the_input_arrives_when_gloo_wakes_the_thread_not_when_it_sees_it():
    """Worker 0 waits for its input's last stripe from 1000.2 ms; gloo's thread wakes it at 1001
    ms, the delay element holds the CPU until 1002.5 ms, then the worker's thread runs 0.1 ms and
    sleeps on its interpreter lock until its filling thread hands it back at 1003 ms; it sees the
    input at 1003.5 ms and starts at 1004 ms: 3 ms late, not the 0.5 ms it saw. Not counted as
    arrivals: a waking by gloo before the last stripe's wait began (the second receive: its last
    stripe was in before the thread waited for it), nor one by a task of another process (the
    third: the wake-up printed on the woken thread's CPU by whatever ran there), nor any for a
    wait event without ``T.LAST_WAIT_NS`` (the fourth: a trace from before it was recorded);
    those count from when the thread saw the input, so none is late."""
    fill = ("tb-w0-fill", 102, 100)
    lines = [
        switch("1.000000", 0, IDLE0, "R", W0[:2]),
        switch("1.000000", 1, IDLE1, "R", W1[:2]),
        switch("1.000500", 0, W0, "S", DELAY[:2]),  # waits on gloo
        wakeup("1.001000", 0, DELAY, W0[:2]),  # printed on its CPU by what ran there
        waking("1.001000", 1, W0_GLOO, W0[:2]),  # the last stripe complete: the input's arrival
        switch("1.002500", 0, DELAY, "S", W0[:2]),
        switch("1.002600", 0, W0, "S", DELAY[:2]),  # asleep on the interpreter lock
        switch("1.002900", 1, W1, "S", fill[:2]),
        waking("1.003000", 1, fill, W0[:2]),  # the filling thread hands the lock back
        wakeup("1.003000", 0, fill, W0[:2]),
        switch("1.003000", 0, DELAY, "S", W0[:2]),
        switch("1.003100", 1, fill, "S", W1[:2]),
        switch("1.008100", 0, W0, "S", DELAY[:2]),
        waking("1.008200", 1, W0_GLOO, W0[:2]),  # before the second receive's last wait (1008.3)
        waking("1.012200", 0, DELAY, W0[:2]),  # another process's task: not gloo's
        waking("1.016200", 1, W0_GLOO, W0[:2]),  # the fourth's: its event has no LAST_WAIT_NS
        switch("1.020500", 1, W1, "S", IDLE1[:2]),
    ]
    ms = {"ready": [1003.5, 1009.8, 1013.8, 1017.8], "start": [1004.0, 1010.0, 1014.0, 1018.0]}
    last_wait = [1000.2, 1008.3, 1012.1, None]
    rows = []
    for m, (ready, start, last) in enumerate(zip(ms["ready"], ms["start"], last_wait)):
        extra = {} if last is None else {T.LAST_WAIT_NS: int(last * MS)}
        rows += [
            event_row(
                0, "h0", "east", 1, 0, T.RECV_WAIT, 1, m, ready - 3, ready + 0.1, ready_ns=int(ready * MS), **extra
            ),
            event_row(0, "h0", "east", 1, 0, T.FORWARD, 1, m, start, start + 0.1, ready_ns=int(ready * MS)),
        ]
    ev = pd.DataFrame(rows, columns=T.COLUMNS)
    ev[T.READY_NS] = pd.to_numeric(ev[T.READY_NS])
    ev[T.LAST_WAIT_NS] = pd.to_numeric(ev[T.LAST_WAIT_NS])
    sched = parse_sched_lines(lines)
    assert (sched[T.EVENT] == T.SCHED_WAKING).sum() == 5
    ops, by_role = late_start_causes(ev, sched, warmup=1, n_cpus=2)
    assert len(ops) == 1
    row = ops.iloc[0]
    assert (row[T.MICROBATCH], row["arrival_ns"]) == (0, int(1001 * MS))
    assert (row["late_ms"], row["unseen_ms"]) == pytest.approx((3.0, 2.5))
    assert (row["runnable"], row["running"], row["sleeping"], row["unknown"]) == pytest.approx((1.5, 1.1, 0.4, 0.0))
    assert dict(zip(by_role["role"], by_role["cpu_ms"])) == pytest.approx({"delay element": 1.5, "other workers": 1.5})
    assert cause_totals(ops, by_role)["sched_late_unseen_ms"] == pytest.approx(2.5)
    # a trace without wakings (made before they were recorded) counts from when the thread saw it
    ops, _ = late_start_causes(ev, sched[sched[T.EVENT] != T.SCHED_WAKING], warmup=1, n_cpus=2)
    assert ops.empty


def test_no_late_operation_or_no_trace_gives_empty_tables():
    ev = pd.DataFrame([event_row(0, "h0", "east", 1, 0, T.FORWARD, 1, 0, 10.0, 20.0, ready_ns=int(9.8 * MS))])
    ev[T.READY_NS] = pd.to_numeric(ev[T.READY_NS])
    ops, by_role = late_start_causes(ev, parse_sched_lines(LINES), warmup=0)
    assert ops.empty and by_role.empty
    assert cause_totals(ops, by_role) == {
        "sched_late_ops": 0,
        "sched_late_unseen_ms": 0.0,
        "sched_late_running_ms": 0.0,
        "sched_late_runnable_ms": 0.0,
        "sched_late_sleeping_ms": 0.0,
        "sched_late_unknown_ms": 0.0,
        "sched_cpu_while_runnable_ms": {},
        "sched_queue_cpu_while_runnable_ms": {},
        "sched_late_free_cpu_ms": 0.0,
        "sched_late_ops_free_cpu": 0,
    }


def test_tasks_of_another_run_and_of_the_machine_are_outside_the_run():
    """With the run's processes known (``roots``), what it forked is its own and the rest is
    outside: here worker 1 (pid 200) was never forked by the run's launcher (pid 50), so it and
    the delay element of another run count as outside, and worker 0's late start waited behind them."""
    lines = [
        switch("0.999000", 0, ("tb-launcher", 50, 50), "S", W0[:2]),
        "      tb-launcher-50      (     50) [000] ..... 0.999500: sched_process_fork: comm=tb-launcher pid=50 "
        "child_comm=tb-launcher child_pid=100",
        *LINES[1:],
    ]
    sched = parse_sched_lines(lines)
    assert (sched[T.EVENT] == T.SCHED_FORK).sum() == 1
    assert run_tasks(sched, [50]) == {50, 100, 101}  # the launcher, the worker it forked, its gloo thread
    ev = _late_op_events()
    ops, by_role = late_start_causes(ev, sched, warmup=1, roots=[50], n_cpus=2)
    cpu = dict(zip(by_role["role"], by_role["cpu_ms"]))
    assert cpu == pytest.approx({"outside the run": 4.0})
    assert ops.iloc[0]["runnable"] == pytest.approx(2.0)


def test_time_the_trace_does_not_hold_whole_is_unknown():
    """Events lost (a CPU's buffer filled): only the span every CPU holds counts; the rest of a late
    operation's wait is ``unknown``, and so is a CPU that never switched, or an empty trace."""
    sched = parse_sched_lines(LINES)
    ops, by_role = late_start_causes(_late_op_events(), sched, warmup=1, n_cpus=2, lost_events=5)
    # the span every CPU holds ends at the earliest of their last switches: CPU 0's, at 1.004 s
    row = ops.iloc[0]
    assert (row["sleeping"], row["runnable"], row["running"]) == pytest.approx((0.5, 2.0, 0.0))
    assert row["unknown"] == pytest.approx(0.5)
    ops, by_role = late_start_causes(_late_op_events(), sched, warmup=1, n_cpus=3)
    assert dict(zip(by_role["role"], by_role["cpu_ms"]))["unknown"] == pytest.approx(2.0)  # CPU 2: never seen
    ops, by_role = late_start_causes(_late_op_events(), parse_sched_lines([]), warmup=1)
    assert ops.iloc[0]["unknown"] == pytest.approx(3.0) and by_role.empty
    assert cause_totals(ops, by_role)["sched_late_unknown_ms"] == pytest.approx(3.0)


@pytest.mark.parametrize(
    "comm, main, role",
    [
        ("tb-w3", True, ("worker", 3)),
        ("tb-w3", False, ("worker thread", 3)),
        ("tb-w12-fill", False, ("fill", 12)),
        ("tb-w0-pf", True, ("stream", 0)),
        ("tb-w10-pf-kv", False, ("kv sender", 10)),
        ("tb-decode", True, ("decode", None)),
        ("tb-decode-step", False, ("decode step", None)),
        ("tb-atlas", True, ("controller", None)),
        ("tb-launcher", True, ("launcher", None)),
        ("testbed", True, ("runner", None)),
        ("nfq_delay-9a8b7", True, ("delay element", None)),
        ("swapper/1", True, ("idle", None)),
        ("kworker/0:1", True, ("other", None)),
        ("tb-w3x", True, ("other", None)),
    ],
)
def test_roles_from_task_names(comm, main, role):
    assert role_of(comm, main) == role


def test_a_thread_named_is_named_for_the_kernel():
    got = {}

    def body():
        name_this_thread("tb-w7-fill-and-more")  # clipped to 15 bytes
        with open(f"/proc/self/task/{threading.get_native_id()}/comm") as f:
            got["comm"] = f.read().strip()

    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert got["comm"] == "tb-w7-fill-and-"


@pytest.mark.parametrize(
    "text, has",
    [("nodev\tsysfs\nnodev\ttracefs\n", True), ("nodev\tsysfs\nnodev\tdebugfs\n", False), ("", False)],
)
def test_whether_the_kernel_can_mount_tracefs_is_read_from_its_filesystems(tmp_path, text, has):
    (tmp_path / "filesystems").write_text(text)
    assert kernel_has_tracefs(tmp_path / "filesystems") is has
    assert kernel_has_tracefs(tmp_path / "absent") is False
