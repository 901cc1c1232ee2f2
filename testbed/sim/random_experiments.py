"""Experiments nobody chose: random valid topologies and experiments drawn from a seed, for checking
the simulator's predictions away from the shipped experiments it was developed against
(``scripts/prediction_error.py --random N --seed S``, ``run/random_validation.py``).

A candidate is drawn uniformly from ``RANGES``: 2-4 DCs of 2-6 training hosts each (and one more
for BubbleTea's decode host, ``decode_hosts: 1``, idle under the other policies), joined in a chain (DC i
to DC i + 1) plus each other pair with probability ``EXTRA_LINK_P``; every link's rate
log-uniform in 10 Mbit/s-1 Gbit/s and its one-way delay log-uniform in 1-100 ms; 2-4 pipeline
stages of two blocks each, 1-4 replicas, 2-8 microbatches, ``d_model`` 64-384 (a multiple of 8,
four heads) and a forward target of 15-60 ms (backward twice). What is not drawn is the shipped
experiments' (1F1B, microbatches of 2 x 64 tokens, a connection filling a fifth of a link:
``FIXED``), and a link's queue holds at least the bandwidth-delay product of every path it is the
bottleneck of (``spec/queues.py``: what ``load_topology`` warns of otherwise). A candidate the
validators refuse, or that pp-fair cannot place, is redrawn and counted (``RandomDraws.invalid``),
as is one whose pipeline fits one DC under pp-fair's file-order placement, so that nothing of it
crosses the WAN (``single_dc``).

The draws are stratified by ``planned_wan_compute_ratio`` (one microbatch's activations at the
slowest stage boundary's bottleneck rate over the forward target: DESIGN.md 2a's ratio, before the
run): the quartiles of the candidates' distribution (``ratio_quartiles``, from ``CALIBRATION``
candidates of a fixed seed) split it in four, and a quarter of the draws falls in each. A draw that
``check`` refuses (the machine cannot run it: ``run/fit.py``) is rejected, counted with its reason,
and never reshaped.

Pure: no kernel, no processes.
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from testbed.errors import SpecError
from testbed.plan.placement import place
from testbed.spec.experiment import Experiment
from testbed.spec.experiment_file import parse_experiment
from testbed.spec.policy import parse_policy
from testbed.spec.queues import queue_shortfalls
from testbed.spec.routing import RoutingTable
from testbed.spec.topology_file import parse_topology


@dataclass(frozen=True)
class Ranges:
    """The uniform ranges a candidate is drawn from (integers inclusive; rates and delays
    log-uniform)."""

    dcs: tuple[int, int] = (2, 4)
    hosts: tuple[int, int] = (2, 6)
    rate_mbit: tuple[float, float] = (10.0, 1000.0)
    delay_ms: tuple[float, float] = (1.0, 100.0)
    stages: tuple[int, int] = (2, 4)
    replicas: tuple[int, int] = (1, 4)
    microbatches: tuple[int, int] = (2, 8)
    d_model: tuple[int, int] = (64, 384)
    forward_ms: tuple[float, float] = (15.0, 60.0)


RANGES = Ranges()
#: the chance that two DCs not next to each other in the chain have a link of their own
EXTRA_LINK_P = 0.5
#: blocks per pipeline stage, attention heads, and d_model's step (so that heads divide it)
BLOCKS_PER_STAGE, N_HEADS, D_MODEL_STEP = 2, 4, 8
#: what every draw shares with the shipped experiments (workloads/default.yaml)
FIXED: dict[str, Any] = {
    "schedule": "1f1b",
    "microbatch_size": 2,
    "lr": 0.001,
    "seed": 0,
    "wan_connection_share": 0.2,
}
SEQ_LEN = 64
#: the candidates (and their seed) the ratio's quartiles are taken from
CALIBRATION, CALIBRATION_SEED = 400, 20261206


@dataclass(frozen=True)
class Draw:
    """One candidate: the topology and the experiment as the mappings their files hold."""

    name: str
    topology: dict[str, Any]
    experiment: dict[str, Any]


@dataclass
class RandomDraws:
    """What ``random_experiments`` drew: the accepted experiments (with their ratios and
    quartiles, 0-3), the rejected draws with why, and how many candidates were redrawn."""

    seed: int
    accepted: list[tuple[Draw, Experiment, float, int]] = field(default_factory=list)
    rejected: list[tuple[Draw, str]] = field(default_factory=list)
    invalid: int = 0
    single_dc: int = 0


def _log_uniform(rng: random.Random, low: float, high: float) -> float:
    return low * (high / low) ** rng.random()


def draw_candidate(rng: random.Random, name: str, ranges: Ranges = RANGES) -> Draw:
    """One candidate drawn from ``ranges`` with ``rng`` (not yet validated)."""
    n = rng.randint(*ranges.dcs)
    dcs = [{"name": f"dc{i}", "hosts": rng.randint(*ranges.hosts) + 1, "decode_hosts": 1} for i in range(n)]
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n) if j == i + 1 or rng.random() < EXTRA_LINK_P]
    links: list[dict[str, Any]] = [
        {
            "between": [f"dc{i}", f"dc{j}"],
            "rate": f"{_log_uniform(rng, *ranges.rate_mbit):.1f}mbit",
            "delay": f"{_log_uniform(rng, *ranges.delay_ms):.1f}ms",
        }
        for i, j in pairs
    ]
    topology = {"name": f"{name}-topology", "description": f"random draw {name}", "dcs": dcs, "links": links}
    for short in queue_shortfalls(parse_topology(topology)):
        links[short.index]["queue"] = short.bdp_packets  # a deep-buffered WAN (spec/queues.py)
    stages = rng.randint(*ranges.stages)
    forward_ms = round(rng.uniform(*ranges.forward_ms), 1)
    d_low, d_high = ranges.d_model
    experiment = {
        "name": name,
        "description": f"random draw {name}",
        "topology": f"{name}-topology.yaml",
        **FIXED,
        "stages": stages,
        "replicas": rng.randint(*ranges.replicas),
        "microbatches": rng.randint(*ranges.microbatches),
        "model": {
            "n_layers": BLOCKS_PER_STAGE * stages,
            "d_model": D_MODEL_STEP * rng.randint(d_low // D_MODEL_STEP, d_high // D_MODEL_STEP),
            "n_heads": N_HEADS,
            "seq_len": SEQ_LEN,
        },
        "compute": {"mode": "padded", "forward_ms": forward_ms, "backward_ms": round(2 * forward_ms, 1)},
    }
    return Draw(name, topology, experiment)


def load_draw(draw: Draw, source: str = "<memory>") -> Experiment:
    """The draw validated as its files would be (``parse_topology``, ``parse_experiment``).
    Raises SpecError as they do."""
    return parse_experiment(draw.experiment, source, topology=parse_topology(draw.topology, source))


def planned_wan_compute_ratio(exp: Experiment) -> float:
    """One microbatch's activations at the bottleneck rate of the slowest stage boundary that
    crosses the WAN, under pp-fair's placement (``place``), over the forward target (s / s); 0 where
    no boundary crosses it. The run's ``wan_compute_ratio`` (``results/analysis.py``) measures the
    same with the transfers' real durations. Raises SpecError where pp-fair cannot place it."""
    workers = place(exp, policy=parse_policy("pp-fair"))
    routes = RoutingTable(exp.topology_spec)
    dc = {(w.stage, w.replica): w.dc for w in workers}
    rates = [
        routes.route(dc[(s, 0)], dc[(s + 1, 0)]).bottleneck_bps
        for s in range(exp.stages - 1)
        if dc[(s, 0)] != dc[(s + 1, 0)]
    ]
    if not rates:
        return 0.0
    return exp.activation_bytes * 8 / min(r for r in rates if r) / (exp.compute.forward_ms / 1000)


