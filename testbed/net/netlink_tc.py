"""Traffic control through netlink (pyroute2): installing HTB trees, netem and pfifo leaves and u32
filters, changing classes in place, compiling class changes ahead and sending them in one system
call, and reading classes, qdiscs and queues back. pyroute2 0.9.7 traps (DESIGN.md section 3): u32
filters need ``protocol=0x0800``; a missing kernel feature comes back as a bare ENOENT, which
``FeatureError`` names here. Namespaces and links: ``netlink.py``.
"""

from __future__ import annotations

import errno
import functools
import struct
from collections.abc import Sequence

from pyroute2 import IPRoute
from pyroute2.netlink import NLM_F_ACK, NLM_F_REPLACE, NLM_F_REQUEST
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl import RTM_NEWTCLASS
from pyroute2.netlink.rtnl.tcmsg.common import calc_xmittime, tick_in_usec

from testbed.errors import BuildError, FeatureError
from testbed.net.netlink import ifindex
from testbed.net.rtnl_raw import CLASS_STATS, NLA, NLMSGHDR, TCMSG
from testbed.net.shaping import ROOT_HANDLE, EgressPlan, HtbClass, Netem, Pfifo, U32Filter

ETH_P_IP = 0x0800


def _tc(ipr: IPRoute, *args, what: str, **kwargs) -> None:
    try:
        ipr.tc(*args, **kwargs)
    except NetlinkError as e:
        if e.code == errno.ENOENT and args[1] in ("netem", "htb", "u32", "pfifo"):
            raise FeatureError(
                f"the kernel refused {what} with ENOENT: the '{args[1]}' module "
                f"(sch_{args[1]} / cls_{args[1]}) is not available"
            ) from None
        raise BuildError(f"{what} failed: {e}") from None


def _leaf_kwargs(leaf: Pfifo | Netem) -> tuple[str, dict]:
    if isinstance(leaf, Pfifo):
        return "pfifo", {"limit": leaf.limit_packets}
    return "netem", {
        "delay": leaf.delay_us,
        "jitter": leaf.jitter_us,
        "loss": leaf.loss_pct,
        "limit": leaf.limit_packets,
    }


def _class_kwargs(cls: HtbClass) -> dict:
    return {
        "handle": cls.classid,
        "parent": ROOT_HANDLE | cls.parent_minor,
        "rate": cls.rate_bps // 8,
        "ceil": cls.ceil_bps // 8,
        "burst": cls.burst_bytes,
        "cburst": cls.cburst_bytes,
        "quantum": cls.quantum_bytes,
    }


def apply_egress(ipr: IPRoute, plan: EgressPlan) -> None:
    """Install an egress plan on its interface (which must have no root qdisc of ours yet)."""
    index = ifindex(ipr, plan.ifname)
    where = f"{plan.netns}/{plan.ifname}"
    if plan.root_netem is not None:
        kind, kw = _leaf_kwargs(plan.root_netem)
        _tc(ipr, "add", kind, index, handle=ROOT_HANDLE, what=f"root {kind} on {where}", **kw)
        return
    if not plan.classes:
        return
    _tc(ipr, "add", "htb", index, handle=ROOT_HANDLE, default=0x10, what=f"root htb on {where}")
    for cls in plan.classes:
        add_class(ipr, index, cls, where)
    for f in plan.filters:
        add_filter(ipr, index, f, where)


def add_class(ipr: IPRoute, index: int, cls: HtbClass, where: str = "") -> None:
    _tc(ipr, "add-class", "htb", index, what=f"htb class 1:{cls.minor:x} on {where}", **_class_kwargs(cls))
    if cls.leaf is not None:
        kind, kw = _leaf_kwargs(cls.leaf)
        _tc(
            ipr,
            "add",
            kind,
            index,
            parent=cls.classid,
            handle=cls.minor << 16,
            what=f"{kind} leaf of 1:{cls.minor:x} on {where}",
            **kw,
        )


def change_netem(ipr: IPRoute, index: int, minor: int, leaf: Netem, where: str = "") -> None:
    """Change class ``1:minor``'s netem leaf to ``leaf`` in place (its queue kept). Raises
    BuildError where the kernel refuses."""
    _, kw = _leaf_kwargs(leaf)
    _tc(
        ipr,
        "change",
        "netem",
        index,
        parent=ROOT_HANDLE | minor,
        handle=minor << 16,
        what=f"netem leaf of 1:{minor:x} on {where}",
        **kw,
    )


