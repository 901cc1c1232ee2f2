"""A scenario swept over WAN rate and one-way delay (``testbed sim SCENARIO --sweep``): every grid
point's figures per policy, simulated in parallel on all cores, as rows of one table; and the
speed-up of ``atlas`` over each baseline at each point (the plots: ``results/sweep_plots.py``).

Pure, apart from the worker processes: a local process pool (``concurrent.futures``), or the
workers of a Dask distributed cluster (``scheduler``: its address), whose results are the same.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import Executor, ProcessPoolExecutor
from contextlib import contextmanager
from typing import Any

from testbed.errors import FeatureError, SpecError
from testbed.sim.scenario import simulate_scenario
from testbed.spec.scenario import Scenario
from testbed.spec.units import UnitError, parse_duration_us, parse_rate_bps
from testbed.trace import metrics as M

#: what ``--sweep`` may vary: name -> (parser, the Scenario.with_wan argument it sets)
SWEPT = {"wan_rate": (parse_rate_bps, "rate_bps"), "delay": (parse_duration_us, "delay_us")}
#: how long a sweep waits for a Dask scheduler to answer (s): a cluster's, reached over a network
SCHEDULER_TIMEOUT_S = 10
#: the policies a sweep simulates; speed-ups are atlas's over the first two
SWEEP_POLICIES = ("pp-fair", "dp-wan", "atlas", "atlas+bubbletea")


def parse_sweep(text: str) -> dict[str, list[int]]:
    """``wan_rate=100gbit,400gbit,delay=5ms,50ms`` -> {"wan_rate": [bit/s...], "delay": [us...]}:
    a name starts each parameter, the values after it up to the next name are its values. Raises
    SpecError naming ``--sweep``, the value and the fix."""
    out: dict[str, list[int]] = {}
    current = None
    for token in (t.strip() for t in text.split(",")):
        if "=" in token:
            current, _, token = token.partition("=")
            current = current.strip()
            if current not in SWEPT:
                raise SpecError("--sweep", "--sweep", current, "is not a swept parameter", f"use {' and '.join(SWEPT)}")
            if current in out:
                raise SpecError("--sweep", "--sweep", current, "is given twice", "list all its values after one name")
            out[current] = []
        if current is None:
            raise SpecError("--sweep", "--sweep", token, "has no parameter name", "write e.g. wan_rate=100gbit,400gbit")
        try:
            out[current].append(SWEPT[current][0](token))
        except UnitError as e:
            raise SpecError("--sweep", f"--sweep {current}", token, *str(e).partition("; ")[::2]) from None
    if not out:
        raise SpecError("--sweep", "--sweep", text, "names no parameter", "write e.g. wan_rate=100gbit,400gbit")
    if any(v <= 0 for v in out.get("wan_rate", [])):
        raise SpecError("--sweep", "--sweep wan_rate", out["wan_rate"], "holds a rate of 0", "give rates above 0")
    return out


def _point(args: tuple[Scenario, int | None, int | None, tuple[str, ...]]) -> list[dict[str, Any]]:
    sc, rate_bps, delay_us, policies = args
    point = sc.with_wan(rate_bps, delay_us)
    rows = []
    for policy in policies:
        row: dict[str, Any] = {
            "wan_rate_bps": point.links[0].rate_bps,
            "delay_us": point.links[0].delay_us,
            "policy": policy,
        }
        try:
            f = simulate_scenario(point, policy).to_dict()
            row.update({k: f.get(k) for k in (M.ITERATION_TIME_S, M.GPU_UTILIZATION, M.TRAINING_GPU_UTILIZATION)})
            row.update({k: f.get(k) for k in (M.PREFILL_TOKENS_PER_S, M.TTFT_P50_S, M.TTFT_P99_S)})
        except SpecError as e:
            row["infeasible"] = f"{e.field} {e.value} {e.problem}"
        rows.append(row)
    return rows


@contextmanager
def points_executor(workers: int | None = None, scheduler: str | None = None) -> Iterator[Executor]:
    """Where a sweep's points are simulated: a pool of ``workers`` local processes (default every
    core), or, with ``scheduler`` (``tcp://HOST:8786``), the workers of that Dask distributed
    cluster (``distributed.Client.get_executor``; each worker must have this checkout's package).
    Raises FeatureError where distributed is not installed, SpecError naming ``--scheduler`` where
    no scheduler answers there."""
    if scheduler is None:
        with ProcessPoolExecutor(max_workers=workers or os.cpu_count() or 1) as pool:
            yield pool
        return
    try:
        from distributed import Client
    except ImportError as e:
        raise FeatureError(f"--scheduler needs Dask's distributed package ({e}): pip install distributed") from None
    try:
        client = Client(scheduler, timeout=SCHEDULER_TIMEOUT_S)
    except (OSError, TimeoutError) as e:
        raise SpecError(
            "--scheduler",
            "--scheduler",
            scheduler,
            f"has no Dask scheduler answering ({e})",
            "start one there (dask scheduler) with workers (dask worker ADDRESS), or leave --scheduler out",
        ) from None
    with client:
        yield client.get_executor()


def sweep(
    sc: Scenario,
    grid: dict[str, list[int]],
    policies: tuple[str, ...] = SWEEP_POLICIES,
    workers: int | None = None,
    scheduler: str | None = None,
) -> list[dict[str, Any]]:
    """One row per grid point and policy: the point's WAN rate (bit/s) and one-way delay (us) (every
    link is set to the swept values; a parameter not swept keeps each link's own, and the row then
    names the first link's), the policy, its iteration time, utilization (with prefill, and training alone),
    BubbleTea's prefill figures, or why it is infeasible; ``speedup_over_<baseline>`` on atlas's
    rows. A parameter left out of ``grid`` keeps the scenario's links. Simulated on ``workers``
    local processes (default every core) or on the Dask cluster at ``scheduler``
    (``points_executor``)."""
    rates: list[int | None] = [*grid.get("wan_rate", [])] or [None]
    delays: list[int | None] = [*grid.get("delay", [])] or [None]
    points = [(sc, r, d, policies) for r in rates for d in delays]
    with points_executor(workers, scheduler) as pool:
        rows = [row for point in pool.map(_point, points) for row in point]
    for row in rows:
        if row["policy"] != "atlas" or M.ITERATION_TIME_S not in row:
            continue
        for base in policies[:2]:
            other = next(
                (
                    x
                    for x in rows
                    if x["policy"] == base
                    and (x["wan_rate_bps"], x["delay_us"]) == (row["wan_rate_bps"], row["delay_us"])
                ),
                None,
            )
            if other is not None and other.get(M.ITERATION_TIME_S):
                row[f"speedup_over_{base}"] = other[M.ITERATION_TIME_S] / row[M.ITERATION_TIME_S]
    return rows
