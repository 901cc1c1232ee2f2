"""A worker's hand-off between two operations on this testbed: once an operation's compute has
ended, its worker traces it and hands its output to gloo (``train/worker.py``: ``computed``,
``hand_on``) before it can start its next operation, whether or not that one waits for a
transfer. The model adds it to every forward and backward (and each part of a split one) of an
experiment run on this testbed's workers; a scenario's devices (``spec/scenario.py``) are real
GPUs, whose hosts' hand-off this machine does not measure, and a launched job (``job_plan.py``)
runs its own processes, timed from its own measured operations: neither gets one.

Pure.
"""

from __future__ import annotations

from testbed.spec.experiment import Experiment

#: the hand-off (s): the median time from the end of one of stage 0's forwards to the start of the
#: next right after it, in a run of the default experiment's six workers inside one emulated DC (no
#: WAN, no controller), ``scripts/bench_training.py`` on this project's 2-core VM (kernel 6.18):
#: medians 0.476 and 0.523 ms in two runs (quartiles 0.41-0.61 ms; docs/simulator.md, "A worker's
#: hand-off")
ACTION_HANDOFF_S = 0.5e-3


def action_handoff_s(exp: Experiment) -> float:
    """The hand-off (s) added to each of ``exp``'s forwards and backwards: ``ACTION_HANDOFF_S`` on
    this testbed's workers, 0 for a scenario's devices (``ComputeModel.emulated``)."""
    return ACTION_HANDOFF_S if exp.compute.emulated else 0.0
