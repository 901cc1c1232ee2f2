"""A topology file as a Mininet ``Topo``: the same hosts, addresses, interface names and routes as the
netns backend, described with Mininet's own classes.

Layout (identical to the netns backend's, ``netns.py``): every host is a Mininet ``Host`` with one interface
``eth0``, linked directly to its DC's router; every DC router is a Mininet node
(:class:`DCRouter`) that holds the DC switch as a Linux bridge ``br0`` over its host ports
``h<k>``, forwards IPv4, and has one interface ``w-<peer>`` per WAN link. There are no Mininet
switches, so neither Open vSwitch nor an OpenFlow controller is needed, and no interface ever lives
in the root namespace.

Links are plain Mininet ``Link`` objects carrying the file's rate, delay, jitter, loss and queue as
``TCLink`` parameters: ``mn --custom topologies/mininet_topos.py --link tc`` uses them (TCLink needs
sch_netem for delay, jitter and loss, and ignores rates over 1 Gbit/s), while the testbed's own
backend ignores them and shapes with its HTB classes and delay mechanism (``shaping.py``).

Topo objects are data: building one needs neither root nor a kernel; only ``Mininet(topo)`` does.
"""

from __future__ import annotations

from mininet.node import Node
from mininet.topo import Topo

from testbed.spec.addressing import BRIDGE_IFNAME, HOST_IFNAME, AddressPlan, host_port_ifname
from testbed.spec.routing import RoutingTable
from testbed.spec.topology import TopologySpec
from testbed.spec.units import format_duration_us

#: Mininet node name of a DC's router (hosts keep the topology's names, such as ``east-h0``).
ROUTER_SUFFIX = "-r"
#: TCLink's ``bw`` is in Mbit/s and it refuses more than 1000 (mininet/link.py, TCIntf.bwCmds).
TCLINK_MAX_MBPS = 1000


def router_node(dc: str) -> str:
    return dc + ROUTER_SUFFIX


class DCRouter(Node):
    """A DC's router: IPv4 forwarding, the DC switch as bridge ``br0`` over the host ports, static
    routes to the other DCs. Params (from :func:`build_topo`): ``bridge_ip`` (``"10.1.0.1/24"``),
    ``ports`` (host port names), ``routes`` (``[(subnet, next hop), ...]``)."""

    def config(
        self,
        bridge_ip: str | None = None,
        ports: tuple[str, ...] = (),
        routes: tuple[tuple[str, str], ...] = (),
        **params,
    ):
        result = super().config(**params)
        self.cmd("sysctl -q -w net.ipv4.ip_forward=1")
        if bridge_ip:
            self.cmd(f"ip link add {BRIDGE_IFNAME} type bridge stp_state 0 forward_delay 0")
            for port in ports:
                self.cmd(f"ip link set {port} master {BRIDGE_IFNAME} up")
            self.cmd(f"ip addr add {bridge_ip} dev {BRIDGE_IFNAME}")
            self.cmd(f"ip link set {BRIDGE_IFNAME} up")
        for subnet, via in routes:
            self.cmd(f"ip route add {subnet} via {via}")
        return result

    def IP(self, intf=None):  # noqa: N802 (Mininet's name)
        """The gateway address on ``br0`` (Mininet's tools, such as pingall, ask a node for one)."""
        if intf is None and self.params.get("bridge_ip"):
            return self.params["bridge_ip"].split("/")[0]
        return super().IP(intf)

    def terminate(self) -> None:
        self.cmd(f"ip link del {BRIDGE_IFNAME}")
        super().terminate()


def tclink_params(
    rate_bps: int | None, delay_us: int, jitter_us: int = 0, loss_pct: float = 0.0, queue_packets: int | None = None
) -> dict:
    """A link's shaping as Mininet ``TCLink`` parameters (``bw`` Mbit/s, ``delay``/``jitter`` strings,
    ``loss`` percent, ``max_queue_size`` packets); rates above TCLink's 1 Gbit/s limit are left out."""
    params: dict = {}
    if rate_bps and rate_bps / 1e6 <= TCLINK_MAX_MBPS:
        params["bw"] = rate_bps / 1e6
    if delay_us:
        params["delay"] = format_duration_us(delay_us).replace(" ", "")
    if jitter_us:
        params["jitter"] = format_duration_us(jitter_us).replace(" ", "")
    if loss_pct:
        params["loss"] = loss_pct
    if queue_packets:
        params["max_queue_size"] = queue_packets
    return params


class SpecTopo(Topo):
    """The Mininet topology of a :class:`TopologySpec` (see the module docstring)."""

    def build(self, spec: TopologySpec, prefix: str = "tbXXXX") -> None:
        plan, routes = AddressPlan(spec, prefix), RoutingTable(spec)
        for dc in spec.dcs:
            router = plan.routers[dc.name]
            hosts = plan.hosts_of(dc.name)
            hops = []
            for other in spec.dcs:
                if other.name != dc.name:
                    nh, _ = routes.next_hop(dc.name, other.name)
                    hops.append((str(plan.routers[other.name].subnet), str(plan.wan_ends[(dc.name, nh)].peer_ip)))
            self.addHost(
                router_node(dc.name),
                cls=DCRouter,
                ip=None,
                bridge_ip=f"{router.ip}/{router.subnet.prefixlen}",
                ports=tuple(host_port_ifname(h.index) for h in hosts),
                routes=tuple(hops),
            )
            access = tclink_params(dc.intra_rate_bps, dc.intra_delay_us)
            for h in hosts:
                self.addHost(h.name, ip=f"{h.ip}/{h.subnet.prefixlen}", defaultRoute=f"via {h.gateway}")
                self.addLink(
                    h.name, router_node(dc.name), intfName1=HOST_IFNAME, intfName2=host_port_ifname(h.index), **access
                )
        for link in spec.links:
            ea, eb = plan.wan_ends[(link.a, link.b)], plan.wan_ends[(link.b, link.a)]
            self.addLink(
                router_node(link.a),
                router_node(link.b),
                intfName1=ea.ifname,
                intfName2=eb.ifname,
                params1={"ip": str(ea.ip)},
                params2={"ip": str(eb.ip)},
                **tclink_params(link.rate_bps, link.delay_us, link.jitter_us, link.loss_pct, link.queue_packets),
            )


def build_topo(spec: TopologySpec, prefix: str = "tbXXXX") -> SpecTopo:
    """The Mininet ``Topo`` of ``spec``; ``prefix`` only matters for the address plan's names."""
    return SpecTopo(spec, prefix)
