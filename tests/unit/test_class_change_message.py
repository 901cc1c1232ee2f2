"""The directly packed HTB class change (``netlink_tc.class_change_message``) equals what pyroute2
encodes for the same class, field by field, less the rate tables the kernel ignores."""

from __future__ import annotations

import struct

import pytest
from pyroute2 import IPBatch
from pyroute2.netlink import NLM_F_ACK, NLM_F_REPLACE, NLM_F_REQUEST
from pyroute2.netlink.rtnl import RTM_NEWTCLASS
from pyroute2.netlink.rtnl.tcmsg import sched_htb, tcmsg

from testbed.errors import BuildError
from testbed.net.netlink_tc import _class_kwargs, class_change_message, compile_class_changes
from testbed.net.shaping import HtbClass


def _pyroute2_message(index: int, cls: HtbClass) -> bytes:
    """The same change encoded by pyroute2's message classes (with rate tables): the reference
    ``class_change_message`` is tested against."""
    kw = _class_kwargs(cls)
    msg = tcmsg()
    msg["index"] = index
    msg["handle"] = kw.pop("handle")
    msg["parent"] = kw.pop("parent")
    msg["attrs"] = [["TCA_KIND", "htb"], ["TCA_OPTIONS", sched_htb.get_class_parameters(kw)]]
    msg["header"]["type"] = RTM_NEWTCLASS
    msg["header"]["flags"] = NLM_F_REQUEST | NLM_F_ACK | NLM_F_REPLACE
    msg.encode()
    return bytes(msg.data)


def _decoded(data: bytes) -> tcmsg:
    msg = tcmsg(data)
    msg.decode()
    return msg


@pytest.mark.parametrize(
    "rate_bps, ceil_bps",
    [
        (1_000_000, 500_000),
        (100_000_000, 100_000_000),
        (40_000_000_000, 20_000_000_000),
        (40_000_000_000, 40_000_000_000),
    ],
)
def test_a_class_change_message_is_what_pyroute2_encodes_less_the_rate_tables(rate_bps, ceil_bps):
    """Decoded through pyroute2's own message classes, the packed change is what pyroute2 encodes
    (IPBatch, its request compiler for ``tc("change-class")``, gives those same bytes), field by
    field, 64-bit rate and ceil included; it leaves out only the two rate tables and says the rate
    specs' link layer (Ethernet) instead."""
    cls = HtbClass(0x11, 1, rate_bps, ceil_bps)
    ipb = IPBatch()
    try:
        ipb.tc("change-class", "htb", 7, **_class_kwargs(cls))
        batch = bytes(ipb.batch)
    finally:
        ipb.close()
    reference = _pyroute2_message(7, cls)
    assert reference[16:] == batch[16:]  # the reference is pyroute2's request, past the sequence number
    raw = class_change_message(7, cls)
    assert struct.unpack_from("=I", raw)[0] == len(raw)
    got, want = _decoded(raw), _decoded(reference)
    assert got["header"]["type"] == want["header"]["type"] and got["header"]["flags"] == want["header"]["flags"]
    assert [got[k] for k in ("index", "handle", "parent")] == [want[k] for k in ("index", "handle", "parent")]
    assert got.get_attr("TCA_KIND") == want.get_attr("TCA_KIND") == "htb"
    mine, theirs = got.get_attr("TCA_OPTIONS"), want.get_attr("TCA_OPTIONS")
    p, q = dict(mine.get_attr("TCA_HTB_PARMS")), dict(theirs.get_attr("TCA_HTB_PARMS"))
    assert p.pop("rate___reserved") == p.pop("ceil___reserved") == 1  # TC_LINKLAYER_ETHERNET
    for d in (p, q):
        for k in ("header", "rate___reserved", "ceil___reserved"):
            d.pop(k, None)
    assert p == q
    assert mine.get_attr("TCA_HTB_RATE64") == theirs.get_attr("TCA_HTB_RATE64")
    assert mine.get_attr("TCA_HTB_CEIL64") == theirs.get_attr("TCA_HTB_CEIL64")
    if ceil_bps // 8 >= 2**32:
        assert mine.get_attr("TCA_HTB_CEIL64") == ceil_bps // 8
    assert theirs.get_attr("TCA_HTB_RTAB") and mine.get_attr("TCA_HTB_RTAB") is None
    assert mine.get_attr("TCA_HTB_CTAB") is None


def test_a_compiled_batch_is_the_messages_one_after_another():
    a, b = HtbClass(0x10, 1, 10_000_000, 10_000_000), HtbClass(0x20, 1, 5_000_000, 10_000_000)
    data = compile_class_changes([(3, a), (4, b)])
    first = struct.unpack_from("=I", data)[0]
    assert data[:first] == class_change_message(3, a) and data[first:] == class_change_message(4, b)
    assert _decoded(data[first:])["index"] == 4


def test_a_rate_below_one_byte_per_second_is_refused_by_name():
    with pytest.raises(BuildError, match="1:21.*at least 8 bit/s"):
        class_change_message(3, HtbClass(0x21, 1, 4, 4))
