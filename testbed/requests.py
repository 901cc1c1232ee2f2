"""LLM inference requests for BubbleTea: the prefill work placed into training pipeline bubbles.

Two sources of a request stream, both returning ``Request`` rows sorted by arrival:

- ``load_azure_trace`` replays a file of the published Azure LLM inference trace 2023
  (``TIMESTAMP,ContextTokens,GeneratedTokens``), optionally stretched in time or in load;
- ``synthetic_requests`` draws a stream whose prompt lengths, output lengths and inter-arrival
  times follow distributions fitted to that trace's conversation file (``AZURE_CONV_2023``).

``requests_to_frame`` / ``requests_from_frame`` turn a stream into a tidy table (one row per
request) for the run folder, and back.
"""
from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from .errors import SpecError

# Column names of the request table in a run folder, and of the Azure trace files.
COLUMNS = ("rid", "arrival_s", "prompt_tokens", "output_tokens")
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")

# Cumulative probabilities of the quantile tables below: denser in the tails, where a log-normal
# fits the trace worst (the 0.999..1 segment holds the single longest prompt).
QUANTILE_PROBS = (0.0, 0.01, 0.05, 0.10, 0.15, 0.20, 0.25, 0.30, 0.35, 0.40, 0.45, 0.50, 0.55, 0.60,
                  0.65, 0.70, 0.75, 0.80, 0.85, 0.90, 0.95, 0.99, 0.995, 0.999, 1.0)

MAX_SYNTHETIC_REQUESTS = 10_000_000  # rate_per_s * duration_s beyond this would not fit in memory comfortably
_CHUNK = 4096                          # gaps drawn per step; fixed, so a shorter stream is a prefix of a longer one
_TIMESTAMP = re.compile(r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(\.\d{1,9})?")
_INTEGER = re.compile(r"[+-]?\d{1,15}")


@dataclass(frozen=True)
class Request:
    """One inference request: ``arrival_s`` seconds after the stream starts, a prompt to prefill
    (``prompt_tokens``) and the number of tokens the decode machines then generate."""
    rid: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int


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
    prompt_tokens_q=(2.0, 29.0, 181.0, 207.0, 372.0, 387.0, 396.0, 403.0, 414.0, 703.0, 984.0, 1020.0,
                     1045.0, 1071.0, 1097.0, 1130.0, 1189.0, 1315.0, 1876.2, 2734.5, 4083.0, 4142.0,
                     4831.0, 6179.1, 14050.0),
    output_tokens_q=(7.0, 16.0, 41.0, 54.0, 67.0, 77.0, 85.0, 91.0, 96.0, 103.0, 113.0, 129.0, 151.0,
                     177.0, 217.0, 384.0, 395.0, 400.0, 411.0, 424.0, 451.0, 601.0, 643.2, 954.0, 1000.0),
    rate_per_s=5.5301,
    interarrival_cv=1.0942,
)


# ---- the published trace ---------------------------------------------------------------------

