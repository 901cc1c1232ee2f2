"""Hand-built trace rows for the unit tests (times given in ms, stored in ns)."""

from __future__ import annotations

from testbed.trace import schema as T

MS = 1_000_000


def event_row(
    worker: int,
    host: str,
    dc: str,
    stage: int,
    replica: int,
    kind: str,
    it: int,
    mb: int,
    start_ms: float,
    end_ms: float,
    **extra,
) -> dict:
    """One event row with every trace column (unset ones None)."""
    row = dict.fromkeys(T.COLUMNS)
    row.update(
        {
            T.WORKER: worker,
            T.HOST: host,
            T.DC: dc,
            T.STAGE: stage,
            T.REPLICA: replica,
            T.ITERATION: it,
            T.MICROBATCH: mb,
            T.KIND: kind,
            T.START_NS: int(start_ms * MS),
            T.END_NS: int(end_ms * MS),
        }
    )
    row.update(extra)
    return row
