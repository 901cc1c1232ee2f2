"""The simulator still predicts what was saved (``tests/data/saved_predictions.json``,
``scripts/save_predictions.py``): every shipped experiment and the 20 random experiments of seed 39
under every policy, figure by figure, under the congestion control they were saved under (a
topology that names none runs this machine's default, ``plan/connections.hosts_congestion``). A
change meant to move predictions saves them again with the script and lists what moved in its
commit; the scenarios are checked by ``save_predictions.py --check`` (minutes of paper-scale
simulation). The shipped experiments' figures were also found the same at b64ba4d, the commit the
speed work is measured against."""

from __future__ import annotations

import json
from pathlib import Path

from testbed.plan import connections
from testbed.plan.grant_plan import _plan_grants
from testbed.plan.placement import _select_dcs
from testbed.sim.saved_predictions import RANDOM_N, differences, predictions

SAVED = Path(__file__).resolve().parents[1] / "data" / "saved_predictions.json"


def test_experiments_and_random_draws_predict_what_was_saved(monkeypatch):
    record = json.loads(SAVED.read_text())
    saved = record["predictions"]
    # predicted as where they were saved: the hosts' congestion control is that machine's default
    monkeypatch.setattr(connections, "machine_congestion", lambda: record["congestion"])
    kept = (_plan_grants, _select_dcs)  # plans and DC selections made under another are not reused
    for cache in kept:
        cache.cache_clear()
    try:
        now = predictions(("experiment", "random"))
    finally:  # nor are these under the machine's own
        for cache in kept:
            cache.cache_clear()
    assert sum(k.startswith("random:") for k in now) == 4 * RANDOM_N
    assert sum(k.startswith("experiment:") for k in now) >= 16
    moved = differences(saved, now)
    assert not moved, f"{len(moved)} figures moved (first: {moved[:5]}); if meant, run scripts/save_predictions.py"


def test_the_saved_file_holds_every_kind():
    saved = json.loads(SAVED.read_text())["predictions"]
    assert {k.split(":")[0] for k in saved} == {"experiment", "random", "scenario"}


def test_differences_names_what_moved_appeared_and_went():
    saved = {"a:x:p": {"t": 1.0, "u": 2.0}}
    now = {"a:x:p": {"t": 1.0 + 1e-12, "u": 2.5, "v": 3.0}}
    assert differences(saved, now) == [("a:x:p", "u", 2.0, 2.5), ("a:x:p", "v", None, 3.0)]