def load_azure_trace(path: str | Path, *, time_scale: float = 1.0, rate_factor: float = 1.0,
                     max_prompt_tokens: int | None = None, limit: int | None = None) -> list[Request]:
    """Requests of an Azure LLM inference trace 2023 CSV file, sorted by arrival.

    The file has the header ``TIMESTAMP,ContextTokens,GeneratedTokens`` (any order) and one row per
    request, e.g. ``2023-11-16 18:15:46.6805900,374,44``: the arrival time (no time zone, up to 9
    fractional digits), the prompt length and the output length in tokens (whole numbers >= 1).

    - ``arrival_s`` = (timestamp - earliest timestamp) in seconds * ``time_scale`` / ``rate_factor``.
      ``time_scale`` maps trace seconds to testbed seconds (2 = everything happens half as fast,
      e.g. to match a testbed whose compute is slower than the GPUs of the trace); ``rate_factor``
      scales the load (2 = twice as many requests per second). Both must be > 0.
    - Rows out of time order are sorted (stably; ``rid`` is the position in arrival order, 0-based).
    - ``max_prompt_tokens`` clips prompts to that length: the testbed's small model has a bounded
      context, so a longer prompt counts as ``max_prompt_tokens`` tokens (outputs are not clipped).
    - ``limit`` keeps the ``limit`` earliest requests.

    Raises SpecError naming the file, the 1-based line, the column, the bad value and the fix for:
    a missing, empty or unreadable file; missing or extra header columns; a row with too many
    fields; an unparsable timestamp; a token count that is not a whole number or is below 1; and
    for a non-positive ``time_scale``/``rate_factor`` or a ``max_prompt_tokens``/``limit`` below 1.
    """
    source = str(path)
    _check_positive(source, "time_scale", time_scale, "give a factor > 0 (1 keeps the trace's own seconds)")
    _check_positive(source, "rate_factor", rate_factor, "give a factor > 0 (1 keeps the trace's load)")
    _check_count(source, "max_prompt_tokens", max_prompt_tokens)
    _check_count(source, "limit", limit)
    table = _read_azure_csv(source)

    stamps = table["TIMESTAMP"].str.strip()
    bad = ~stamps.str.fullmatch(_TIMESTAMP)
    when = pd.to_datetime(stamps.where(~bad), format="ISO8601", errors="coerce")
    _fail_first(source, table, "TIMESTAMP", bad | when.isna(), "is not a timestamp",
                "write it as YYYY-MM-DD HH:MM:SS.fffffff, e.g. 2023-11-16 18:15:46.6805900, without a time zone")
    years = when.dt.year
    _fail_first(source, table, "TIMESTAMP", (years < 1678) | (years > 2261), "is outside the years 1678-2261",
                "fix the date (nanosecond timestamps cover 1678 to 2261)")
    prompt = _token_column(source, table, "ContextTokens")
    output = _token_column(source, table, "GeneratedTokens")

    ns = when.to_numpy(dtype="datetime64[ns]").astype(np.int64)
    order = np.argsort(ns, kind="stable")
    if limit is not None:
        order = order[:limit]
    arrival_s = (ns[order] - ns[order[0]]) / 1e9 * (time_scale / rate_factor)
    prompt = prompt[order]
    if max_prompt_tokens is not None:
        prompt = np.minimum(prompt, max_prompt_tokens)
    return [Request(i, float(a), int(p), int(o)) for i, (a, p, o) in enumerate(zip(arrival_s, prompt, output[order]))]


def _read_azure_csv(source: str) -> pd.DataFrame:
    """The data rows as strings (row i is line i + 2 of the file), after checking the header."""
    fix_header = f"the first line must be the header {','.join(AZURE_COLUMNS)}"
    try:
        with open(source, encoding="utf-8-sig") as f:
            header = [h.strip() for h in f.readline().split(",")]
        if header == [""]:
            raise SpecError(source, "(file)", "", "is empty", f"{fix_header}, then one row per request")
        missing = [c for c in AZURE_COLUMNS if c not in header]
        extra = [c for c in header if c not in AZURE_COLUMNS]
        if missing or extra or len(set(header)) != len(header):
            problem = "; ".join(p for p in (f"lacks column {', '.join(missing)}" if missing else "",
                                            f"has unknown column {', '.join(extra)}" if extra else "") if p)
            raise SpecError(source, "line 1 (header)", ",".join(header), problem or "repeats a column", fix_header)
        # header=None: the header line fixes the field count, so a longer row is an error, never an index
        table = pd.read_csv(source, header=None, dtype=str, keep_default_na=False, skip_blank_lines=False,
                            encoding="utf-8-sig")
    except FileNotFoundError:
        raise SpecError(source, "(file)", source, "does not exist", "give the path of a trace CSV file") from None
    except pd.errors.ParserError as e:
        m = re.search(r"Expected \d+ fields in line (\d+), saw (\d+)", str(e))
        if not m:
            raise SpecError(source, "(file)", str(e)[:100], "is not CSV", fix_header + ", then one row per request") from None
        line = int(m.group(1))
        with open(source, encoding="utf-8-sig") as f:
            text = next(itertools.islice(f, line - 1, None), "").rstrip("\r\n")
        raise SpecError(source, f"line {line}, column {len(header) + 1} (beyond the header)", text,
                        f"has {m.group(2)} fields", f"give each row exactly the {len(header)} fields of the header "
                        f"{','.join(header)}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(source, "(file)", source, f"cannot be read as UTF-8 text ({type(e).__name__})",
                        "check the path, its permissions and that it is the CSV, not a compressed copy") from None
    table = table.iloc[1:].set_axis(header, axis=1).reset_index(drop=True)
    if table.empty:
        raise SpecError(source, "(file)", ",".join(header), "has a header but no requests", "add one row per request")
    return table


