"""The names of a run folder's trace tables, once (STYLE.md): event columns and kinds, link
counter columns. Analysis, the report, the workers and the tests all use these names.

Events (``events/w<rank>.jsonl``, ``events.parquet``): one row per operation of a worker, with
CLOCK_MONOTONIC start and end in nanoseconds (DESIGN.md section 2, "One clock").
"""

from __future__ import annotations

#: bumped when a column changes meaning; recorded in env.json
SCHEMA_VERSION = 2

# event columns
WORKER, HOST, DC, STAGE, REPLICA = "worker", "host", "dc", "stage", "replica"
ITERATION, MICROBATCH, KIND = "iteration", "microbatch", "kind"
START_NS, END_NS, BYTES, PEER = "start_ns", "end_ns", "bytes", "peer"
REAL_NS, PADDED_NS, LOSS, READY_NS = "real_ns", "padded_ns", "loss", "ready_ns"
#: BubbleTea: on forward/backward, when the input had arrived (``ready_ns``) and how long a running
#: prefill chunk held the operation back (``prefill_delay_ns``); on prefill slices (one forward pass
#: over the chunks of one or more requests), the first chunk's request and first position, the
#: tokens of the pass (counted on the slice that completes it) and every chunk it holds, as
#: ``rid:first position:tokens`` joined by ``;`` (``chunks``)
PREFILL_DELAY_NS, RID, CHUNK_START, TOKENS = "prefill_delay_ns", "rid", "chunk_start", "tokens"
CHUNKS = "chunks"
#: BubbleTea: on a wait BubbleTea fills (receive wait, send drain, all-reduce), the bubble its
#: worker's slot predictor predicted when the wait began (``predicted_bubble_ns``; absent: none
#: predicted) and the bubble observed (``bubble_ns``: from the end of the worker's previous
#: compute, or the wait's start, to when the data arrived or the wait ended)
PREDICTED_BUBBLE_NS, BUBBLE_NS = "predicted_bubble_ns", "bubble_ns"
#: on a prefill slice (a pass given GPU time in one bubble, ``bubbletea/prefill_stream.py``), the
#: emulated GPU time it gave the pass (its padding target), how many blocks (layers) the prefill
#: stream computed meanwhile, and the bytes its memory then held (training state, activations in
#: flight, the inference model, the KV caches admitted: ``bubbletea.decisions.KVBudget``)
TARGET_NS, BLOCKS, MEMORY_BYTES = "target_ns", "blocks", "memory_bytes"
#: on a prefill slice, how long it waited, past the GPU time it gave, for the CPU to finish
#: computing the pass's blocks (ns; 0: none): an overrun of its target
OVERRUN_NS = "overrun_ns"
#: on a serving window (prefill served alone), how long its worker had no request queued (ns)
QUEUE_EMPTY_NS = "queue_empty_ns"
#: on a receive wait, when the worker began to wait for the receive's last stripe (the last of its
#: gloo operations, every earlier one in by then): a scheduler trace's waking of the thread after it
#: is the whole input's arrival (``results/input_arrival.input_arrivals_ns``)
LAST_WAIT_NS = "last_wait_ns"
#: on forward and backward events, the model chunk's virtual stage (the worker's stage where it holds
#: one: ``plan/schedule.py``); on send and receive wait events, the boundary's (the virtual stage on
#: its lower side, ``Transfer.stage``) and which ``TENSOR`` crosses it (``ACTIVATIONS`` forward,
#: ``GRADIENTS`` back); on a backward of a split-backward schedule, which ``PART`` it is
#: (``INPUT_PART``: the gradient the stage before waits for; ``WEIGHT_PART``: the weights')
VIRTUAL_STAGE, PART, TENSOR = "virtual_stage", "part", "tensor"
INPUT_PART, WEIGHT_PART = "input", "weight"
#: on a launched job's send and receive wait events (``train/job_hook.py``): the Atlas hook's own
#: time on the transfer (ns), everything its wrapper did beside the torch.distributed call itself
HOOK_NS = "hook_ns"
ACTIVATIONS, GRADIENTS = "activations", "gradients"
COLUMNS = [
    WORKER,
    HOST,
    DC,
    STAGE,
    REPLICA,
    ITERATION,
    MICROBATCH,
    KIND,
    START_NS,
    END_NS,
    BYTES,
    PEER,
    REAL_NS,
    PADDED_NS,
    LOSS,
    READY_NS,
    PREFILL_DELAY_NS,
    PREDICTED_BUBBLE_NS,
    BUBBLE_NS,
    TARGET_NS,
    BLOCKS,
    MEMORY_BYTES,
    OVERRUN_NS,
    QUEUE_EMPTY_NS,
    LAST_WAIT_NS,
    VIRTUAL_STAGE,
    PART,
    TENSOR,
    RID,
    CHUNK_START,
    TOKENS,
    CHUNKS,
]

