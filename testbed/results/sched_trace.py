"""A run's scheduler trace (``sched.parquet``, ``testbed run --sched-trace``) read against its late
training operations: for each forward or backward that started more than ``LATE_START_NS`` after
its input arrived, what the worker's main thread did meanwhile (ran, waited on a run queue for a
CPU, slept) and, while it waited for a CPU, what each CPU ran instead and what the CPU whose run
queue it was on ran, by role (``trace/task_names.py``, relative to the late operation's worker:
its own gloo threads, its own prefill, other workers, the delay elements...).

The input's arrival is the kernel's where the trace tells it: gloo's waking of the worker's thread
as it waited for the receive's last stripe (``input_arrival.input_arrivals_ns``). The worker's own
figure (``analysis.start_after_arrival``) starts only once its thread ran again and saw the
input, so it leaves out the time the thread waited for a CPU, or for its interpreter lock,
after the wake-up.

The trace's lines are the kernel's text (``net/tracefs.py``): timestamps in microseconds, so
every figure here is good to a microsecond."""

from __future__ import annotations

import re
from collections.abc import Iterable

import numpy as np
import pandas as pd

from testbed.results import analysis as A
from testbed.results.cpu_timeline import CpuTimeline
from testbed.results.input_arrival import input_arrivals_ns
from testbed.trace import schema as T
from testbed.trace.task_names import role_of

_LINE = re.compile(
    r"^\s*(?P<comm>.*?)-(?P<pid>\d+)\s+\(\s*(?P<tgid>[\d-]+)\)\s+\[(?P<cpu>\d+)\]\s+\S+\s+"
    r"(?P<sec>\d+)\.(?P<usec>\d{6}): "
    r"(?P<event>sched_switch|sched_wakeup|sched_waking|sched_migrate_task|sched_process_fork): (?P<rest>.*)$"
)
_SWITCH = re.compile(r"prev_comm=.* prev_pid=(\d+) prev_prio=-?\d+ prev_state=(\S+) ==> next_comm=(.*) next_pid=(\d+) ")
_WAKEUP = re.compile(r"comm=(.*) pid=(\d+) prio=-?\d+ target_cpu=(\d+)")
_MIGRATE = re.compile(r"comm=(.*) pid=(\d+) prio=-?\d+ orig_cpu=\d+ dest_cpu=(\d+)")
_FORK = re.compile(r"comm=.* pid=(\d+) child_comm=(.*) child_pid=(\d+)$")

#: a late operation's main thread, between its input and its start: on a CPU, on a run queue
#: waiting for one (woken, or preempted), or asleep (waiting on a lock, a socket...)
RUNNING, RUNNABLE, SLEEPING = "running", "runnable", "sleeping"
#: of a late operation's time on a run queue, the ms at least one other CPU than that queue's ran
#: only tasks of ``FREE_ROLES``, and the first such moment (ms after the input's arrival; NaN if none)
FREE_CPU, FREE_FROM = "free_cpu_ms", "free_from_ms"


def parse_sched_lines(lines: Iterable[str]) -> pd.DataFrame:
    """The kernel's ``sched_switch``, ``sched_wakeup``, ``sched_waking``, ``sched_migrate_task`` and
    ``sched_process_fork`` lines (tracefs ``trace``, with ``record-tgid``) as a table of
    ``T.SCHED_COLUMNS``, in the order given. A task's process id (``*_tgid``) comes from the lines
    where it is the running task (-1 where it never is; a thread id the kernel reuses keeps its
    last process, which a run of minutes does not meet). Lines of other events and malformed lines are left out."""
    rows, tgid_of = [], {}
    for line in lines:
        m = _LINE.match(line)
        if not m:
            continue
        pid, tgid = int(m["pid"]), m["tgid"]
        if tgid.isdigit():
            tgid_of[pid] = int(tgid)
        t_ns = int(m["sec"]) * 1_000_000_000 + int(m["usec"]) * 1000
        if m["event"] == "sched_switch":
            s = _SWITCH.match(m["rest"] + " ")
            if s:
                rows.append((T.SCHED_SWITCH, t_ns, int(m["cpu"]), int(s[1]), s[2], int(s[4]), s[3]))
        elif m["event"] in ("sched_wakeup", "sched_waking"):
            w = _WAKEUP.match(m["rest"])
            if w:
                kind = T.SCHED_WAKEUP if m["event"] == "sched_wakeup" else T.SCHED_WAKING
                rows.append((kind, t_ns, int(w[3]), pid, "", int(w[2]), w[1]))
        elif m["event"] == "sched_migrate_task":
            g = _MIGRATE.match(m["rest"])
            if g:
                rows.append((T.SCHED_MIGRATE, t_ns, int(g[3]), pid, "", int(g[2]), g[1]))
        else:
            f = _FORK.match(m["rest"])
            if f:
                rows.append((T.SCHED_FORK, t_ns, int(m["cpu"]), int(f[1]), "", int(f[3]), f[2]))
    df = pd.DataFrame(rows, columns=[T.EVENT, T.T_NS, T.CPU, T.PREV_PID, T.PREV_STATE, T.NEXT_PID, T.NEXT_COMM])
    df[T.PREV_TGID] = df[T.PREV_PID].map(tgid_of).fillna(-1).astype("int64")
    df[T.NEXT_TGID] = df[T.NEXT_PID].map(tgid_of).fillna(-1).astype("int64")
    return df[T.SCHED_COLUMNS].astype({T.T_NS: "int64", T.CPU: "int64", T.PREV_PID: "int64", T.NEXT_PID: "int64"})


