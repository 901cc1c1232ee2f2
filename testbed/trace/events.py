"""The workers' event files: the streaming writer, and reading a run's events and link counters.

Workers append one JSON line per operation to ``events/w<rank>.jsonl`` and flush it, so a run
that dies still leaves every completed operation on disk; ``to_parquet`` turns the lines into
``events.parquet`` at the end of a run or in ``testbed analyze``. Column names: ``schema.py``.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pandas as pd

from testbed.trace import schema as T
from testbed.trace.jsonl import open_jsonl, read_jsonl, write_row


class EventWriter:
    """Appends events of one worker as JSON lines, flushed at once (survives the writer's death).
    ``fixed``: columns every row carries (worker, host, dc, stage, replica). ``defer`` keeps an
    event to be written by ``write_deferred`` (or the next ``write``, before its own): the worker
    writes a receive's wait once the operation it feeds has started, off that operation's
    critical path; a worker killed in between loses at most those events. Thread-safe (a worker's
    bubble filler writes beside it, ``bubbletea/prefill.py``)."""

    def __init__(self, path: Path, **fixed: Any) -> None:
        self._f = open_jsonl(path)
        self.fixed = fixed
        self._deferred: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def _row(self, kind: str, start_ns: int, end_ns: int, fields: dict[str, Any]) -> dict[str, Any]:
        return {**self.fixed, T.KIND: kind, T.START_NS: start_ns, T.END_NS: end_ns, **fields}

    def write(self, kind: str, start_ns: int, end_ns: int, **fields: Any) -> None:
        row = self._row(kind, start_ns, end_ns, fields)
        with self._lock:
            self._write_deferred()
            write_row(self._f, row)

    def defer(self, kind: str, start_ns: int, end_ns: int, **fields: Any) -> None:
        row = self._row(kind, start_ns, end_ns, fields)
        with self._lock:
            self._deferred.append(row)

    def write_deferred(self) -> None:
        with self._lock:
            self._write_deferred()

    def _write_deferred(self) -> None:
        for row in self._deferred:
            write_row(self._f, row)
        self._deferred.clear()

    def close(self) -> None:
        with self._lock:
            self._write_deferred()
            self._f.close()


def read_events(run_dir: Path) -> pd.DataFrame:
    """Every event of a run, from ``events.parquet`` or else from the JSON lines (a torn last line,
    from a writer killed mid-write, is skipped); every column of ``schema.COLUMNS`` is present (a
    run from before a column was added has it empty)."""
    parquet = run_dir / "events.parquet"
    df = pd.read_parquet(parquet) if parquet.exists() else pd.DataFrame(read_jsonl(run_dir / "events", "*.jsonl"))
    for col in T.COLUMNS:
        if col not in df:
            df[col] = pd.NA
    return df


def to_parquet(run_dir: Path) -> pd.DataFrame:
    df = read_events(run_dir)
    if len(df):
        df.to_parquet(run_dir / "events.parquet", index=False)
    return df


def read_link_counters(run_dir: Path) -> pd.DataFrame:
    """The WAN class byte counters sampled during a run (``link_counters.jsonl``)."""
    return pd.DataFrame(read_jsonl(run_dir / "link_counters.jsonl"), columns=T.LINK_COUNTER_COLUMNS)
