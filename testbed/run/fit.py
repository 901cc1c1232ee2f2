"""Refusing, before anything is built, a run this machine cannot carry out: more memory than it has
(the run plan's estimate, ``plan/memory.py``, against MemAvailable), a corpus too small for the
sequence length, or an iteration the plan predicts to last longer than ``MAX_ITERATION_S`` (unless
forced). Every refusal names the field, the value, the figure it was checked against and the fix;
the figures come from the run's plan (``plan/run_plan.RunPlan``), made once."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path

from testbed.errors import SpecError
from testbed.plan.connections import connection_window_bytes
from testbed.plan.memory import LAUNCHER_BYTES
from testbed.plan.run_plan import RunPlan
from testbed.spec.experiment import Experiment
from testbed.spec.model import ModelConfig
from testbed.spec.wire import MIN_SOCKET_BUFFER_BYTES, TCP_MSS_WITH_TIMESTAMPS
from testbed.train.corpus import corpus_bytes, train_split_bytes

#: an iteration predicted to last longer than this is refused unless forced (s)
MAX_ITERATION_S = 600.0
#: the share of this machine's available memory a run may plan to use
MEMORY_SHARE = 0.8
GIB = 2**30


#: the sizes a refusal may blame, with their defaults (``Experiment``, ``ModelConfig``)
SIZES = {
    "microbatches": 4,
    "microbatch_size": 4,
    "model.n_layers": ModelConfig.n_layers,
    "model.d_model": ModelConfig.d_model,
    "model.seq_len": ModelConfig.seq_len,
}


def size_of(exp: Experiment, field: str) -> int:
    """The value of one of ``SIZES`` in ``exp``."""
    owner = exp.model if field.startswith("model.") else exp
    return int(getattr(owner, field.removeprefix("model.")))


def largest_size(exp: Experiment, fields: tuple[str, ...]) -> tuple[str, int]:
    """(field, value) of the one of ``fields`` furthest above its default: the size to blame."""
    field = max(fields, key=lambda f: size_of(exp, f) / SIZES[f])
    return field, size_of(exp, field)


def available_memory_bytes() -> int:
    """This machine's MemAvailable (proc(5)), in bytes."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise OSError("/proc/meminfo has no MemAvailable")


def check_memory(plan: RunPlan, available: int | None = None) -> None:
    """Raise SpecError when the plan's workers need more than ``MEMORY_SHARE`` of ``available``
    bytes (default: this machine's MemAvailable), naming the part that dominates a worker's need."""
    exp, workers = plan.experiment, plan.workers
    avail = available_memory_bytes() if available is None else available
    worst = plan.largest_worker
    need = worst.total_bytes * len(workers) + LAUNCHER_BYTES
    if need <= MEMORY_SHARE * avail:
        return
    blamed, fix = {
        "model": (("model.n_layers", "model.d_model"), "use a smaller model (fewer layers or a smaller d_model)"),
        "optimizer": (("model.n_layers", "model.d_model"), "use a smaller model, or more stages to share it"),
        "activations": (
            ("microbatch_size", "model.seq_len", "model.n_layers", "model.d_model"),
            "use a smaller microbatch_size, a shorter model.seq_len, fewer layers per stage or the 1f1b schedule",
        ),
        "bubbletea": (("model.n_layers",), "use a smaller inference model (bubbletea.model)"),
    }[worst.largest_part]
    field, value = largest_size(exp, blamed)
    if worst.largest_part == "bubbletea":
        inf = exp.bubbletea.model
        field, value = "bubbletea.model", f"n_layers {inf.n_layers}, d_model {inf.d_model}, seq_len {inf.seq_len}"
    raise SpecError(
        exp.source,
        field,
        value,
        f"makes each worker need about {worst.total_bytes / GIB:.3g} GiB (stage {worst.stage}, mostly "
        f"{worst.largest_part}: {exp.model.n_layers} layers of d_model {exp.model.d_model}, microbatches of "
        f"{exp.microbatch_size} x {exp.model.seq_len} tokens), {need / GIB:.3g} GiB for {len(workers)} workers "
        "and their launcher, "
        "more than "
        f"{MEMORY_SHARE:.0%} of the {avail / GIB:.3g} GiB this machine has available",
        fix,
    )


#: the fewest full segments one connection's modelled window may hold: below it TCP's delayed
#: ACKs (every second segment, or after Linux's 40 ms minimum timer: RFC 1122 4.2.3.2, RFC 5681 4.2)
#: and loss recovery decide the connection's rate, which neither the window model nor the
#: simulator follows (a random draw with a 2 kB window on a 10 Mbit/s link ran 28% slower than
#: predicted); it also keeps the cap above the kernel's least socket buffer
MIN_WINDOW_SEGMENTS = 4


