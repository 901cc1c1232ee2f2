"""Plain rtnetlink sockets for the paths where pyroute2's request pipeline costs too much: sending
compiled messages in one system call and awaiting their acknowledgements (live rate changes,
Atlas's grants), and reading one HTB class's byte counter (Atlas's grant ends when its bytes have
passed). Message layouts: netlink(7), rtnetlink(7), linux/pkt_sched.h."""

from __future__ import annotations

import os
import socket
import struct

from testbed.errors import BuildError
from testbed.net.netlink import in_netns

#: nlmsghdr: length, type, flags, sequence, port id
NLMSGHDR = struct.Struct("=IHHII")
NLMSG_ERROR, NLMSG_DONE = 2, 3
RTM_NEWTCLASS, RTM_GETTCLASS = 40, 42
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
TCMSG = struct.Struct("=BBHiIII")  # family, pad, pad, ifindex, handle, parent, info
NLA = struct.Struct("=HH")  # nlattr: length, type
_TCA_STATS = 3  # struct tc_stats: bytes (u64), packets, drops, overlimits, bps, pps, qlen, backlog (u32)


def rtnl_socket(netns: str) -> socket.socket:
    """A plain rtnetlink socket opened inside ``netns`` (it stays bound to that namespace), for
    ``send_batch`` and ``class_tx_bytes``; 1 s receive timeout."""
    with in_netns(netns):
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
    sock.bind((0, 0))
    sock.settimeout(1.0)
    return sock


def send_batch(sock: socket.socket, data: bytes, count: int) -> None:
    """Send compiled requests (each with NLM_F_ACK) and wait for their ``count`` acknowledgements
    (``await_acks``)."""
    sock.send(data)
    await_acks(sock, count)


def await_acks(sock: socket.socket, count: int) -> None:
    """Wait for ``count`` acknowledgements (NLMSG_ERROR messages, error 0 on success; netlink(7))
    of requests sent on ``sock``. Raises BuildError naming the first refusal, TimeoutError if the
    kernel does not answer within the socket's timeout."""
    acks, failure = 0, None
    while acks < count:
        buf = sock.recv(65536)
        off = 0
        while off + NLMSGHDR.size <= len(buf):
            length, mtype = NLMSGHDR.unpack_from(buf, off)[:2]
            if mtype == NLMSG_ERROR:
                acks += 1
                code = struct.unpack_from("=i", buf, off + NLMSGHDR.size)[0]
                if code and failure is None:
                    failure = -code
            off += max((length + 3) & ~3, NLMSGHDR.size)
    if failure is not None:
        raise BuildError(f"the kernel refused a batched class change: {os.strerror(failure)}")


def class_dump_request(index: int) -> bytes:
    """RTM_GETTCLASS dump of every class of interface ``index``."""
    body = TCMSG.pack(0, 0, 0, index, 0, 0, 0)
    return NLMSGHDR.pack(NLMSGHDR.size + len(body), RTM_GETTCLASS, NLM_F_REQUEST | NLM_F_DUMP, 0, 0) + body


def class_bytes_from_dump(data: bytes, classid: int) -> int | None:
    """The ``bytes`` counter of class ``classid`` in a dump's RTM_NEWTCLASS messages (None: absent)."""
    off = 0
    while off + NLMSGHDR.size <= len(data):
        length, mtype = NLMSGHDR.unpack_from(data, off)[:2]
        if mtype == RTM_NEWTCLASS and TCMSG.unpack_from(data, off + NLMSGHDR.size)[4] == classid:
            at, end = off + NLMSGHDR.size + TCMSG.size, off + length
            while at + NLA.size <= end:
                alen, atype = NLA.unpack_from(data, at)
                if atype == _TCA_STATS:
                    return struct.unpack_from("=Q", data, at + NLA.size)[0]
                at += max((alen + 3) & ~3, NLA.size)
        off += max((length + 3) & ~3, NLMSGHDR.size)
    return None


def class_tx_bytes(sock: socket.socket, index: int, classid: int) -> int:
    """Bytes HTB class ``classid`` of interface ``index`` has sent (tc_stats), read with one dump on
    ``sock`` (an ``rtnl_socket`` of the interface's namespace). Raises KeyError for no such class,
    OSError when the kernel refuses the dump (e.g. no such interface)."""
    sock.send(class_dump_request(index))
    found = None
    while True:
        buf = sock.recv(1 << 16)
        value = class_bytes_from_dump(buf, classid)
        found = value if value is not None else found
        off, done = 0, False
        while off + NLMSGHDR.size <= len(buf):
            length, mtype = NLMSGHDR.unpack_from(buf, off)[:2]
            if mtype == NLMSG_ERROR:
                code = struct.unpack_from("=i", buf, off + NLMSGHDR.size)[0]
                if code:
                    raise OSError(-code, f"class dump of interface {index}: {os.strerror(-code)}")
            done = done or mtype in (NLMSG_DONE, NLMSG_ERROR)
            off += max((length + 3) & ~3, NLMSGHDR.size)
        if done:
            break
    if found is None:
        raise KeyError(f"no class {classid >> 16:x}:{classid & 0xFFFF:x} on interface {index}")
    return found
