"""Atlas's grants for a launched job (``testbed launch --policy .../sharing=fifo|planned``,
``user_job.py``): the rank pairs the hook manages, the held classes' floor and borrowing, and the
planned grants' profile (``JobProfile``: FIFO until the job's workload is measured, then the plan
made from it)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from testbed.atlas.controller import Controller
from testbed.errors import SpecError
from testbed.plan.boundary_transfers import boundary_paths
from testbed.plan.grant_plan import format_grant_plan
from testbed.plan.job_plan import PROFILED_ITERATION, JobWorkload, job_grant_plan, workload_from_events
from testbed.plan.virtual_stages import home_boundaries
from testbed.plan.workers import WorkerSpec
from testbed.spec.experiment import Experiment
from testbed.spec.experiment_fields import EXPERIMENT_FIELDS
from testbed.spec.routing import RoutingTable
from testbed.spec.topology import TopologySpec
from testbed.trace.events import read_events

#: whether held pipelines' classes may use what the link has idle under a job's grants (an
#: experiment's default, ``atlas_borrow``: the granted class first, the others fill the delay's tail)
JOB_BORROW = EXPERIMENT_FIELDS["atlas_borrow"].default


def job_floor_share(replicas: int) -> float:
    """The share of a link each held pipeline's class keeps under Atlas's grants: an experiment's
    default (``atlas_floor_share``), lowered to half of 1 / ``replicas`` where that would not
    leave the granted class most of the link."""
    return min(EXPERIMENT_FIELDS["atlas_floor_share"].default, 0.5 / replicas)


def managed_pairs(topo: TopologySpec, stages: int, workers: list[WorkerSpec]) -> list[tuple[int, int]]:
    """The (sender, receiver) rank pairs whose transfers Atlas's controller shares: a pipeline's
    neighbours in different DCs, both ways (``boundary_transfers.boundary_paths``), for ``stages``
    stages placed as ``workers`` on ``topo``."""
    return sorted(boundary_paths(workers, RoutingTable(topo), home_boundaries(list(range(stages)))))


class JobProfile:
    """Planned grants for a job: polled by the watch loop until the job's first iteration is traced
    (its passes by the helper, its transfers by the hook), then the grant plan is made from it
    (``plan/job_plan.py``: ``stands_for`` makes the experiment that stands for the job from its
    workload) and the controller, FIFO until then, switches to it; the plan goes to
    ``grant_plan_profiled.txt``. A job that never gives that iteration stays FIFO."""

    #: how often the events are read (s)
    POLL_S = 0.5

    def __init__(
        self,
        stands_for: Callable[[JobWorkload], Experiment],
        workers: list[WorkerSpec],
        out_dir: Path,
        controller: Controller,
        progress: Callable[[str], object],
    ) -> None:
        self.stands_for, self.workers, self.out_dir = stands_for, workers, out_dir
        self.controller, self.progress = controller, progress
        self.workload: JobWorkload | None = None
        self.failed: str | None = None
        self._next = 0.0

    def poll(self) -> None:
        if self.workload is not None or self.failed is not None or time.monotonic() < self._next:
            return
        self._next = time.monotonic() + self.POLL_S
        if not (self.out_dir / "events").is_dir():
            return
        try:
            workload = workload_from_events(read_events(self.out_dir), self.workers, PROFILED_ITERATION)
            if workload is None:
                return
            plan = job_grant_plan(self.stands_for(workload), self.workers, workload)
        except (ValueError, SpecError) as e:
            self.failed = str(e)
            self.progress(f"no grant plan for the job ({e}): FIFO grants throughout")
            return
        self.controller.replan(plan, sharing="planned")
        self.workload = workload
        (self.out_dir / "grant_plan_profiled.txt").write_text(
            f"profiled in iteration {PROFILED_ITERATION}: {workload.describe()}\n" + format_grant_plan(plan) + "\n"
        )
        self.progress(f"grant plan made from the job's iteration {PROFILED_ITERATION} ({workload.describe()})")

    def outcome(self) -> str:
        """What the summary says of the job's sharing."""
        if self.workload is not None:
            return (
                f"planned: Atlas's grants in the order planned from iteration {PROFILED_ITERATION} "
                f"({self.workload.describe()}), earliest ready first before"
            )
        why = self.failed or (
            f"iteration {PROFILED_ITERATION} was never traced whole: the job marks no iterations, times no "
            "passes (testbed.trace.job) or moved no cross-DC transfer"
        )
        return f"fifo: planned grants were asked, but {why}; Atlas's grants, earliest ready first, throughout"