def check_connection_window(plan: RunPlan) -> None:
    """Raise SpecError when one connection's modelled window (``connections.connection_window_bytes``)
    holds fewer than ``MIN_WINDOW_SEGMENTS`` full segments, or the socket-buffer cap that holds it
    is below the least the kernel takes (``MIN_SOCKET_BUFFER_BYTES``: the sysctl would be refused),
    naming the field that sets the window and the least value that works."""
    exp = plan.experiment
    window = connection_window_bytes(exp, exp.topology_spec, list(plan.workers))
    least_window = MIN_WINDOW_SEGMENTS * TCP_MSS_WITH_TIMESTAMPS
    cap = plan.socket_buffer_bytes
    if window is None or (window >= least_window and (cap is None or cap >= MIN_SOCKET_BUFFER_BYTES)):
        return
    factor = max(least_window / window, MIN_SOCKET_BUFFER_BYTES / cap if cap else 1.0)
    if exp.wan_window_bytes is not None:
        field, value, least = "wan_window_bytes", exp.wan_window_bytes, f"{math.ceil(window * factor)}"
    else:
        share = exp.wan_connection_share or 0.0
        needed = share * factor  # rounded up at its third significant digit, so that the value given works
        step = 10 ** (math.floor(math.log10(needed)) - 2)
        field, value, least = "wan_connection_share", share, f"{math.ceil(needed / step) * step:.3g} on these links"
    raise SpecError(
        exp.source,
        field,
        value,
        f"gives one TCP connection a window of {window:.0f} bytes on the WAN path with the smallest "
        f"bandwidth-delay product (a socket-buffer cap of {cap} bytes), under {MIN_WINDOW_SEGMENTS} full segments "
        f"({least_window} bytes; or under the {MIN_SOCKET_BUFFER_BYTES}-byte buffer the kernel takes at least): "
        "delayed ACKs and loss recovery would then set its rate, which the testbed does not model",
        f"use at least {least}, or links with a larger bandwidth-delay product (rate x RTT)",
    )


def check_corpus(exp: Experiment) -> None:
    """Raise SpecError when the training split of the corpus is not longer than one sequence."""
    train = train_split_bytes(len(corpus_bytes(Path(exp.data) if exp.data else None)))
    if train <= exp.model.seq_len:
        raise SpecError(
            exp.source,
            "model.seq_len",
            exp.model.seq_len,
            f"is not shorter than the corpus's training split ({train} bytes)",
            "give more text (data:) or a shorter seq_len",
        )


def check_iteration_time(plan: RunPlan, force: bool = False) -> float:
    """The plan's predicted iteration time (s); SpecError above ``MAX_ITERATION_S`` unless
    ``force``, naming the count that makes it long."""
    exp, predicted = plan.experiment, plan.predicted_iteration_s
    if predicted <= MAX_ITERATION_S or force:
        return predicted
    field, value = largest_size(exp, tuple(SIZES))
    raise SpecError(
        exp.source,
        field,
        value,
        f"makes one iteration take about {predicted:.3g} s by the cost model ({exp.microbatches} microbatches of "
        f"{exp.microbatch_size} sequences of {exp.model.seq_len} tokens through {exp.model.n_layers} layers of "
        f"d_model {exp.model.d_model}), above the {MAX_ITERATION_S:g} s limit",
        f"use a smaller {field}, or pass --force to run it anyway",
    )


#: the share of its padding target one operation may take when every worker computes at once (its
#: real time on one thread, times the workers sharing each core). Set from the development seed's
#: random runs (``prediction_error.py --random 20 --seed 1``, before the check): runs whose draw
#: scored 0.77 and above overran their targets in 9-74% of operations under atlas or BubbleTea,
#: none at 0.63 and below
MAX_CONTENDED_SHARE = 0.7
#: timed repetitions of a stage's forward and backward (the median counts; one more warms up)
TIMING_REPS = 5


def real_stage_s(exp: Experiment, stage: int) -> float:
    """Seconds this machine takes, on one thread as a worker has, for the forward and backward of one
    microbatch through ``stage`` (real PyTorch; the median of ``TIMING_REPS``), timed once per
    process for each model, microbatch size, seed and stage layout (a draw's policies share it)."""
    return _timed_stage_s(exp.model, exp.microbatch_size, exp.seed, stage, exp.stages)


