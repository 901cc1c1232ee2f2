"""What each action of a schedule table takes and which transfers it waits for and makes: its
seconds (compute and the worker's hand-off after it, ``handoff.py``) and its input and output
across a pipeline boundary, as the simulation (``grant_sim.simulate``) and its lower bound
(``critical_path.py``) play them.

Pure.
"""

from __future__ import annotations

from testbed.plan.boundary_transfers import Transfer
from testbed.plan.handoff import action_handoff_s
from testbed.plan.schedule import RankAction
from testbed.plan.virtual_stages import backward_parts
from testbed.spec.experiment import Experiment
from testbed.spec.model import stage_layers


def action_seconds(
    exp: Experiment, V: int, block_s: tuple[float, float] | None, stage_s: tuple[tuple[float, float], ...] | None
) -> dict[str, list[float]]:
    """Each kind of action's seconds per virtual stage (``F``, ``B``, and a split backward's ``I``
    and ``W``): its blocks times ``block_s`` (default the experiment's), or ``stage_s``'s profile,
    each with the worker's hand-off after it (``handoff.action_handoff_s``: its output is ready,
    and its worker free, that much after its compute)."""
    per_f, per_b = block_s or exp.block_s
    f = [len(stage_layers(exp.model.n_layers, V, v)) * per_f for v in range(V)]
    b = [len(stage_layers(exp.model.n_layers, V, v)) * per_b for v in range(V)]
    if stage_s is not None:
        f, b = [x[0] for x in stage_s], [x[1] for x in stage_s]
    parts = [backward_parts(x) for x in b]
    h = action_handoff_s(exp)
    return {
        "F": [x + h for x in f],
        "B": [x + h for x in b],
        "I": [x + h for x, _ in parts],
        "W": [x + h for _, x in parts],
    }


def input_of(a: RankAction, r: int, V: int) -> Transfer | None:
    """The transfer action ``a`` of replica ``r`` waits for (``V`` virtual stages): a forward its
    input, a backward (or its input part) the gradient; none on the first (last) virtual stage, nor
    for a weight part."""
    if a.kind == "F":
        return Transfer("F", a.stage - 1, a.microbatch, r) if a.stage > 0 else None
    if a.kind == "W":
        return None
    return Transfer("B", a.stage, a.microbatch, r) if a.stage < V - 1 else None


def output_of(a: RankAction, r: int, V: int) -> Transfer | None:
    """The transfer action ``a`` of replica ``r`` makes ready when it ends: a forward's activations
    (but the last virtual stage's), a backward's (or its input part's) gradient (but the first's)."""
    if a.kind == "F" and a.stage < V - 1:
        return Transfer("F", a.stage, a.microbatch, r)
    if a.kind in ("B", "I") and a.stage > 0:
        return Transfer("B", a.stage - 1, a.microbatch, r)
    return None
