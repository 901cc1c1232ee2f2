"""Trace column names and the streaming event writer (one module for every name; STYLE.md).

Workers append one JSON line per operation to ``events/w<rank>.jsonl`` and flush it, so a run
that dies still leaves every completed operation on disk; ``to_parquet`` turns the lines into
``events.parquet`` at the end of a run or in ``testbed analyze``.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pandas as pd

SCHEMA_VERSION = 1

# event columns
WORKER, HOST, DC, STAGE, REPLICA = "worker", "host", "dc", "stage", "replica"
ITERATION, MICROBATCH, KIND = "iteration", "microbatch", "kind"
START_NS, END_NS, BYTES, PEER = "start_ns", "end_ns", "bytes", "peer"
REAL_NS, PADDED_NS, LOSS, READY_NS = "real_ns", "padded_ns", "loss", "ready_ns"
#: BubbleTea: on forward/backward, when the input had arrived (``ready_ns``) and how long a running
#: prefill chunk then held the operation back (``prefill_delay_ns``); on prefill chunks, the request,
#: the chunk's first position and its tokens
PREFILL_DELAY_NS, RID, CHUNK_START, TOKENS = "prefill_delay_ns", "rid", "chunk_start", "tokens"
COLUMNS = [WORKER, HOST, DC, STAGE, REPLICA, ITERATION, MICROBATCH, KIND, START_NS, END_NS, BYTES, PEER,
           REAL_NS, PADDED_NS, LOSS, READY_NS, PREFILL_DELAY_NS, RID, CHUNK_START, TOKENS]

# event kinds
FORWARD, BACKWARD, SEND, RECV_WAIT = "forward", "backward", "send", "recv_wait"
ALLREDUCE, OPTIMIZER, IDLE, PREFILL = "allreduce", "optimizer", "idle", "prefill"
COMPUTE_KINDS = (FORWARD, BACKWARD, OPTIMIZER)
KINDS = (FORWARD, BACKWARD, SEND, RECV_WAIT, ALLREDUCE, OPTIMIZER, IDLE, PREFILL)

# link counter columns
T_NS, LINK, CLASSID, TX_BYTES, RATE_BPS = "t_ns", "link", "classid", "tx_bytes", "rate_bps"


class EventWriter:
    """Appends events of one worker as JSON lines, flushed at once (survives the writer's death)."""

    def __init__(self, path: Path, **fixed) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(path, "a", buffering=1)
        self.fixed = fixed

    def write(self, kind: str, start_ns: int, end_ns: int, **fields) -> None:
        self._f.write(json.dumps({**self.fixed, KIND: kind, START_NS: start_ns, END_NS: end_ns, **fields}) + "\n")

    def close(self) -> None:
        self._f.close()


#: This machine's CLOCK_MONOTONIC minus the run's reference clock (the runner's), in ns: set by
#: ``--backend remote`` for processes on other machines (clock_offsets.json records how it was
#: estimated); 0 on the runner's machine.
CLOCK_OFFSET_NS = int(os.environ.get("TESTBED_CLOCK_OFFSET_NS", "0"))


def now_ns() -> int:
    """CLOCK_MONOTONIC nanoseconds (shared by every namespace on one machine), in the run's
    reference clock (see CLOCK_OFFSET_NS)."""
    return time.monotonic_ns() - CLOCK_OFFSET_NS


def read_events(run_dir: Path) -> pd.DataFrame:
    """Every event of a run, from ``events.parquet`` or else from the JSON lines; a torn last line
    (writer killed mid-write) is skipped."""
    parquet = run_dir / "events.parquet"
    if parquet.exists():
        return pd.read_parquet(parquet)
    rows = []
    for path in sorted((run_dir / "events").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
    df = pd.DataFrame(rows)
    for col in COLUMNS:
        if col not in df:
            df[col] = pd.NA
    return df


def to_parquet(run_dir: Path) -> pd.DataFrame:
    df = read_events(run_dir)
    if len(df):
        df.to_parquet(run_dir / "events.parquet", index=False)
    return df


def read_link_counters(run_dir: Path) -> pd.DataFrame:
    path = run_dir / "link_counters.jsonl"
    if not path.exists():
        return pd.DataFrame(columns=[T_NS, LINK, CLASSID, TX_BYTES, RATE_BPS])
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return pd.DataFrame(rows, columns=[T_NS, LINK, CLASSID, TX_BYTES, RATE_BPS])
