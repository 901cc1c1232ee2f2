"""The names of a run's summary figures (``summary.json``), once: the report writes them, ``compare``
aggregates them, the CLI prints them, scripts and tests read them. Definitions: ``results/``.
"""

from __future__ import annotations

# what ran
POLICY, TOPOLOGY, EXPERIMENT, SCHEDULE = "policy", "topology", "experiment", "schedule"
WORKERS, ITERATIONS, COMPLETED_ITERATIONS, WARMUP_ITERATIONS = (
    "workers",
    "iterations",
    "completed_iterations",
    "warmup_iterations",
)
BACKEND, DELAY_MECHANISM, ABORTED = "backend", "delay_mechanism", "aborted"
#: from the command (or, within ``compare``, the run's own start) to the end of the first forward
STARTUP_S = "startup_s"
#: the fair-scheduler slice the training workers' threads had (ms; ``thread_slice.py``)
TRAINING_SLICE_MS = "training_slice_ms"
#: the real-time priority the training workers' main threads waited for their inputs at
#: (``SCHED_FIFO``, the lowest a worker reported; None where any reported none: the fair class,
#: refused; ``thread_slice.TRAINING_WAIT_RT_PRIORITY``)
TRAINING_WAIT_RT_PRIORITY = "training_wait_rt_priority"
#: the nice value the training workers' main threads waited for their inputs with where the
#: real-time class was refused (the highest a worker reported; None where any reported none,
#: the real-time class granted included; ``thread_slice.TRAINING_WAIT_NICE``)
TRAINING_WAIT_NICE = "training_wait_nice"
#: the nice value of BubbleTea's filling threads (the highest a worker reported; absent without
#: BubbleTea; ``thread_slice.FILL_THREAD_NICE``). Unlike ``TRAINING_WAIT_NICE``, a refused value
#: shows as the thread's own nice, not None: the filling thread always has one
FILL_THREAD_NICE = "fill_thread_nice"
#: the interpreter's switch interval the training workers ran with (µs, the longest a worker
#: reported on its start-up line, ``trace/startup.SWITCH_INTERVAL_US``; None where one reported
#: none, or a run from before it was recorded): ``bubbletea/fill.SWITCH_INTERVAL_S`` with
#: BubbleTea's filling thread, Python's own (``sys.getswitchinterval``) otherwise
SWITCH_INTERVAL_US = "switch_interval_us"

# training
ITERATION_TIME_S, ITERATION_TIME_P50_S, ITERATION_TIME_P95_S = (
    "iteration_time_s",
    "iteration_time_p50_s",
    "iteration_time_p95_s",
)
TOKENS_PER_S = "tokens_per_s"
GPU_UTILIZATION, TRAINING_GPU_UTILIZATION = "gpu_utilization", "training_gpu_utilization"
BUBBLE_FRACTION, BUBBLE_FRACTION_PER_STAGE = "bubble_fraction", "bubble_fraction_per_stage"
LOSS_FIRST, LOSS_LAST = "loss_first", "loss_last"
WAN_COMPUTE_RATIO, WAN_UTILIZATION_MEAN = "wan_compute_ratio", "wan_utilization_mean"
WAN_QUEUE_DROPS, WAN_QUEUE_DROPS_BY_LINK = "wan_queue_drops", "wan_queue_drops_by_link"
WAN_QUEUE_BACKLOG_MAX_BYTES = "wan_queue_backlog_max_bytes"
COMPUTE_OVERRUN_FRACTION, REPRESENTATIVE, COMPUTE_HEADROOM = (
    "compute_overrun_fraction",
    "representative",
    "compute_headroom",
)
PREDICTED_ITERATION_TIME_S, PREDICTION_ERROR = "predicted_iteration_time_s", "prediction_error"

# Atlas's controller
GRANTS, CONTROLLER_FAILED = "grants", "controller_failed"
GRANT_LATENCY_P50_MS, GRANT_LATENCY_P99_MS = "grant_latency_p50_ms", "grant_latency_p99_ms"
HANDOVER_GAP_P50_MS, HANDOVER_GAP_P99_MS = "handover_gap_p50_ms", "handover_gap_p99_ms"
IDLE_BETWEEN_GRANTS_P50_MS, IDLE_BETWEEN_GRANTS_P99_MS = "idle_between_grants_p50_ms", "idle_between_grants_p99_ms"
GRANT_HOLD_P50_MS, GRANT_HOLD_P99_MS = "grant_hold_p50_ms", "grant_hold_p99_ms"
GRANTS_RELEASED_BY_DEADLINE = "grants_released_by_deadline"
#: which layout ran: the experiment's own, or the planner's choice (``--plan best``) and why
PLAN = "plan"
LINK_BUSY_DURING_GRANTS = "link_busy_during_grants"

