"""Reading HTB classes and their counters out of a netlink dump (no kernel: the dump is built here;
tests/integration/test_build.py reads a real one against pyroute2's)."""

from __future__ import annotations

import struct

from testbed.net.rtnl_raw import (
    NLA,
    NLMSG_DONE,
    NLMSGHDR,
    RTM_NEWTCLASS,
    TCMSG,
    class_bytes_from_dump,
    class_dump_request,
    htb_classes_from_dump,
)


def _class_msg(classid: int, nbytes: int) -> bytes:
    stats = NLA.pack(NLA.size + 36, 3) + struct.pack("=QIIIIIII", nbytes, 7, 0, 0, 0, 0, 0, 0)
    kind = NLA.pack(NLA.size + 4, 1) + b"htb\0"
    body = TCMSG.pack(0, 0, 0, 5, classid, 0x10000, 0) + kind + stats
    return NLMSGHDR.pack(NLMSGHDR.size + len(body), RTM_NEWTCLASS, 2, 0, 0) + body


def test_the_counter_of_the_asked_class_among_others():
    dump = _class_msg(0x10001, 10) + _class_msg(0x10020, 12345) + _class_msg(0x10021, 999)
    assert class_bytes_from_dump(dump, 0x10020) == 12345
    assert class_bytes_from_dump(dump, 0x10021) == 999
    done = NLMSGHDR.pack(NLMSGHDR.size + 4, NLMSG_DONE, 2, 0, 0) + b"\0\0\0\0"
    assert class_bytes_from_dump(dump + done, 0x10030) is None


def test_the_dump_request_names_the_interface():
    req = class_dump_request(42)
    length, mtype, flags = struct.unpack_from("=IHH", req)
    assert length == len(req) and mtype == 42 and flags & 0x300 == 0x300
    assert TCMSG.unpack_from(req, NLMSGHDR.size)[3] == 42


def _ratespec(rate: int) -> bytes:
    """struct tc_ratespec: cell_log, linklayer, overhead, cell_align, mpu, rate (bytes/s, clipped to u32)."""
    return struct.pack("=BBHhHI", 0, 1, 0, -1, 0, min(rate, 2**32 - 1))


def _htb_class_msg(classid: int, rate: int, ceil: int, stats: tuple[int, ...], big: bool = False) -> bytes:
    """An RTM_NEWTCLASS message of an HTB class: rates in bytes/s; ``big``: the u32 fields hold the
    kernel's clipped value and TCA_HTB_RATE64/CEIL64 the real one."""
    parms = _ratespec(rate) + _ratespec(ceil) + struct.pack("=IIIII", 1600, 1600, 1514, 0, 0)
    opts = NLA.pack(NLA.size + len(parms), 1) + parms
    if big:
        for kind, value in ((6, rate), (7, ceil)):  # TCA_HTB_RATE64, TCA_HTB_CEIL64
            opts += NLA.pack(NLA.size + 8, kind) + struct.pack("=Q", value)
    nested = NLA.pack(NLA.size + len(opts), 2 | 0x8000) + opts
    kind = NLA.pack(NLA.size + 4, 1) + b"htb\0"
    st = NLA.pack(NLA.size + 36, 3) + struct.pack("=QIIIIIII", *stats)
    body = TCMSG.pack(0, 0, 0, 5, classid, 0x10000, 0) + kind + nested + st
    return NLMSGHDR.pack(NLMSGHDR.size + len(body), RTM_NEWTCLASS, 2, 0, 0) + body


def test_every_htb_class_with_its_rates_and_counters():
    stats = (123456, 99, 3, 7, 0, 0, 2, 3028)  # bytes, packets, drops, overlimits, bps, pps, qlen, backlog
    dump = _htb_class_msg(0x10001, 1_250_000, 1_250_000, stats) + _htb_class_msg(
        0x10020, 6 * 2**30, 8 * 2**30, (5,) + (0,) * 7, big=True
    )
    dump += _class_msg(0x10030, 1)  # an HTB class without options is skipped
    got = htb_classes_from_dump(dump + NLMSGHDR.pack(NLMSGHDR.size + 4, NLMSG_DONE, 2, 0, 0) + b"\0\0\0\0")
    assert got == {
        0x1: {
            "rate_bps": 10_000_000,
            "ceil_bps": 10_000_000,
            "tx_bytes": 123456,
            "tx_packets": 99,
            "drops": 3,
            "overlimits": 7,
            "backlog_bytes": 3028,
            "qlen": 2,
        },
        0x20: {
            "rate_bps": 48 * 2**30,
            "ceil_bps": 64 * 2**30,
            "tx_bytes": 5,
            "tx_packets": 0,
            "drops": 0,
            "overlimits": 0,
            "backlog_bytes": 0,
            "qlen": 0,
        },
    }


def test_a_dump_skips_what_an_earlier_timed_out_dump_left_on_the_socket(monkeypatch):
    """Each dump is numbered; the answer of an earlier one (which timed out) still queued on the
    socket is left out, and the dump ends at its own NLMSG_DONE. A datagram socket pair stands in
    for the kernel's end."""
    import itertools
    import socket

    from testbed.net import rtnl_raw

    def numbered(msg: bytes, seq: int) -> bytes:
        length, mtype, flags, _, port = NLMSGHDR.unpack_from(msg)
        return NLMSGHDR.pack(length, mtype, flags, seq, port) + msg[NLMSGHDR.size :]

    done = NLMSGHDR.pack(NLMSGHDR.size + 4, NLMSG_DONE, 2, 0, 0) + b"\0\0\0\0"
    ours, kernel = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    with ours, kernel:
        kernel.send(numbered(_htb_class_msg(0x10001, 100, 100, (1,) + (0,) * 7), 7) + numbered(done, 7))  # stale
        kernel.send(numbered(_htb_class_msg(0x10002, 200, 200, (2,) + (0,) * 7), 42))
        kernel.send(numbered(done, 42))
        monkeypatch.setattr(rtnl_raw, "_dump_seq", itertools.count(42))
        got = htb_classes_from_dump(rtnl_raw.dump_classes(ours, 5))
        request = kernel.recv(4096)
    assert list(got) == [0x2] and got[0x2]["tx_bytes"] == 2
    assert NLMSGHDR.unpack_from(request)[3] == 42 and TCMSG.unpack_from(request, NLMSGHDR.size)[3] == 5
