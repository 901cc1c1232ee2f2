"""Workers as data: one worker = one emulated GPU, and the rank of (stage, replica)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WorkerSpec:
    """One worker = one emulated GPU: global rank, pipeline stage, data-parallel replica, host."""

    rank: int
    stage: int
    replica: int
    host: str
    dc: str


def rank_of(stage: int, replica: int, replicas: int) -> int:
    """Global rank of (stage, replica): stage x replicas + replica, under every placement."""
    return stage * replicas + replica
