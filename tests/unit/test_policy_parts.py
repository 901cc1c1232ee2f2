"""Policies as independent parts: presets, parts replaced by name, refusals that say why; the
planner's own choice (``--plan best``) and the per-GPU memory budget."""

from __future__ import annotations

import pytest

from testbed.errors import SpecError
from testbed.plan.memory import gpu_bytes, gpu_shortfall
from testbed.plan.what_if import alternatives, best_plan
from testbed.spec.compute import ComputeModel
from testbed.spec.model import largest_stage_blocks
from testbed.spec.policy import ABLATION, UnknownPolicy, parse_policy
from tests.unit.experiments import exp, topo


def test_presets_and_parts():
    a = parse_policy("atlas")
    assert (a.placement, a.striping, a.sharing, a.bubbletea) == ("atlas", True, "planned", False) and a.grants
    p = parse_policy("pp-fair/placement=atlas/striping=on/sharing=fifo+bubbletea")
    assert (p.preset, p.placement, p.striping, p.sharing, p.bubbletea) == ("pp-fair", "atlas", True, "fifo", True)
    assert p.base == "pp-fair/placement=atlas/striping=on/sharing=fifo" and p.grants
    assert not parse_policy("dp-wan").pipeline_across_dcs


def test_prefill_alone_keeps_the_placement_and_trains_nothing():
    a = parse_policy("pp-fair/placement=atlas+prefill-alone")
    assert (a.base, a.placement, a.bubbletea, a.training) == ("pp-fair/placement=atlas", "atlas", True, False)
    assert parse_policy("atlas+bubbletea").training and parse_policy("atlas").training
    with pytest.raises(UnknownPolicy, match="prefill-alone"):
        parse_policy("atlas+prefill-alone+bubbletea")


def test_the_ablation_adds_one_part_at_a_time():
    steps = [parse_policy(n) for n in ABLATION]
    parts = [(s.placement, s.striping, s.sharing) for s in steps]
    assert parts[0] == ("file-order", False, "tcp") and parts[-1] == ("atlas", True, "planned")
    for a, b in zip(parts, parts[1:]):
        assert sum(x != y for x, y in zip(a, b)) == 1  # exactly one part changes per step


@pytest.mark.parametrize(
    "name, why",
    [
        ("bogus", "use a preset"),
        ("atlas/colour=red", "'colour=red' is no policy part"),
        ("atlas/sharing=lottery", "'sharing=lottery' is no policy part"),
        ("atlas/striping=on/striping=off", "striping is given twice"),
        ("dp-wan/sharing=planned", "replica-per-dc does not make"),
    ],
)
def test_a_name_that_is_no_policy_says_why(name, why):
    with pytest.raises(UnknownPolicy, match=why):
        parse_policy(name)


def test_a_stage_above_the_gpu_budget_makes_a_plan_infeasible():
    e = exp(gpu_memory_mb=1.0)
    assert gpu_shortfall(exp()) is None
    why = gpu_shortfall(e)
    assert why and f"{gpu_bytes(e, 0) / 2**20:.0f} MiB" in why and "gpu_memory_mb 1" in why
    plans = alternatives(e, topo({"a": 4, "b": 4}))
    assert plans and all(p.prediction is None and "GPU memory" in p.why_not for p in plans)
    with pytest.raises(SpecError, match="no feasible plan"):
        best_plan(e, topo({"a": 4, "b": 4}))


def test_the_best_plan_keeps_the_global_batch_and_says_why():
    e = exp(policy=parse_policy("atlas"))
    chosen, why = best_plan(e, e.topology_spec)
    assert chosen.replicas * chosen.microbatches == e.replicas * e.microbatches
    assert why.startswith(f"--plan best: {chosen.stages} stages x {chosen.replicas} replicas")
    assert "feasible plans of the same global batch" in why


def test_the_best_plan_scales_a_given_optimizer_target_with_the_largest_stage():
    """4 stages of one block each, one replica: the planner picks 2 stages of two blocks, so the
    targets of the largest stage double, the given optimizer step's with them."""
    kw = {"stages": 4, "replicas": 1, "microbatches": 8, "policy": parse_policy("atlas")}
    e = exp(**kw, compute=ComputeModel(forward_ms=40, backward_ms=80, optimizer_ms=20))
    chosen, _ = best_plan(e, e.topology_spec)
    assert chosen.stages == 2 and largest_stage_blocks(e.model.n_layers, chosen.stages) == 2
    assert chosen.compute.optimizer_ms == pytest.approx(40) and chosen.compute.forward_ms == pytest.approx(80)
    # left out, the step follows the chosen forward target
    chosen, _ = best_plan(exp(**kw), e.topology_spec)
    assert chosen.stages == 2 and chosen.compute.optimizer_ms is None
    assert chosen.compute.optimizer_target_ms == chosen.compute.forward_ms == pytest.approx(80)
