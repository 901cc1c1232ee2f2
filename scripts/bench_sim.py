#!/usr/bin/env python3
"""Benchmark of the simulator's speed (goal: one iteration of the shipped 1,024-GPU scenario,
gpt3_175b_4dc, in under 5 s on this 2-core machine, imports excluded), and the curve of its cost
against the GPU count (128 to 8,192: the same scenario with 32 to 2,048 GPUs per DC, 64
microbatches per replica). Per size: one simulated iteration under pp-fair (TCP sharing) and
under atlas's planned grants (its grant plan included; the placement given), and, for the shipped
size, ``testbed sim``'s whole work per policy (atlas's DC selection and grant plan included); then
issue 39's goals beside their figures: ``testbed sim`` of that scenario under atlas as a command
(imports included) and one atlas iteration at 8,192 GPUs (its grant plan's offsets simulated on
every core, ``cores.map_over_cores``; and on one core, for the floor). Each figure starts with the grant plans
and DC selections that ``plan/`` keeps emptied. Figures printed (best of --repeats), nothing
asserted.

Run: .venv/bin/python scripts/bench_sim.py [--repeats 3] [--largest 8192]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import simpy

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testbed.plan.connections import wan_connections
from testbed.plan.cores import map_over_cores, processes_allowed, usable_cores
from testbed.plan.grant_plan import STAGGER_STEPS, _plan_grants, simulated_iteration
from testbed.plan.grant_sim import _Call
from testbed.plan.placement import _select_dcs, place_pipeline
from testbed.sim.scenario import simulate_scenario
from testbed.spec.scenario_file import load_scenario

GOAL_S = 5.0
REPO = Path(__file__).resolve().parents[1]
#: issue 39's goals and the figures when it was filed (b64ba4d): `testbed sim` of the 1,024-GPU
#: scenario under atlas (s, imports included), and one atlas iteration at 8,192 GPUs (s)
CLI_GOAL_S, CLI_ANCHOR_S = 3.0, 12.4
LARGEST_GOAL_GPUS, LARGEST_GOAL_S, LARGEST_ANCHOR_S = 8192, 5.0, 20.3
SCENARIO = "gpt3_175b_4dc"
MICROBATCHES = 64


def best_of(repeats: int, fn) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        _plan_grants.cache_clear()  # each run plans and selects afresh, as a new command would
        _select_dcs.cache_clear()
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def events_of(fn) -> int:
    """How many events SimPy schedules while ``fn`` runs (its environment's ``schedule`` counted)."""
    count = 0
    schedule = simpy.Environment.schedule

    def counted(self, *args, **kwargs):
        nonlocal count
        count += 1
        return schedule(self, *args, **kwargs)

    simpy.Environment.schedule = counted
    try:
        fn()
    finally:
        simpy.Environment.schedule = schedule
    return count


def simpy_event_s(n: int = 1_000_000, chains: int = 512) -> float:
    """SimPy's own cost (s) of one event that does nothing, as ``grant_sim`` makes them
    (``_Call``): ``chains`` of them pending at once (one per worker of the 8,192-GPU iteration's
    512), each making the next of its chain a few us later when processed, n in all."""
    env = simpy.Environment()
    left = [n]

    def step(k: int) -> None:
        left[0] -= 1
        if left[0] >= chains:
            _Call(env, 1e-6 * (1 + k % 7), step, k)

    for k in range(chains):
        _Call(env, 0.0, step, k)
    t0 = time.perf_counter()
    env.run()
    return (time.perf_counter() - t0) / n


def one_iteration_s(sc, policy: str, repeats: int) -> tuple[float, float]:
    """(seconds to simulate one iteration of ``sc`` under ``policy``, placed in the file's DC order
    (atlas's DC selection, 24 such simulations on 4 DCs, left out); the simulated iteration in s)."""
    exp = sc.experiment(policy)
    workers = place_pipeline(exp, exp.topology_spec)
    connections = wan_connections(exp, exp.topology_spec, workers)
    secs, t = best_of(repeats, lambda: simulated_iteration(exp, exp.topology_spec, workers, connections))
    return secs, t


def pool_start_s(repeats: int = 5) -> float:
    """The least time (s) ``cores.map_over_cores`` takes over one item per core that does nothing:
    a pool's start and end."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        map_over_cores(abs, [0] * max(2, usable_cores()))
        best = min(best, time.perf_counter() - t0)
    return best


@processes_allowed()  # as testbed sim: atlas's grant plans on every core
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3, help="runs per figure; the best is printed (default 3)")
    ap.add_argument("--largest", type=int, default=8192, help="largest GPU count of the curve (default 8192)")
    args = ap.parse_args()
    base = load_scenario(SCENARIO)
    print(
        f"{SCENARIO}: {base.gpus} GPUs, {base.stages} stages x {base.replicas} replicas, "
        f"{base.microbatches} microbatches"
    )
    for policy in ("pp-fair", "atlas"):
        secs, t = one_iteration_s(base, policy, args.repeats)
        print(f"  {policy}: one iteration simulated in {secs:.2f} s (goal < {GOAL_S:g} s); simulated: {t:.2f} s")
    for policy in ("pp-fair", "dp-wan", "atlas"):
        secs, _ = best_of(1, lambda p=policy: simulate_scenario(base, p))
        print(f"  {policy}: testbed sim's whole work (placement, DC selection, grant plan, figures) {secs:.2f} s")
    largest_atlas_s, largest = None, base
    print("cost against GPU count (one simulated iteration, placement given):")
    print(f"  {'GPUs':>6} {'replicas':>8} {'pp-fair s':>10} {'atlas s':>10}")
    per_dc = 32
    while per_dc * len(base.dcs) <= args.largest:
        sc = replace(base, dcs=tuple((name, per_dc) for name, _ in base.dcs))
        replicas = sc.gpus // sc.tensor_parallel // sc.stages
        sc = replace(sc, global_batch=replicas * MICROBATCHES * sc.microbatch_size)
        row = [one_iteration_s(sc, p, 1 if sc.gpus > 2048 else args.repeats)[0] for p in ("pp-fair", "atlas")]
        print(f"  {sc.gpus:>6} {replicas:>8} {row[0]:>10.2f} {row[1]:>10.2f}")
        if sc.gpus == LARGEST_GOAL_GPUS:
            largest_atlas_s = row[1]
            largest = sc
        per_dc *= 2
    print("issue 39's goals on this machine (anchors: when the issue was filed, at b64ba4d):")
    cli = [sys.executable, "-m", "testbed.cli", "sim", SCENARIO, "--policies", "atlas"]
    walls = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        subprocess.run(cli, check=True, capture_output=True, cwd=REPO)
        walls.append(time.perf_counter() - t0)
    print(
        f"  testbed sim {SCENARIO} --policies atlas ({base.gpus} GPUs, imports included): {min(walls):.2f} s "
        f"(goal <= {CLI_GOAL_S:g} s; anchor {CLI_ANCHOR_S:g} s)"
    )
    if largest_atlas_s is not None:
        print(
            f"  one atlas iteration at {LARGEST_GOAL_GPUS:,} GPUs: {largest_atlas_s:.2f} s (goal <= "
            f"{LARGEST_GOAL_S:g} s; anchor {LARGEST_ANCHOR_S:g} s)"
        )
        # the grant plan's offsets run on every core: on one, they run one after another, and in
        # this process, where SimPy's events are counted
        cores = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {min(cores)})
        try:
            one_core_s = one_iteration_s(largest, "atlas", 1)[0]
            events = events_of(lambda: one_iteration_s(largest, "atlas", 1))
        finally:
            os.sched_setaffinity(0, cores)
        print(f"    on one core (the plan's offsets one after another): {one_core_s:.2f} s")
        per_event_s = simpy_event_s()
        print(
            f"    its floor: {events:,} SimPy events (the grant plan's {STAGGER_STEPS + 1} simulations) x "
            f"{per_event_s * 1e6:.2f} us, SimPy's own cost of an event that does nothing = "
            f"{events * per_event_s:.2f} s before the model's own work"
        )
    start_ms = pool_start_s() * 1e3
    print(f"  a pool's start and end on {usable_cores()} cores (plan/cores.py), nothing computed: {start_ms:.1f} ms")
    print("  the paper-scale table: scripts/paper_scale.py prints its own time (goal <= 120 s; anchor about 18 min)")


if __name__ == "__main__":
    main()
