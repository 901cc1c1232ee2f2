"""The memoized HTB rate tables equal pyroute2's own computation (same table, same side effects)."""
from __future__ import annotations

import pytest
from pyroute2.netlink.rtnl.tcmsg import sched_htb

from pyroute2.netlink.rtnl.tcmsg.common import nla_plus_rtab

from testbed.netlink import _memoize_rate_tables


def _parms(rate: int):
    p = sched_htb.options.htb_parms()
    p.update({"rate": rate, "ceil": rate, "rate_cell_log": 0, "rate_mpu": 0, "ceil_cell_log": 0, "ceil_mpu": 0})
    return p


@pytest.mark.parametrize("rate_bytes", [125_000, 12_500_000, 125_000_000])
def test_memoized_tables_equal_the_original(rate_bytes):
    _memoize_rate_tables()  # idempotent: installed once on import
    memo = nla_plus_rtab.parms.calc_rtab
    assert memo._testbed_memo
    first, second, fresh = _parms(rate_bytes), _parms(rate_bytes), _parms(rate_bytes)
    expected = memo._original(fresh, "rate")
    assert memo(first, "rate") == expected          # computed and stored
    assert memo(second, "rate") == expected         # served from the cache
    assert second["rate_cell_log"] == fresh["rate_cell_log"] and second["rate_cell_align"] == -1
