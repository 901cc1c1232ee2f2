"""The simulator's predictions saved as data (``tests/data/saved_predictions.json``,
``scripts/save_predictions.py``): every shipped experiment and scenario and ``RANDOM_N`` random
experiments of ``RANDOM_SEED`` under every policy of ``POLICIES``, each a flat table of figures. A
change meant to keep the predictions (speed work) is checked against them (a unit test, for the
experiments and the random draws; the script's ``--check`` for the scenarios too); a change meant
to move them (a model fix) saves them again and lists what moved (``differences``).

Pure: no kernel, no processes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from testbed.errors import SpecError
from testbed.sim.figures import simulate_policy
from testbed.sim.random_experiments import random_experiments
from testbed.sim.scenario import simulate_scenario
from testbed.spec.experiment_file import load_experiment, shipped_experiments
from testbed.spec.scenario_file import load_scenario, shipped_scenarios

POLICIES = ("pp-fair", "dp-wan", "atlas", "atlas+bubbletea")
#: the random experiments saved (issue 39's 20, at a seed not used while developing)
RANDOM_N, RANDOM_SEED = 20, 39
#: the kinds of prediction saved, in the order they are computed
KINDS = ("experiment", "random", "scenario")
#: relative difference below which two figures are the same (float summation order)
REL_TOL = 1e-9


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """The numbers of ``d`` (nested dicts and lists flattened to ``a.b``/``a[0]`` keys)."""
    out: dict[str, float] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flat(v, f"{key}."))
        elif isinstance(v, list | tuple):
            out.update(_flat({f"[{i}]": x for i, x in enumerate(v)}, key))
        elif isinstance(v, int | float) and not isinstance(v, bool):
            out[key] = float(v)
    return out


def predictions(kinds: Iterable[str] = KINDS) -> dict[str, dict[str, float]]:
    """``{"KIND:NAME:POLICY": {figure: value}}`` for each of ``kinds``; a policy that cannot
    place an experiment gives ``{"infeasible": 1.0}``."""
    cases: list[tuple[str, Any]] = []
    for kind in kinds:
        if kind == "experiment":
            cases += [(f"experiment:{n}", load_experiment(n)) for n in shipped_experiments()]
        elif kind == "random":
            drawn = random_experiments(RANDOM_N, RANDOM_SEED).accepted
            cases += [(f"random:{draw.name}", exp) for draw, exp, _, _ in drawn]
        elif kind == "scenario":
            cases += [(f"scenario:{n}", load_scenario(n)) for n in shipped_scenarios()]
        else:
            raise ValueError(f"unknown kind {kind!r}: one of {', '.join(KINDS)}")
    out: dict[str, dict[str, float]] = {}
    for key, case in cases:
        for policy in POLICIES:
            try:
                figures = (
                    simulate_scenario(case, policy) if key.startswith("scenario:") else simulate_policy(case, policy)
                )
            except SpecError:
                out[f"{key}:{policy}"] = {"infeasible": 1.0}
                continue
            out[f"{key}:{policy}"] = _flat(figures.to_dict())
    return out


def differences(
    saved: dict[str, dict[str, float]], now: dict[str, dict[str, float]]
) -> list[tuple[str, str, float | None, float | None]]:
    """(case, figure, saved, now) for every figure of ``now``'s cases that is not in ``saved``,
    is gone, or differs by more than ``REL_TOL`` (relative)."""
    out = []
    for case in sorted(now):
        old, new = saved.get(case, {}), now[case]
        for fig in sorted(set(old) | set(new)):
            a, b = old.get(fig), new.get(fig)
            if a is None or b is None or not math.isclose(a, b, rel_tol=REL_TOL, abs_tol=1e-12):
                out.append((case, fig, a, b))
    return out