def add_filter(ipr: IPRoute, index: int, f: U32Filter, where: str = "") -> None:
    _tc(
        ipr,
        "add-filter",
        "u32",
        index,
        parent=ROOT_HANDLE,
        prio=f.prio,
        protocol=ETH_P_IP,
        target=ROOT_HANDLE | f.flow_minor,
        keys=f.keys(),
        what=f"u32 filter prio {f.prio} on {where}",
    )


# rtnetlink numbers of an HTB class change (linux/rtnetlink.h, linux/pkt_sched.h)
_TCA_KIND, _TCA_OPTIONS = 1, 2
_TCA_HTB_PARMS, _TCA_HTB_RATE64, _TCA_HTB_CEIL64 = 1, 6, 7
_TC_LINKLAYER_ETHERNET = 1
# tc_htb_opt: rate and ceil tc_ratespec (cell_log, linklayer, overhead, cell_align, mpu, rate),
# then buffer, cbuffer (in scheduler ticks), quantum, level, prio
_HTB_OPT = struct.Struct("=BBHhHI BBHhHI IIIII")
_CELL_LOG = 3  # tc's cell log for an MTU of 1600 (pyroute2 and iproute2 compute the same)


def _nla(kind: int, payload: bytes) -> bytes:
    return NLA.pack(NLA.size + len(payload), kind) + payload + b"\0" * (-len(payload) % 4)


@functools.lru_cache(maxsize=4096)
def class_change_message(index: int, cls: HtbClass) -> bytes:
    """One in-place change of an HTB class: RTM_NEWTCLASS with NLM_F_ACK and NLM_F_REPLACE but not
    NLM_F_CREATE, as ``tc class change`` sends, with the same ``tc_htb_opt`` as pyroute2 encodes
    (``tests/unit/test_class_change_message.py`` compares the two field by field) and without the two
    256-entry rate tables: the rate specs say their link layer (Ethernet), and Linux has then
    ignored the tables since 3.11 (sch_htb.c keeps them only for tc binaries without link-layer
    support). Packed with ``struct`` instead of pyroute2's message classes: 10 us instead of
    about 0.3 ms of Python, on the path of every live rate change. Remembered per class."""
    rate_Bps, ceil_Bps = cls.rate_bps // 8, cls.ceil_bps // 8  # bytes/s, as the kernel takes them
    if rate_Bps < 1 or ceil_Bps < 1:
        raise BuildError(
            f"htb class 1:{cls.minor:x}: rate {cls.rate_bps} bit/s, ceil {cls.ceil_bps} bit/s: give at least 8 bit/s"
        )
    buffer = int(calc_xmittime(rate_Bps, cls.burst_bytes))
    cbuffer = int(calc_xmittime(ceil_Bps, cls.cburst_bytes))
    eth = _TC_LINKLAYER_ETHERNET
    opt = _HTB_OPT.pack(
        *(_CELL_LOG, eth, 0, -1, 0, min(rate_Bps, 2**32 - 1)),
        *(_CELL_LOG, eth, 0, -1, 0, min(ceil_Bps, 2**32 - 1)),
        *(buffer, cbuffer, cls.quantum_bytes, 0, 0),
    )
    options = _nla(_TCA_HTB_PARMS, opt)
    if rate_Bps >= 2**32:
        options += _nla(_TCA_HTB_RATE64, struct.pack("=Q", rate_Bps))
    if ceil_Bps >= 2**32:
        options += _nla(_TCA_HTB_CEIL64, struct.pack("=Q", ceil_Bps))
    body = (
        TCMSG.pack(0, 0, 0, index, cls.classid, ROOT_HANDLE | cls.parent_minor, 0)
        + _nla(_TCA_KIND, b"htb\0")
        + _nla(_TCA_OPTIONS, options)
    )
    header = NLMSGHDR.pack(NLMSGHDR.size + len(body), RTM_NEWTCLASS, NLM_F_REQUEST | NLM_F_ACK | NLM_F_REPLACE, 0, 0)
    return header + body