# event kinds
FORWARD, BACKWARD, SEND, RECV_WAIT = "forward", "backward", "send", "recv_wait"
ALLREDUCE, OPTIMIZER, IDLE, PREFILL = "allreduce", "optimizer", "idle", "prefill"
#: the wait at an iteration's end for the pending sends to drain (before the all-reduce)
SEND_WAIT = "send_wait"
#: BubbleTea's slots besides the receive waits (``F2``/``B0``): the send drain and the all-reduce
SEND_DRAIN_SLOT, ALLREDUCE_SLOT = "drain", "allreduce"
#: prefill served alone (``+prefill-alone``, ``bubbletea/alone.py``): a worker's window of the run,
#: the counterpart of an iteration, and the one slot its prefill fills
SERVING_WINDOW, ALONE_SLOT = "serving_window", "alone"
#: what counts as a worker computing (training): padded forward, backward and the optimizer step
COMPUTE_KINDS = (FORWARD, BACKWARD, OPTIMIZER)

# link counter columns (``link_counters.jsonl``)
T_NS, LINK, CLASSID, TX_BYTES, RATE_BPS = "t_ns", "link", "classid", "tx_bytes", "rate_bps"
#: cumulative packets the class's queue dropped and times it was throttled; bytes queued now
DROPS, OVERLIMITS, BACKLOG_BYTES = "drops", "overlimits", "backlog_bytes"
LINK_COUNTER_COLUMNS = [T_NS, LINK, CLASSID, TX_BYTES, RATE_BPS, DROPS, OVERLIMITS, BACKLOG_BYTES]

# the scheduler's events (``sched.parquet``, ``testbed run --sched-trace``: net/tracefs.py), one
# row each: a context switch on ``cpu`` at ``t_ns`` from task ``prev_pid`` (left in state
# ``prev_state``: ``R``/``R+`` preempted, still runnable; ``S``, ``D`` and the rest asleep) to
# ``next_pid``; a wake-up of ``next_pid`` (onto ``cpu``'s run queue); a move of ``next_pid`` to
# ``cpu`` (its run queue, or the CPU it is woken on); or a new task ``next_pid`` (a process or a
# thread) made by ``prev_pid``; or a waking of ``next_pid`` by ``prev_pid`` (the kernel's
# ``sched_waking``, printed by the waker itself as it starts the wake-up, where ``sched_wakeup``
# may be printed on the woken task's CPU, by whatever ran there). In a wake-up and a move,
# ``prev_pid`` is the task that ran then.
# Task ids are thread ids; ``*_tgid`` their process (-1: unknown); ``next_comm`` the kernel's name
# of the task (``trace/task_names.py``)
SCHED_SWITCH, SCHED_WAKEUP, SCHED_MIGRATE, SCHED_FORK = "switch", "wakeup", "migrate", "fork"
SCHED_WAKING = "waking"
#: the kernel's event whose lines are ``SCHED_WAKING`` rows: a trace that recorded it tells who woke
#: a task (``results/input_arrival.input_arrivals_ns``)
SCHED_WAKING_EVENT = "sched/sched_waking"
#: the kernel's event (tracefs ``events/`` path) whose lines are ``SCHED_MIGRATE`` rows: a trace
#: that recorded it tells which run queue a waiting task was on
SCHED_MIGRATE_EVENT = "sched/sched_migrate_task"
EVENT, CPU, PREV_PID, PREV_TGID, PREV_STATE = "event", "cpu", "prev_pid", "prev_tgid", "prev_state"
NEXT_PID, NEXT_TGID, NEXT_COMM = "next_pid", "next_tgid", "next_comm"
SCHED_COLUMNS = [EVENT, T_NS, CPU, PREV_PID, PREV_TGID, PREV_STATE, NEXT_PID, NEXT_TGID, NEXT_COMM]
SCHED_FILE = "sched.parquet"