# BubbleTea
BUBBLE_FILL_FRACTION, PREFILL_TOKENS_PER_S, PREFILL_CHUNKS = (
    "bubble_fill_fraction",
    "prefill_tokens_per_s",
    "prefill_chunks",
)
REQUESTS_ASSIGNED, REQUESTS_COMPLETED, REQUESTS_DECODED = (
    "requests_assigned",
    "requests_completed",
    "requests_decoded",
)
TTFT_P50_S, TTFT_P99_S = "ttft_p50_s", "ttft_p99_s"
#: from a request's arrival to the dispatcher's handing it to a worker (ms; part of its TTFT): the
#: dispatcher's own lag, plus the wait while no worker's predicted bubble had room
DISPATCH_DELAY_P50_MS, DISPATCH_DELAY_P99_MS = "dispatch_delay_p50_ms", "dispatch_delay_p99_ms"
#: BubbleTea's prefill of the measured window as a share of what the same training hosts deliver
#: serving prefill alone (no training), and that rate (tokens/s over all of them): the slices'
#: padded targets over the hosts' wall time, since alone each host runs the same chunks back to
#: back at the same emulated time per FLOP, and a prompt's FLOPs do not depend on where it is cut
#: into chunks (each attends to the KV cache of the ones before)
PREFILL_ALONE_SHARE, PREFILL_ALONE_TOKENS_PER_S = "prefill_alone_share", "prefill_alone_tokens_per_s"
#: a run serving prefill alone (``+prefill-alone``): its serving windows' mean length (s); its
#: ``prefill_alone_share`` is then the share of its hosts' wall time their prefill had the
#: emulated GPU, which the derivation above takes as 1
SERVING_WINDOW_S = "serving_window_s"
#: a run serving prefill alone: the share of its workers' measured windows in which they had no
#: request queued (``T.QUEUE_EMPTY_NS``): above a few percent, the run measured the request rate
#: rather than what its GPUs deliver
QUEUE_EMPTY_SHARE = "queue_empty_share"
#: ``compare``: a BubbleTea run's prefill over that of the same policy's run serving prefill alone,
#: measured: in tokens per second (the two runs' medians) and in emulated GPU time (their
#: ``prefill_alone_share`` medians)
MEASURED_ALONE_TOKENS_SHARE = "measured_alone_tokens_share"
MEASURED_ALONE_GPU_TIME_SHARE = "measured_alone_gpu_time_share"
#: the share of the requests assigned to workers whose first token came within ``ttft_slo_s``
#: (a request not finished by the run's end counts as outside it)
TTFT_WITHIN_SLO_SHARE, TTFT_SLO_S = "ttft_within_slo_share", "ttft_slo_s"
#: the TTFT of the same requests on emulated GPUs serving prefill alone, from an empty queue: each
#: assigned request's prompt prefilled in one pass of the served model at the run's emulated time
#: per FLOP, without the KV transfer (the least any schedule on these GPUs gives it); its median,
#: and the share of the requests for which even that is within ``ttft_slo_s`` (the ceiling of
#: ``ttft_within_slo_share``)
TTFT_ALONE_P50_S, TTFT_SLO_REACHABLE_SHARE = "ttft_alone_p50_s", "ttft_slo_reachable_share"
#: of the requests whose deadline (arrival + SLO) fell within the run, the share whose first token
#: came by it, and how many those were (``results/ttft.py``): against ``ttft_slo_s``, and against
#: ``ttft_slo_scale`` x each request's TTFT served alone
TTFT_SLO_ATTAINMENT, TTFT_SLO_JUDGED = "ttft_slo_attainment", "ttft_slo_judged"
TTFT_SCALED_SLO_ATTAINMENT, TTFT_SCALED_SLO_JUDGED = "ttft_scaled_slo_attainment", "ttft_scaled_slo_judged"
TTFT_SLO_SCALE = "ttft_slo_scale"
#: BubbleTea's padded work whose real time exceeded its target: prefill slices (of all in the run)
#: and decode steps (of all the decode hosts ran)
PREFILL_OVERRUN_FRACTION, DECODE_OVERRUN_FRACTION = "prefill_overrun_fraction", "decode_overrun_fraction"
#: continuous batching on the decode hosts: the requests in the batch of a decode step, averaged
#: over every request's steps (so weighted as a request sees it)
DECODE_MEAN_BATCH = "decode_mean_batch"
#: BubbleTea: the most memory a training host's emulated GPU held while prefilling (MiB: training
#: state, activations in flight, the inference model, the KV caches admitted) and its budget
#: (``gpu_memory_mb``; None: none, no admission control)
PEAK_GPU_MEMORY_MB, GPU_MEMORY_MB = "peak_gpu_memory_mb", "gpu_memory_mb"
#: every run: of the forward/backward operations of the measured iterations that received their
#: input (``TRAINING_OPS_WITH_INPUT``), those that started more than 1 ms after it arrived, and the
#: 50th and 99th percentile of their start after the arrival (ms): ``results.analysis.start_after_arrival``.
#: A run without BubbleTea gives the floor of the same policy's run with it
TRAINING_OPS_WITH_INPUT = "training_ops_with_input"
TRAINING_OPS_STARTED_LATE = "training_ops_started_late"
START_AFTER_ARRIVAL_P50_MS = "start_after_arrival_p50_ms"
START_AFTER_ARRIVAL_P99_MS = "start_after_arrival_p99_ms"
#: BubbleTea: of those, the operations whose input arrived while a prefill pass had the GPU and
#: that started more than 1 ms after it (``results.analysis.LATE_START_NS``), and the 99th
#: percentile of their start after the arrival (ms); beside them, the same of the operations whose
#: input arrived while no pass ran
TRAINING_OPS_DELAYED_BY_PREFILL = "training_ops_delayed_by_prefill"
PREFILL_HOLD_P99_MS = "prefill_hold_p99_ms"
TRAINING_OPS_LATE_WITHOUT_PREFILL = "training_ops_late_without_prefill"
START_AFTER_ARRIVAL_P99_MS_WITHOUT_PREFILL = "start_after_arrival_p99_ms_without_prefill"
BUBBLE_PREDICTION_ERROR_P50_MS, BUBBLE_PREDICTION_ERROR_P99_MS = (
    "bubble_prediction_error_p50_ms",
    "bubble_prediction_error_p99_ms",
)
BUBBLE_OVER_PREDICTED_SHARE = "bubble_over_predicted_share"
#: of the predicted waits' observed time, the part after their predicted end, which prefill
#: cannot fill (``bubbletea.profile.prediction_error_stats``)
BUBBLE_BEYOND_PREDICTION_SHARE = "bubble_beyond_prediction_share"

