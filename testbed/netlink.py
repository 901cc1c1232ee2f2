"""The one place that talks to the kernel's netlink (through pyroute2).

Namespaces are created from the calling thread (unshare + bind mount of /proc/thread-self/ns/net,
as ``ip netns add`` does) and each gets one rtnetlink socket opened inside it, so building dozens
of namespaces costs milliseconds instead of a fork each. pyroute2 0.9.7 traps (DESIGN.md section 3):
u32 filters need ``protocol=0x0800``; a missing kernel feature comes back as a bare ENOENT, which
``FeatureError`` names here.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import socket
import struct
from contextlib import contextmanager
from typing import Iterator, Sequence

from pyroute2 import IPBatch, IPRoute
from pyroute2 import netns as _netns
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl.tcmsg.common import nla_plus_rtab

from .errors import BuildError, FeatureError
from .shaping import ROOT_HANDLE, EgressPlan, HtbClass, Netem, Pfifo, U32Filter

def _memoize_rate_tables() -> None:
    """pyroute2 0.9.7 recomputes HTB's two 256-entry rate tables in Python for every class message,
    about half the cost of a live rate change. The tables depend only on (rate, cell_log, mpu, mtu),
    and a controller alternates among a few rates, so remember them (same values, same side effects)."""
    parms = nla_plus_rtab.parms
    if getattr(parms.calc_rtab, "_testbed_memo", False):
        return
    original = parms.calc_rtab
    cache: dict[tuple, tuple[list, int]] = {}

    def calc_rtab(self, kind):
        key = (kind, self.get(kind, "rate"), self[f"{kind}_cell_log"], self[f"{kind}_mpu"], self.get("mtu", 0))
        if key not in cache:
            if len(cache) > 4096:
                cache.clear()
            table = original(self, kind)
            cache[key] = (table, self[f"{kind}_cell_log"])
            return table
        table, cell_log = cache[key]
        self[f"{kind}_cell_align"] = -1
        self[f"{kind}_cell_log"] = cell_log
        return list(table)

    calc_rtab._testbed_memo = True
    calc_rtab._original = original
    parms.calc_rtab = calc_rtab


_memoize_rate_tables()

CLONE_NEWNET = 0x40000000
ETH_P_IP = 0x0800
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


@contextmanager
def _inside_new_netns(name: str) -> Iterator[None]:
    """Create namespace ``name`` and run the body with this thread inside it."""
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        if _libc.unshare(CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"unshare(CLONE_NEWNET) failed: {os.strerror(err)}")
        try:
            _netns.attach(name, "thread-self")
            yield
        finally:
            _netns.setns(home)
    finally:
        os.close(home)


@contextmanager
def in_netns(name: str) -> Iterator[None]:
    """Run the body with this thread inside existing namespace ``name`` (other threads unaffected)."""
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        _netns.setns(target)
        try:
            yield
        finally:
            _netns.setns(home)
    finally:
        os.close(target)
        os.close(home)


def bind_thread(ipr: IPRoute, netns: str) -> None:
    """Make ``ipr`` usable from the calling thread. pyroute2 0.9 opens one socket per thread, lazily,
    in the thread's current namespace; open this thread's socket inside ``netns``."""
    with in_netns(netns):
        ipr.link_lookup(ifname="lo")


def _write_sysctl(key: str, value: str, optional: bool) -> None:
    try:
        with open("/proc/sys/" + key.replace(".", "/"), "w") as f:
            f.write(value)
    except FileNotFoundError:
        if not optional:
            raise


def _write_sysctls(sysctls: dict[str, str], optional: dict[str, str] | None) -> None:
    """Set ``sysctls`` (and ``optional`` ones, where the kernel has them) in this thread's namespace."""
    for key, value in sysctls.items():
        _write_sysctl(key, value, optional=False)
    for key, value in (optional or {}).items():
        _write_sysctl(key, value, optional=True)


def create_netns(name: str, sysctls: dict[str, str], optional: dict[str, str] | None = None) -> IPRoute:
    """Create network namespace ``name``, set ``sysctls`` (and ``optional`` ones, where the kernel
    has them) inside it, return an IPRoute bound to it."""
    with _inside_new_netns(name):
        _write_sysctls(sysctls, optional)
        return IPRoute()


def attach_netns(name: str, pid: int, sysctls: dict[str, str], optional: dict[str, str] | None = None) -> IPRoute:
    """Give the network namespace of process ``pid`` (e.g. a Mininet node's shell) the name ``name``
    (like ``ip netns attach``: a bind mount under /run/netns that keeps it alive), set ``sysctls``
    (and ``optional`` ones) inside it, return an IPRoute bound to it."""
    _netns.attach(name, pid)
    with in_netns(name):
        _write_sysctls(sysctls, optional)
        return IPRoute()


