"""Random experiments (``sim/random_experiments.py``): every draw is a valid experiment whose files
load back as drawn and whose plan passes the memory check; the candidates follow the stated
uniform and log-uniform ranges; the draws fall a quarter in each quartile of the planned ratio;
a seed gives the same draws again; a draw the machine check refuses is counted, never reshaped.
Also the errors' distribution (``sim/validate.error_distribution``) and the compute-load refusal
(``run/fit.check_compute_load``: real PyTorch on one thread)."""

from __future__ import annotations

import math
import random
import statistics
from collections import Counter
from dataclasses import replace

import pytest

from testbed.errors import SpecError
from testbed.plan.run_plan import make_plan
from testbed.run.fit import check_compute_load, check_memory
from testbed.run.random_validation import write_draw
from testbed.sim.random_experiments import (
    CALIBRATION,
    RANGES,
    Draw,
    draw_candidate,
    load_draw,
    planned_wan_compute_ratio,
    quartile,
    random_experiments,
    ratio_quartiles,
)
from testbed.sim.validate import error_distribution
from testbed.spec.experiment_file import load_experiment
from testbed.spec.queues import queue_shortfalls
from testbed.spec.topology_file import parse_topology


@pytest.fixture(scope="module")
def draws():
    return random_experiments(12, seed=7)


def test_every_draw_is_a_valid_experiment_that_loads_back_from_its_files(draws, tmp_path):
    assert len(draws.accepted) == 12
    for draw, exp, ratio, _ in draws.accepted:
        loaded = load_experiment(write_draw(draw, tmp_path / draw.name))
        assert _without_sources(loaded.to_dict()) == _without_sources(exp.to_dict())
        check_memory(make_plan(loaded))  # raises where the workers would not fit this machine
        assert ratio == planned_wan_compute_ratio(loaded) > 0
        assert not queue_shortfalls(loaded.topology_spec)  # every WAN queue holds a BDP


def _without_sources(d: dict) -> dict:
    """An experiment's record less where its files were read from (and so its topology's name as written)."""
    return {**d, "source": "", "topology": "", "topology_spec": {**d["topology_spec"], "source": ""}}


def test_candidates_follow_the_stated_ranges():
    rng = random.Random(3)
    cands = [draw_candidate(rng, f"c{i}") for i in range(3000)]
    n_dcs = Counter(len(c.topology["dcs"]) for c in cands)
    assert set(n_dcs) == {2, 3, 4} and all(abs(v / 3000 - 1 / 3) < 0.04 for v in n_dcs.values())
    hosts = Counter(dc["hosts"] - dc["decode_hosts"] for c in cands for dc in c.topology["dcs"])
    assert set(hosts) == set(range(2, 7)) and all(abs(v / sum(hosts.values()) - 0.2) < 0.03 for v in hosts.values())
    rates = [float(k["rate"].removesuffix("mbit")) for c in cands for k in c.topology["links"]]
    delays = [float(k["delay"].removesuffix("ms")) for c in cands for k in c.topology["links"]]
    assert 10 <= min(rates) and max(rates) <= 1000 and 1 <= min(delays) and max(delays) <= 100
    # log-uniform: the median of log10 halfway between the ends, a third of the draws per decade
    assert abs(statistics.median(math.log10(r) for r in rates) - 2) < 0.08
    assert abs(statistics.median(math.log10(d) for d in delays) - 1) < 0.08
    assert abs(sum(r < 100 for r in rates) / len(rates) - 0.5) < 0.03
    for field, (low, high) in (
        ("stages", RANGES.stages),
        ("replicas", RANGES.replicas),
        ("microbatches", RANGES.microbatches),
    ):
        seen = Counter(c.experiment[field] for c in cands)
        assert set(seen) == set(range(low, high + 1))
        assert all(abs(v / 3000 - 1 / (high - low + 1)) < 0.04 for v in seen.values())
    widths = [c.experiment["model"]["d_model"] for c in cands]
    assert min(widths) == 64 and max(widths) == 384 and all(w % 8 == 0 for w in widths)
    fwd = [c.experiment["compute"]["forward_ms"] for c in cands]
    assert 15 <= min(fwd) < 16 and 59 < max(fwd) <= 60 and abs(statistics.mean(fwd) - 37.5) < 1.0
    assert all(
        c.experiment["compute"]["backward_ms"] == round(2 * c.experiment["compute"]["forward_ms"], 1) for c in cands
    )
    # every topology is connected: the chain is always there
    assert all(
        {tuple(k["between"]) for k in c.topology["links"]}
        >= {(f"dc{i}", f"dc{i + 1}") for i in range(len(c.topology["dcs"]) - 1)}
        for c in cands
    )