def run_tasks(sched: pd.DataFrame, roots: Iterable[int]) -> set[int]:
    """The thread ids of a run's tasks in ``sched``: its processes known when the trace began
    (``roots``: the runner, the worker launcher, the processes its registry lists), every thread
    of theirs, and every task one of them made, directly or not (``T.SCHED_FORK``). What another
    run, another program or the kernel ran is outside it."""
    members = set(roots)
    ids = pd.concat(
        [
            sched[[T.PREV_PID, T.PREV_TGID]].set_axis(["pid", "tgid"], axis=1),
            sched[[T.NEXT_PID, T.NEXT_TGID]].set_axis(["pid", "tgid"], axis=1),
        ]
    ).drop_duplicates()
    forks = sched[sched[T.EVENT] == T.SCHED_FORK]
    while True:
        before = len(members)
        members |= set(ids.loc[ids["tgid"].isin(members), "pid"])
        for parent, child in zip(forks[T.PREV_PID], forks[T.NEXT_PID]):  # in time order
            if parent in members:
                members.add(int(child))
        if len(members) == before:
            return members


def worker_pids(sched: pd.DataFrame, members: set[int] | None = None) -> dict[int, int]:
    """Each worker's main thread id, by rank: of the run's tasks (``members``; None: every task)
    named ``task_names.WORKER`` whose thread id is their process id, the one switched to most
    often (a process the worker forks carries its name until it names itself: the prefill
    stream, ``task_names.STREAM``)."""
    sw = sched[sched[T.EVENT] == T.SCHED_SWITCH]
    best: dict[int, tuple[int, int]] = {}  # rank -> (switches, pid)
    for (comm, pid, tgid), g in sw.groupby([T.NEXT_COMM, T.NEXT_PID, T.NEXT_TGID]):
        if members is not None and pid not in members:
            continue
        role, rank = role_of(comm, pid == tgid)
        if role == "worker" and rank is not None and (len(g), int(pid)) > best.get(rank, (0, 0)):
            best[rank] = (len(g), int(pid))
    return {rank: pid for rank, (_, pid) in best.items()}


#: the role of what ran outside the run: the kernel's threads, other programs, another run
OUTSIDE = "outside the run"


def relative_role(
    comm: str, pid: int, tgid: int, worker: int, rank_of_pid: dict[int, int], members: set[int] | None = None
) -> str:
    """The role of task ``pid`` (process ``tgid``) named ``comm`` as seen from worker ``worker``'s
    late operation: ``OUTSIDE`` for a task not of the run (``members``; None: every task is), an
    idle CPU as ``idle``; else its own threads (``own threads``: gloo's and torch's, whatever
    their names, by their process: ``rank_of_pid``, each worker's main thread id to its rank), its
    own ``own fill``/``own stream``/``own kv sender``, the same of ``other workers``, or the role ``role_of`` gives
    (``delay element``, ``controller``...; ``other of the run``: a task of the run named by no
    role, such as a tool it ran or the runner started as ``python -m``)."""
    role, rank = role_of(comm, pid == tgid)
    if members is not None and pid not in members and role != "idle":
        return OUTSIDE
    if rank is None and tgid in rank_of_pid and pid != tgid:
        role, rank = "worker thread", rank_of_pid[tgid]
    if rank is None:
        return "other of the run" if members is not None and role == "other" else role
    own = rank == worker
    return {
        "worker": "own main thread" if own else "other workers",
        "worker thread": "own threads" if own else "other workers' threads",
        "fill": "own fill" if own else "other workers' fills",
        "stream": "own stream" if own else "other workers' streams",
        "kv sender": "own kv sender" if own else "other workers' kv senders",
    }[role]


