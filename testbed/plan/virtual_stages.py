"""Virtual stages (model chunks) of a pipeline as data: the worker that holds each
(``stage_homes``: looped, Narayanan et al. 2021, section 2.2, or ZB-V's V, Qi et al. 2024, section
6), the pairs of workers its boundaries join (``home_boundaries``), each chunk's number on its
worker, the names of the waits before them (``slot_name``), the tags of their transfers
(``transfer_tag``), and what each operation is padded to (``padding_targets_ms``; a split backward's
parts: ``backward_parts``). ``schedule.py`` holds the action tables. Pure.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from testbed.trace import schema as T

if TYPE_CHECKING:
    from testbed.spec.experiment import Experiment


#: the share of a backward its input part takes under a split backward (ZB-H1, ZB-V), the weight
#: part the rest: the two are about equal (Qi et al. 2024, section 2: each about one forward's
#: matrix multiplications, so T_B = T_W = T_F under their 1:2 forward to backward)
INPUT_SHARE = 0.5


def backward_parts(backward: float) -> tuple[float, float]:
    """A backward's (input part, weight part) under a split backward, in its unit (``INPUT_SHARE``)."""
    return backward * INPUT_SHARE, backward * (1 - INPUT_SHARE)


def padding_targets_ms(forward_ms: float, backward_ms: float, optimizer_ms: float, chunks: int) -> dict[str, float]:
    """What each operation of a worker is padded to (ms), by event kind, and by ``T.PART`` for a
    split backward's parts: a stage's forward and backward targets shared among its ``chunks``
    (equal blocks each), the input part ``INPUT_SHARE`` of the backward, the weight part the rest;
    the optimizer step its own. The workers pad to these; the summary counts overruns against them."""
    input_ms, weight_ms = backward_parts(backward_ms / chunks)
    return {
        T.FORWARD: forward_ms / chunks,
        T.BACKWARD: backward_ms / chunks,
        T.INPUT_PART: input_ms,
        T.WEIGHT_PART: weight_ms,
        T.OPTIMIZER: optimizer_ms,
    }


def stage_homes(schedule: str, stages: int, chunks: int) -> list[int]:
    """The worker (pipeline position) holding each of the ``stages`` x ``chunks`` virtual stages:
    looped (virtual stage v on worker v mod stages) except under ``zbv``'s V (worker w holds w and
    2 x stages - 1 - w)."""
    if schedule == "zbv":
        return list(range(stages)) + list(reversed(range(stages)))
    return [v % stages for v in range(stages * chunks)]


def home_boundaries(homes: list[int]) -> list[tuple[int, int]]:
    """The (sender, receiver) workers of each forward boundary of a pipeline whose virtual stages
    sit on the workers ``homes`` (``stage_homes``), where the two differ, in virtual-stage order (a
    pair twice where two boundaries join the same workers; the backward crosses each the other
    way)."""
    return [(a, b) for a, b in zip(homes, homes[1:]) if a != b]


def slot_name(kind: str, microbatch: int, chunk: int = 0) -> str:
    """The name of the wait before an action fed by a transfer, as the workers and BubbleTea's bubble
    timeline call it: ``F2`` (the forward of microbatch 2), ``B2`` (its backward, or the input part
    of it), ``F2c1`` on a worker's second chunk."""
    return f"{'F' if kind == 'F' else 'B'}{microbatch}" + (f"c{chunk}" if chunk else "")


def experiment_homes(exp: Experiment) -> list[int]:
    """``stage_homes`` of ``exp``'s schedule, stages and chunks."""
    return stage_homes(exp.schedule, exp.stages, exp.chunks)


def experiment_boundaries(exp: Experiment) -> list[tuple[int, int]]:
    """``home_boundaries`` of ``exp``'s virtual stages."""
    return home_boundaries(experiment_homes(exp))


def chunk_numbers(homes: list[int]) -> list[int]:
    """Each virtual stage's chunk number on its worker (0 for its first, in virtual-stage order),
    the virtual stages sitting on the workers ``homes`` (``stage_homes``)."""
    seen: dict[int, int] = {}
    out = []
    for w in homes:
        out.append(seen.get(w, 0))
        seen[w] = out[-1] + 1
    return out


def transfer_tag(kind: str, boundary: int, microbatch: int, microbatches: int) -> int:
    """The tag that tells a transfer apart from the others between the same two workers in one
    iteration: its direction (``kind`` F, activations; B, gradients), the boundary after virtual
    stage ``boundary`` and the microbatch."""
    return (2 * boundary + (kind != "F")) * microbatches + microbatch