def remove_netns(name: str) -> None:
    if name in _netns.listnetns():
        _netns.remove(name)


def _one(ipr: IPRoute, ifname: str) -> int:
    found = ipr.link_lookup(ifname=ifname)
    if not found:
        raise BuildError(f"interface {ifname} not found")
    return found[0]


def ifindex(ipr: IPRoute, ifname: str) -> int:
    return _one(ipr, ifname)


def add_bridge(ipr: IPRoute, ifname: str) -> int:
    ipr.link("add", ifname=ifname, kind="bridge", br_stp_state=0, br_forward_delay=0)
    return _one(ipr, ifname)


def add_veth(ipr: IPRoute, ifname: str, peer_ifname: str, peer_netns: str, mtu: int | None = None) -> int:
    """A veth pair: ``ifname`` in ``ipr``'s namespace, ``peer_ifname`` directly in ``peer_netns``
    (never in the root namespace, so a crash cannot leave a link there)."""
    extra = {"mtu": mtu} if mtu else {}
    ipr.link("add", ifname=ifname, kind="veth", peer={"ifname": peer_ifname, "net_ns_fd": peer_netns, **extra}, **extra)
    return _one(ipr, ifname)


def add_vxlan(ifname: str, netns: str, vni: int, local: str, remote: str, port: int, mtu: int) -> None:
    """A VXLAN interface ``ifname`` created directly inside ``netns`` whose UDP underlay stays in the
    caller's namespace (the device's link namespace): the calling thread's namespace carries the
    tunnel between ``local`` and ``remote`` (unicast, UDP ``port``), ``netns`` sees one Ethernet
    link. Never exists outside ``netns``, so a crash cannot leave it behind (ip-link(8), VXLAN)."""
    with IPRoute() as ipr:
        ipr.link("add", ifname=ifname, kind="vxlan", vxlan_id=vni, vxlan_local=local, vxlan_group=remote,
                 vxlan_port=port, vxlan_learning=0, mtu=mtu, net_ns_fd=netns)


def set_master(ipr: IPRoute, index: int, master: int) -> None:
    ipr.link("set", index=index, master=master)


def up(ipr: IPRoute, index: int) -> None:
    ipr.link("set", index=index, state="up")


def add_address(ipr: IPRoute, index: int, address: str, prefixlen: int) -> None:
    ipr.addr("add", index=index, address=address, prefixlen=prefixlen)


def add_route(ipr: IPRoute, dst: str, gateway: str) -> None:
    """``dst`` as ``a.b.c.d/len`` or ``default``."""
    if dst == "default":
        ipr.route("add", dst="0.0.0.0/0", gateway=gateway)
    else:
        ipr.route("add", dst=dst, gateway=gateway)


def _tc(ipr: IPRoute, *args, what: str, **kwargs) -> None:
    try:
        ipr.tc(*args, **kwargs)
    except NetlinkError as e:
        if e.code == errno.ENOENT and args[1] in ("netem", "htb", "u32", "pfifo"):
            raise FeatureError(f"the kernel refused {what} with ENOENT: the '{args[1]}' module "
                               f"(sch_{args[1]} / cls_{args[1]}) is not available") from None
        raise BuildError(f"{what} failed: {e}") from None


def _leaf_kwargs(leaf: Pfifo | Netem) -> tuple[str, dict]:
    if isinstance(leaf, Pfifo):
        return "pfifo", {"limit": leaf.limit_packets}
    return "netem", {"delay": leaf.delay_us, "jitter": leaf.jitter_us, "loss": leaf.loss_pct,
                     "limit": leaf.limit_packets}


def _class_kwargs(cls: HtbClass) -> dict:
    return {"handle": cls.classid, "parent": ROOT_HANDLE | cls.parent_minor if cls.parent_minor else ROOT_HANDLE,
            "rate": cls.rate_bps // 8, "ceil": cls.ceil_bps // 8, "burst": cls.burst_bytes,
            "cburst": cls.cburst_bytes, "quantum": cls.quantum_bytes}


def apply_egress(ipr: IPRoute, plan: EgressPlan) -> None:
    """Install an egress plan on its interface (which must have no root qdisc of ours yet)."""
    index = _one(ipr, plan.ifname)
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
        _tc(ipr, "add", kind, index, parent=cls.classid, handle=cls.minor << 16,
            what=f"{kind} leaf of 1:{cls.minor:x} on {where}", **kw)


def add_filter(ipr: IPRoute, index: int, f: U32Filter, where: str = "") -> None:
    _tc(ipr, "add-filter", "u32", index, parent=ROOT_HANDLE, prio=f.prio, protocol=ETH_P_IP,
        target=ROOT_HANDLE | f.flow_minor, keys=f.keys(), what=f"u32 filter prio {f.prio} on {where}")


