"""The run's outage timeout (``run/outage_watch.py``): a link down past it aborts the run, naming
it; a link that fails over does not stall training and is not counted."""

from __future__ import annotations

import pytest

from testbed.run.outage_watch import OutageError, OutageWatch
from testbed.trace.jsonl import open_jsonl, write_row
from testbed.trace.shaping_log import LINK_DOWN, LINK_UP, SHAPING_LOG


def test_only_an_outage_that_stalls_training_counts(tmp_path):
    watch = OutageWatch(tmp_path, timeout_s=3, fails_over=["central:west"])
    with open_jsonl(tmp_path / SHAPING_LOG) as log:
        write_row(log, {"t_ns": 0, "event": LINK_DOWN, "link": "central:west"})
    watch.check(now_ns=10 * 10**9)  # down for 10 s, its traffic rerouted: nothing to abort
    assert watch.down == {}
    with open_jsonl(tmp_path / SHAPING_LOG) as log:
        write_row(log, {"t_ns": 11 * 10**9, "event": LINK_DOWN, "link": "east:central"})
    watch.check(now_ns=13 * 10**9)
    assert watch.down == {"east:central": 11 * 10**9}
    with pytest.raises(OutageError, match=r"WAN link east:central has been down for 3\.5 s"):
        watch.check(now_ns=14_500_000_000)
    with open_jsonl(tmp_path / SHAPING_LOG) as log:
        write_row(log, {"t_ns": 15 * 10**9, "event": LINK_UP, "link": "east:central"})
    watch.check(now_ns=30 * 10**9)
    assert watch.down == {} and watch.last_up_ns == 15 * 10**9
