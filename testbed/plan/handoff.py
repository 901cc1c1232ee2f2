"""A worker's hand-off between two operations on this testbed: once an operation's compute has
ended, its worker traces it and hands its output to gloo (``train/worker.py``: ``computed``,
``hand_on``) before it can start its next operation, whether or not that one waits for a
transfer. The model adds it to every forward and backward (and each part of a split one) of an
experiment run on this testbed's workers; a scenario's devices (``spec/scenario.py``) are real
GPUs, whose hosts' hand-off this machine does not measure, and a launched job (``job_plan.py``)
runs its own processes, timed from its own measured operations: neither gets one. An output
striped across the WAN over several connections takes one gloo send per connection, posted one
after another, so its hand-off grows with them (``STRIPE_SEND_S`` each).

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
#: what each further connection a transfer is striped over adds to its sender's hand-off (s): the
#: least-squares slope of stage 0's median hand-off over 1, 2, 4, 8 and 16 connections, its
#: activations crossing a two-DC link no transfer waits for, ``scripts/bench_training.py
#: --stripes 1,2,4,8,16`` on this project's 2-core VM (kernel 6.18): 0.042, 0.032 and 0.044 ms in
#: three runs (docs/simulator.md, "A worker's hand-off")
STRIPE_SEND_S = 0.04e-3


def action_handoff_s(exp: Experiment, stripes: int = 1) -> float:
    """The hand-off (s) added to one of ``exp``'s forwards and backwards whose output leaves over
    ``stripes`` connections (1: one send, or none): ``ACTION_HANDOFF_S`` plus ``STRIPE_SEND_S`` for
    each connection beyond the first, on this testbed's workers; 0 for a scenario's devices
    (``ComputeModel.emulated``)."""
    if not exp.compute.emulated:
        return 0.0
    return ACTION_HANDOFF_S + (stripes - 1) * STRIPE_SEND_S
