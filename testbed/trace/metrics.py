"""The figures of a run's summary (``summary.json``), once: each one's name, unit and definition
(``METRICS``, in the order of the groups below). The report writes them, ``compare`` aggregates
them, the CLI prints them, scripts and tests read them by these names, and the reference page
(``docs/reference/metrics.md``) is written from this table. The code computing each one is in
``results/`` (named in its definition); a figure added here appears on that page unasked."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    """One figure of ``summary.json``: ``name`` (its key), ``group`` (the heading it is listed
    under), ``unit`` ("" for a count, a share or a name) and ``definition``."""

    name: str
    group: str
    unit: str
    definition: str


#: every figure of the summary, in order
METRICS: list[Metric] = []


def _group(group: str) -> Callable[[str, str, str], str]:
    """A declarer of the figures of ``group``: it records one and returns its name."""

    def declare(name: str, unit: str, definition: str) -> str:
        if any(m.name == name for m in METRICS):
            raise ValueError(f"metric {name} is declared twice")
        METRICS.append(Metric(name, group, unit, definition))
        return name

    return declare


_ran = _group("What ran")
POLICY = _ran("policy", "", "the policy run (a preset, parts replaced, `+bubbletea`)")
TOPOLOGY = _ran("topology", "", "the topology as the experiment names it")
EXPERIMENT = _ran("experiment", "", "the experiment's name")
SCHEDULE = _ran("schedule", "", "the pipeline schedule")
WORKERS = _ran("workers", "", "training worker processes (one per emulated GPU)")
ITERATIONS = _ran("iterations", "", "iterations the run was asked for")
COMPLETED_ITERATIONS = _ran(
    "completed_iterations", "", "iterations whose loss the last stage reported (fewer than asked in an aborted run)"
)
WARMUP_ITERATIONS = _ran("warmup_iterations", "", "first iterations left out of every measured figure")
BACKEND = _ran("backend", "", "the network backend (`netns`, `mininet`, `remote`)")
DELAY_MECHANISM = _ran("delay_mechanism", "", "what added the WAN's delay: `netem` or the NFQUEUE delay element")
MACHINES = _ran("machines", "", "`--backend remote`: the machines the run spanned, each with its DCs")
CLOCK_OFFSET_UNCERTAINTY_MS = _ran(
    "clock_offset_uncertainty_ms",
    "ms",
    "`--backend remote`: the largest uncertainty of the machines' clock offsets (half the round trip of the "
    "exchange that estimated it: `clock_offsets.json`), within which times from two machines compare",
)
ABORTED = _ran(
    "aborted", "", "true where the run ended early (a failed worker, Ctrl-C, a signal): its figures cover what ran"
)
PLAN = _ran("plan", "", "which layout ran: the experiment's own, or the planner's choice (`--plan best`) and why")
TIME_DILATION = _ran(
    "time_dilation",
    "",
    "the factor k the run was dilated by (`time_dilation`, `--dilation`; `spec/dilation.py`): it ran k times "
    "slower than the world it emulates, and every duration here is divided by k and every rate multiplied by k "
    "(the emulated frame), except the three figures said to be in real time; 1: not dilated",
)
STARTUP_S = _ran(
    "startup_s",
    "s",
    "from the command (or, within `compare`, the run's own start) to the end of the first forward; in real time",
)
TRAINING_SLICE_MS = _ran(
    "training_slice_ms",
    "ms",
    "the fair-scheduler slice the training workers' threads had (`thread_slice.py`); in real time",
)
TRAINING_WAIT_RT_PRIORITY = _ran(
    "training_wait_rt_priority",
    "",
    "the real-time priority (`SCHED_FIFO`) the training workers' main threads waited for their inputs at, the "
    "lowest a worker reported; none where any reported none (the fair class: refused)",
)
TRAINING_WAIT_NICE = _ran(
    "training_wait_nice",
    "",
    "the nice value the training workers' main threads waited with where the real-time class was refused (the "
    "highest a worker reported); none where the real-time class was granted",
)
FILL_THREAD_NICE = _ran(
    "fill_thread_nice",
    "",
    "the nice value of BubbleTea's filling threads (the highest a worker reported; absent without BubbleTea); a "
    "refused value shows as the thread's own nice",
)
SWITCH_INTERVAL_US = _ran(
    "switch_interval_us",
    "µs",
    "the interpreter's switch interval the training workers ran with (the longest a worker reported): "
    "BubbleTea's with its filling thread, Python's own otherwise; in real time",
)

_training = _group("Training")
ITERATION_TIME_S = _training(
    "iteration_time_s",
    "s",
    "the pipeline's period, mean over the measured iterations: from one iteration's last optimizer step to the "
    "next one's (iterations overlap across stages; `results/analysis.iteration_times`)",
)
ITERATION_TIME_P50_S = _training("iteration_time_p50_s", "s", "the median of the same iteration times")
ITERATION_TIME_P95_S = _training("iteration_time_p95_s", "s", "the 95th percentile of the same iteration times")
TOKENS_PER_S = _training(
    "tokens_per_s", "tokens/s", "tokens trained per iteration (the global batch times seq_len) over `iteration_time_s`"
)
GPU_UTILIZATION = _training(
    "gpu_utilization",
    "",
    "busy time over wall time of the measured iterations, mean over the workers; busy is padded forward, "
    "backward, optimizer step and, under BubbleTea, prefill",
)
TRAINING_GPU_UTILIZATION = _training(
    "training_gpu_utilization", "", "the same, of training alone (prefill left out; BubbleTea runs)"
)
BUBBLE_FRACTION = _training(
    "bubble_fraction", "", "1 - training's utilization per stage (mean over its replicas), mean over the stages"
)
BUBBLE_FRACTION_PER_STAGE = _training("bubble_fraction_per_stage", "", "the same, one value per pipeline stage")
LOSS_FIRST = _training("loss_first", "", "the training loss of the first iteration (reported by the last stage)")
LOSS_LAST = _training("loss_last", "", "the training loss of the last completed iteration")
WAN_COMPUTE_RATIO = _training(
    "wan_compute_ratio",
    "",
    "the cross-DC activation transfer time (from when both sides are ready; the median over sender-receiver "
    "pairs of each pair's median) over the senders' median forward time (DESIGN.md 2a)",
)
WAN_UTILIZATION_MEAN = _training(
    "wan_utilization_mean",
    "",
    "mean utilization of the WAN link directions that carried traffic, over the link counters' samples within "
    "the measured iterations",
)
WAN_QUEUE_DROPS = _training("wan_queue_drops", "packets", "packets the WAN classes' queues dropped, over the run")
WAN_QUEUE_DROPS_BY_LINK = _training("wan_queue_drops_by_link", "packets", "the same, per link direction that dropped")
WAN_QUEUE_BACKLOG_MAX_BYTES = _training(
    "wan_queue_backlog_max_bytes", "bytes", "the most bytes any WAN class held queued at a sample"
)
COMPUTE_OVERRUN_FRACTION = _training(
    "compute_overrun_fraction",
    "",
    "the share of the measured padded operations whose real time exceeded their target",
)
REPRESENTATIVE = _training(
    "representative",
    "",
    "`compute_overrun_fraction` at most 5% (`results/summary.MAX_REPRESENTATIVE_OVERRUN`): the emulated GPU "
    "kept its times",
)
COMPUTE_HEADROOM = _training(
    "compute_headroom",
    "",
    "the smallest ratio, over forward, backward and optimizer step, of the padding target to the median real duration",
)
PREDICTED_ITERATION_TIME_S = _training(
    "predicted_iteration_time_s", "s", "the cost model's prediction, made before the run (`plan/cost_model.py`)"
)
PREDICTION_ERROR = _training("prediction_error", "", "(measured - predicted) / measured, of `iteration_time_s`")

_wan = _group("A WAN that changed (link profiles, outages)")
OUTAGES = _wan(
    "outages",
    "",
    "each outage of a WAN link: `link`, `down_s` (after the run's start), `duration_s` (none: still down at the "
    "end) and `resume_ms`, from the link's return to the end of the first wait under way then (TCP's "
    "retransmission backoff)",
)
PROFILE_PHASES = _wan(
    "profile_phases",
    "",
    "each phase of the links' profiles: `start_s` (after the first step), the `links`' `rate_bps` (0: down) and "
    "`delay_us`, the measured `iterations` that began in it and their mean `iteration_time_s`",
)

_atlas = _group("Atlas's controller")
GRANTS = _atlas("grants", "", "link grants the controller applied")
CONTROLLER_FAILED = _atlas(
    "controller_failed", "", "true where the controller died: the links fell back to fair sharing"
)
GRANT_LATENCY_P50_MS = _atlas(
    "grant_latency_p50_ms", "ms", "median, from a transfer ready (both sides reported) to its grant applied"
)
GRANT_LATENCY_P99_MS = _atlas("grant_latency_p99_ms", "ms", "99th percentile of the same")
GRANT_APPLY_P50_MS = _atlas(
    "grant_apply_p50_ms",
    "ms",
    "median, from the controller's decision to the kernel's acknowledgement on the link's machine (across "
    "machines the relay's time, corrected into the runner's clock: within `clock_offset_uncertainty_ms`)",
)
GRANT_APPLY_P99_MS = _atlas("grant_apply_p99_ms", "ms", "99th percentile of the same")
GRANT_ROUND_TRIP_P50_MS = _atlas(
    "grant_round_trip_p50_ms",
    "ms",
    "across machines: median, from the controller's decision to the relay's answer back at the controller (one clock)",
)
GRANT_ROUND_TRIP_P99_MS = _atlas("grant_round_trip_p99_ms", "ms", "99th percentile of the same")
CONTROL_RELAYS = _atlas(
    "control_relays",
    "",
    "across machines: each machine's control relay's counts (`forwarded` worker messages, grants `applied`, "
    "`stale` grants not applied, `repeated` requests answered from memory, byte counts `read`, `foreign` "
    "datagrams dropped, and deliberate faults: `forwards_dropped`, `forwards_duplicated`, `replies_dropped`, "
    "`replies_duplicated`)",
)
HANDOVER_GAP_P50_MS = _atlas(
    "handover_gap_p50_ms",
    "ms",
    "median, on one link, from a grant's release while another transfer waited to that next grant applied "
    "(the controller's own dead time)",
)
HANDOVER_GAP_P99_MS = _atlas("handover_gap_p99_ms", "ms", "99th percentile of the same")
IDLE_BETWEEN_GRANTS_P50_MS = _atlas(
    "idle_between_grants_p50_ms", "ms", "median, from every release to the next grant on the same link, waiting or not"
)
IDLE_BETWEEN_GRANTS_P99_MS = _atlas("idle_between_grants_p99_ms", "ms", "99th percentile of the same")
GRANT_HOLD_P50_MS = _atlas("grant_hold_p50_ms", "ms", "median time a grant held its link (grant to release)")
GRANT_HOLD_P99_MS = _atlas("grant_hold_p99_ms", "ms", "99th percentile of the same")
GRANTS_RELEASED_BY_DEADLINE = _atlas(
    "grants_released_by_deadline",
    "",
    "grants that ended at their deadline (a lost message, or bytes slower than planned)",
)
LINK_BUSY_DURING_GRANTS = _atlas(
    "link_busy_during_grants",
    "",
    "what the granted classes sent over what their links could have carried while held (planned grants)",
)

_bubbletea = _group("BubbleTea")
BUBBLE_FILL_FRACTION = _bubbletea(
    "bubble_fill_fraction", "", "the share of the training workers' idle time prefill filled"
)
PREFILL_TOKENS_PER_S = _bubbletea(
    "prefill_tokens_per_s", "tokens/s", "prompt tokens prefilled per second over the measured window, all workers"
)
PREFILL_CHUNKS = _bubbletea("prefill_chunks", "", "prompt chunks prefilled (a pass may hold several)")
REQUESTS_ASSIGNED = _bubbletea("requests_assigned", "", "requests the dispatcher handed to workers")
REQUESTS_COMPLETED = _bubbletea(
    "requests_completed", "", "requests whose first token came (prefill done, KV cache received)"
)
REQUESTS_DECODED = _bubbletea("requests_decoded", "", "requests the decode hosts decoded to their last token")
TTFT_P50_S = _bubbletea("ttft_p50_s", "s", "median time to first token, from a request's arrival (wall time)")
TTFT_P99_S = _bubbletea("ttft_p99_s", "s", "99th percentile of the same")
DISPATCH_DELAY_P50_MS = _bubbletea(
    "dispatch_delay_p50_ms",
    "ms",
    "median, from a request's arrival to the dispatcher's handing it to a worker (part of its TTFT): the "
    "dispatcher's own lag, plus the wait while no worker's predicted bubble had room",
)
DISPATCH_DELAY_P99_MS = _bubbletea("dispatch_delay_p99_ms", "ms", "99th percentile of the same")
PREFILL_ALONE_SHARE = _bubbletea(
    "prefill_alone_share",
    "",
    "BubbleTea's prefill of the measured window as a share of what the same training hosts deliver serving "
    "prefill alone: the slices' padded targets over the hosts' wall time (alone, each host runs the same chunks "
    "back to back at the same emulated time per FLOP)",
)
PREFILL_ALONE_TOKENS_PER_S = _bubbletea(
    "prefill_alone_tokens_per_s", "tokens/s", "that rate serving prefill alone, over all the hosts"
)
SERVING_WINDOW_S = _bubbletea(
    "serving_window_s",
    "s",
    "a run serving prefill alone (`+prefill-alone`): its serving windows' mean length; its `prefill_alone_share` "
    "is then the share of its hosts' wall time their prefill had the emulated GPU",
)
QUEUE_EMPTY_SHARE = _bubbletea(
    "queue_empty_share",
    "",
    "a run serving prefill alone: the share of its workers' measured windows with no request queued (above a "
    "few percent, the run measured the request rate rather than what its GPUs deliver)",
)
MEASURED_ALONE_TOKENS_SHARE = _bubbletea(
    "measured_alone_tokens_share",
    "",
    "`compare`: a BubbleTea run's prefill tokens/s over the same policy's run serving prefill alone (medians)",
)
MEASURED_ALONE_GPU_TIME_SHARE = _bubbletea(
    "measured_alone_gpu_time_share", "", "`compare`: the same in emulated GPU time (`prefill_alone_share` medians)"
)
TTFT_WITHIN_SLO_SHARE = _bubbletea(
    "ttft_within_slo_share",
    "",
    "the share of the requests assigned whose first token came within `ttft_slo_s` (one not finished by the "
    "run's end counts as outside)",
)
TTFT_SLO_S = _bubbletea("ttft_slo_s", "s", "the TTFT SLO judged against (`bubbletea.ttft_slo_s`)")
TTFT_ALONE_P50_S = _bubbletea(
    "ttft_alone_p50_s",
    "s",
    "median TTFT of the same requests on emulated GPUs serving prefill alone from an empty queue: each prompt "
    "in one pass at the run's emulated time per FLOP, without the KV transfer",
)
TTFT_SLO_REACHABLE_SHARE = _bubbletea(
    "ttft_slo_reachable_share",
    "",
    "the share of the requests for which even that is within `ttft_slo_s` (the ceiling of `ttft_within_slo_share`)",
)
TTFT_SLO_ATTAINMENT = _bubbletea(
    "ttft_slo_attainment",
    "",
    "of the requests whose deadline (arrival + SLO) fell within the run, the share whose first token came by it "
    "(`results/ttft.py`)",
)
TTFT_SLO_JUDGED = _bubbletea("ttft_slo_judged", "", "how many requests that judged")
TTFT_SCALED_SLO_ATTAINMENT = _bubbletea(
    "ttft_scaled_slo_attainment",
    "",
    "the same against `ttft_slo_scale` x each request's TTFT served alone",
)
TTFT_SCALED_SLO_JUDGED = _bubbletea("ttft_scaled_slo_judged", "", "how many requests that judged")
TTFT_SLO_SCALE = _bubbletea("ttft_slo_scale", "", "the scaled SLO's multiple (`bubbletea.ttft_slo_scale`)")
PREFILL_OVERRUN_FRACTION = _bubbletea(
    "prefill_overrun_fraction", "", "the share of the prefill slices whose real time exceeded their target"
)
DECODE_OVERRUN_FRACTION = _bubbletea(
    "decode_overrun_fraction", "", "the share of the decode steps whose real time exceeded their target"
)
DECODE_MEAN_BATCH = _bubbletea(
    "decode_mean_batch",
    "requests",
    "continuous batching on the decode hosts: the requests in a decode step's batch, averaged over every "
    "request's steps (weighted as a request sees it)",
)
PEAK_GPU_MEMORY_MB = _bubbletea(
    "peak_gpu_memory_mb",
    "MiB",
    "the most memory a training host's emulated GPU held while prefilling: training state, activations in "
    "flight, the inference model, the KV caches admitted",
)
GPU_MEMORY_MB = _bubbletea("gpu_memory_mb", "MiB", "its budget (`gpu_memory_mb`; none: no admission control)")
TRAINING_OPS_WITH_INPUT = _bubbletea(
    "training_ops_with_input",
    "",
    "every run: forward and backward operations of the measured iterations that received their input",
)
TRAINING_OPS_STARTED_LATE = _bubbletea(
    "training_ops_started_late",
    "",
    "of those, the ones that started more than 1 ms after their input arrived "
    "(`results/analysis.start_after_arrival`); a run without BubbleTea gives the floor of the same policy's run "
    "with it",
)
START_AFTER_ARRIVAL_P50_MS = _bubbletea(
    "start_after_arrival_p50_ms", "ms", "median start of those operations after their input's arrival"
)
START_AFTER_ARRIVAL_P99_MS = _bubbletea("start_after_arrival_p99_ms", "ms", "99th percentile of the same")
TRAINING_OPS_DELAYED_BY_PREFILL = _bubbletea(
    "training_ops_delayed_by_prefill",
    "",
    "operations whose input arrived while a prefill pass had the GPU and that started more than 1 ms after it",
)
PREFILL_HOLD_P99_MS = _bubbletea("prefill_hold_p99_ms", "ms", "99th percentile of their start after the arrival")
TRAINING_OPS_LATE_WITHOUT_PREFILL = _bubbletea(
    "training_ops_late_without_prefill",
    "",
    "the same of the operations whose input arrived while no pass ran",
)
START_AFTER_ARRIVAL_P99_MS_WITHOUT_PREFILL = _bubbletea(
    "start_after_arrival_p99_ms_without_prefill", "ms", "99th percentile of their start after the arrival"
)
BUBBLE_PREDICTION_ERROR_P50_MS = _bubbletea(
    "bubble_prediction_error_p50_ms",
    "ms",
    "median |predicted - observed| length of the bubbles (waits) BubbleTea predicted "
    "(`bubbletea.profile.prediction_error_stats`)",
)
BUBBLE_PREDICTION_ERROR_P99_MS = _bubbletea("bubble_prediction_error_p99_ms", "ms", "99th percentile of the same")
BUBBLE_OVER_PREDICTED_SHARE = _bubbletea(
    "bubble_over_predicted_share",
    "",
    "the share of the predicted bubbles predicted longer than they turned out (the case that could delay training)",
)
BUBBLE_BEYOND_PREDICTION_SHARE = _bubbletea(
    "bubble_beyond_prediction_share",
    "",
    "of the predicted waits' observed time, the part after their predicted end, which prefill cannot fill",
)

_sched = _group("The scheduler trace (`--sched-trace`)")
SCHED_LATE_OPS = _sched(
    "sched_late_ops",
    "",
    "operations started more than 1 ms after their input's arrival as the kernel saw it (the waking of the "
    "worker's thread: `results/input_arrival.input_arrivals_ns`)",
)
SCHED_LATE_UNSEEN_MS = _sched(
    "sched_late_unseen_ms",
    "ms",
    "of their lateness, the time before their workers saw the input (the wake-up to `ready_ns`), which "
    "`training_ops_started_late` does not count",
)
SCHED_LATE_RUNNING_MS = _sched(
    "sched_late_running_ms", "ms", "of their lateness, the time their workers' main threads spent on a CPU"
)
SCHED_LATE_RUNNABLE_MS = _sched("sched_late_runnable_ms", "ms", "the time they spent on a run queue waiting for a CPU")
SCHED_LATE_SLEEPING_MS = _sched("sched_late_sleeping_ms", "ms", "the time they spent asleep")
SCHED_LATE_UNKNOWN_MS = _sched(
    "sched_late_unknown_ms",
    "ms",
    "the late time the trace cannot account for (before it saw the thread, or past what it holds whole)",
)
SCHED_CPU_WHILE_RUNNABLE_MS = _sched(
    "sched_cpu_while_runnable_ms",
    "ms",
    "what every CPU ran while the late threads waited for one, by role (`trace/task_names.py`)",
)
SCHED_QUEUE_CPU_WHILE_RUNNABLE_MS = _sched(
    "sched_queue_cpu_while_runnable_ms",
    "ms",
    "of that, what the CPU whose run queue the thread waited on ran, by role (none for a trace without the "
    "moves between CPUs)",
)
SCHED_LATE_FREE_CPU_MS = _sched(
    "sched_late_free_cpu_ms",
    "ms",
    "of their time waiting for a CPU, the time another CPU was idle or ran only `SCHED_IDLE` work, summed",
)
SCHED_LATE_OPS_FREE_CPU = _sched(
    "sched_late_ops_free_cpu",
    "",
    "how many of them had such a CPU at some moment before the 1 ms bound while they waited",
)
SCHED_EVENTS_LOST = _sched("sched_events_lost", "", "the kernel's events that did not fit its trace buffers")
SCHED_TRACE_ERROR = _sched(
    "sched_trace_error", "", "why a run's scheduler trace could not be read (its file and the fault)"
)
