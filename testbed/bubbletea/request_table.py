"""An inference request (``Request``) and the request table of a run folder (one row per request:
``requests_to_frame`` / ``requests_from_frame``), with the argument checks the request sources
share (``requests.py``, ``azure_trace.py``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from testbed.errors import SpecError

#: the columns of the request table in a run folder
COLUMNS = ("rid", "arrival_s", "prompt_tokens", "output_tokens")


@dataclass(frozen=True)
class Request:
    """One inference request: ``arrival_s`` seconds after the stream starts, a prompt to prefill
    (``prompt_tokens``) and the number of tokens the decode machines then generate."""

    rid: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int


def requests_to_frame(reqs: Sequence[Request]) -> pd.DataFrame:
    """One row per request, columns ``COLUMNS`` (rid, arrival_s in seconds, prompt_tokens,
    output_tokens), typed int64 / float64 / int64 / int64."""
    return pd.DataFrame(
        {
            "rid": np.array([r.rid for r in reqs], dtype=np.int64),
            "arrival_s": np.array([r.arrival_s for r in reqs], dtype=np.float64),
            "prompt_tokens": np.array([r.prompt_tokens for r in reqs], dtype=np.int64),
            "output_tokens": np.array([r.output_tokens for r in reqs], dtype=np.int64),
        },
        columns=list(COLUMNS),
    )


def requests_from_frame(df: pd.DataFrame, source: str = "requests table") -> list[Request]:
    """The requests of a table written by ``requests_to_frame``, in row order. ``source`` names the
    table (e.g. its file) in errors. Raises SpecError naming the row, the column and the value if a
    column is missing, an arrival is not a finite number >= 0, or a token count or rid is not a
    whole number (token counts >= 1)."""
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise SpecError(
            source,
            "columns",
            list(map(str, df.columns)),
            f"lack {', '.join(missing)}",
            f"give the columns {', '.join(COLUMNS)}",
        )
    rows = []
    for i, (rid, arrival, prompt, output) in enumerate(df[list(COLUMNS)].itertuples(index=False, name=None)):
        for column, value, least in (("rid", rid, 0), ("prompt_tokens", prompt, 1), ("output_tokens", output, 1)):
            if not is_whole(value) or value < least:
                raise SpecError(
                    source,
                    f"row {i}, column {column}",
                    value,
                    f"is not a whole number >= {least}",
                    "rewrite the table with requests_to_frame",
                )
        if not isinstance(arrival, (int, float, np.number)) or not math.isfinite(arrival) or arrival < 0:
            raise SpecError(
                source,
                f"row {i}, column arrival_s",
                arrival,
                "is not a finite number of seconds >= 0",
                "rewrite the table with requests_to_frame",
            )
        rows.append(Request(int(rid), float(arrival), int(prompt), int(output)))
    return rows


# ---- argument checks -------------------------------------------------------------------------


def is_whole(value: object) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return False
    if isinstance(value, (int, np.integer)):
        return True
    return isinstance(value, (float, np.floating)) and math.isfinite(value) and float(value).is_integer()


def check_positive(source: str, field: str, value: object, fix: str) -> None:
    ok = isinstance(value, (int, float, np.number)) and not isinstance(value, (bool, np.bool_))
    if not ok or not math.isfinite(value) or value <= 0:
        raise SpecError(source, field, value, "is not a finite number > 0", fix)


def check_count(source: str, field: str, value: object) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1):
        raise SpecError(
            source, field, value, "is not a whole number >= 1", "give a whole number >= 1, or None for no bound"
        )