#: the roles (``relative_role``) of a CPU free for a woken thread of the fair class's normal
#: policy: an idle CPU, or one running work the testbed runs in ``SCHED_IDLE`` (BubbleTea's
#: prefill streams' computing threads, ``bubbletea/stream_process.SCHED_POLICY``, and the decode
#: hosts' step threads, ``bubbletea/decode.DECODE_POLICY``), which such a thread queued on that
#: CPU would preempt (``check_preempt_wakeup_fair``, kernel/sched/fair.c). Time a CPU ran them
#: while a late thread waited on another CPU's run queue is time the kernel did not move it
#: there (this module does not say why: affinity, a task kept where it ran recently, when the
#: kernel balances).
FREE_ROLES = frozenset({"idle", "decode step", "own stream", "other workers' streams"})


def _states(events: pd.DataFrame, pid: int) -> tuple[np.ndarray, list[str], list[int]]:
    """The state timeline of task ``pid``: the times it changed state or run queue, the state from
    each, and the CPU it ran on or whose run queue it was on (-1 asleep). A task moved while
    asleep is moved as it is woken, and its wake-up names the CPU."""
    mine = events[(events[T.NEXT_PID] == pid) | ((events[T.EVENT] == T.SCHED_SWITCH) & (events[T.PREV_PID] == pid))]
    mine = mine[~mine[T.EVENT].isin((T.SCHED_FORK, T.SCHED_WAKING))]
    times, states, cpus = [], [], []
    for ev, cpu, prev, prev_state, nxt, t in zip(
        mine[T.EVENT], mine[T.CPU], mine[T.PREV_PID], mine[T.PREV_STATE], mine[T.NEXT_PID], mine[T.T_NS]
    ):
        if ev == T.SCHED_MIGRATE:
            if not states or states[-1] != RUNNABLE:
                continue
            state = RUNNABLE
        elif ev == T.SCHED_WAKEUP:
            if states and states[-1] == RUNNING:
                continue
            state = RUNNABLE
        elif nxt == pid:
            state = RUNNING
        else:
            state = RUNNABLE if prev == pid and prev_state.startswith("R") else SLEEPING
        times.append(t)
        states.append(state)
        cpus.append(-1 if state == SLEEPING else int(cpu))
    return np.asarray(times, dtype=np.int64), states, cpus


def covered(sched: pd.DataFrame, lost_events: int) -> tuple[float, float]:
    """The span of the run's clock (ns) the trace holds whole: all of it where no event was lost;
    else from the latest of the CPUs' first events to the earliest of their last (a CPU whose
    buffer filled holds nothing after its last event)."""
    if lost_events == 0 or sched.empty:
        return float("-inf"), float("inf")
    per_cpu = sched[sched[T.EVENT] == T.SCHED_SWITCH].groupby(T.CPU)[T.T_NS]
    return float(per_cpu.min().max()), float(per_cpu.max().min())