def compile_class_changes(changes: Sequence[tuple[int, HtbClass]]) -> bytes:
    """In-place changes of HTB classes, given as (ifindex, class) pairs, compiled into one buffer of
    RTM_NEWTCLASS messages (``class_change_message``) without sending anything. ``rtnl_raw.send_batch``
    applies the buffer later in one system call: a live change then costs one sendmsg instead of
    one pyroute2 round trip per class."""
    return b"".join(class_change_message(index, cls) for index, cls in changes)


def read_classes(ipr: IPRoute, index: int) -> dict[int, dict]:
    """HTB classes of the interface of index ``index`` as ``{minor: {"rate_bps", "ceil_bps",
    "tx_bytes", "tx_packets", "drops", "overlimits", "backlog_bytes", "qlen"}}``, read back from
    the kernel (tc_stats: ``drops`` counts packets the class's leaf queue refused, ``overlimits``
    the times the class was throttled, ``backlog_bytes``/``qlen`` what its leaf holds now). The
    index, not the name: a name lookup dumps the namespace's links, which cost the link sampler
    a third of its CPU time (``NamespaceHandles.ifindex`` looks each up once)."""
    out = {}
    for msg in ipr.get_classes(index):
        if msg.get_attr("TCA_KIND") != "htb":
            continue
        opts = msg.get_attr("TCA_OPTIONS")
        params = opts.get_attr("TCA_HTB_PARMS")
        stats = msg.get_attr("TCA_STATS")
        rate = opts.get_attr("TCA_HTB_RATE64") or params["rate"]
        ceil = opts.get_attr("TCA_HTB_CEIL64") or params["ceil"]
        out[msg["handle"] & 0xFFFF] = {
            "rate_bps": rate * 8,
            "ceil_bps": ceil * 8,
            **{key: stats[field] if stats is not None else 0 for key, field in CLASS_STATS.items()},
        }
    return out


def read_qdiscs(ipr: IPRoute, ifname: str) -> list[str]:
    """Kinds of the qdiscs on an interface (root first), read back from the kernel."""
    index = ifindex(ipr, ifname)
    return [m.get_attr("TCA_KIND") for m in ipr.get_qdiscs(index) if m["index"] == index]


def read_netem(ipr: IPRoute, ifname: str) -> dict[int, Netem]:
    """The netem qdiscs on an interface as the kernel holds them, by the classid of their parent
    (``TC_H_ROOT`` for a bare root): delay and jitter converted from the kernel's scheduler ticks
    (``/proc/net/psched``), loss from its 32-bit probability, limit in packets."""
    index = ifindex(ipr, ifname)
    out = {}
    for m in ipr.get_qdiscs(index):
        if m["index"] != index or m.get_attr("TCA_KIND") != "netem":
            continue
        opts = m.get_attr("TCA_OPTIONS")
        out[m["parent"]] = Netem(
            delay_us=round(opts["delay"] / tick_in_usec),
            jitter_us=round(opts["jitter"] / tick_in_usec),
            loss_pct=round(opts["loss"] / (2**32 - 1) * 100, 6),
            limit_packets=opts["limit"],
        )
    return out


TC_H_ROOT = 0xFFFFFFFF


def queued_packets(ipr: IPRoute, ifname: str) -> int:
    """Packets queued on an interface's egress (the root qdisc's qlen counts its whole tree)."""
    index = ifindex(ipr, ifname)
    return sum(
        m.get_attr("TCA_STATS")["qlen"]
        for m in ipr.get_qdiscs(index)
        if m["index"] == index and m["parent"] == TC_H_ROOT and m.get_attr("TCA_STATS") is not None
    )


def netem_available(ipr: IPRoute) -> bool:
    """Whether the kernel has sch_netem: try one on loopback of ``ipr``'s (our own) namespace."""
    index = ifindex(ipr, "lo")
    try:
        ipr.tc("add", "netem", index, handle=0xFFFE0000, delay=1000)
    except NetlinkError as e:
        if e.code in (errno.ENOENT, errno.EOPNOTSUPP):
            return False
        raise
    ipr.tc("del", "netem", index, handle=0xFFFE0000)
    return True