def _candidates(seed: int, prefix: str) -> Iterator[tuple[Draw, Experiment | None, float]]:
    """Every candidate of ``seed`` as (draw, experiment, planned ratio); the experiment None where
    the validators refuse the draw (ratio nan) or nothing of it crosses the WAN (ratio 0)."""
    rng = random.Random(seed)
    for i in itertools.count():
        draw = draw_candidate(rng, f"{prefix}{i:03d}")
        try:
            exp = load_draw(draw)
            ratio = planned_wan_compute_ratio(exp)
        except SpecError:
            yield draw, None, math.nan
            continue
        yield draw, exp if ratio > 0 else None, ratio


@cache
def ratio_quartiles() -> tuple[float, float, float]:
    """The ratio's quartile boundaries over ``CALIBRATION`` valid candidates of
    ``CALIBRATION_SEED`` that cross the WAN."""
    ratios: list[float] = []
    for _, exp, ratio in _candidates(CALIBRATION_SEED, "calibration-"):
        if exp is not None:
            ratios.append(ratio)
            if len(ratios) == CALIBRATION:
                break
    ratios.sort()
    return tuple(ratios[len(ratios) * q // 4] for q in (1, 2, 3))  # type: ignore[return-value]


def quartile(ratio: float) -> int:
    """Which quartile (0-3) of ``ratio_quartiles`` ``ratio`` falls in."""
    return bisect.bisect_right(ratio_quartiles(), ratio)


def random_experiments(n: int, seed: int, check: Callable[[Experiment], None] | None = None) -> RandomDraws:
    """``n`` random valid experiments from ``seed``, a quarter in each quartile of the planned
    ratio (the first ``n % 4`` quartiles take one more); ``check`` (raising SpecError) rejects what
    the machine cannot run. Draws are named ``random-<seed>-<candidate>``."""
    out = RandomDraws(seed)
    wanted = [n // 4 + (q < n % 4) for q in range(4)]
    candidates = _candidates(seed, f"random-{seed}-")
    while sum(wanted):
        draw, exp, ratio = next(candidates)
        if exp is None:
            out.single_dc += ratio == 0
            out.invalid += ratio != 0
            continue
        q = quartile(ratio)
        if not wanted[q]:
            continue
        try:
            if check is not None:
                check(exp)
        except SpecError as e:
            out.rejected.append((draw, f"{e.field} {e.value}: {e.problem}"))
            continue
        wanted[q] -= 1
        out.accepted.append((draw, exp, ratio, q))
    return out
