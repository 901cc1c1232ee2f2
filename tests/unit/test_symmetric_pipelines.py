"""One pipeline simulated for all where every pipeline runs the same timeline
(``symmetric_pipelines.symmetric_copies``): the same iteration time and link order as every pipeline
simulated (a ``timeline`` asks for every pipeline's actions, so it turns the shortcut off), on the
shipped experiments and random draws under TCP sharing, and the cases that must not take it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from testbed.plan.boundary_transfers import Hop, LinkTiming
from testbed.plan.connections import wan_connections
from testbed.plan.grant_plan import wan_links
from testbed.plan.grant_sim import simulate
from testbed.plan.placement import place
from testbed.plan.symmetric_pipelines import symmetric_copies
from testbed.sim.random_experiments import random_experiments
from testbed.spec.experiment_file import load_experiment, shipped_experiments
from testbed.spec.scenario_file import load_scenario
from tests.unit.experiments import exp


def _both(e, workers, stagger=None):
    """(the iteration and link order as simulated with the shortcut where it applies; the same with
    every pipeline simulated; how many copies the shortcut used)."""
    wan = wan_links(e, e.topology_spec, workers, wan_connections(e, e.topology_spec, workers), float)
    stagger = stagger or (0.0,) * e.replicas
    args = (e, workers, wan.links, wan.paths, wan.one_way_s, stagger)
    kw = {"path_links": wan.path_links}
    rank = {(w.stage, w.replica): w.rank for w in workers}
    rank_at = [[rank[(s, r)] for r in range(e.replicas)] for s in range(e.stages)]
    copies = symmetric_copies(e, rank_at, wan.path_links, wan.paths, wan.one_way_s, stagger, True)
    return simulate(*args, sharing="tcp", **kw), simulate(*args, sharing="tcp", timeline=[], **kw), copies


def _cases():
    out = [load_experiment(n).with_overrides(policy="pp-fair") for n in shipped_experiments()]
    out += [e.with_overrides(policy="pp-fair") for _, e, _, _ in random_experiments(8, seed=39).accepted]
    sc = load_scenario("gpt3_175b_4dc")  # 128 GPUs, 8 microbatches a pipeline
    small = replace(sc, dcs=tuple((name, 32) for name, _ in sc.dcs))
    replicas = small.gpus // small.tensor_parallel // small.stages
    out.append(replace(small, global_batch=replicas * 8 * small.microbatch_size).experiment("pp-fair"))
    return out


def test_one_pipeline_for_all_gives_every_pipelines_iteration_and_order():
    reduced = 0
    for e in _cases():
        workers = place(e)
        (end, order), (full_end, full_order), copies = _both(e, workers)
        assert end == pytest.approx(full_end, rel=1e-12), e.name
        assert order == full_order, e.name
        reduced += copies > 1
    assert reduced >= 3  # the shortcut was taken, not only passed over


def test_pipelines_that_start_apart_or_cross_other_paths_are_each_simulated():
    e = exp(schedule="gpipe", microbatches=2, stages=2, replicas=2)
    workers = place(e)
    by = {(w.stage, w.replica): w.rank for w in workers}
    rank_at = [[by[(s, r)] for r in range(2)] for s in range(2)]
    hop, back = Hop("a", "b"), Hop("b", "a")
    paths = {(by[(0, r)], by[(1, r)]): [hop] for r in (0, 1)} | {(by[(1, r)], by[(0, r)]): [back] for r in (0, 1)}
    one_way = dict.fromkeys(paths, 0.010)
    links = {k: (LinkTiming(0.020, 0.010),) for k in paths}  # each pair's timing on its one hop
    assert symmetric_copies(e, rank_at, links, paths, one_way, (0.0, 0.0), True) == 2
    assert symmetric_copies(e, rank_at, links, paths, one_way, (0.0, 0.010), True) == 1  # staggered
    assert symmetric_copies(e, rank_at, links, paths, one_way, (0.0, 0.0), False) == 1  # granted
    bursts = {k: (replace(x, bursts=True),) for k, (x,) in links.items()}  # a fluid queue: side by side
    assert symmetric_copies(e, rank_at, bursts, paths, one_way, (0.0, 0.0), True) == 2
    slower = dict(one_way) | {(by[(0, 1)], by[(1, 1)]): 0.020}
    assert symmetric_copies(e, rank_at, links, paths, slower, (0.0, 0.0), True) == 1  # another delay
    # replica 1's activations slower on the same hop (a window over a longer RTT): its own timeline
    other = links | {(by[(0, 1)], by[(1, 1)]): (LinkTiming(0.040, 0.010),)}
    assert symmetric_copies(e, rank_at, other, paths, one_way, (0.0, 0.0), True) == 1
    # replica 1's boundary inside one DC: no hop where replica 0's crosses one
    inside = {k: v for k, v in paths.items() if k != (by[(0, 1)], by[(1, 1)])}
    assert symmetric_copies(e, rank_at, links, inside, one_way, (0.0, 0.0), True) == 1
    # no link crossed: no sharing at all, whatever the policy
    assert symmetric_copies(e, rank_at, {}, {}, {}, (0.0, 0.0), False) == 2
