"""LLM inference requests for BubbleTea: the prefill work placed into training pipeline bubbles.

Two sources of a request stream, both returning ``Request`` rows sorted by arrival:

- ``azure_trace.load_azure_trace`` replays a file of the published Azure LLM inference trace 2023
  (``TIMESTAMP,ContextTokens,GeneratedTokens``), optionally stretched in time or in load;
- ``synthetic_requests`` (here) draws a stream whose prompt lengths, output lengths and
  inter-arrival times follow distributions fitted to that trace's conversation file
  (``AZURE_CONV_2023``, fitted by ``azure_trace.fit_trace``).

``request_table.py`` holds the ``Request`` row, its table in a run folder and the argument checks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from testbed.bubbletea.request_table import Request, check_count, check_positive
from testbed.errors import SpecError

# Column names of the Azure trace files (the run folder's table: ``request_table.COLUMNS``).
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")

# Cumulative probabilities of the quantile tables below: denser in the tails, where a log-normal
# fits the trace worst (the 0.999..1 segment holds the single longest prompt).
QUANTILE_PROBS = (
    0.0,
    0.01,
    0.05,
    0.10,
    0.15,
    0.20,
    0.25,
    0.30,
    0.35,
    0.40,
    0.45,
    0.50,
    0.55,
    0.60,
    0.65,
    0.70,
    0.75,
    0.80,
    0.85,
    0.90,
    0.95,
    0.99,
    0.995,
    0.999,
    1.0,
)

MAX_SYNTHETIC_REQUESTS = 10_000_000  # rate_per_s * duration_s beyond this would not fit in memory comfortably
_CHUNK = 4096  # gaps drawn per step; fixed, so a shorter stream is a prefix of a longer one


@dataclass(frozen=True)
class TraceFit:
    """Distributions fitted to a request trace (see ``fit_trace``).

    ``prompt_tokens_q`` and ``output_tokens_q`` are token counts at the cumulative probabilities
    ``QUANTILE_PROBS`` (an empirical inverse CDF, interpolated linearly in log tokens).
    Inter-arrival times are a Gamma renewal process with mean ``1 / rate_per_s`` seconds and
    coefficient of variation ``interarrival_cv`` (1 would be Poisson).
    """

    prompt_tokens_q: tuple[float, ...]
    output_tokens_q: tuple[float, ...]
    rate_per_s: float
    interarrival_cv: float


# Fitted by `scripts/fit_azure_trace.py /work/shared/data/azure-llm-inference-2023/AzureLLMInferenceTrace_conv.csv`
# on 2026-11-30 (Azure LLM inference trace 2023, conversation file: 19366 requests over 3502 s).
# The numbers carry over; the file does not ship with the testbed. A log-normal fits both token
# counts badly (prompts are bimodal, near 400 and 1000 tokens; outputs pile up near 400), hence
# quantile tables. The rate is the hour's mean; the trace's load also drifts (5-minute counts
# range 1297..2239) and is burstier over 10 s windows than a renewal process, which this omits.
AZURE_CONV_2023 = TraceFit(
    prompt_tokens_q=(
        2.0,
        29.0,
        181.0,
        207.0,
        372.0,
        387.0,
        396.0,
        403.0,
        414.0,
        703.0,
        984.0,
        1020.0,
        1045.0,
        1071.0,
        1097.0,
        1130.0,
        1189.0,
        1315.0,
        1876.2,
        2734.5,
        4083.0,
        4142.0,
        4831.0,
        6179.1,
        14050.0,
    ),
    output_tokens_q=(
        7.0,
        16.0,
        41.0,
        54.0,
        67.0,
        77.0,
        85.0,
        91.0,
        96.0,
        103.0,
        113.0,
        129.0,
        151.0,
        177.0,
        217.0,
        384.0,
        395.0,
        400.0,
        411.0,
        424.0,
        451.0,
        601.0,
        643.2,
        954.0,
        1000.0,
    ),
    rate_per_s=5.5301,
    interarrival_cv=1.0942,
)


def tokens_from_quantiles(u: np.ndarray, quantiles: Sequence[float]) -> np.ndarray:
    """Token counts (int64, >= 1) at cumulative probabilities ``u`` in [0, 1], from a table of token
    counts at ``QUANTILE_PROBS``, interpolated linearly in log tokens and rounded to whole tokens."""
    if len(quantiles) != len(QUANTILE_PROBS) or min(quantiles) < 1 or list(quantiles) != sorted(quantiles):
        raise SpecError(
            "tokens_from_quantiles",
            "quantiles",
            tuple(quantiles),
            "is not a quantile table",
            f"give {len(QUANTILE_PROBS)} ascending token counts >= 1, one per QUANTILE_PROBS entry",
        )
    logs = np.interp(u, QUANTILE_PROBS, np.log(np.asarray(quantiles, dtype=float)))
    return np.maximum(np.rint(np.exp(logs)), 1).astype(np.int64)


def synthetic_requests(
    rate_per_s: float,
    duration_s: float,
    seed: int,
    *,
    max_prompt_tokens: int | None = None,
    fit: TraceFit = AZURE_CONV_2023,
) -> list[Request]:
    """A seeded request stream over [0, ``duration_s``) seconds, ``rate_per_s`` requests per second
    on average, sorted by arrival.

    Numbers come from ``fit`` (default ``AZURE_CONV_2023``, fitted to the Azure LLM inference trace
    2023 conversation file): inter-arrival gaps are Gamma distributed with the fit's coefficient of
    variation and mean 1 / ``rate_per_s`` s (the fit's own rate is not used); prompt and output
    lengths are drawn independently from the fit's quantile tables (their rank correlation in the
    trace is 0.07). ``max_prompt_tokens`` clips prompts (the testbed model's context is bounded).

    Deterministic for a seed (numpy ``default_rng(seed)``), and a stream is a prefix of a longer
    one with the same seed and rate. Raises SpecError if ``rate_per_s`` or ``duration_s`` is not a
    finite number > 0, if they ask for more than ``MAX_SYNTHETIC_REQUESTS`` requests, if ``seed`` is
    not an integer >= 0, or if ``max_prompt_tokens`` is below 1.
    """
    source = "synthetic_requests"
    check_positive(source, "rate_per_s", rate_per_s, "give a mean request rate in requests per second > 0")
    check_positive(source, "duration_s", duration_s, "give the stream's length in seconds > 0")
    check_count(source, "max_prompt_tokens", max_prompt_tokens)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise SpecError(source, "seed", seed, "is not an integer >= 0", "give a whole number such as 0")
    if rate_per_s * duration_s > MAX_SYNTHETIC_REQUESTS:
        raise SpecError(
            source,
            "rate_per_s * duration_s",
            rate_per_s * duration_s,
            "requests are too many",
            f"ask for at most {MAX_SYNTHETIC_REQUESTS} (a shorter duration or a lower rate)",
        )

    arrival_rng, prompt_rng, output_rng = np.random.default_rng(seed).spawn(3)
    shape = 1.0 / fit.interarrival_cv**2
    scale = 1.0 / (rate_per_s * shape)  # mean gap = shape * scale = 1 / rate_per_s
    chunks, last = [], 0.0
    while last < duration_s:
        times = last + np.cumsum(arrival_rng.gamma(shape, scale, _CHUNK))
        chunks.append(times)
        last = float(times[-1])
    arrival_s = np.concatenate(chunks)
    arrival_s = arrival_s[arrival_s < duration_s]
    n = len(arrival_s)
    prompt = tokens_from_quantiles(prompt_rng.random(n), fit.prompt_tokens_q)
    if max_prompt_tokens is not None:
        prompt = np.minimum(prompt, max_prompt_tokens)
    output = tokens_from_quantiles(output_rng.random(n), fit.output_tokens_q)
    return [Request(i, float(a), int(p), int(o)) for i, (a, p, o) in enumerate(zip(arrival_s, prompt, output))]


# ---- tables for the run folder ---------------------------------------------------------------