def test_a_quarter_of_the_draws_in_each_quartile_of_the_ratio(draws):
    q1, q2, q3 = ratio_quartiles()
    assert 0 < q1 < q2 < q3
    assert Counter(q for *_, q in draws.accepted) == {0: 3, 1: 3, 2: 3, 3: 3}
    for _, _, ratio, q in draws.accepted:
        assert quartile(ratio) == q
        assert (0, q1, q2, q3, math.inf)[q] <= ratio < (0, q1, q2, q3, math.inf)[q + 1]
    # the boundaries split another seed's candidates that cross the WAN in quarters too
    rng = random.Random(99)
    seen = []
    while len(seen) < CALIBRATION:
        try:
            ratio = planned_wan_compute_ratio(load_draw(draw_candidate(rng, "x")))
        except SpecError:
            continue
        if ratio > 0:
            seen.append(quartile(ratio))
    counts = Counter(seen)
    assert all(abs(counts[q] / len(seen) - 0.25) < 0.07 for q in range(4)), counts


def test_a_seed_gives_the_same_draws_and_another_seed_others(draws):
    again = random_experiments(12, seed=7)
    assert [d.name for d, *_ in again.accepted] == [d.name for d, *_ in draws.accepted]
    assert [d.experiment for d, *_ in again.accepted] == [d.experiment for d, *_ in draws.accepted]
    other = random_experiments(12, seed=8)
    assert [d.experiment for d, *_ in other.accepted] != [d.experiment for d, *_ in draws.accepted]


def test_a_refused_draw_is_counted_and_never_reshaped():
    def narrow_only(exp):
        if exp.model.d_model > 200:
            raise SpecError(exp.source, "model.d_model", exp.model.d_model, "is too wide here", "narrower")

    out = random_experiments(8, seed=7, check=narrow_only)
    assert len(out.accepted) == 8 and all(exp.model.d_model <= 200 for _, exp, _, _ in out.accepted)
    assert out.rejected and all(d.experiment["model"]["d_model"] > 200 for d, _ in out.rejected)
    assert all("model.d_model" in why and "too wide" in why for _, why in out.rejected)


def test_planned_ratio_by_hand():
    # 2 x 64 tokens x 128 values x 4 bytes = 64 KiB: 524,288 bits at 100 Mbit/s is 5.24 ms, over 40 ms
    draw = Draw(
        "hand",
        {
            "name": "t",
            "dcs": [{"name": "a", "hosts": 2}, {"name": "b", "hosts": 2}],
            "links": [{"between": ["a", "b"], "rate": "100mbit", "delay": "20ms"}],
        },
        {
            "name": "hand",
            "topology": "t.yaml",
            "stages": 2,
            "replicas": 2,
            "microbatches": 4,
            "microbatch_size": 2,
            "model": {"n_layers": 4, "d_model": 128, "n_heads": 4, "seq_len": 64},
            "compute": {"mode": "padded", "forward_ms": 40, "backward_ms": 80},
        },
    )
    assert planned_wan_compute_ratio(load_draw(draw)) == pytest.approx(524_288 / 100e6 / 0.040)
    one_dc = Draw(
        "one", {**draw.topology, "dcs": [{"name": "a", "hosts": 4}, {"name": "b", "hosts": 2}]}, draw.experiment
    )
    assert planned_wan_compute_ratio(load_draw(one_dc)) == 0.0  # both stages fit DC a
    assert parse_topology(draw.topology).dcs[0].hosts == 2


def test_error_distribution():
    d = error_distribution([0.01, -0.02, 0.05, -0.04])
    assert d["n"] == 4 and d["median"] == pytest.approx(0.03) and d["largest"] == pytest.approx(0.05)
    assert d["p90"] == pytest.approx(0.04 + 0.7 * 0.01)  # numpy's linear: 0.9 x 3 = 2.7 between 0.04 and 0.05
    assert math.isnan(error_distribution([])["median"])


def test_compute_load_is_refused_where_the_targets_are_shorter_than_this_machine_computes():
    exp = load_experiment("two_dc")
    load = check_compute_load(make_plan(exp))
    assert 0 < load < 0.7
    fast = exp.with_overrides(compute=replace(exp.compute, forward_ms=0.01, backward_ms=0.02))
    with pytest.raises(SpecError) as e:
        check_compute_load(make_plan(fast))
    assert e.value.field == "model.d_model" and "target" in e.value.problem
