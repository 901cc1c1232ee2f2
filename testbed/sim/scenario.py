"""A scenario's figures per policy (``testbed sim SCENARIO``): its memory checked first (a stage a
device cannot hold makes every policy infeasible, with the figure), then the same simulation as an
experiment's (``figures.simulate_policy``) on the scenario's devices.

Pure.
"""

from __future__ import annotations

from dataclasses import replace

from testbed.errors import SpecError
from testbed.plan.memory import in_flight, inference_bytes, stage_device_bytes
from testbed.sim.figures import Figures, simulate_policy
from testbed.spec.scenario import Scenario


def stage_memory_gb(sc: Scenario, bubbletea: bool = False) -> list[float]:
    """Each stage's memory on one GPU (GB, 10^9 bytes): ``memory.stage_device_bytes`` with the
    scenario's tensor parallelism and recomputation, under its schedule's microbatches in flight;
    with ``bubbletea``, the inference model and its queued KV caches too (``inference_bytes``)."""
    exp = sc.experiment()
    extra = inference_bytes(sc.inference_model, sc.tensor_parallel) if bubbletea else 0
    return [
        (
            stage_device_bytes(
                sc.model,
                sc.stages,
                s,
                sc.microbatch_size,
                in_flight(exp, s),
                sc.tensor_parallel,
                sc.recompute,
                exp.chunks,
            )
            + extra
        )
        / 1e9
        for s in range(sc.stages)
    ]


def check_memory(sc: Scenario, bubbletea: bool = False) -> float:
    """The largest stage's memory on one GPU (GB). Raises SpecError naming ``gpu_memory`` with the
    figure when it exceeds the device's memory."""
    need = stage_memory_gb(sc, bubbletea)
    worst = max(range(len(need)), key=lambda s: need[s])
    if sc.gpu_memory_gb is not None and need[worst] > sc.gpu_memory_gb:
        raise SpecError(
            sc.source,
            "gpu_memory",
            f"{sc.gpu_memory_gb:g}GB",
            f"is less than stage {worst} needs on one GPU ({need[worst]:.1f} GB: training state and "
            f"{in_flight(sc.experiment(), worst)} microbatches' activations)",
            "use more stages or tensor parallelism, recompute: true, or a smaller microbatch_size",
        )
    return need[worst]


def simulate_scenario(sc: Scenario, policy: str) -> Figures:
    """The figures of ``sc`` under ``policy``, with the peak memory of one GPU. Raises SpecError
    when it does not fit the devices' memory or the policy cannot place it."""
    exp = sc.experiment(policy)
    peak = check_memory(sc, exp.policy.bubbletea)
    return replace(simulate_policy(exp), device_memory_gb=peak)
