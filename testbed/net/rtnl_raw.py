"""Plain rtnetlink sockets for the paths where pyroute2's request pipeline costs too much: sending
compiled messages in one system call and awaiting their acknowledgements (live rate changes,
Atlas's grants), reading one HTB class's byte counter (Atlas's grant ends when its bytes have
passed), and reading an interface's HTB classes with their counters (the link sampler, ten times
a second while training: pyroute2 decoded each dump in about 4 ms of the runner's CPU). Message
layouts: netlink(7), rtnetlink(7), linux/pkt_sched.h."""

from __future__ import annotations

import itertools
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
NLA_TYPE_MASK = 0x3FFF  # the type without NLA_F_NESTED and NLA_F_NET_BYTEORDER
TCA_KIND, TCA_OPTIONS, _TCA_STATS = 1, 2, 3
#: struct tc_stats: bytes (u64), packets, drops, overlimits, bps, pps, qlen, backlog (u32), and its
#: fields' names (pyroute2's, linux/pkt_sched.h)
TC_STATS = struct.Struct("=QIIIIIII")
TC_STATS_FIELDS = ("bytes", "packets", "drop", "overlimits", "bps", "pps", "qlen", "backlog")
#: the counters a class is read with (``htb_classes_from_dump``, ``netlink_tc.read_classes``), by
#: the name of their tc_stats field
CLASS_STATS = {
    "tx_bytes": "bytes",
    "tx_packets": "packets",
    "drops": "drop",
    "overlimits": "overlimits",
    "backlog_bytes": "backlog",
    "qlen": "qlen",
}
#: TCA_OPTIONS of an HTB class: struct tc_htb_opt (its rate's and ceil's tc_ratespec, 12 bytes
#: each, the rate in bytes/s a u32 at offset 8 of each), and the 64-bit rates for 4 GB/s and more
TCA_HTB_PARMS, TCA_HTB_RATE64, TCA_HTB_CEIL64 = 1, 6, 7
_RATESPEC_RATE = struct.Struct("=8xI")


def rtnl_socket(netns: str) -> socket.socket:
    """A plain rtnetlink socket opened inside ``netns`` (it stays bound to that namespace), for
    ``send_batch``, ``class_tx_bytes`` and ``read_htb_classes``; 1 s receive timeout."""
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


