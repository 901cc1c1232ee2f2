"""pyroute2 shortcuts equal pyroute2: the memoized HTB rate tables (same table, same side effects) and
the directly encoded class change (same bytes as its request pipeline)."""

from __future__ import annotations

import pytest
from pyroute2 import IPBatch
from pyroute2.netlink.rtnl.tcmsg import sched_htb
from pyroute2.netlink.rtnl.tcmsg.common import nla_plus_rtab

from testbed.net.netlink_tc import _class_kwargs, _memoize_rate_tables, class_change_message
from testbed.net.shaping import HtbClass


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
    assert memo(first, "rate") == expected  # computed and stored
    assert memo(second, "rate") == expected  # served from the cache
    assert second["rate_cell_log"] == fresh["rate_cell_log"] and second["rate_cell_align"] == -1


@pytest.mark.parametrize("rate_bps", [1_000_000, 100_000_000, 40_000_000_000])
def test_a_class_change_message_is_what_pyroute2s_request_pipeline_sends(rate_bps):
    """The directly encoded change (``class_change_message``) equals, byte for byte past the
    sequence number, what IPBatch (pyroute2's own request compiler for ``tc("change-class")``)
    produces for the same class, 64-bit rates included."""
    cls = HtbClass(0x11, 1, rate_bps, rate_bps)
    ipb = IPBatch()
    try:
        ipb.tc("change-class", "htb", 7, **_class_kwargs(cls))
        expected = bytes(ipb.batch)
    finally:
        ipb.close()
    got = class_change_message(7, cls)
    assert len(got) == len(expected)
    assert got[:8] == expected[:8]  # length, type, flags
    assert got[16:] == expected[16:]  # the tcmsg and its attributes (8..16: sequence and port)
