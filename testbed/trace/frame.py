"""A dilated run's figures in the emulated frame (``spec/dilation.py``): the run went ``k`` times
slower than the world it emulates, so each duration it measured is divided by ``k`` and each rate
multiplied by it; counts, shares, sizes and names stay as measured. A summary figure's kind comes
from its unit (``trace/metrics.py``): ``s``, ``ms``, ``µs`` are durations, ``.../s`` rates. Inside
the figures that hold records (``outages``, ``profile_phases``), a key's suffix says its kind
(``_s``, ``_ms``, ``_us``; ``_bps``). The machine's own settings and the start-up stay in real
time (``REAL_TIME``): nothing dilated them. Tables for plots and the Chrome trace go over by their
columns' names (``in_frame``); the traces in the run folder stay in real time, as recorded."""

from __future__ import annotations

from typing import Any

import pandas as pd

from testbed.trace import metrics as M

#: ``config.json``'s record of the dilation a run ran with (``run/records.write_config``)
TIME_DILATION_KEY = "time_dilation_applied"
#: units of durations and of rates (per second)
DURATIONS = ("s", "ms", "µs")
RATES = ("tokens/s",)
#: figures that stay in real time: settings of the machine, and the start-up (processes starting, not the world)
REAL_TIME = frozenset({M.STARTUP_S, M.TRAINING_SLICE_MS, M.SWITCH_INTERVAL_US})
#: figures holding records whose keys say their kind by suffix
RECORDS = frozenset({M.OUTAGES, M.PROFILE_PHASES})


def run_dilation(config: dict[str, Any]) -> float:
    """The time dilation a run folder's ``config.json`` ran with (1: none, or a run from before)."""
    return float(config.get(TIME_DILATION_KEY) or 1.0)


def _scaled(value: Any, factor: float) -> Any:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return value * factor
    if isinstance(value, dict):
        return {k: _scaled(v, factor) for k, v in value.items()}
    if isinstance(value, list):
        return [_scaled(v, factor) for v in value]
    return value


def _record(value: Any, k: float) -> Any:
    """A record's keys converted by suffix (module doc), recursively."""
    if isinstance(value, list):
        return [_record(v, k) for v in value]
    if not isinstance(value, dict):
        return value
    out = {}
    for key, v in value.items():
        if _is_duration(key):
            out[key] = _scaled(v, 1 / k)
        elif _is_rate(key):
            out[key] = _scaled(v, k)
        else:
            out[key] = _record(v, k)
    return out


def to_emulated_frame(summary: dict[str, Any], k: float) -> dict[str, Any]:
    """``summary`` (``summary.json``'s figures, measured in real time) in the emulated frame of a
    run dilated ``k`` times, with ``time_dilation`` set to ``k``. Raises ValueError for k < 1."""
    if not k >= 1:
        raise ValueError(f"time dilation {k!r}: a factor of 1 or more")
    return {**_converted(summary, k), M.TIME_DILATION: k}


def to_real_frame(summary: dict[str, Any]) -> dict[str, Any]:
    """A ``summary.json`` back in the real time its run was measured in (its ``time_dilation``
    undone; ``time_dilation`` kept): what the simulator, which models the run as it ran (its
    ``config.json``), compares with."""
    k = float(summary.get(M.TIME_DILATION) or 1.0)
    return {**_converted(summary, 1 / k), M.TIME_DILATION: k}


def _converted(summary: dict[str, Any], k: float) -> dict[str, Any]:
    """``summary`` with its durations divided by ``k`` and its rates multiplied by it (module doc)."""
    units = {m.name: m.unit for m in M.METRICS}
    out: dict[str, Any] = {}
    for key, value in summary.items():
        unit = units.get(key, "")
        if k == 1 or key in REAL_TIME:
            out[key] = value
        elif key in RECORDS:
            out[key] = _record(value, k)
        elif unit in DURATIONS:
            out[key] = _scaled(value, 1 / k)
        elif unit in RATES:
            out[key] = _scaled(value, k)
        else:
            out[key] = value
    return out


def _is_duration(name: str) -> bool:
    return name.endswith(("_ns", "_s", "_ms", "_us")) and not name.endswith("_per_s")


def _is_rate(name: str) -> bool:
    return name == "bps" or name.endswith(("_bps", "_per_s"))


def in_frame(table: pd.DataFrame, k: float) -> pd.DataFrame:
    """``table`` (events, link samples, configured rates, grant intervals: real time) in the
    emulated frame of a run dilated ``k`` times: each column whose name ends in ``_ns``, ``_s``,
    ``_ms`` or ``_us`` divided by ``k`` (times as well as durations: a time scaled keeps its
    differences scaled), each rate (``bps``, ``..._bps``, ``..._per_s``) multiplied by it. ``k`` = 1
    returns ``table`` itself."""
    if k == 1:
        return table
    out = table.copy()
    for col in out.columns:
        if not pd.api.types.is_numeric_dtype(out[col]) or pd.api.types.is_bool_dtype(out[col]):
            continue
        if _is_duration(str(col)):
            out[col] = out[col] / k
        elif _is_rate(str(col)):
            out[col] = out[col] * k
    return out


def rows_in_frame(rows: list[dict[str, Any]], k: float) -> list[dict[str, Any]]:
    """Log rows (``shaping.jsonl``'s) with their times in the emulated frame, as ``in_frame``."""
    if k == 1:
        return rows
    return [
        {
            key: v / k if _is_duration(key) and isinstance(v, (int, float)) and not isinstance(v, bool) else v
            for key, v in r.items()
        }
        for r in rows
    ]
