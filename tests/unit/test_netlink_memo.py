"""pyroute2 shortcuts equal pyroute2: the memoized HTB rate tables (same table, same side effects) and
the directly packed class change (pyroute2's fields, without the rate tables the kernel ignores)."""

from __future__ import annotations

import pytest
from pyroute2 import IPBatch
from pyroute2.netlink.rtnl.tcmsg import sched_htb, tcmsg
from pyroute2.netlink.rtnl.tcmsg.common import nla_plus_rtab

from testbed.net.netlink_tc import (
    _class_kwargs,
    _memoize_rate_tables,
    class_change_message,
    pyroute2_class_change_message,
)
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


def _decoded(data: bytes) -> tcmsg:
    msg = tcmsg(data)
    msg.decode()
    return msg


@pytest.mark.parametrize("rate_bps", [1_000_000, 100_000_000, 40_000_000_000])
def test_a_class_change_message_is_what_pyroute2_encodes_less_the_rate_tables(rate_bps):
    """The directly packed change (``class_change_message``) decodes, through pyroute2's own
    message classes, to what pyroute2 encodes for the same class (IPBatch, its request compiler
    for ``tc("change-class")``, gives those same bytes), field by field, 64-bit rates included;
    it leaves out only the two rate tables and says the rate specs' link layer instead."""
    cls = HtbClass(0x11, 1, rate_bps, rate_bps // 2 or 1)
    ipb = IPBatch()
    try:
        ipb.tc("change-class", "htb", 7, **_class_kwargs(cls))
        batch = bytes(ipb.batch)
    finally:
        ipb.close()
    reference = pyroute2_class_change_message(7, cls)
    assert reference[16:] == batch[16:]  # the reference is pyroute2's request, past the sequence number
    got, want = _decoded(class_change_message(7, cls)), _decoded(reference)
    assert got["header"]["type"] == want["header"]["type"] and got["header"]["flags"] == want["header"]["flags"]
    assert [got[k] for k in ("index", "handle", "parent")] == [want[k] for k in ("index", "handle", "parent")]
    assert got.get_attr("TCA_KIND") == want.get_attr("TCA_KIND") == "htb"
    mine, theirs = got.get_attr("TCA_OPTIONS"), want.get_attr("TCA_OPTIONS")
    p, q = dict(mine.get_attr("TCA_HTB_PARMS")), dict(theirs.get_attr("TCA_HTB_PARMS"))
    for d in (p, q):
        for k in ("header", "rate___reserved", "ceil___reserved"):
            d.pop(k, None)
    assert p == q
    assert mine.get_attr("TCA_HTB_RATE64") == theirs.get_attr("TCA_HTB_RATE64")
    assert mine.get_attr("TCA_HTB_CEIL64") == theirs.get_attr("TCA_HTB_CEIL64")
    assert theirs.get_attr("TCA_HTB_RTAB") and mine.get_attr("TCA_HTB_RTAB") is None
    assert mine.get_attr("TCA_HTB_CTAB") is None
