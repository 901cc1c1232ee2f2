"""The BubbleTea section of an experiment (prefill in the pipeline bubbles, DESIGN.md section 1,
item 5), its limits and its checks."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from testbed.errors import SpecError
from testbed.spec.fields import Field, FieldTable
from testbed.spec.model import MODEL_FIELDS, ModelConfig

#: highest synthetic request rate (per second) an experiment may ask for
MAX_REQUEST_RATE = 1000.0
#: smallest prefill chunk worth starting (tokens); smaller leftovers of a bubble stay idle
MIN_CHUNK_TOKENS = 16
#: the longest prompt of the Azure LLM inference trace 2023 (conversation file), the largest the
#: synthetic stream draws (``bubbletea.requests.AZURE_CONV_2023``'s last prompt quantile; a unit test
#: keeps the two equal): the served model's default context holds it, so no prompt is clipped
LONGEST_PROMPT_TOKENS = 14050
#: a long prompt of that trace, its 90th percentile (``AZURE_CONV_2023``'s 0.90 prompt quantile,
#: rounded up; kept equal by the same test): the memory estimate's queued prompts
#: (``plan/memory.inference_bytes``) are this long, one of them at the full context
QUEUED_PROMPT_TOKENS = 2735


@dataclass(frozen=True)
class BubbleTeaSpec:
    """Prefill-in-the-bubbles (BubbleTea, DESIGN.md section 1 item 5), used by ``<policy>+bubbletea``.

    ``model``: the inference model each worker holds beside its stage (real weights from the
    experiment's seed; ``seq_len`` is its context); None, the default: the training model's
    layers, width and heads (the published setting serves an LLM of the kind being trained) with
    a context of the longest prompt plus ``max_output_tokens`` (``served_model``; the experiment
    resolves it when made). Requests: the Azure 2023 trace's CSV (``requests``, with
    ``time_scale`` and ``rate_factor``) or, without one, a synthetic stream at ``request_rate``
    per second fitted to that trace (``requests.synthetic_requests``). Prompts are never clipped
    by default (``max_prompt_tokens`` None: a long prompt spans several bubbles and iterations;
    the context holds ``LONGEST_PROMPT_TOKENS``, and a trace with a longer prompt is refused when
    the run starts); a number clips them to it. Decode stops at ``max_output_tokens``.
    A forward pass holds at most ``max_chunk_tokens`` tokens, over the chunks of one or more
    requests, each chunk the largest whose pass ends ``guard_ms`` before the predicted bubble does,
    predicted as the minimum of the slot's last ``profile_iterations`` bubbles. Training preempts
    a pass at once (``bubbletea/prefill_stream.py``), so with ``fill_every_bubble`` (the default)
    a worker keeps prefilling through every bubble: where no chunk fits what is left of the
    predicted bubble, or the bubble outlasts its prediction, it resumes the oldest stopped pass or
    starts one of ``max_chunk_tokens``, which training may stop and a later bubble resume; false:
    a pass starts only where it is predicted to end ``guard_ms`` before the bubble does.
    ``decode``: decode hosts run the decode steps, batching up to ``max_decode_batch`` requests per
    step (continuous batching; a step's target is its roofline time on the emulated GPU: the
    bytes it reads, the blocks' and head's weights and each request's KV cache, or its FLOPs
    where more).
    ``ttft_slo_s``: the time to first token a request is judged against (s, wall time; the
    summary reports the share of requests within it). Its default, 1 s, is a round figure for an
    interactive service, not a published one: set your own. ``ttft_slo_scale``: a second SLO, for
    each request this multiple of its TTFT served alone (its prompt in one pass on an idle
    emulated GPU), which means the same on the slow emulated GPU as on a real one
    (``results/ttft.py``); its default, 3, is likewise a round figure."""

    model: ModelConfig | None = None
    request_rate: float = 4.0
    requests: str | None = None
    time_scale: float = 1.0
    rate_factor: float = 1.0
    max_prompt_tokens: int | None = None
    max_output_tokens: int = 256
    max_chunk_tokens: int = 128
    guard_ms: float = 3.0
    fill_every_bubble: bool = True
    profile_iterations: int = 3
    decode: bool = True
    max_decode_batch: int = 32
    ttft_slo_s: float = 1.0
    ttft_slo_scale: float = 3.0


#: an experiment's ``bubbletea``: defaults are ``BubbleTeaSpec``'s
BUBBLETEA_FIELDS = FieldTable(
    "experiment: bubbletea",
    "bubbletea",
    "Prefill of inference requests in the pipeline bubbles, under a policy with `+bubbletea`.",
    (
        Field(
            "model",
            "section",
            "the inference model each worker holds beside its stage (keys as `model`'s)",
            default_text="the training model's layers, width and heads, a context of the longest prompt "
            "plus `max_output_tokens`",
            table=MODEL_FIELDS.name,
        ),
        Field(
            "request_rate",
            "number",
            "the synthetic stream's mean rate",
            "requests/s",
            4.0,
            low=0,
            low_open=True,
            high=MAX_REQUEST_RATE,
            fix="give e.g. 4: the workers' bubbles hold a few tens of prefills per second",
        ),
        Field(
            "requests",
            "path",
            "a CSV in the Azure LLM inference trace format (TIMESTAMP,ContextTokens,GeneratedTokens), "
            "relative to the experiment file",
            default_text="a synthetic stream fitted to the Azure 2023 trace",
        ),
        Field("time_scale", "number", "the trace's time stretched by this factor", default=1.0, low=0, low_open=True),
        Field("rate_factor", "number", "the trace's rate multiplied by this", default=1.0, low=0, low_open=True),
        Field("max_prompt_tokens", "int", "prompts clipped to this", "tokens", default_text="unclipped", low=1),
        Field("max_output_tokens", "int", "decode stops here", "tokens", 256, low=1),
        Field(
            "max_chunk_tokens",
            "int",
            "a prefill pass's token budget (chunks of one or more requests)",
            "tokens",
            128,
            low=MIN_CHUNK_TOKENS,
            fix=f"use {MIN_CHUNK_TOKENS} or more (the smallest chunk worth a pass)",
        ),
        Field(
            "guard_ms",
            "number",
            "a chunk is sized to end this long before its predicted bubble does",
            "ms",
            3.0,
            low=0,
        ),
        Field(
            "profile_iterations",
            "int",
            "a bubble is predicted as the minimum of its last this many iterations",
            "iterations",
            3,
            low=1,
            rule="below `iterations`",
        ),
        Field("decode", "bool", "decode hosts run the decode steps", default=True),
        Field(
            "fill_every_bubble",
            "bool",
            "prefill through every bubble (resume or start a pass where no chunk fits)",
            default=True,
        ),
        Field(
            "ttft_slo_s",
            "number",
            "the time to first token a request is judged against",
            "s",
            1.0,
            low=0,
            low_open=True,
        ),
        Field(
            "ttft_slo_scale",
            "number",
            "a second SLO: this multiple of each request's TTFT served alone",
            default=3.0,
            low=1,
        ),
        Field("max_decode_batch", "int", "requests per decode step (continuous batching)", default=32, low=1),
    ),
)


def bubbletea_from_dict(d: dict[str, Any]) -> BubbleTeaSpec:
    """A BubbleTeaSpec from its ``asdict`` form (the workers' configuration)."""
    return BubbleTeaSpec(**{**d, "model": ModelConfig(**d["model"]) if d.get("model") else None})


def longest_prompt(bt: BubbleTeaSpec) -> int:
    """The longest prompt the served default's context is sized for (tokens): ``max_prompt_tokens``
    (prompts are clipped to it), or, unclipped, ``LONGEST_PROMPT_TOKENS`` (a trace's own are
    checked against the context when the run starts)."""
    return LONGEST_PROMPT_TOKENS if bt.max_prompt_tokens is None else bt.max_prompt_tokens


def dispatched_prompt(prompt_tokens: int, max_prompt_tokens: int | None) -> int:
    """A prompt's tokens as the dispatcher gives them to a worker: clipped at ``max_prompt_tokens``
    (None: unclipped)."""
    return prompt_tokens if max_prompt_tokens is None else min(prompt_tokens, max_prompt_tokens)


def served_model(bt: BubbleTeaSpec, training: ModelConfig) -> ModelConfig:
    """The inference model BubbleTea serves: ``bt.model`` when given, else the training model's
    layers, width, heads and vocabulary with a context of ``longest_prompt(bt) +
    max_output_tokens`` (every prompt and its output fit)."""
    if bt.model is not None:
        return bt.model
    return replace(training, seq_len=longest_prompt(bt) + bt.max_output_tokens)


def check_model_size(source: str, where: str, model: ModelConfig) -> None:
    """Raise SpecError naming ``<where>.<field>`` for a model size out of range (``MODEL_FIELDS``)
    or heads that do not divide the width."""
    MODEL_FIELDS.check(source, model, where)
    if model.d_model % model.n_heads:
        raise SpecError(
            source,
            f"{where}.n_heads",
            model.n_heads,
            f"does not divide d_model ({model.d_model})",
            "choose heads that divide d_model",
        )


def check_bubbletea(source: str, bt: BubbleTeaSpec, iterations: int | None) -> None:
    """Raise SpecError naming the first field of the BubbleTea section out of range, and the fix.
    ``iterations``: the run's iterations when BubbleTea is on (the profile must fit in them)."""

    def bad(field: str, value: Any, problem: str, fix: str) -> SpecError:
        return SpecError(source, field, value, problem, fix)

    if bt.model is not None:
        check_model_size(source, "bubbletea.model", bt.model)
    BUBBLETEA_FIELDS.check(source, bt, "bubbletea")
    if iterations is not None and bt.profile_iterations >= iterations:
        raise bad(
            "bubbletea.profile_iterations",
            bt.profile_iterations,
            f"is not below iterations ({iterations})",
            "run more iterations (requests start once every worker has seen this many), or lower it",
        )
    if bt.model is not None and longest_prompt(bt) + bt.max_output_tokens > bt.model.seq_len:
        need, room = longest_prompt(bt) + bt.max_output_tokens, bt.model.seq_len - bt.max_output_tokens
        fixes = [f"raise bubbletea.model.seq_len to {need} or more"]
        if room >= 1:
            fixes.append(f"clip prompts with max_prompt_tokens <= {room}")
        else:
            fixes.append(f"lower max_output_tokens below {bt.model.seq_len} and clip prompts with max_prompt_tokens")
        if bt.max_prompt_tokens is None:
            raise bad(
                "bubbletea.model.seq_len",
                bt.model.seq_len,
                f"cannot hold an unclipped prompt (up to {LONGEST_PROMPT_TOKENS} tokens, max_prompt_tokens unset) "
                f"plus max_output_tokens ({bt.max_output_tokens})",
                "; or ".join(fixes),
            )
        raise bad(
            "bubbletea.max_prompt_tokens",
            bt.max_prompt_tokens,
            f"plus max_output_tokens ({bt.max_output_tokens}) exceeds the inference model's context "
            f"(bubbletea.model.seq_len {bt.model.seq_len})",
            "; or ".join(fixes),
        )
