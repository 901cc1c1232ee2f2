"""The netns backend: a topology's namespaces, links, addresses and routes made through netlink
(pyroute2), as functions of the address plan: the namespaces and their sysctls, each DC (the
router namespace holding the DC switch, a bridge, and one namespace per host), the WAN links
between routers (veths, or VXLAN tunnels to DCs on other machines), and the routers' least-delay
routes (``spec/routing.py``). :class:`NetnsRealiser` runs them for ``local.LocalNetwork``;
:class:`Realiser` is what any backend that builds on this machine provides, and
:class:`RealiseContext` what it is given."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from testbed.net import netlink
from testbed.net.namespaces import NamespaceHandles
from testbed.net.registry import RunRecord
from testbed.spec.addressing import BRIDGE_IFNAME, HOST_IFNAME, AddressPlan, host_port_ifname
from testbed.spec.routing import RoutingTable
from testbed.spec.topology import DCSpec, TopologySpec
from testbed.spec.wire import MIN_SOCKET_BUFFER_BYTES

#: Smallest socket-buffer ceiling the hosts get (Linux's default tcp_rmem maximum, 6 MiB).
MIN_TCP_BUFFER_BYTES = 6 * 2**20
#: Largest: the sysctl holds an int; 1 GiB is far above any path the testbed can carry.
MAX_TCP_BUFFER_BYTES = 2**30


def tcp_buffer_bytes(spec: TopologySpec, routes: RoutingTable) -> int:
    """Per-socket buffer ceiling so one TCP connection can fill any path: 4x the largest
    bandwidth-delay product (rate x RTT), at least Linux's default. Experiments that model a
    per-connection share lower it (DESIGN.md section 2a)."""
    bdp = 0.0
    for a in spec.dcs:
        for b in spec.dcs:
            rate = routes.bottleneck_bps(a.name, b.name)
            if rate is not None:
                bdp = max(bdp, rate / 8 * routes.rtt_us(a.name, b.name) / 1e6)
    return int(min(MAX_TCP_BUFFER_BYTES, max(MIN_TCP_BUFFER_BYTES, 4 * bdp)))


def namespace_sysctls(
    tcp_bytes: int, congestion: str | None = None
) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """(every namespace's sysctls, a router's extra ones, a router's optional ones) for socket
    buffers of at most ``tcp_bytes`` and TCP congestion control ``congestion`` (None: the one new
    namespaces inherit, the machine's default)."""
    # pipeline traffic is bursty: an idle connection must not restart from slow start (RFC 2861's
    # cwnd validation would shrink it between microbatches)
    base = {
        "net.ipv6.conf.all.disable_ipv6": "1",
        "net.ipv6.conf.default.disable_ipv6": "1",
        "net.ipv4.tcp_slow_start_after_idle": "0",
        "net.ipv4.tcp_rmem": f"{MIN_SOCKET_BUFFER_BYTES} {min(131072, tcp_bytes)} {tcp_bytes}",
        "net.ipv4.tcp_wmem": f"{MIN_SOCKET_BUFFER_BYTES} {min(16384, tcp_bytes)} {tcp_bytes}",
    }
    # br_netfilter (where loaded) would pass bridged frames through the router's iptables
    # chains and delay intra-DC traffic twice; the DC switch is a plain switch
    no_br_nf = {f"net.bridge.bridge-nf-call-{t}": "0" for t in ("iptables", "ip6tables", "arptables")}
    if congestion is not None:
        base["net.ipv4.tcp_congestion_control"] = congestion
    return base, {"net.ipv4.ip_forward": "1"}, no_br_nf


def create_namespaces(
    handles: NamespaceHandles, plan: AddressPlan, dcs: Sequence[DCSpec], tcp_bytes: int, congestion: str | None
) -> None:
    """Create the router and host namespaces of ``dcs``, with their sysctls."""
    base, router, no_br_nf = namespace_sysctls(tcp_bytes, congestion)
    for dc in dcs:
        r = plan.routers[dc.name]
        handles.add(r.netns, netlink.create_netns(r.netns, {**base, **router}, no_br_nf))
        for h in plan.hosts_of(dc.name):
            handles.add(h.netns, netlink.create_netns(h.netns, base))


def build_dcs(handles: NamespaceHandles, plan: AddressPlan, dcs: Sequence[DCSpec], mtu: int | None) -> None:
    """Each DC: the bridge in its router namespace (the hosts' gateway), a veth per host."""
    for dc in dcs:
        router = plan.routers[dc.name]
        r = handles.ipr(router.netns)
        netlink.up(r, netlink.ifindex(r, "lo"))
        br = netlink.add_bridge(r, BRIDGE_IFNAME)
        netlink.add_address(r, br, str(router.ip), router.subnet.prefixlen)
        for h in plan.hosts_of(dc.name):
            port = netlink.add_veth(r, host_port_ifname(h.index), HOST_IFNAME, h.netns, mtu)
            netlink.set_master(r, port, br)
            netlink.up(r, port)
            hi = handles.ipr(h.netns)
            eth = netlink.ifindex(hi, HOST_IFNAME)
            netlink.add_address(hi, eth, str(h.ip), h.subnet.prefixlen)
            netlink.up(hi, eth)
            netlink.up(hi, netlink.ifindex(hi, "lo"))
            netlink.add_route(hi, "default", str(h.gateway))
        netlink.up(r, br)


def build_wan(
    handles: NamespaceHandles,
    plan: AddressPlan,
    spec: TopologySpec,
    dcs_here: set[str],
    tunnels: dict[tuple[str, str], dict],
    mtu: int | None,
) -> None:
    """Every WAN link with an end here: a veth between two routers here, or, for a link to a DC on
    another machine, a VXLAN tunnel ``tunnels[(here, there)]`` = {"vni", "local", "remote", "port"}."""
    for link in spec.links:
        ea, eb = plan.wan_ends[(link.a, link.b)], plan.wan_ends[(link.b, link.a)]
        ends = [end for end in (ea, eb) if end.dc in dcs_here]
        if len(ends) == 2:
            netlink.add_veth(
                handles.ipr(plan.routers[link.a].netns), ea.ifname, eb.ifname, plan.routers[link.b].netns, mtu
            )
        elif len(ends) == 1:
            t = tunnels[(ends[0].dc, ends[0].peer)]
            netlink.add_vxlan(
                ends[0].ifname,
                plan.routers[ends[0].dc].netns,
                t["vni"],
                t["local"],
                t["remote"],
                t["port"],
                mtu or 1450,
                t.get("mac"),
            )
        for end in ends:
            ipr = handles.ipr(plan.routers[end.dc].netns)
            idx = netlink.ifindex(ipr, end.ifname)
            netlink.add_address(ipr, idx, str(end.ip.ip), 30)
            netlink.up(ipr, idx)
            if len(ends) == 1 and tunnels[(end.dc, end.peer)].get("peer_mac"):  # the far end's address is known
                netlink.add_permanent_neighbour(ipr, idx, str(end.peer_ip), tunnels[(end.dc, end.peer)]["peer_mac"])


def add_routes(
    handles: NamespaceHandles, plan: AddressPlan, spec: TopologySpec, routes: RoutingTable, dcs: Sequence[DCSpec]
) -> None:
    """Each router's route to every other DC's subnet, via its least-delay next hop."""
    for dc in dcs:
        r = handles.ipr(plan.routers[dc.name].netns)
        for other in spec.dcs:
            if other.name == dc.name:
                continue
            nh, _ = routes.next_hop(dc.name, other.name)
            end = plan.wan_ends[(dc.name, nh)]
            netlink.add_route(r, str(plan.routers[other.name].subnet), str(end.peer_ip))


def pin_wan_neighbours(handles: NamespaceHandles, plan: AddressPlan, dcs_here: set[str]) -> None:
    """Give each router a permanent neighbour entry for its WAN peers on this machine, as the
    address plan knows them: a router would otherwise resolve its peer by ARP across the delayed
    link when the first packet goes out (with netem, whose delay covers ARP too, the first transfer
    over each link waited one extra round trip). Peers on another machine (VXLAN) are pinned where
    the tunnel is made, to the address the tunnel plan gives their end (``remote/tunnels.py``)."""
    for (dc, peer), end in plan.wan_ends.items():
        if dc not in dcs_here or peer not in dcs_here:
            continue
        far = plan.wan_ends[(peer, dc)]
        near_ipr, far_ipr = handles.ipr(plan.routers[dc].netns), handles.ipr(plan.routers[peer].netns)
        mac = netlink.mac_address(far_ipr, netlink.ifindex(far_ipr, far.ifname))
        netlink.add_permanent_neighbour(near_ipr, netlink.ifindex(near_ipr, end.ifname), str(end.peer_ip), mac)


def segment_at_hosts(handles: NamespaceHandles, plan: AddressPlan, dcs_here: set[str]) -> None:
    """Make every host here hand the network packets of one segment each (``gso_max_segs`` 1 on its
    interface), as a NIC puts frames on a wire: otherwise TCP passes the WAN's HTB leaf segments of
    up to 64 KB, each let through whole once the class has any tokens, and the link's output is
    bursty at low rates (measured at 20 Mbit/s: +-11% over 100 ms windows, against +-0.5% with one
    segment per packet). Set by the fidelity check under change (``profile_check.py``), which
    judges delivery every 100 ms; not for runs: the packets per byte it costs the hosts and the
    delay element slowed the default experiment from 1.52 to 1.81 s an iteration on the
    development VM (2 cores), where training's 64 KB messages average the bursts out."""
    for dc in dcs_here:
        for h in plan.hosts_of(dc):
            ipr = handles.ipr(h.netns)
            netlink.set_gso_max_segs(ipr, netlink.ifindex(ipr, HOST_IFNAME), 1)


@dataclass(frozen=True)
class RealiseContext:
    """What a realiser builds and where it records it: the topology, its address plan and routes,
    the DCs built here, VXLAN tunnels to DCs elsewhere, the MTU, the hosts' socket-buffer ceiling,
    the namespaces' handles (to fill) and the run's registry record."""

    spec: TopologySpec
    plan: AddressPlan
    routes: RoutingTable
    dcs: Sequence[DCSpec]
    dcs_here: set[str]
    tunnels: dict[tuple[str, str], dict]
    mtu: int | None
    tcp_bytes: int
    handles: NamespaceHandles
    record: RunRecord


class Realiser(Protocol):
    """What creates a local network's namespaces and links (``local.LocalNetwork``)."""

    #: the backend's name (``--backend``)
    backend: str

    def prepare(self, prefix: str) -> None:
        """Before anything of run ``prefix`` is created (a lock, a check)."""

    def realise(self, ctx: RealiseContext) -> None:
        """Create the namespaces of ``ctx.dcs`` (adding each one's handle to ``ctx.handles`` and
        registering processes with ``ctx.record``), their links, addresses and routes."""

    def stop(self) -> None:
        """Stop what the realiser runs, before the namespaces' names are removed."""

    def info(self) -> dict[str, Any]:
        """What the realiser found on the machine (recorded in ``env.json``)."""


class NetnsRealiser:
    """The netns backend's realiser (``local.Realiser``): every step above, nothing left running."""

    backend = "netns"

    def prepare(self, prefix: str) -> None:
        pass

    def realise(self, ctx: RealiseContext) -> None:
        create_namespaces(ctx.handles, ctx.plan, ctx.dcs, ctx.tcp_bytes, ctx.spec.tcp_congestion)
        build_dcs(ctx.handles, ctx.plan, ctx.dcs, ctx.mtu)
        build_wan(ctx.handles, ctx.plan, ctx.spec, ctx.dcs_here, ctx.tunnels, ctx.mtu)
        add_routes(ctx.handles, ctx.plan, ctx.spec, ctx.routes, ctx.dcs)

    def stop(self) -> None:
        pass

    def info(self) -> dict[str, Any]:
        return {}
