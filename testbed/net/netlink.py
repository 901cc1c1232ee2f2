"""Namespaces and links through netlink (pyroute2): with ``netlink_tc.py`` (traffic control), the one
place that talks to the kernel's netlink.

Namespaces are created from the calling thread (unshare + bind mount of /proc/thread-self/ns/net,
as ``ip netns add`` does) and each gets one rtnetlink socket opened inside it, so building dozens
of namespaces costs milliseconds instead of a fork each.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Iterator
from contextlib import contextmanager

from pyroute2 import IPRoute
from pyroute2 import netns as _netns

from testbed.errors import BuildError

CLONE_NEWNET = 0x40000000
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


def set_sysctls(netns: str, sysctls: dict[str, str]) -> None:
    """Set ``sysctls`` inside the existing namespace ``netns`` (from this thread). Raises OSError
    where one cannot be written."""
    with in_netns(netns):
        _write_sysctls(sysctls, None)


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


def add_vxlan(
    ifname: str, netns: str, vni: int, local: str, remote: str, port: int, mtu: int, mac: str | None = None
) -> None:
    """A VXLAN interface ``ifname`` created directly inside ``netns`` whose UDP underlay stays in the
    caller's namespace (the device's link namespace): the calling thread's namespace carries the
    tunnel between ``local`` and ``remote`` (unicast, UDP ``port``), ``netns`` sees one Ethernet
    link with link-layer address ``mac`` (default: a random one). Never exists outside ``netns``,
    so a crash cannot leave it behind (ip-link(8), VXLAN)."""
    extra = {"address": mac} if mac else {}
    with IPRoute() as ipr:
        ipr.link(
            "add",
            ifname=ifname,
            **extra,
            kind="vxlan",
            vxlan_id=vni,
            vxlan_local=local,
            vxlan_group=remote,
            vxlan_port=port,
            vxlan_learning=0,
            mtu=mtu,
            net_ns_fd=netns,
        )


NUD_PERMANENT = 0x80


def mac_address(ipr: IPRoute, index: int) -> str:
    """The link-layer address of interface ``index``."""
    return ipr.get_links(index)[0].get_attr("IFLA_ADDRESS")


def add_permanent_neighbour(ipr: IPRoute, index: int, ip: str, mac: str) -> None:
    """A permanent neighbour entry (``ip neigh replace IP lladdr MAC dev IF nud permanent``)."""
    ipr.neigh("replace", dst=ip, lladdr=mac, ifindex=index, state=NUD_PERMANENT)


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


def replace_route(ipr: IPRoute, dst: str, gateway: str) -> None:
    """Point the route to ``dst`` (``a.b.c.d/len``) at ``gateway``, in place (RTM_NEWROUTE with
    NLM_F_REPLACE: no moment without a route)."""
    ipr.route("replace", dst=dst, gateway=gateway)


def set_gso_max_segs(ipr: IPRoute, index: int, segments: int) -> None:
    """The most TCP segments the kernel hands the interface in one packet (IFLA_GSO_MAX_SEGS)."""
    ipr.link("set", index=index, gso_max_segs=segments)
