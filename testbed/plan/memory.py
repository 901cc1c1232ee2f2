"""How much memory a worker of an experiment needs, estimated before anything runs, so that a run
the machine cannot hold is refused with the figure instead of ending in the allocator.

Per worker of the emulator (fp32 throughout, 4 bytes a value; the simulator's scenarios use
``stage_device_bytes`` with 16-bit values, ``ModelConfig.value_bytes``):

- the seeded full model, built once and kept as the worker's stage (``train/worker.py``): every
  parameter of the model;
- its stage's gradients and AdamW's two moment buffers: three times the stage's parameters;
- activations kept for the backward pass: per block and microbatch, the block's saved tensors,
  34 x s x b x h bytes plus 5 x a x s^2 x b for attention (Korthikanti et al. 2022, "Reducing
  Activation Recomputation in Large Transformer Models", section 4.1, counted there in bytes of
  16-bit values; here 4-byte values, so twice their figure: ``block_activation_bytes``), times the
  microbatches in flight:
  GPipe keeps all M, 1F1B at most S - s on stage s (Narayanan et al. 2021, section 2.2), the
  schedules of virtual stages or a split backward what their tables hold at most
  (``schedule.peak_in_flight``: interleaving's longer warm-up holds more, a weight backward
  delayed holds its microbatch's activations until it runs);
- the transfers' buffers: a received activation or gradient per microbatch in flight;
- with BubbleTea: the inference model (every parameter) and the KV caches of the queued requests:
  one at full context, the others at a long prompt's length (``QUEUED_PROMPT_TOKENS``) plus the
  output (2 x n_layers x positions x d_model values; ``bubbletea/kv_cache.py``), held by the
  worker's prefill stream, a process forked from the worker (``bubbletea/prefill_stream.py``)
  that adds its own written pages as a worker does (a second ``RUNTIME_BYTES``; on the default
  experiment under atlas+bubbletea, 2026-12-04, each stream's PSS was 85-94 MiB beside its
  worker's 87-95 MiB, the pages they share split between them).

Interpreter, torch and gloo take a share on top. Workers on this machine are forked from one
launcher that imported torch (``train/launcher.py``), so its ~300 MiB of interpreter and torch is
held once (``LAUNCHER_BYTES``) and each worker adds only the pages it writes (``RUNTIME_BYTES``):
``scripts/bench_density.py`` measured a worker of a small model at 64-83 MiB proportional set size
(PSS) and 312 MiB resident, most of it shared with the launcher.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from testbed.plan.schedule import worker_tables
from testbed.spec.bubbletea import QUEUED_PROMPT_TOKENS, BubbleTeaSpec, served_model
from testbed.spec.experiment import Experiment
from testbed.spec.model import FP32_BYTES, ModelConfig, activation_bytes, stage_layers, stage_params

#: what a forked worker adds before its model: its own pages of the interpreter, torch and gloo
#: (bytes; measured on the development machine, rounded up: see the module docstring)
RUNTIME_BYTES = 100 * 2**20
#: the launcher the workers are forked from, held once per run (bytes, rounded up)
LAUNCHER_BYTES = 400 * 2**20
#: prompts a worker may hold queued at once under BubbleTea, for the KV caches' estimate
QUEUED_REQUESTS = 8


@dataclass(frozen=True)
class WorkerMemory:
    """Bytes a worker of stage ``stage`` needs, by part (see the module docstring)."""

    stage: int
    model_bytes: int
    optimizer_bytes: int
    activation_bytes: int
    bubbletea_bytes: int
    runtime_bytes: int = RUNTIME_BYTES

    @property
    def total_bytes(self) -> int:
        return (
            self.model_bytes + self.optimizer_bytes + self.activation_bytes + self.bubbletea_bytes + self.runtime_bytes
        )

    @property
    def largest_part(self) -> str:
        """The part that dominates: ``model``, ``optimizer``, ``activations`` or ``bubbletea``."""
        parts = {
            "model": self.model_bytes,
            "optimizer": self.optimizer_bytes,
            "activations": self.activation_bytes,
            "bubbletea": self.bubbletea_bytes,
        }
        return max(parts, key=lambda k: parts[k])


def block_activation_bytes(
    cfg: ModelConfig, microbatch_size: int, tensor_parallel: int = 1, recompute: bool = False
) -> int:
    """Bytes one block saves for its backward pass on one microbatch, on one of ``tensor_parallel``
    devices that split it (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
    Transformer Models", table 2: s b h (10 + 24 / t) + 5 a s^2 b / t bytes of 16-bit values, 34 s b
    h + 5 a s^2 b at t = 1; with full recomputation only the block's input, 2 s b h; s sequence, b
    microbatch, h width, a heads), scaled to ``cfg.value_bytes`` (fp32: twice their figure)."""
    s, b, h, a, t = cfg.seq_len, microbatch_size, cfg.d_model, cfg.n_heads, tensor_parallel
    sixteen_bit = 2 * s * b * h if recompute else s * b * h * (10 + 24 / t) + 5 * a * s * s * b / t
    return math.ceil(sixteen_bit * cfg.value_bytes / 2)


#: bytes of training state per parameter with Adam: fp32 weights, gradients and two moments (4 x 4),
#: or mixed precision's 16-bit weights and gradients and fp32 master weights and moments (2 + 2 +
#: 12; Rajbhandari et al. 2020, "ZeRO", section 3.1): 16 either way
STATE_BYTES_PER_PARAM = 16


def kv_cache_bytes(cfg: ModelConfig, tokens: int, tensor_parallel: int = 1) -> int:
    """The KV cache of ``tokens`` positions of the inference model on one of ``tensor_parallel``
    devices: a key and a value of d_model per layer and position (2 x n_layers x tokens x d_model
    values, ``cfg.value_bytes`` each; ``bubbletea/kv_cache.KVCache``)."""
    return math.ceil(2 * cfg.n_layers * tokens * cfg.d_model * cfg.value_bytes / tensor_parallel)


def decode_step_bytes(cfg: ModelConfig, lengths: Sequence[int]) -> int:
    """The bytes one decode step moves on its device, for a batch of requests with ``lengths``
    positions cached: the blocks' and head's weights, read once for the whole batch (the
    embeddings are lookups of a row a request), and each request's KV cache with its new position
    (``kv_cache_bytes``); ``cfg.value_bytes`` a value, as the emulator holds them (fp32: twice a
    16-bit model's). The memory-bound decode of Pope et al. 2023 ("Efficiently Scaling Transformer
    Inference", section 2)."""
    weights = cfg.value_bytes * (cfg.params() - cfg.embedding_params)
    return weights + sum(kv_cache_bytes(cfg, n + 1) for n in lengths)


def inference_bytes(cfg: ModelConfig, tensor_parallel: int = 1, queued: int = QUEUED_REQUESTS) -> int:
    """What BubbleTea's inference model takes on one of ``tensor_parallel`` devices: its weights and
    the KV caches of ``queued`` prompts, one at full context (seq_len positions) and the others at
    ``QUEUED_PROMPT_TOKENS`` plus the output, within the context (``kv_cache_bytes``),
    ``cfg.value_bytes`` a value. An estimate for the plan's checks; at run time admission control
    holds each prompt's own cache."""
    weights = math.ceil(cfg.params() * cfg.value_bytes / tensor_parallel)
    if queued == 0:
        return weights
    typical = min(cfg.seq_len, QUEUED_PROMPT_TOKENS + BubbleTeaSpec.max_output_tokens)
    full = kv_cache_bytes(cfg, cfg.seq_len, tensor_parallel)
    return weights + full + (queued - 1) * kv_cache_bytes(cfg, typical, tensor_parallel)


def device_bytes_besides_kv(exp: Experiment, stage: int) -> int:
    """What one emulated GPU of ``stage`` holds under BubbleTea besides its KV caches: its stage's
    training state and activations in flight (``stage_device_bytes``; none when it serves prefill
    alone, ``exp.policy.training`` False) and the inference model's weights; the budget
    ``gpu_memory_mb`` less this is the room BubbleTea's admission control gives the caches of the
    prompts it prefills (``bubbletea.decisions.KVBudget``)."""
    train = (
        stage_device_bytes(exp.model, exp.stages, stage, exp.microbatch_size, in_flight(exp, stage), chunks=exp.chunks)
        if exp.policy.training
        else 0
    )
    return train + inference_bytes(served_model(exp.bubbletea, exp.model), queued=0)


def stage_device_bytes(
    cfg: ModelConfig,
    stages: int,
    stage: int,
    microbatch_size: int,
    held: float,
    tensor_parallel: int = 1,
    recompute: bool = False,
    chunks: int = 1,
) -> int:
    """What one device of ``stage`` holds for training, split ``tensor_parallel`` ways: its share of
    the stage's weights, gradients and optimizer state (``STATE_BYTES_PER_PARAM``), and for each of
    the ``held`` microbatches in flight its blocks' saved activations and, for each of its
    ``chunks`` (virtual stages), one received boundary tensor (its share of it)."""
    blocks = len(stage_layers(cfg.n_layers, stages, stage))
    state = STATE_BYTES_PER_PARAM * stage_params(cfg, stages, stage) / tensor_parallel
    saved = blocks * block_activation_bytes(cfg, microbatch_size, tensor_parallel, recompute)
    per_microbatch = saved + chunks * activation_bytes(cfg, microbatch_size) / tensor_parallel
    return math.ceil(state + held * per_microbatch)


@functools.cache
def peak_in_flight(schedule: str, stages: int, microbatches: int, chunks: int = 1) -> tuple[float, ...]:
    """Per worker, the most microbatches' worth of its activations it holds at once under the
    table: a virtual stage's activations of a microbatch live from its forward to its backward (a
    split backward's weight part: an upper bound, as that part needs only its layers' inputs), each
    a ``1 / chunks`` share of the worker's. Raises what ``worker_tables`` raises."""
    out = []
    for acts in worker_tables(schedule, stages, microbatches, chunks):
        live = peak = 0
        for a in acts:
            live += 1 if a.kind == "F" else -1 if a.kind in ("B", "W") else 0
            peak = max(peak, live)
        out.append(peak / chunks)
    return tuple(out)


def in_flight(exp: Experiment, stage: int) -> float:
    """Microbatches' worth of activations the worker of ``stage`` holds at once under the
    experiment's schedule."""
    if exp.schedule == "gpipe":
        return exp.microbatches
    if exp.schedule == "1f1b":
        return min(exp.stages - stage, exp.microbatches)
    return peak_in_flight(exp.schedule, exp.stages, exp.microbatches, exp.chunks)[stage]


def worker_memory(exp: Experiment, stage: int) -> WorkerMemory:
    """The memory a worker of ``stage`` needs (see the module docstring)."""
    cfg = exp.model
    blocks = len(stage_layers(cfg.n_layers, exp.stages, stage))
    held = in_flight(exp, stage)
    # a received boundary tensor per live microbatch of each chunk
    acts = math.ceil(
        held
        * (
            blocks * block_activation_bytes(cfg, exp.microbatch_size)
            + exp.chunks * activation_bytes(cfg, exp.microbatch_size)
        )
    )
    bt = inference_bytes(served_model(exp.bubbletea, exp.model)) if exp.policy.bubbletea else 0
    runtime = 2 * RUNTIME_BYTES if exp.policy.bubbletea else RUNTIME_BYTES  # and the prefill stream's
    return WorkerMemory(
        stage, cfg.params() * FP32_BYTES, 3 * stage_params(cfg, exp.stages, stage) * FP32_BYTES, acts, bt, runtime
    )


def gpu_bytes(exp: Experiment, stage: int) -> int:
    """What one emulated GPU of ``stage`` would hold (the per-GPU budget ``gpu_memory_mb`` is
    checked against it): ``stage_device_bytes`` (its stage's training state, the activations in
    flight) and, with BubbleTea, the inference model and KV caches; not the host-side copy of the
    full model nor the interpreter (``worker_memory``)."""
    train = stage_device_bytes(
        exp.model, exp.stages, stage, exp.microbatch_size, in_flight(exp, stage), chunks=exp.chunks
    )
    return train + worker_memory(exp, stage).bubbletea_bytes


def gpu_shortfall(exp: Experiment) -> str | None:
    """Why a stage does not fit ``exp.gpu_memory_mb`` (with the figures), or None when all fit or
    no budget is set."""
    if exp.gpu_memory_mb is None:
        return None
    need = max(range(exp.stages), key=lambda s: gpu_bytes(exp, s))
    mib = gpu_bytes(exp, need) / 2**20
    if mib <= exp.gpu_memory_mb:
        return None
    return f"stage {need} needs {mib:.0f} MiB of GPU memory, above gpu_memory_mb {exp.gpu_memory_mb:g}"


def largest_worker(exp: Experiment) -> WorkerMemory:
    """The worker that needs the most memory (its stage's figures)."""
    return max((worker_memory(exp, s) for s in range(exp.stages)), key=lambda m: m.total_bytes)