def _fail_first(source: str, table: pd.DataFrame, column: str, bad: pd.Series, problem: str, fix: str) -> None:
    if bad.any():
        row = int(np.flatnonzero(bad.to_numpy())[0])
        raise SpecError(source, f"line {row + 2}, column {column}", table[column].iloc[row], problem, fix)


def _token_column(source: str, table: pd.DataFrame, column: str) -> np.ndarray:
    text = table[column].str.strip()
    whole = text.str.fullmatch(_INTEGER)
    _fail_first(source, table, column, ~whole, "is not a whole number of tokens", "write a whole number >= 1")
    values = text.astype(np.int64).to_numpy()
    _fail_first(source, table, column, pd.Series(values < 1), "is not a positive token count",
                "a request has at least 1 token; fix or delete the row")
    return values


# ---- fitting and synthetic streams -----------------------------------------------------------

def fit_trace(reqs: Sequence[Request]) -> TraceFit:
    """Fit ``TraceFit`` to a request stream (at least 3 requests, sorted by arrival).

    Token quantiles are numpy's linearly interpolated sample quantiles at ``QUANTILE_PROBS``
    (rounded to 0.1 token); the rate is (n - 1) / (last - first arrival) in requests per second;
    the CV is the population standard deviation of the gaps over their mean. Raises SpecError if
    there are fewer than 3 requests or all arrive at one instant.
    """
    if len(reqs) < 3:
        raise SpecError("fit_trace", "reqs", len(reqs), "requests are too few to fit", "give at least 3")
    frame = requests_to_frame(reqs)
    gaps = np.diff(frame["arrival_s"].to_numpy())
    if gaps.mean() <= 0:
        raise SpecError("fit_trace", "reqs", f"{len(reqs)} requests", "all arrive at one instant",
                        "give a stream that spans some time")

    def table(column: str) -> tuple[float, ...]:
        return tuple(round(float(q), 1) for q in np.quantile(frame[column].to_numpy(), QUANTILE_PROBS))

    return TraceFit(table("prompt_tokens"), table("output_tokens"), round(1.0 / float(gaps.mean()), 4),
                    round(float(gaps.std() / gaps.mean()), 4))


def tokens_from_quantiles(u: np.ndarray, quantiles: Sequence[float]) -> np.ndarray:
    """Token counts (int64, >= 1) at cumulative probabilities ``u`` in [0, 1], from a table of token
    counts at ``QUANTILE_PROBS``, interpolated linearly in log tokens and rounded to whole tokens."""
    if len(quantiles) != len(QUANTILE_PROBS) or min(quantiles) < 1 or list(quantiles) != sorted(quantiles):
        raise SpecError("tokens_from_quantiles", "quantiles", tuple(quantiles), "is not a quantile table",
                        f"give {len(QUANTILE_PROBS)} ascending token counts >= 1, one per QUANTILE_PROBS entry")
    logs = np.interp(u, QUANTILE_PROBS, np.log(np.asarray(quantiles, dtype=float)))
    return np.maximum(np.rint(np.exp(logs)), 1).astype(np.int64)


