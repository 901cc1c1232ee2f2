"""The pipeline schedules an experiment may name, and the rules between a schedule and the layout
it runs on (checked when an experiment is made: ``experiment.check_experiment``). The action
tables themselves are ``plan/schedule.py``'s.

A worker runs ``chunks`` virtual stages (model chunks) of its pipeline: one under ``gpipe``,
``1f1b`` and ``zb-h1``; ``virtual_stages`` under ``interleaved-1f1b`` (Narayanan et al. 2021,
section 2.2: chunk c of worker w is virtual stage c x stages + w); two under ``zbv`` (Qi et al.
2024, section 6: worker w holds virtual stages w and 2 x stages - 1 - w). Pure.
"""

from __future__ import annotations

#: pipeline schedules (``plan/schedule.py`` builds their action tables)
SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zbv")
#: the schedules that take their microbatches a round of ``stages`` at a time (``rounds``)
IN_ROUNDS = ("interleaved-1f1b", "zb-h1")
#: virtual stages per worker under interleaved-1f1b when the experiment gives none, and the most
DEFAULT_VIRTUAL_STAGES, MAX_VIRTUAL_STAGES = 2, 64


def chunks_per_worker(schedule: str, virtual_stages: int | None) -> int:
    """Virtual stages (model chunks) each worker holds under ``schedule``."""
    if schedule == "interleaved-1f1b":
        return virtual_stages or DEFAULT_VIRTUAL_STAGES
    return 2 if schedule == "zbv" else 1


def rounds(stages: int, microbatches: int) -> int:
    """How many rounds of microbatches an interleaved or ZB-H1 table takes its chunks in: one per
    ``stages`` microbatches (at least one), as ``torch.distributed.pipelining`` does."""
    return max(1, microbatches // stages)


def takes_in_rounds(stages: int, microbatches: int) -> bool:
    """Whether ``microbatches`` is a whole number of the rounds they are taken in (``rounds``)."""
    return microbatches % rounds(stages, microbatches) == 0


def microbatches_near(stages: int, microbatches: int) -> tuple[int | None, int]:
    """The nearest microbatch counts below (None if there is none) and above ``microbatches`` that
    are a whole number of their rounds (``takes_in_rounds``; the rounds change with the count)."""
    below = next((m for m in range(microbatches - 1, 0, -1) if takes_in_rounds(stages, m)), None)
    above = next(m for m in range(microbatches + 1, 2 * microbatches + stages + 1) if takes_in_rounds(stages, m))
    return below, above


def rounds_problem(schedule: str, stages: int, microbatches: int) -> tuple[str, str] | None:
    """(problem, fix) where ``schedule`` takes microbatches in rounds (``IN_ROUNDS``) that do not
    divide ``microbatches``; else None. The fix names the nearest counts that do
    (``microbatches_near``)."""
    if schedule not in IN_ROUNDS or takes_in_rounds(stages, microbatches):
        return None
    n = rounds(stages, microbatches)
    below, above = microbatches_near(stages, microbatches)
    return (
        f"over {stages} stages make {n} rounds under {schedule} (one per {stages} microbatches), which do not "
        "divide them",
        "use " + (f"{below} or {above}" if below else f"{above}") + " microbatches, whose rounds divide them",
    )


def stages_fitting(n_layers: int, chunks: int) -> list[int]:
    """The stage counts whose ``chunks`` virtual stages each split ``n_layers`` blocks evenly."""
    return [s for s in range(1, n_layers // chunks + 1) if n_layers % (s * chunks) == 0]


def schedule_problem(
    schedule: str, stages: int, microbatches: int, virtual_stages: int | None, n_layers: int
) -> tuple[str, int, str, str] | None:
    """The first rule the layout breaks under ``schedule``, as (field, value, problem, fix), or None.
    Rules: ``virtual_stages`` only under interleaved-1f1b; the microbatches a multiple of the rounds
    they are taken in (``rounds``); every virtual stage the same number of model blocks."""
    if virtual_stages is not None and schedule != "interleaved-1f1b":
        return (
            "virtual_stages",
            virtual_stages,
            f"applies to the interleaved-1f1b schedule only, not {schedule}",
            "leave virtual_stages out, or use schedule: interleaved-1f1b",
        )
    problem = rounds_problem(schedule, stages, microbatches)
    if problem is not None:
        return ("microbatches", microbatches, *problem)
    chunks = chunks_per_worker(schedule, virtual_stages)
    if chunks > 1 and n_layers % (stages * chunks):
        fits = sorted(sorted(stages_fitting(n_layers, chunks), key=lambda x: (abs(x - stages), x))[:2])
        other = f", or {' or '.join(map(str, fits))} stages" if fits else ""
        fewer = ", or fewer virtual_stages" if schedule == "interleaved-1f1b" else ""
        return (
            "model.n_layers",
            n_layers,
            f"does not split evenly into {stages} stages x {chunks} virtual stages under {schedule}",
            f"use a multiple of {stages * chunks} blocks{other}{fewer}",
        )
    return None
