"""Atlas's grant plan (DESIGN.md section 1, item 4): temporal sharing of the WAN links planned from
the training workload, before it runs.

Inputs: the schedule tables (``schedule.py``), the microbatch count, the padded compute targets of
every stage (``Experiment.block_s``; under real compute, the first iteration's profile:
``run/profile.py``), the bytes of one boundary transfer, and each WAN link's rate
and one-way delay, the held classes' floor and the per-connection share of striped transfers on
each path. Output, per link direction (``Hop``): the order of the stage-boundary transfers over one
iteration, how long one needs the link when granted (``transfer_s``: its bytes over the granted
rate), and its deadline; and, per data-parallel pipeline, the offset at which its first stage
starts each iteration (``stagger_s``), so that one pipeline computes while another transmits.

How: ``grant_sim.simulate`` plays one iteration (see there). ``plan_grants`` tries
pipeline offsets r x delta for delta from 0 to the longest transfer time, keeps the largest one
whose simulated iteration is no longer than the shortest found (so that pipelines take each link in
turn instead of queueing their bytes at the floor rate behind each other's grants), and records the
order in which that iteration's transfers took each link. The offsets' simulations are independent:
where they are many (``PARALLEL_ACTIONS``) and the program allows it (``cores.processes_allowed``:
``testbed sim`` and ``testbed plan`` do), they run on every core, with the same plan as one after
another.

Pure: no kernel; no processes but those workers, which end with the plan. ``testbed plan --grants``
prints it (``format_grant_plan``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from testbed.plan.allreduce import loss_allreduce_s
from testbed.plan.boundary_transfers import Hop, LinkTiming, Transfer, boundary_paths
from testbed.plan.connections import one_connection_bps, sent_at_once, transfer_time_s
from testbed.plan.cores import map_over_cores
from testbed.plan.critical_path import critical_path_s
from testbed.plan.grant_sim import simulate
from testbed.plan.schedule import RankAction
from testbed.plan.virtual_stages import experiment_boundaries, experiment_homes
from testbed.plan.workers import WorkerSpec
from testbed.spec.experiment import Experiment
from testbed.spec.routing import RoutingTable
from testbed.spec.topology import TopologySpec
from testbed.spec.wire import TCP_GOODPUT_FRACTION

__all__ = [
    "DEADLINE_TRANSFERS",
    "FLOOR_SHARE",
    "GrantPlan",
    "Hop",
    "HopPlan",
    "Transfer",
    "boundary_paths",
    "iteration_lower_bound",
    "format_grant_plan",
    "granted_class_bps",
    "held_floor_share",
    "plan_grants",
    "simulate_wan",
    "simulated_iteration",
    "wan_links",
]

#: grant plans kept for reuse (``plan_grants``)
PLANS_KEPT = 8
#: the share of a link a held (not granted) pipeline's class keeps (DESIGN.md section 1, item 4)
FLOOR_SHARE = 0.05
#: deadline of a grant: this many times its transfer time, plus one round trip (docs/policies.md)
DEADLINE_TRANSFERS = 3.0
#: the simulated compute actions (2 x virtual stages x microbatches x replicas) from which
#: ``plan_grants`` simulates its offsets on every core (``cores.map_over_cores``, where the program
#: allows it): a plan took as long on two cores as on one at 2,048 actions (0.054 s), 0.085 s
#: against 0.101 s at 4,096 and 0.155 s against 0.220 s at 8,192 (gpt3_175b_4dc at 128, 256 and
#: 512 GPUs, 64 microbatches, timed once each on 2026-12-07 with the collector running; the 8,192-GPU
#: iteration on both: ``scripts/bench_sim.py``)
PARALLEL_ACTIONS = 4000
#: pipeline offsets tried: r x k/STAGGER_STEPS x the longest transfer time, k = 0..STAGGER_STEPS
STAGGER_STEPS = 4
#: an offset may lengthen the simulated iteration by this share and still count as free
STAGGER_TOLERANCE = 1e-3


@dataclass(frozen=True)
class HopPlan:
    """One link direction's part of the plan. ``rate_bps``: the link's rate; ``granted_bps``: what a
    granted transfer gets on average (the link less the held classes' floors, less where its
    connections' windows cannot cover the path's bandwidth-delay product:
    ``connections.transfer_time_s``); ``transfer_s``: its bytes at that rate; ``delay_s``: the
    link's one-way delay (a transfer's grant on the next hop of its path comes that much after this
    one's); ``rtt_s``: the longest round trip of the paths through it; ``order``: the transfers of
    one iteration in the order they take the link."""

    hop: Hop
    rate_bps: int
    granted_bps: float
    transfer_s: float
    delay_s: float
    rtt_s: float
    order: tuple[Transfer, ...]

    @property
    def deadline_s(self) -> float:
        """How long a grant may last at most: ``DEADLINE_TRANSFERS`` transfer times plus one RTT."""
        return DEADLINE_TRANSFERS * self.transfer_s + self.rtt_s


@dataclass(frozen=True)
class GrantPlan:
    """A run's grant plan: every crossed link direction's part, each pipeline's offset (s), the
    simulated iteration with and without the offsets (s), the bytes of one boundary transfer."""

    hops: tuple[HopPlan, ...]
    stagger_s: tuple[float, ...]
    iteration_s: float
    iteration_unstaggered_s: float
    bytes_per_transfer: int

    def hop(self, hop: Hop) -> HopPlan:
        return next(h for h in self.hops if h.hop == hop)


def held_floor_share(exp: Experiment) -> float:
    """The floor a planned grant leaves the held classes: none when they may borrow (they then use
    only what the granted transfer leaves idle), else ``atlas_floor_share``."""
    return 0.0 if exp.atlas_borrow else exp.atlas_floor_share


def granted_class_bps(link_bps: int, replicas: int, floor_share: float) -> float:
    """The rate of the granted class on a link: the link less the ``replicas - 1`` held floors."""
    return link_bps - (replicas - 1) * floor_share * link_bps


@dataclass(frozen=True)
class WanLinks:
    """What ``simulate`` needs of the WAN a placement's boundaries cross: each crossed link
    direction's timing (the slowest path through it decides: a grant's deadline), the hops of each
    (sender, receiver) pair, each pair's one-way delay (s), per hop the link's line rate (bit/s)
    and the longest RTT of the paths through it (s), and each pair's own timing on each hop of its
    path (``path_links``: a window-limited transfer's time follows its path's RTT, not the slowest
    path's through the same link), and the connections each transfer is striped over."""

    links: dict[Hop, LinkTiming]
    paths: dict[tuple[int, int], list[Hop]]
    one_way_s: dict[tuple[int, int], float]
    rate_bps: dict[Hop, int]
    rtt_s: dict[Hop, float]
    path_links: dict[tuple[int, int], tuple[LinkTiming, ...]]
    stripes: int = 1


def wan_links(
    exp: Experiment,
    topo: TopologySpec,
    workers: list[WorkerSpec],
    connections: int,
    usable_bps: Callable[[int], float],
) -> WanLinks:
    """The WAN of ``workers`` on ``topo`` for ``simulate``: one boundary transfer's time alone on
    each crossed link (``connections.transfer_time_s`` at ``usable_bps(line rate)`` times TCP's
    payload share, over ``connections`` each carrying at most ``one_connection_bps`` on the path:
    the modelled window per RTT, or as measured) and how many such transfers the link carries at
    once before each slows down (that time over the bytes' time at the line rate): per pair on
    each hop of its path (``WanLinks.path_links``), and per hop the slowest pair's."""
    routes = RoutingTable(topo)
    paths = boundary_paths(workers, routes, experiment_boundaries(exp))
    dc = {w.rank: w.dc for w in workers}
    nbytes = exp.activation_bytes
    links: dict[Hop, LinkTiming] = {}
    rates: dict[Hop, int] = {}
    rtts: dict[Hop, float] = {}
    path_links: dict[tuple[int, int], tuple[LinkTiming, ...]] = {}
    # each DC pair's timing on each hop of its route, the same for every pair of workers there
    by_dcs: dict[tuple[str, str], tuple[LinkTiming, ...]] = {}
    for (src, dst), path in paths.items():
        pair = (dc[src], dc[dst])
        if pair not in by_dcs:
            rtt_s = routes.rtt_us(*pair) / 1e6
            one = one_connection_bps(exp, topo, workers, *pair, nbytes / connections)
            burst = sent_at_once(exp, topo, workers, *pair, nbytes, connections)
            own = []
            for h in path:
                link = topo.link_between(h.src, h.dst)
                assert link is not None  # a routed hop is a link
                line_s = nbytes * 8 / (link.rate_bps * TCP_GOODPUT_FRACTION)
                t = transfer_time_s(nbytes, usable_bps(link.rate_bps) * TCP_GOODPUT_FRACTION, one, connections)
                rates[h], rtts[h] = link.rate_bps, max(rtts.get(h, 0.0), rtt_s)
                own.append(LinkTiming(t, link.delay_us / 1e6, max(1.0, t / line_s), burst))
                if h not in links or links[h].transfer_s < t:
                    links[h] = own[-1]
            by_dcs[pair] = tuple(own)
        path_links[(src, dst)] = by_dcs[pair]
    one_way = {k: routes.one_way_delay_us(dc[k[0]], dc[k[1]]) / 1e6 for k in paths}
    return WanLinks(links, paths, one_way, rates, rtts, path_links, connections)


def plan_grants(
    exp: Experiment,
    topo: TopologySpec,
    workers: list[WorkerSpec],
    connections: int,
    floor_share: float | None = None,
    block_s: tuple[float, float] | None = None,
    stage_s: tuple[tuple[float, float], ...] | None = None,
) -> GrantPlan:
    """The grant plan (``_plan_grants``), kept for the last few inputs: a policy and the same
    policy with BubbleTea (which fills bubbles and moves no training transfer) share one, so that a
    sweep point's ``atlas`` and ``atlas+bubbletea``, and a plan's prediction and its bubbles, plan
    it once (``scripts/bench_sim.py``)."""
    p = exp.policy
    if p.bubbletea:
        exp = replace(exp, policy=replace(p, name=p.base, bubbletea=False))
    return _plan_grants(exp, topo, tuple(workers), connections, floor_share, block_s, stage_s)


@functools.lru_cache(maxsize=PLANS_KEPT)
def _plan_grants(
    exp: Experiment,
    topo: TopologySpec,
    placed: tuple[WorkerSpec, ...],
    connections: int,
    floor_share: float | None = None,
    block_s: tuple[float, float] | None = None,
    stage_s: tuple[tuple[float, float], ...] | None = None,
) -> GrantPlan:
    """The grant plan of ``exp`` placed as ``workers`` on ``topo`` with ``connections`` per
    cross-DC transfer (see the module doc); ``floor_share`` of the held classes (default
    ``held_floor_share(exp)``); ``block_s`` per-block compute seconds (default the experiment's);
    ``stage_s`` each virtual stage's profiled (forward, backward) seconds per microbatch (real
    compute; a worker's stage where each holds one). A layout without cross-DC boundaries has no
    hops. Raises ValueError when ``stage_s`` does not give every virtual stage."""
    workers = list(placed)
    virtual = len(experiment_homes(exp))
    if stage_s is not None and len(stage_s) != virtual:
        raise ValueError(f"stage_s gives {len(stage_s)} stages' times for {virtual} virtual stages")
    floor = held_floor_share(exp) if floor_share is None else floor_share
    wan = wan_links(exp, topo, workers, connections, lambda bps: granted_class_bps(bps, exp.replicas, floor))
    longest = max((x.transfer_s for x in wan.links.values()), default=0.0)
    staggers = [
        tuple(r * k * longest / STAGGER_STEPS for r in range(exp.replicas))
        for k in (range(STAGGER_STEPS + 1) if wan.links else [0])
    ]
    # the offsets' simulations are independent: on every core where they outweigh a pool's start
    actions = 2 * virtual * exp.microbatches * exp.replicas
    simulated = functools.partial(simulate_wan, exp, topo, workers, wan, block_s=block_s, stage_s=stage_s)
    sims = map_over_cores(simulated, staggers, parallel=actions >= PARALLEL_ACTIONS)
    tried = [(*sim, st) for sim, st in zip(sims, staggers, strict=True)]
    best_t = min(t for t, _, _ in tried)
    # the largest offset that costs the simulated iteration nothing: pipelines then take the link in
    # turn instead of queueing their bytes behind each other's grants at the floor rate
    t, order, stagger = max((x for x in tried if x[0] <= best_t * (1 + STAGGER_TOLERANCE)), key=lambda x: x[2])
    nbytes = exp.activation_bytes
    hops = tuple(
        HopPlan(
            h,
            wan.rate_bps[h],
            nbytes * 8 / (x.transfer_s * TCP_GOODPUT_FRACTION),
            x.transfer_s,
            x.delay_s,
            wan.rtt_s[h],
            tuple(order[h]),
        )
        for h, x in sorted(wan.links.items())
    )
    return GrantPlan(hops, stagger, t, tried[0][0], nbytes)


def simulated_iteration(
    exp: Experiment,
    topo: TopologySpec,
    workers: list[WorkerSpec],
    connections: int,
    block_s: tuple[float, float] | None = None,
    timeline: list[tuple[int, int, RankAction, float, float]] | None = None,
    start_offsets_s: tuple[float, ...] | None = None,
) -> float:
    """One iteration of ``exp`` placed as ``workers`` with its links shared as its policy shares
    them (``simulate``): without grants as TCP's flows do, all pipelines starting together, or
    pipeline r ``start_offsets_s[r]`` s after the first (as a run measured them:
    ``testbed sim --validate``); under FIFO grants each held for the rendezvous,
    likewise; under planned grants at the grant plan's offsets (``plan_grants``). Returns the
    iteration (s); ``timeline`` as ``simulate``'s. Raises ValueError when ``start_offsets_s`` does
    not give every replica."""
    if start_offsets_s is not None and len(start_offsets_s) != exp.replicas:
        raise ValueError(f"{len(start_offsets_s)} start offsets for {exp.replicas} replicas")
    stagger = start_offsets_s or (0.0,) * exp.replicas
    sharing = exp.policy.sharing if exp.policy.grants else "tcp"
    if sharing == "tcp":
        wan = wan_links(exp, topo, workers, connections, float)
    else:
        floor = held_floor_share(exp)
        wan = wan_links(exp, topo, workers, connections, lambda bps: granted_class_bps(bps, exp.replicas, floor))
        if sharing == "planned":
            plan = plan_grants(exp, topo, workers, connections, block_s=block_s)
            if timeline is None:
                return plan.iteration_s  # the plan's own simulation at its offsets
            stagger = plan.stagger_s
    return simulate_wan(exp, topo, workers, wan, stagger, block_s, sharing=sharing, timeline=timeline)[0]


def simulate_wan(
    exp: Experiment,
    topo: TopologySpec,
    workers: list[WorkerSpec],
    wan: WanLinks,
    stagger_s: tuple[float, ...],
    block_s: tuple[float, float] | None = None,
    **kwargs: Any,
) -> tuple[float, Mapping[Hop, list[Transfer]]]:
    """``simulate`` of ``exp`` placed as ``workers`` on ``topo`` over ``wan`` (``wan_links``): each
    pair's transfers at their own path's timing and striped over ``wan.stripes`` connections, the
    loss's worker starting once the loss has been averaged (``allreduce.loss_allreduce_s``);
    ``kwargs`` as ``simulate``'s."""
    return simulate(
        exp,
        workers,
        wan.links,
        wan.paths,
        wan.one_way_s,
        stagger_s,
        block_s,
        path_links=wan.path_links,
        loss_wait_s=loss_allreduce_s(exp, topo, workers),
        stripes=wan.stripes,
        **kwargs,
    )


def iteration_lower_bound(
    exp: Experiment,
    topo: TopologySpec,
    workers: list[WorkerSpec],
    connections: int,
    block_s: tuple[float, float] | None = None,
) -> float:
    """A lower bound (s) of ``simulated_iteration`` without grants (links shared as TCP's flows
    share them), with the pipelines starting together or later: the longest path through the first
    pipeline's schedule (``critical_path.critical_path_s``), each transfer at its speed alone. A
    thousandth of the simulation's cost or less (``placement.select_dcs`` prunes DC orders with it)."""
    wan = wan_links(exp, topo, workers, connections, float)
    return critical_path_s(exp, workers, wan.links, wan.paths, wan.one_way_s, block_s, wan.path_links)


def format_grant_plan(plan: GrantPlan) -> str:
    """The plan as text: per link direction its rates, times and the order of one iteration's
    transfers (``F2r1``: replica 1's activations of microbatch 2); then the offsets."""
    if not plan.hops:
        return "no stage boundary crosses the WAN: nothing to grant"
    lines = [
        f"one transfer: {plan.bytes_per_transfer} bytes; pipeline offsets (stagger): "
        + ", ".join(f"r{r} {s * 1e3:.1f} ms" for r, s in enumerate(plan.stagger_s))
        + f"; simulated iteration {plan.iteration_s * 1e3:.1f} ms "
        f"(all pipelines starting together: {plan.iteration_unstaggered_s * 1e3:.1f} ms)"
    ]
    for h in plan.hops:
        lines.append(
            f"  {h.hop}: link {h.rate_bps / 1e6:g} Mbit/s, {h.delay_s * 1e3:g} ms one way; granted "
            f"{h.granted_bps / 1e6:.1f} Mbit/s, {h.transfer_s * 1e3:.2f} ms per transfer, deadline "
            f"{h.deadline_s * 1e3:.1f} ms"
        )
        lines.append("    order: " + " ".join(str(t) for t in h.order))
    return "\n".join(lines)