def class_dump_request(index: int, seq: int = 0) -> bytes:
    """RTM_GETTCLASS dump of every class of interface ``index``, numbered ``seq`` (the answer's
    messages carry it)."""
    body = TCMSG.pack(0, 0, 0, index, 0, 0, 0)
    return NLMSGHDR.pack(NLMSGHDR.size + len(body), RTM_GETTCLASS, NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + body


_dump_seq = itertools.count(1)


def _attrs(data: bytes, at: int, end: int) -> dict[int, tuple[int, int]]:
    """The netlink attributes in ``data[at:end]``: {type: (payload start, payload end)}."""
    out = {}
    while at + NLA.size <= end:
        alen, atype = NLA.unpack_from(data, at)
        if alen < NLA.size:
            break
        out[atype & NLA_TYPE_MASK] = (at + NLA.size, at + alen)
        at += (alen + 3) & ~3
    return out


def _class_messages(data: bytes):
    """(class handle, its attributes (``_attrs``)) of each RTM_NEWTCLASS message in ``data``."""
    off = 0
    while off + NLMSGHDR.size <= len(data):
        length, mtype = NLMSGHDR.unpack_from(data, off)[:2]
        if mtype == RTM_NEWTCLASS:
            handle = TCMSG.unpack_from(data, off + NLMSGHDR.size)[4]
            yield handle, _attrs(data, off + NLMSGHDR.size + TCMSG.size, off + length)
        off += max((length + 3) & ~3, NLMSGHDR.size)


def class_bytes_from_dump(data: bytes, classid: int) -> int | None:
    """The ``bytes`` counter of class ``classid`` in a dump's RTM_NEWTCLASS messages (None: absent)."""
    for handle, attrs in _class_messages(data):
        if handle == classid and _TCA_STATS in attrs:
            return TC_STATS.unpack_from(data, attrs[_TCA_STATS][0])[0]
    return None


def htb_classes_from_dump(data: bytes) -> dict[int, dict[str, int]]:
    """The HTB classes of a dump's RTM_NEWTCLASS messages, in ``netlink_tc.read_classes``' form:
    ``{minor: {"rate_bps", "ceil_bps", "tx_bytes", "tx_packets", "drops", "overlimits",
    "backlog_bytes", "qlen"}}`` (rates in bit/s; a class without tc_stats counts zeros)."""
    out = {}
    for handle, attrs in _class_messages(data):
        kind = data[slice(*attrs[TCA_KIND])].rstrip(b"\0") if TCA_KIND in attrs else b""
        if kind != b"htb" or TCA_OPTIONS not in attrs:
            continue
        opts = _attrs(data, *attrs[TCA_OPTIONS])
        rate, ceil = 0, 0
        if TCA_HTB_PARMS in opts:
            at = opts[TCA_HTB_PARMS][0]
            rate, ceil = _RATESPEC_RATE.unpack_from(data, at)[0], _RATESPEC_RATE.unpack_from(data, at + 12)[0]
        rate = struct.unpack_from("=Q", data, opts[TCA_HTB_RATE64][0])[0] if TCA_HTB_RATE64 in opts else rate
        ceil = struct.unpack_from("=Q", data, opts[TCA_HTB_CEIL64][0])[0] if TCA_HTB_CEIL64 in opts else ceil
        stats = TC_STATS.unpack_from(data, attrs[_TCA_STATS][0]) if _TCA_STATS in attrs else (0,) * 8
        named = dict(zip(TC_STATS_FIELDS, stats))
        out[handle & 0xFFFF] = {
            "rate_bps": rate * 8,
            "ceil_bps": ceil * 8,
            **{key: named[field] for key, field in CLASS_STATS.items()},
        }
    return out


def dump_classes(sock: socket.socket, index: int) -> bytes:
    """Every class of interface ``index``, dumped on ``sock`` (an ``rtnl_socket`` of the
    interface's namespace): the dump's messages, as received. Messages of an earlier dump that
    timed out are left out (each dump is numbered). Raises OSError when the kernel refuses the
    dump (e.g. no such interface), TimeoutError when it does not answer within the socket's timeout."""
    seq = next(_dump_seq) & 0xFFFFFFFF
    sock.send(class_dump_request(index, seq))
    parts = []
    while True:
        buf = sock.recv(1 << 16)
        off, done = 0, False
        while off + NLMSGHDR.size <= len(buf):
            length, mtype, _, mseq = NLMSGHDR.unpack_from(buf, off)[:4]
            step = max((length + 3) & ~3, NLMSGHDR.size)
            if mseq == seq:
                if mtype == NLMSG_ERROR:
                    code = struct.unpack_from("=i", buf, off + NLMSGHDR.size)[0]
                    if code:
                        raise OSError(-code, f"class dump of interface {index}: {os.strerror(-code)}")
                done = done or mtype in (NLMSG_DONE, NLMSG_ERROR)
                parts.append(buf[off : off + step])
            off += step
        if done:
            return b"".join(parts)


def class_tx_bytes(sock: socket.socket, index: int, classid: int) -> int:
    """Bytes HTB class ``classid`` of interface ``index`` has sent (tc_stats), read with one dump on
    ``sock`` (an ``rtnl_socket`` of the interface's namespace). Raises KeyError for no such class,
    OSError when the kernel refuses the dump (e.g. no such interface)."""
    found = class_bytes_from_dump(dump_classes(sock, index), classid)
    if found is None:
        raise KeyError(f"no class {classid >> 16:x}:{classid & 0xFFFF:x} on interface {index}")
    return found


def read_htb_classes(sock: socket.socket, index: int) -> dict[int, dict[str, int]]:
    """The HTB classes of interface ``index`` with their counters (``htb_classes_from_dump``), read
    with one dump on ``sock`` (an ``rtnl_socket`` of its namespace). Raises OSError as
    ``dump_classes``."""
    return htb_classes_from_dump(dump_classes(sock, index))
