"""Preparing Atlas for a run: the grant plan (written to ``grant_plan.txt``) and the controller
that applies it to the WAN links, installed and started before the workers."""

from __future__ import annotations

from pathlib import Path

from testbed.atlas.controller import Controller
from testbed.net.network import Network
from testbed.net.registry import control_dir
from testbed.plan.grant_plan import GrantPlan, format_grant_plan
from testbed.plan.run_plan import RunPlan
from testbed.plan.virtual_stages import experiment_homes
from testbed.run.profile import unprofiled
from testbed.spec.experiment import Experiment


def profiles_first(exp: Experiment) -> bool:
    """Whether the run plans its grants from a profile of its first iteration (planned sharing
    under real compute), so that its plan starts ``unprofiled``; a run serving prefill alone
    moves no training data and has no grants."""
    return exp.policy.sharing == "planned" and not exp.compute.padded and exp.policy.training


def start_controller(net: Network, run_plan: RunPlan, out_dir: Path) -> tuple[Controller | None, GrantPlan | None]:
    """(the started controller, its grant plan), or (None, None) for a policy without grants.
    The plan (the run plan's, from iteration 0) is written to ``grant_plan.txt``; a run that
    ``profiles_first`` starts from it ``unprofiled``. The controller's socket lives beside the run
    registry (AF_UNIX paths are limited to 108 bytes). Raises what ``Controller.install`` raises."""
    exp, workers, plan = run_plan.experiment, list(run_plan.workers), run_plan.grant_plan
    if plan is None:
        return None, None
    (out_dir / "grant_plan.txt").write_text(format_grant_plan(plan) + "\n")
    if profiles_first(exp):
        plan = unprofiled(plan)
    controller = Controller(
        net,
        workers,
        exp.replicas,
        control_dir() / f"{net.prefix}.sock",
        out_dir / "controller.jsonl",
        exp.atlas_floor_share,
        exp.policy.sharing,
        plan,
        exp.atlas_borrow,
        experiment_homes(exp),
    )
    controller.install()
    controller.start()
    return controller, plan
