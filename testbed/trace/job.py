"""The testbed's event lines from a user's own job (``testbed launch``): a small helper the job
may call, so that its timeline, bubbles and iteration time appear as for a built-in run.

    from testbed.trace.job import JobTrace

    trace = JobTrace()
    trace.watch(stage_module)            # each forward and backward pass of this rank's stage
    for step in range(steps):
        trace.iteration(step)            # marks the iteration (Atlas's sharing also reads it)
        ...                              # the pipeline schedule's step
        with trace.op("allreduce", step):
            ...
        with trace.op("optimizer", step):  # an iteration ends with its last optimizer step
            opt.step()
    trace.close()

Each rank appends one JSON line per operation to ``events/w<rank>.jsonl`` in the job's folder
(``JOB_DIR_ENV``), with the columns of a built-in worker's events (``schema.py``: worker, host,
dc, stage, replica from the job's placement; iteration, microbatch, kind, CLOCK_MONOTONIC start
and end in ns), flushed at once: a job that dies keeps what it wrote. Outside ``testbed launch``
(no ``JOB_DIR_ENV``) every call does nothing, so the job runs unchanged anywhere.

Microbatches are counted per iteration in the order the passes run: the k-th forward of an
iteration is microbatch k, and so is the k-th backward (the order of 1F1B and GPipe). A pass's
backward begins when the gradient of the module's output arrives (a tensor hook on the output)
and ends when the gradients of every parameter of the module are in
(``torch.autograd.graph.register_multi_grad_hook``).
"""

from __future__ import annotations

import atexit
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from testbed.trace import schema as T
from testbed.trace.clock import now_ns
from testbed.trace.events import EventWriter

#: the job's folder, set by ``testbed launch`` in every rank's environment
JOB_DIR_ENV = "TESTBED_JOB_DIR"
#: where ``testbed launch`` writes the job's placement, in its folder
JOB_FILE = "job.json"


def rank_placement(job_dir: Path, rank: int) -> dict[str, Any]:
    """This rank's worker, host, dc, stage and replica from the job's ``job.json``. Raises
    KeyError for a rank the job's placement does not hold."""
    workers = json.loads((job_dir / JOB_FILE).read_text())["workers"]
    mine = next((w for w in workers if w["rank"] == rank), None)
    if mine is None:
        raise KeyError(f"rank {rank} is not in {job_dir / JOB_FILE}")
    return {T.WORKER: rank, T.HOST: mine["host"], T.DC: mine["dc"], T.STAGE: mine["stage"], T.REPLICA: mine["replica"]}


_writer: EventWriter | None = None


def rank_writer() -> EventWriter | None:
    """This rank's event file, opened on first use (shared by ``JobTrace`` and the Atlas hook,
    ``train/job_hook.py``); None outside ``testbed launch``. Raises KeyError for a rank the job's
    placement does not hold."""
    global _writer
    job_dir = os.environ.get(JOB_DIR_ENV)
    if _writer is None and job_dir:
        rank = int(os.environ["RANK"])
        _writer = EventWriter(Path(job_dir) / "events" / f"w{rank}.jsonl", **rank_placement(Path(job_dir), rank))
        atexit.register(_writer.close)
    return _writer


class JobTrace:
    """One rank's event lines (see the module doc); a no-op outside ``testbed launch``."""

    def __init__(self) -> None:
        self.iteration_now = 0
        self._forwards = self._backwards = 0
        self._open: dict[str, int] = {}
        self.writer = rank_writer()
        self.stage = self.writer.fixed[T.STAGE] if self.writer is not None else 0

    @property
    def enabled(self) -> bool:
        return self.writer is not None

    def iteration(self, k: int) -> None:
        """Iteration ``k`` begins: events after this belong to it; microbatches count from 0."""
        self.iteration_now = k
        self._forwards = self._backwards = 0
        _set_current(self)

    def event(self, kind: str, start_ns: int, end_ns: int, **fields: Any) -> None:
        """One operation of ``kind`` (``schema.py``'s kinds, or the job's own) from ``start_ns`` to
        ``end_ns`` (CLOCK_MONOTONIC ns), in the current iteration unless ``fields`` says."""
        if self.writer is not None:
            self.writer.write(kind, start_ns, end_ns, **{T.ITERATION: self.iteration_now, **fields})

    @contextmanager
    def op(self, kind: str, iteration: int | None = None, microbatch: int | None = None) -> Iterator[None]:
        """Times the block as one operation of ``kind`` (``allreduce``, ``optimizer``, ...)."""
        t0 = now_ns()
        try:
            yield
        finally:
            fields: dict[str, Any] = {T.ITERATION: self.iteration_now if iteration is None else iteration}
            if microbatch is not None:
                fields[T.MICROBATCH] = microbatch
            self.event(kind, t0, now_ns(), **fields)

    def watch(self, module: Any) -> None:
        """Times every forward and backward pass of ``module`` (a ``torch.nn.Module``: this rank's
        pipeline stage) through module hooks; does nothing outside ``testbed launch``."""
        if self.writer is None:
            return
        from torch.autograd.graph import register_multi_grad_hook

        def forward_begins(*_: Any) -> None:
            self._open["F"] = now_ns()

        def backward_begins(_grad: Any) -> None:
            self._open["B"] = now_ns()

        def forward_ends(_module: Any, _inputs: Any, output: Any) -> None:
            self._pass(T.FORWARD, self._open.pop("F", now_ns()), self._forwards)
            self._forwards += 1
            outputs = output if isinstance(output, (tuple, list)) else (output,)
            first = next((o for o in outputs if getattr(o, "requires_grad", False)), None)
            if first is not None:  # its gradient's arrival starts this pass's backward
                first.register_hook(backward_begins)

        def backward_ends(*_: Any) -> None:
            self._pass(T.BACKWARD, self._open.pop("B", now_ns()), self._backwards)
            self._backwards += 1

        module.register_forward_pre_hook(forward_begins)
        module.register_forward_hook(forward_ends)
        params = [p for p in module.parameters() if p.requires_grad]
        register_multi_grad_hook(params, backward_ends, mode="all")

    def _pass(self, kind: str, start_ns: int, microbatch: int) -> None:
        self.event(kind, start_ns, now_ns(), **{T.MICROBATCH: microbatch, T.VIRTUAL_STAGE: self.stage})

    def close(self) -> None:
        """Flush this rank's events (they are also flushed at exit)."""
        if self.writer is not None:
            self.writer.write_deferred()


_current: JobTrace | None = None


def _set_current(trace: JobTrace) -> None:
    global _current
    _current = trace


def current_iteration() -> int:
    """The iteration the job last marked (``JobTrace.iteration``), 0 where it marks none: what the
    Atlas hook (``train/job_hook.py``) files a transfer under."""
    return _current.iteration_now if _current is not None else 0
