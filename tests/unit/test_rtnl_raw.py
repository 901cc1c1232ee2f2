"""Reading one HTB class's byte counter out of a netlink dump (no kernel: the dump is built here)."""

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
