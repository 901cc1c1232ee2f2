"""A measured run against the simulator (``testbed sim --validate RUN_DIR``): the run's experiment
and placement (its ``config.json``) simulated, each figure of its ``summary.json`` set beside the
prediction. Error: (measured - predicted) / measured for times and rates, measured - predicted
for fractions (utilization, bubble fraction). Where the run measured its WAN paths
(``wan_profile.json``, ``testbed run --profile-wan``), one connection's rate on each is the
measured one, not the modelled window's (``plan/connections.one_connection_bps``), unless
``measured_links`` is False. Likewise the pipelines start each iteration as far apart as they did
in the run's measured iterations (``pipeline_start_offsets_s``), unless
``measured_starts`` is False: the simulator has no model of what sets them apart (the end of the
all-reduce inside a DC, 0-6 ms apart on the emulator's two cores), and pipelines that start
together and share a link stay together. The hosts' congestion control is the one the run
recorded (``topology.json``), so that a run is predicted under what its hosts ran, not under
this machine's default. Pure (reads the run's files)."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from testbed.errors import SpecError
from testbed.plan.workers import WorkerSpec
from testbed.sim.figures import simulate_policy
from testbed.spec.experiment import Experiment
from testbed.spec.wan_profile import WAN_PROFILE_FILE, WanProfile
from testbed.trace import metrics as M
from testbed.trace import schema as T
from testbed.trace.events import read_events
from testbed.trace.frame import to_real_frame
from testbed.trace.jsonl import read_json_object

#: figures compared as relative errors, and as absolute differences
RELATIVE = (M.ITERATION_TIME_S, M.TOKENS_PER_S)
ABSOLUTE = (M.GPU_UTILIZATION, M.BUBBLE_FRACTION, M.WAN_UTILIZATION_MEAN)


#: how the simulator took one connection's rate on the WAN paths
MEASURED_LINKS, MODELLED_WINDOW = "measured (wan_profile.json)", "modelled window"
#: a built network's record in its run folder (``net/topology_record.py``), and its congestion control
TOPOLOGY_RECORD, RECORDED_CONGESTION = "topology.json", "tcp_congestion"
#: how the simulator started the pipelines
MEASURED_STARTS, IN_STEP = "as measured", "in step"


@dataclass(frozen=True)
class MeasuredRun:
    """A finished run as the simulator takes it: its experiment (with its WAN profile where
    ``links`` is ``MEASURED_LINKS``), its placement and its ``summary.json``, in the real time the
    run ran in (a dilated run's experiment and figures as they ran: ``trace/frame.py``)."""

    exp: Experiment
    workers: list[WorkerSpec]
    summary: dict[str, Any]
    links: str


def load_run(run_dir: Path, measured_links: bool = True) -> MeasuredRun:
    """``run_dir``'s experiment, placement and summary, with its measured WAN paths unless
    ``measured_links`` is False. Raises SpecError naming the file when the folder is not a
    finished run's, or when its ``wan_profile.json`` is unreadable."""
    files = {}
    for name in ("config.json", "summary.json"):
        files[name] = read_json_object(run_dir / name, "give the folder of a finished run (testbed run ... --out DIR)")
    config, summary = files["config.json"], to_real_frame(files["summary.json"])  # as config.json ran
    try:
        exp = Experiment.from_dict(config)
        workers = [WorkerSpec(**w) for w in config["workers"]]
    except (KeyError, TypeError, ValueError) as e:
        raise SpecError(
            str(run_dir / "config.json"), "config.json", "(record)", f"is not a run's record ({e!r})", "rerun it"
        ) from e
    links = MODELLED_WINDOW
    profile_path = run_dir / WAN_PROFILE_FILE
    if measured_links and profile_path.exists():
        try:
            exp = replace(exp, wan_profile=WanProfile.from_dict(json.loads(profile_path.read_text())))
        except (OSError, KeyError, TypeError, ValueError) as e:
            raise SpecError(
                str(profile_path),
                WAN_PROFILE_FILE,
                "(profile)",
                f"is not a WAN profile ({e!r})",
                "rerun with --profile-wan, or delete the file to use the modelled window",
            ) from e
        links = MEASURED_LINKS
    ran = _recorded_congestion(run_dir)
    if ran is not None and exp.topology_spec.tcp_congestion is None:
        exp = replace(exp, topology_spec=replace(exp.topology_spec, tcp_congestion=ran))
    return MeasuredRun(exp, workers, summary, links)


def _recorded_congestion(run_dir: Path) -> str | None:
    """The TCP congestion control ``run_dir``'s hosts ran (its ``topology.json``), or None where
    the folder has no readable record of it (the run then counts as this machine's)."""
    try:
        ran = json.loads((run_dir / TOPOLOGY_RECORD).read_text()).get(RECORDED_CONGESTION)
    except (OSError, ValueError, AttributeError):
        return None
    return ran if isinstance(ran, str) and ran else None


def pipeline_start_offsets_s(ev: pd.DataFrame, warmup: int = 0) -> tuple[float, ...] | None:
    """How far apart the data-parallel pipelines start an iteration (s): in each measured
    iteration, the start of every replica's first forward on stage 0 after the earliest one's,
    sorted; the mean of each position over the iterations (the earliest first, so the first is
    0). None with one replica or no complete iteration."""
    first = ev[(ev[T.KIND] == T.FORWARD) & (ev[T.STAGE] == 0) & (ev[T.ITERATION] >= warmup)]
    starts = first.groupby([T.ITERATION, T.REPLICA])[T.START_NS].min().unstack(T.REPLICA).dropna()
    if starts.shape[1] < 2 or starts.empty:
        return None
    rows = np.sort(starts.to_numpy(dtype="float64"), axis=1)
    return tuple(float(x) for x in ((rows - rows[:, :1]).mean(axis=0) / 1e9))


def validate_run(run_dir: Path, measured_links: bool = True, measured_starts: bool = True) -> dict[str, Any]:
    """``{"run", "policy", "links", "starts", "start_offsets_s", "figures": {NAME: {"predicted",
    "measured", "error"}}}`` for ``run_dir``; ``links``: ``MEASURED_LINKS`` or
    ``MODELLED_WINDOW``; ``starts``: ``MEASURED_STARTS`` (the offsets used, s) or ``IN_STEP``
    (where ``measured_starts`` is False or the run has no such offsets). Raises SpecError as
    ``load_run``."""
    run = load_run(run_dir, measured_links)
    exp, summary = run.exp, run.summary
    offsets = None
    if measured_starts and exp.replicas > 1 and exp.policy.training:
        offsets = pipeline_start_offsets_s(read_events(run_dir), exp.warmup_iterations)
    predicted = simulate_policy(exp, workers=run.workers, start_offsets_s=offsets).to_dict()
    figures = {}
    for name in (*RELATIVE, *ABSOLUTE):
        x, y = predicted.get(name), summary.get(name)
        if x is None or y is None:
            error = None
        elif name in RELATIVE:
            error = (y - x) / y if y else None
        else:
            error = y - x
        figures[name] = {"predicted": x, "measured": y, "error": error}
    return {
        "run": str(run_dir),
        "policy": exp.policy.name,
        "links": run.links,
        "starts": IN_STEP if offsets is None else MEASURED_STARTS,
        "start_offsets_s": offsets,
        "figures": figures,
    }


def error_distribution(errors: list[float]) -> dict[str, float]:
    """The median, 90th percentile and largest of ``errors``' magnitudes (numpy's linear
    percentile), and how many there were: the prediction-error goals' figures (issue 39)."""
    x = np.abs(np.asarray(errors, dtype=float))
    if x.size == 0:
        return {"n": 0, "median": float("nan"), "p90": float("nan"), "largest": float("nan")}
    return {
        "n": int(x.size),
        "median": float(np.median(x)),
        "p90": float(np.percentile(x, 90)),
        "largest": float(x.max()),
    }