@functools.cache
def _timed_stage_s(model: ModelConfig, microbatch_size: int, seed: int, stage: int, stages: int) -> float:
    import statistics
    import time

    import torch

    from testbed.model.gpt import Stage, build_model

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        m = Stage(build_model(model, seed), stage, stages)
        shape = (microbatch_size, model.seq_len)
        x = torch.randint(0, model.vocab, shape) if stage == 0 else torch.randn(*shape, model.d_model)
        times = []
        for _ in range(TIMING_REPS + 1):
            t0 = time.perf_counter()
            m(x).float().square().mean().backward()
            times.append(time.perf_counter() - t0)
        return statistics.median(times[1:])
    finally:
        torch.set_num_threads(threads)


def contended_share(plan: RunPlan, cores: int | None = None) -> tuple[float, float, float]:
    """(share, worst_s, per_core): the share of its padding target the slowest stage's forward and
    backward of one microbatch takes on this machine when every worker of ``plan`` computes at once
    (``worst_s``, ``real_stage_s``, times ``per_core``, the workers per core, at least 1; ``cores``
    default all)."""
    import os

    exp = plan.experiment
    cores = cores or os.cpu_count() or 1
    worst = max(real_stage_s(exp, s) for s in range(exp.stages))
    target_s = (exp.compute.forward_ms + exp.compute.backward_ms) / 1000
    per_core = max(1.0, len(plan.workers) / cores)
    return worst * per_core / target_s, worst, per_core


#: ``suggest_dilation`` rounds up to a multiple of this
DILATION_STEP = 0.5


@dataclass(frozen=True)
class DilationNeed:
    """The smallest time dilation ``k`` under which this machine runs an experiment
    representatively (``suggest_dilation``), and why: ``compute_share``, the contended share of its
    targets undilated (``contended_share``; k must bring it to ``MAX_CONTENDED_SHARE``), and
    ``link_load``, its fastest link's rate over what the delay mechanism carries (None: that figure
    is not cached yet; k must bring it to 1)."""

    k: float
    compute_share: float
    link_load: float | None

    def describe(self) -> str:
        links = (
            f"its fastest link {self.link_load:.2f}x what this machine carries"
            if self.link_load is not None
            else "the links not judged (no capacity measured yet: testbed doctor)"
        )
        return (
            f"smallest time dilation this machine runs it representatively at: k = {self.k:g} (compute "
            f"{self.compute_share:.0%} of its targets with every worker at once, at most "
            f"{MAX_CONTENDED_SHARE:.0%}; {links})"
        )


def suggest_dilation(plan: RunPlan, cores: int | None = None, capacity_bps: int | None = None) -> DilationNeed:
    """The smallest time dilation, a multiple of ``DILATION_STEP`` from 1, under which ``plan``'s
    experiment (described in its own frame, undilated) runs representatively here: its contended
    compute share (``contended_share``) divided by k at most ``MAX_CONTENDED_SHARE`` (dilation
    stretches the targets, not the CPU's time), and every WAN link's rate divided by k at most
    ``capacity_bps``, what the delay mechanism carries (None: not judged)."""
    share, _, _ = contended_share(plan, cores)
    spec = plan.experiment.topology_spec
    load = max(x.rate_bps for x in spec.links) / capacity_bps if capacity_bps and spec.links else None
    need = max(1.0, share / MAX_CONTENDED_SHARE, load or 0.0)
    return DilationNeed(math.ceil(need / DILATION_STEP - 1e-9) * DILATION_STEP, share, load)


def check_compute_load(plan: RunPlan, cores: int | None = None) -> float:
    """The share of its padding target the slowest stage's forward and backward of one microbatch
    takes on this machine when every worker of the plan computes at once: ``real_stage_s`` times
    the workers per core (``cores``, default all; at least 1). Raises SpecError, naming the model's
    width, above ``MAX_CONTENDED_SHARE``: the padded operations would then overrun
    (``compute_overrun_fraction``) and the run would not emulate the device it models."""
    import os

    exp = plan.experiment
    cores = cores or os.cpu_count() or 1
    share, worst, per_core = contended_share(plan, cores)
    target_s = (exp.compute.forward_ms + exp.compute.backward_ms) / 1000
    if share > MAX_CONTENDED_SHARE:
        raise SpecError(
            exp.source,
            "model.d_model",
            exp.model.d_model,
            f"takes this machine {worst * 1000:.0f} ms a microbatch on one thread, "
            f"{worst * per_core * 1000:.0f} ms with its {len(plan.workers)} workers on {cores} cores: {share:.0%} "
            f"of the {target_s * 1000:.0f} ms target (at most {MAX_CONTENDED_SHARE:.0%})",
            "use a narrower model, longer compute targets, fewer workers, or a time dilation (time_dilation; "
            "testbed plan suggests the smallest)",
        )
    return share