def synthetic_requests(rate_per_s: float, duration_s: float, seed: int, *, max_prompt_tokens: int | None = None,
                       fit: TraceFit = AZURE_CONV_2023) -> list[Request]:
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
    _check_positive(source, "rate_per_s", rate_per_s, "give a mean request rate in requests per second > 0")
    _check_positive(source, "duration_s", duration_s, "give the stream's length in seconds > 0")
    _check_count(source, "max_prompt_tokens", max_prompt_tokens)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise SpecError(source, "seed", seed, "is not an integer >= 0", "give a whole number such as 0")
    if rate_per_s * duration_s > MAX_SYNTHETIC_REQUESTS:
        raise SpecError(source, "rate_per_s * duration_s", rate_per_s * duration_s, "requests are too many",
                        f"ask for at most {MAX_SYNTHETIC_REQUESTS} (a shorter duration or a lower rate)")

    arrival_rng, prompt_rng, output_rng = np.random.default_rng(seed).spawn(3)
    shape = 1.0 / fit.interarrival_cv ** 2
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

def requests_to_frame(reqs: Sequence[Request]) -> pd.DataFrame:
    """One row per request, columns ``COLUMNS`` (rid, arrival_s in seconds, prompt_tokens,
    output_tokens), typed int64 / float64 / int64 / int64."""
    return pd.DataFrame({
        "rid": np.array([r.rid for r in reqs], dtype=np.int64),
        "arrival_s": np.array([r.arrival_s for r in reqs], dtype=np.float64),
        "prompt_tokens": np.array([r.prompt_tokens for r in reqs], dtype=np.int64),
        "output_tokens": np.array([r.output_tokens for r in reqs], dtype=np.int64),
    }, columns=list(COLUMNS))


def requests_from_frame(df: pd.DataFrame, source: str = "requests table") -> list[Request]:
    """The requests of a table written by ``requests_to_frame``, in row order. ``source`` names the
    table (e.g. its file) in errors. Raises SpecError naming the row, the column and the value if a
    column is missing, an arrival is not a finite number >= 0, or a token count or rid is not a
    whole number (token counts >= 1)."""
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise SpecError(source, "columns", list(map(str, df.columns)), f"lack {', '.join(missing)}",
                        f"give the columns {', '.join(COLUMNS)}")
    rows = []
    for i, (rid, arrival, prompt, output) in enumerate(df[list(COLUMNS)].itertuples(index=False, name=None)):
        for column, value, least in (("rid", rid, 0), ("prompt_tokens", prompt, 1), ("output_tokens", output, 1)):
            if not _is_whole(value) or value < least:
                raise SpecError(source, f"row {i}, column {column}", value, f"is not a whole number >= {least}",
                                "rewrite the table with requests_to_frame")
        if not isinstance(arrival, (int, float, np.number)) or not math.isfinite(arrival) or arrival < 0:
            raise SpecError(source, f"row {i}, column arrival_s", arrival, "is not a finite number of seconds >= 0",
                            "rewrite the table with requests_to_frame")
        rows.append(Request(int(rid), float(arrival), int(prompt), int(output)))
    return rows


# ---- argument checks -------------------------------------------------------------------------

def _is_whole(value: object) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return False
    if isinstance(value, (int, np.integer)):
        return True
    return isinstance(value, (float, np.floating)) and math.isfinite(value) and float(value).is_integer()


def _check_positive(source: str, field: str, value: object, fix: str) -> None:
    ok = isinstance(value, (int, float, np.number)) and not isinstance(value, (bool, np.bool_))
    if not ok or not math.isfinite(value) or value <= 0:
        raise SpecError(source, field, value, "is not a finite number > 0", fix)


def _check_count(source: str, field: str, value: object) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1):
        raise SpecError(source, field, value, "is not a whole number >= 1", "give a whole number >= 1, or None for no bound")