# the scheduler trace (``testbed run --sched-trace``, ``results/sched_trace.py``): of the operations
# started late, counted from their input's arrival as the kernel saw it (``input_arrival.input_arrivals_ns``),
# the ms their workers' main threads spent on a CPU, on a run queue waiting for one, and asleep,
# between their input and their start; what the CPUs ran while they waited, by role (ms;
# ``trace/task_names.py``); and how many of the kernel's events did not fit its buffers
SCHED_LATE_OPS = "sched_late_ops"
#: of their lateness, the ms before their workers saw the input (the wake-up to ``T.READY_NS``),
#: which ``TRAINING_OPS_STARTED_LATE`` does not count
SCHED_LATE_UNSEEN_MS = "sched_late_unseen_ms"
SCHED_LATE_RUNNING_MS, SCHED_LATE_RUNNABLE_MS, SCHED_LATE_SLEEPING_MS = (
    "sched_late_running_ms",
    "sched_late_runnable_ms",
    "sched_late_sleeping_ms",
)
#: the late time the trace cannot account for (before it saw the thread, or past what it holds whole)
SCHED_LATE_UNKNOWN_MS = "sched_late_unknown_ms"
SCHED_CPU_WHILE_RUNNABLE_MS = "sched_cpu_while_runnable_ms"
#: of that, what the CPU whose run queue the thread waited on ran, by role (ms; None for a trace
#: that did not record the moves between CPUs)
SCHED_QUEUE_CPU_WHILE_RUNNABLE_MS = "sched_queue_cpu_while_runnable_ms"
#: of their time waiting for a CPU, the ms some other CPU than the one whose run queue they were
#: on was idle or ran only ``SCHED_IDLE`` work (``results/sched_trace.FREE_ROLES``), summed; and
#: how many of them had such a CPU at some moment before the bound (1 ms after their input,
#: ``results/analysis.LATE_START_NS``) while they waited; both over the operations whose thread
#: the trace saw, None for a trace that did not record the moves between CPUs
SCHED_LATE_FREE_CPU_MS = "sched_late_free_cpu_ms"
SCHED_LATE_OPS_FREE_CPU = "sched_late_ops_free_cpu"
SCHED_EVENTS_LOST = "sched_events_lost"
#: why a run's scheduler trace could not be read (its file and the fault)
SCHED_TRACE_ERROR = "sched_trace_error"