def change_class(ipr: IPRoute, index: int, cls: HtbClass) -> None:
    """Change an HTB class's rate and ceil in place (netlink RTM_NEWTCLASS without NLM_F_CREATE:
    the class and its queue stay, no unshaped window)."""
    _tc(ipr, "change-class", "htb", index, what=f"change of htb class 1:{cls.minor:x}", **_class_kwargs(cls))


def compile_class_changes(changes: Sequence[tuple[int, HtbClass]]) -> bytes:
    """In-place changes of HTB classes, given as (ifindex, class) pairs, compiled into one buffer of
    RTM_NEWTCLASS messages by pyroute2's request compiler (``IPBatch``) without sending anything.
    ``send_batch`` applies the buffer later in one system call: a live grant then costs one
    sendmsg instead of one pyroute2 round trip per class."""
    ipb = IPBatch()
    try:
        for index, cls in changes:
            ipb.tc("change-class", "htb", index, **_class_kwargs(cls))
        return bytes(ipb.batch)
    finally:
        ipb.close()


NLMSG_ERROR = 2
_NLMSGHDR = struct.Struct("=IHHII")   # length, type, flags, sequence, port id (netlink(7))


def rtnl_socket(netns: str) -> socket.socket:
    """A plain rtnetlink socket opened inside ``netns`` (it stays bound to that namespace), for
    ``send_batch``; 1 s receive timeout."""
    with in_netns(netns):
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
    sock.bind((0, 0))
    sock.settimeout(1.0)
    return sock


def send_batch(sock: socket.socket, data: bytes, count: int) -> None:
    """Send compiled requests (each with NLM_F_ACK) and wait for their ``count`` acknowledgements
    (NLMSG_ERROR messages, error 0 on success; netlink(7)). Raises BuildError naming the first
    refusal, TimeoutError if the kernel does not answer within the socket's timeout."""
    sock.send(data)
    acks, failure = 0, None
    while acks < count:
        buf = sock.recv(65536)
        off = 0
        while off + _NLMSGHDR.size <= len(buf):
            length, mtype = _NLMSGHDR.unpack_from(buf, off)[:2]
            if mtype == NLMSG_ERROR:
                acks += 1
                code = struct.unpack_from("=i", buf, off + _NLMSGHDR.size)[0]
                if code and failure is None:
                    failure = -code
            off += max((length + 3) & ~3, _NLMSGHDR.size)
    if failure is not None:
        raise BuildError(f"the kernel refused a batched class change: {os.strerror(failure)}")


def read_classes(ipr: IPRoute, ifname: str) -> dict[int, dict]:
    """HTB classes of an interface as ``{minor: {"rate_bps", "ceil_bps", "tx_bytes"}}``, read back
    from the kernel (``tx_bytes``: bytes the class has sent)."""
    out = {}
    for msg in ipr.get_classes(_one(ipr, ifname)):
        if msg.get_attr("TCA_KIND") != "htb":
            continue
        opts = msg.get_attr("TCA_OPTIONS")
        params = opts.get_attr("TCA_HTB_PARMS")
        stats = msg.get_attr("TCA_STATS")
        rate = opts.get_attr("TCA_HTB_RATE64") or params["rate"]
        ceil = opts.get_attr("TCA_HTB_CEIL64") or params["ceil"]
        out[msg["handle"] & 0xFFFF] = {"rate_bps": rate * 8, "ceil_bps": ceil * 8,
                                       "tx_bytes": stats["bytes"] if stats is not None else 0}
    return out


def read_qdiscs(ipr: IPRoute, ifname: str) -> list[str]:
    """Kinds of the qdiscs on an interface (root first), read back from the kernel."""
    index = _one(ipr, ifname)
    return [m.get_attr("TCA_KIND") for m in ipr.get_qdiscs(index) if m["index"] == index]


TC_H_ROOT = 0xFFFFFFFF


def queued_packets(ipr: IPRoute, ifname: str) -> int:
    """Packets queued on an interface's egress (the root qdisc's qlen counts its whole tree)."""
    index = _one(ipr, ifname)
    return sum(m.get_attr("TCA_STATS")["qlen"] for m in ipr.get_qdiscs(index)
               if m["index"] == index and m["parent"] == TC_H_ROOT and m.get_attr("TCA_STATS") is not None)


def netem_available(ipr: IPRoute) -> bool:
    """Whether the kernel has sch_netem: try one on loopback of ``ipr``'s (our own) namespace."""
    index = _one(ipr, "lo")
    try:
        ipr.tc("add", "netem", index, handle=0xFFFE0000, delay=1000)
    except NetlinkError as e:
        if e.code in (errno.ENOENT, errno.EOPNOTSUPP):
            return False
        raise
    ipr.tc("del", index=index, handle=0xFFFE0000)
    return True
