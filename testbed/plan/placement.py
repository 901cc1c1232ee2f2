"""Placement: which host (emulated GPU) runs which pipeline stage of which data-parallel replica.

Pure functions of an experiment and a topology. Rank = stage x replicas + replica under every
placement (``rank_of``), so the training math (and the losses) never depend on where workers run.
The policy's ``placement`` (``spec/policy.py``) chooses the layout:

- ``file-order`` (``pp-fair``), ``largest-first`` and ``atlas`` (DESIGN.md section 1, items 1-2):
  PP across DCs, DP inside a DC. DCs are taken in an order (file order; most hosts first, ties in
  file order; or the order ``select_dcs`` finds fastest by the cost model); each takes as many
  consecutive stages as it holds with all replicas of a stage inside it.
- ``replica-per-dc`` (``dp-wan``): the conventional layout: all stages of replica r in one DC,
  replicas in different DCs, so every stage's gradient all-reduce crosses the WAN.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import replace

from testbed.errors import SpecError
from testbed.plan.cost_model import lower_bound_s, predict
from testbed.plan.workers import WorkerSpec, rank_of
from testbed.spec.addressing import host_name
from testbed.spec.experiment import Experiment
from testbed.spec.policy import Policy
from testbed.spec.topology import DCSpec, TopologySpec

__all__ = [
    "WorkerSpec",
    "rank_of",
    "place",
    "place_pipeline",
    "place_stages",
    "place_dp_wan",
    "select_dcs",
    "decode_hosts",
]
#: DC selection tries every order of every subset up to this many DCs (1956 orders at 6);
#: above it, the prefixes of the largest-first order
MAX_DCS_SEARCHED = 6
#: DC selections kept for reuse (``select_dcs``)
SELECTIONS_KEPT = 8


def atlas_dc_order(topo: TopologySpec) -> list[DCSpec]:
    """DCs by available hosts, largest first; ties keep file order (Python's sort is stable)."""
    return sorted(topo.dcs, key=lambda dc: -dc.training_hosts)


def place_pipeline(exp: Experiment, topo: TopologySpec, order: list[DCSpec] | None = None) -> list[WorkerSpec]:
    """PP across DCs (in ``order``, default file order), all replicas of a stage in one DC.
    Raises SpecError naming the shortfall when the DCs cannot hold the layout."""
    return place_stages(exp.stages, exp.replicas, topo, order, exp.source)


def place_stages(
    stages: int, replicas: int, topo: TopologySpec, order: list[DCSpec] | None = None, source: str = "--mesh"
) -> list[WorkerSpec]:
    """``place_pipeline`` for ``stages`` x ``replicas`` workers (a user job's mesh has no
    experiment); ``source`` is named in the error. Raises SpecError naming the shortfall."""
    workers, stage = [], 0
    for dc in order or topo.dcs:
        for k in range(dc.training_hosts // replicas):
            if stage == stages:
                break
            for r in range(replicas):
                host = host_name(dc.name, k * replicas + r)
                workers.append(WorkerSpec(rank_of(stage, r, replicas), stage, r, host, dc.name))
            stage += 1
    if stage < stages:
        reserved = sum(dc.decode_hosts for dc in topo.dcs)
        note = f" ({reserved} hosts are reserved by decode_hosts)" if reserved else ""
        largest = max(dc.training_hosts for dc in topo.dcs)
        raise SpecError(
            source,
            "stages",
            stages,
            f"x replicas {replicas} do not fit topology "
            f"{topo.name}: its DCs hold only {stage} stages of {replicas} replicas (a stage needs "
            f"{replicas} hosts in one DC; the largest DC has {largest}){note}",
            "use fewer stages or replicas, or a topology with more hosts",
        )
    return sorted(workers, key=lambda w: w.rank)


def place_by_hand(hosts: dict[tuple[int, int], str], replicas: int, topo: TopologySpec) -> list[WorkerSpec]:
    """A user job's workers where its placement file puts them (``spec/mesh.read_placement``:
    each (stage, replica)'s host, checked against ``topo``), ranked as the mesh numbers them."""
    dc_of = {host_name(dc.name, k): dc.name for dc in topo.dcs for k in range(dc.hosts)}
    workers = [WorkerSpec(rank_of(s, r, replicas), s, r, h, dc_of[h]) for (s, r), h in hosts.items()]
    return sorted(workers, key=lambda w: w.rank)


def place_dp_wan(exp: Experiment, topo: TopologySpec) -> list[WorkerSpec]:
    """Data parallelism across DCs: whole pipelines in the DCs (file order) that hold ``stages``
    hosts, the replicas spread over them in consecutive blocks as evenly as their hosts allow
    (replica r in its own DC while there are DCs enough; at the paper's scale several pipelines in
    each DC), so that the gradient all-reduce's ring, which runs in replica order
    (``allreduce.py``), crosses each DC boundary once. Raises SpecError naming the shortfall."""
    dcs = [dc for dc in topo.dcs if dc.training_hosts >= exp.stages]
    room = [dc.training_hosts // exp.stages for dc in dcs]
    if sum(room) < exp.replicas:
        raise SpecError(
            exp.source,
            "replicas",
            exp.replicas,
            f"do not fit topology {topo.name} under dp-wan: its DCs hold only "
            f"{sum(room)} whole pipelines of {exp.stages} stages",
            "use fewer replicas or stages, or a topology with larger DCs",
        )
    home: list[tuple[str, int]] = []  # (DC, pipeline slot in it) of each replica
    left = exp.replicas
    for i, dc in enumerate(dcs):
        share = min(room[i], -(-left // (len(dcs) - i)), left)  # an even share of what is left
        short = left - share - sum(room[i + 1 :])  # take more where the later DCs cannot hold the rest
        share += max(0, short)
        home += [(dc.name, k) for k in range(share)]
        left -= share
    return [
        WorkerSpec(rank_of(s, r, exp.replicas), s, r, host_name(home[r][0], home[r][1] * exp.stages + s), home[r][0])
        for s in range(exp.stages)
        for r in range(exp.replicas)
    ]


def dc_orders(topo: TopologySpec) -> list[tuple[DCSpec, ...]]:
    """The DC orders DC selection weighs: every order of every subset of DCs (up to
    ``MAX_DCS_SEARCHED`` DCs), else the prefixes of the largest-first order."""
    if len(topo.dcs) > MAX_DCS_SEARCHED:
        order = atlas_dc_order(topo)
        return [tuple(order[:k]) for k in range(1, len(order) + 1)]
    return [p for k in range(1, len(topo.dcs) + 1) for p in itertools.permutations(topo.dcs, k)]


def select_dcs(exp: Experiment, topo: TopologySpec, policy: Policy) -> tuple[tuple[DCSpec, ...], float]:
    """Atlas's DC selection (``_select_dcs``), kept for the last few inputs: a policy and the same
    policy with BubbleTea (which moves no training transfer) share one, so that a sweep point's
    ``atlas`` and ``atlas+bubbletea`` select once (``scripts/bench_sim.py``)."""
    if policy.bubbletea:
        policy = replace(policy, name=policy.base, bubbletea=False)
    # the experiment's own policy plays no part (``policy`` is weighed), and would only split the keys
    return _select_dcs(replace(exp, policy=policy), topo, policy)


@functools.lru_cache(maxsize=SELECTIONS_KEPT)
def _select_dcs(exp: Experiment, topo: TopologySpec, policy: Policy) -> tuple[tuple[DCSpec, ...], float]:
    """Atlas's DC selection (DESIGN.md section 1, item 2): among the DC orders of ``dc_orders`` that
    hold ``exp``'s stages x replicas, the one whose pipeline placement the cost model
    (``cost_model.predict``, its links shared as TCP shares them) predicts to be fastest under
    ``policy``'s striping (WAN rates, delays and per-connection shares included); ties go to fewer
    DCs, then to the largest-first order. An order whose lower bound (``cost_model.lower_bound_s``)
    exceeds the best prediction found is not predicted: it could neither win nor tie. Returns (the
    DCs used, in pipeline order; the predicted iteration time in s). Raises SpecError when no order
    holds the layout (``place_pipeline``'s message for the largest-first order)."""
    # ranked under TCP sharing (the grant plan's simulation, per candidate, would cost seconds)
    costed = replace(exp, policy=replace(policy, sharing="tcp"))
    rank = {dc.name: i for i, dc in enumerate(atlas_dc_order(topo))}
    candidates: dict[tuple[str, ...], list[WorkerSpec]] = {}
    for order in dc_orders(topo):
        try:
            workers = place_pipeline(exp, topo, list(order))
        except SpecError:
            continue
        candidates.setdefault(tuple(dict.fromkeys(w.dc for w in sorted(workers, key=lambda w: w.stage))), workers)
    # the most promising first, so that a candidate whose lower bound exceeds the best prediction
    # found is left out (it could neither win nor tie); without a bound, a candidate is predicted
    bounds: dict[tuple[str, ...], float] = {}
    for used, workers in candidates.items():
        bound = lower_bound_s(costed, topo, workers)
        bounds[used] = -math.inf if bound is None else bound
    best: tuple[tuple, tuple[DCSpec, ...], float] | None = None
    for used in sorted(candidates, key=bounds.__getitem__):
        if best is not None and round(bounds[used], 9) > best[0][0]:
            continue
        t = predict(costed, topo, candidates[used]).iteration_s
        key = (round(t, 9), len(used), [rank[d] for d in used])
        if best is None or key < best[0]:
            best = (key, tuple(topo.dc(d) for d in used), t)
    if best is None:
        place_pipeline(exp, topo, atlas_dc_order(topo))  # raises the shortfall
        raise AssertionError("unreachable")
    return best[1], best[2]


def place(exp: Experiment, topo: TopologySpec | None = None, policy: Policy | None = None) -> list[WorkerSpec]:
    """The placement of ``policy`` (default: the experiment's) on ``topo`` (default: the
    experiment's own topology). Raises SpecError naming the shortfall."""
    topo = topo or exp.topology_spec
    pol = policy or exp.policy
    if pol.placement == "replica-per-dc":
        return place_dp_wan(exp, topo)
    if pol.placement == "largest-first":
        return place_pipeline(exp, topo, atlas_dc_order(topo))
    if pol.placement == "atlas":
        return place_pipeline(exp, topo, list(select_dcs(exp, topo, pol)[0]))
    return place_pipeline(exp, topo)


def decode_hosts(topo: TopologySpec, workers: list[WorkerSpec]) -> dict[str, str]:
    """BubbleTea's decode host of every DC that holds training workers: the first of the hosts the
    topology declares for decoding (``decode_hosts``: the DC's last hosts), else its first host that
    is not a training worker. Raises SpecError naming the DC when it has none."""
    used = {w.host for w in workers}
    out = {}
    for i, dc in enumerate(topo.dcs):
        if not any(w.dc == dc.name for w in workers):
            continue
        free = [host_name(dc.name, k) for k in range(dc.training_hosts, dc.hosts)]
        free += [host_name(dc.name, k) for k in range(dc.training_hosts) if host_name(dc.name, k) not in used]
        if not free:
            raise SpecError(
                topo.source,
                f"dcs[{i}].hosts",
                dc.hosts,
                f"leaves no host in DC {dc.name} for a BubbleTea decode host (every host trains)",
                "declare one more host with decode_hosts: 1 (hosts + 1), which keeps the training layout as it is",
            )
        out[dc.name] = free[0]
    return out
