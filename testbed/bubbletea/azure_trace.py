"""The published Azure LLM inference trace of 2023 (Patel et al., "Splitwise", ISCA 2024): reading a
file of it into ``requests.Request`` rows, and fitting the distributions the synthetic stream
draws from (``requests.TraceFit``). The trace's files do not ship with the testbed.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from testbed.bubbletea.request_table import Request, check_count, check_positive, requests_to_frame
from testbed.bubbletea.requests import AZURE_COLUMNS, QUANTILE_PROBS, TraceFit
from testbed.errors import SpecError

_TIMESTAMP = re.compile(r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(\.\d{1,9})?")
_INTEGER = re.compile(r"[+-]?\d{1,15}")


def load_azure_trace(
    path: str | Path,
    *,
    time_scale: float = 1.0,
    rate_factor: float = 1.0,
    max_prompt_tokens: int | None = None,
    limit: int | None = None,
) -> list[Request]:
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
    check_positive(source, "time_scale", time_scale, "give a factor > 0 (1 keeps the trace's own seconds)")
    check_positive(source, "rate_factor", rate_factor, "give a factor > 0 (1 keeps the trace's load)")
    check_count(source, "max_prompt_tokens", max_prompt_tokens)
    check_count(source, "limit", limit)
    table = _read_azure_csv(source)

    stamps = table["TIMESTAMP"].str.strip()
    bad = ~stamps.str.fullmatch(_TIMESTAMP)
    when = pd.to_datetime(stamps.where(~bad), format="ISO8601", errors="coerce")
    _fail_first(
        source,
        table,
        "TIMESTAMP",
        bad | when.isna(),
        "is not a timestamp",
        "write it as YYYY-MM-DD HH:MM:SS.fffffff, e.g. 2023-11-16 18:15:46.6805900, without a time zone",
    )
    years = when.dt.year
    _fail_first(
        source,
        table,
        "TIMESTAMP",
        (years < 1678) | (years > 2261),
        "is outside the years 1678-2261",
        "fix the date (nanosecond timestamps cover 1678 to 2261)",
    )
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
    """The data rows as strings (index i is line i + 2 of the file; blank lines dropped), after
    checking the header (column names may be quoted)."""
    fix_header = f"the first line must be the header {','.join(AZURE_COLUMNS)}"
    try:
        with open(source, encoding="utf-8-sig") as f:
            header = [h.strip().strip('"').strip() for h in f.readline().split(",")]  # quoted names too
        if header == [""]:
            raise SpecError(source, "(file)", "", "is empty", f"{fix_header}, then one row per request")
        missing = [c for c in AZURE_COLUMNS if c not in header]
        extra = [c for c in header if c not in AZURE_COLUMNS]
        if missing or extra or len(set(header)) != len(header):
            problem = "; ".join(
                p
                for p in (
                    f"lacks column {', '.join(missing)}" if missing else "",
                    f"has unknown column {', '.join(extra)}" if extra else "",
                )
                if p
            )
            raise SpecError(source, "line 1 (header)", ",".join(header), problem or "repeats a column", fix_header)
        # header=None: the header line fixes the field count, so a longer row is an error, never an index
        table = pd.read_csv(
            source, header=None, dtype=str, keep_default_na=False, skip_blank_lines=False, encoding="utf-8-sig"
        )
    except FileNotFoundError:
        raise SpecError(source, "(file)", source, "does not exist", "give the path of a trace CSV file") from None
    except pd.errors.ParserError as e:
        m = re.search(r"Expected \d+ fields in line (\d+), saw (\d+)", str(e))
        if not m:
            raise SpecError(
                source, "(file)", str(e)[:100], "is not CSV", fix_header + ", then one row per request"
            ) from None
        line = int(m.group(1))
        with open(source, encoding="utf-8-sig") as f:
            text = next(itertools.islice(f, line - 1, None), "").rstrip("\r\n")
        raise SpecError(
            source,
            f"line {line}, column {len(header) + 1} (beyond the header)",
            text,
            f"has {m.group(2)} fields",
            f"give each row exactly the {len(header)} fields of the header {','.join(header)}",
        ) from None
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(
            source,
            "(file)",
            source,
            f"cannot be read as UTF-8 text ({type(e).__name__})",
            "check the path, its permissions and that it is the CSV, not a compressed copy",
        ) from None
    table = table.iloc[1:].set_axis(header, axis=1).reset_index(drop=True)
    table = table[~(table == "").all(axis=1)]  # blank lines (a file's trailing one): skipped, numbering kept
    if table.empty:
        raise SpecError(source, "(file)", ",".join(header), "has a header but no requests", "add one row per request")
    return table


def _fail_first(source: str, table: pd.DataFrame, column: str, bad: pd.Series, problem: str, fix: str) -> None:
    if bad.any():
        row = int(np.flatnonzero(bad.to_numpy())[0])  # position; the index holds the line (line - 2)
        line = int(table.index[row]) + 2
        raise SpecError(source, f"line {line}, column {column}", table[column].iloc[row], problem, fix)


def _token_column(source: str, table: pd.DataFrame, column: str) -> np.ndarray:
    text = table[column].str.strip()
    whole = text.str.fullmatch(_INTEGER)
    _fail_first(source, table, column, ~whole, "is not a whole number of tokens", "write a whole number >= 1")
    values = text.astype(np.int64).to_numpy()
    _fail_first(
        source,
        table,
        column,
        pd.Series(values < 1),
        "is not a positive token count",
        "a request has at least 1 token; fix or delete the row",
    )
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
        raise SpecError(
            "fit_trace",
            "reqs",
            f"{len(reqs)} requests",
            "all arrive at one instant",
            "give a stream that spans some time",
        )

    def table(column: str) -> tuple[float, ...]:
        return tuple(round(float(q), 1) for q in np.quantile(frame[column].to_numpy(), QUANTILE_PROBS))

    return TraceFit(
        table("prompt_tokens"),
        table("output_tokens"),
        round(1.0 / float(gaps.mean()), 4),
        round(float(gaps.std() / gaps.mean()), 4),
    )