def late_start_causes(
    ev: pd.DataFrame,
    sched: pd.DataFrame,
    warmup: int,
    roots: Iterable[int] | None = None,
    n_cpus: int = 0,
    lost_events: int = 0,
    queues: bool = False,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(one row per late operation of the measured iterations: ``worker``, ``kind``,
    ``iteration``, ``microbatch``, ``ready_ns``, ``arrival_ns`` (``input_arrivals_ns``), ``start_ns``,
    ``late_ms`` (from ``arrival_ns``; late: over ``analysis.LATE_START_NS``), ``unseen_ms`` (of
    it, before the worker saw the input: ``ready_ns`` less ``arrival_ns``) and the ms its
    worker's main thread spent ``running``, ``runnable`` and ``sleeping`` from the arrival to the
    start, and ``unknown``
    (before the trace saw the thread, or outside what it holds whole: ``covered``), and of its
    time on a run queue, ``FREE_CPU``: the ms at least one other CPU than that queue's ran only
    tasks of ``FREE_ROLES`` (idle, or ``SCHED_IDLE`` work; ``CpuTimeline.spans_where``), and
    ``FREE_FROM``: the first such moment, in ms after the arrival (NaN where there was none;
    both NaN unless ``queues``, or where the trace never saw the thread); one row per
    (late operation, role): ``op`` (the first table's index), ``role`` (``relative_role``),
    ``cpu_ms``, the CPU time all CPUs gave that role while the operation's thread was runnable,
    and ``queue_cpu_ms``, the part of it on the CPU whose run queue the thread was on: NaN unless
    ``queues``, the trace recorded the moves between CPUs, ``T.SCHED_MIGRATE``).
    ``ev``: the run's events; ``sched``: ``parse_sched_lines``' table; ``roots``: the run's
    processes when the trace began (``run_tasks``; None: every task counts as the run's);
    ``n_cpus``: the machine's CPUs; ``lost_events``: events the kernel's buffers dropped."""
    columns = ["op", "role", "cpu_ms", "queue_cpu_ms"]
    train = A.training_events(ev).reset_index(drop=True)
    starts = A.start_after_arrival(train, warmup)  # indexed as ``train``
    cols = [T.WORKER, T.KIND, T.ITERATION, T.MICROBATCH, T.READY_NS, T.START_NS]
    ops = train.loc[starts.index, cols].astype({T.READY_NS: "int64"}).reset_index(drop=True)
    sched = sched.sort_values(T.T_NS, kind="stable")
    members = run_tasks(sched, roots) if roots is not None and not sched.empty else None
    pids = worker_pids(sched, members)
    ops.insert(5, "arrival_ns", input_arrivals_ns(ops, ev, sched, pids))
    late_ns = ops[T.START_NS].to_numpy(dtype=np.int64) - ops["arrival_ns"].to_numpy()
    keep = late_ns > A.LATE_START_NS
    ops = ops[keep].reset_index(drop=True)
    ops["late_ms"] = late_ns[keep] / 1e6
    ops["unseen_ms"] = (ops[T.READY_NS] - ops["arrival_ns"]) / 1e6
    for s in (RUNNING, RUNNABLE, SLEEPING):
        ops[s] = 0.0
    ops["unknown"] = ops["late_ms"]  # until accounted for
    ops[FREE_CPU] = ops[FREE_FROM] = np.nan
    by_role: list[tuple[int, str, float, float]] = []
    if ops.empty or sched.empty:
        return ops, pd.DataFrame(by_role, columns=columns)
    cpus = CpuTimeline(sched[sched[T.EVENT] == T.SCHED_SWITCH], n_cpus)
    rank_of_pid = {pid: rank for rank, pid in pids.items()}
    timelines = {rank: _states(sched, pid) for rank, pid in pids.items()}
    lo, hi_cover = covered(sched, lost_events)
    for k, op in ops.iterrows():
        w = int(op[T.WORKER])
        a, b = max(int(op["arrival_ns"]), lo), min(int(op[T.START_NS]), hi_cover)
        times, states, queue_cpus = timelines.get(w, (np.zeros(0, dtype=np.int64), [], []))
        roles: dict[str, float] = {}
        on_queue: dict[str, float] = {}

        def role(comm: str, pid: int, tgid: int, w: int = w) -> str:
            return relative_role(comm, pid, tgid, w, rank_of_pid, members)

        def free(comm: str, pid: int, tgid: int) -> bool:
            return role(comm, pid, tgid) in FREE_ROLES

        free_ns, first_free = 0, None

        i = int(np.searchsorted(times, a, side="right")) - 1
        cursor = a
        if i < 0:  # the trace never saw the thread before: unknown until its first change
            cursor, i = (min(b, int(times[0])) if len(times) else b), 0
        while cursor < b and i < len(times):
            end = min(b, int(times[i + 1])) if i + 1 < len(times) else b
            if end > cursor:
                ops.at[k, states[i]] += (end - cursor) / 1e6
                ops.at[k, "unknown"] -= (end - cursor) / 1e6
                if states[i] == RUNNABLE:
                    cpus.time_by_role(cursor, end, role, roles)
                    if queues:
                        cpus.time_by_role(cursor, end, role, on_queue, cpu=queue_cpus[i])
                        spans = cpus.spans_where(cursor, end, free, besides=queue_cpus[i])
                        free_ns += sum(hi - lo for lo, hi in spans)
                        first_free = spans[0][0] if first_free is None and spans else first_free
                cursor = end
            i += 1
        if queues and len(times):
            ops.at[k, FREE_CPU] = free_ns / 1e6
            ops.at[k, FREE_FROM] = (first_free - int(op["arrival_ns"])) / 1e6 if first_free is not None else np.nan
        by_role += [(k, r, ms, on_queue.get(r, 0.0) if queues else np.nan) for r, ms in roles.items()]
    ops["unknown"] = ops["unknown"].clip(lower=0.0)
    return ops, pd.DataFrame(by_role, columns=columns)
