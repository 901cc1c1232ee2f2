"""The deterministic address and name plan of a realised topology.

Addresses: DC number i (file order) gets the i-th ``/dc_prefix_len`` subnet of ``dc_pool``; its
router (the DC switch's gateway) takes the first address, host k the (k+2)-th. WAN link number j
gets the j-th /30 of ``wan_pool``: its ``a`` end takes .1, its ``b`` end .2.

Names: every kernel object lives inside a namespace whose name starts with the run prefix
(``tb`` + 4 hex digits), so runs coexist and cleanup removes exactly one run's objects. Inside a
router namespace: bridge ``br0``, host ports ``h<k>``, WAN interfaces ``w-<peer DC>``; inside a
host namespace: ``eth0``.
"""

from __future__ import annotations

import ipaddress
import secrets
from dataclasses import dataclass

from testbed.errors import SpecError
from testbed.spec.topology import IFNAME_MAX, WAN_IFNAME_PREFIX, LinkSpec, TopologySpec

BRIDGE_IFNAME = "br0"
HOST_IFNAME = "eth0"
RUN_PREFIX_STEM = "tb"


def new_run_prefix() -> str:
    """A short random prefix for one run's kernel object names, such as ``tb3f9a``."""
    return RUN_PREFIX_STEM + secrets.token_hex(2)


def host_name(dc: str, index: int) -> str:
    """The name of host ``index`` of DC ``dc`` (``east-h0``): one emulated GPU."""
    return f"{dc}-h{index}"


def host_port_ifname(index: int) -> str:
    return f"h{index}"


def wan_ifname(peer_dc: str) -> str:
    name = WAN_IFNAME_PREFIX + peer_dc
    assert len(name) <= IFNAME_MAX, name  # guaranteed by topology validation
    return name


@dataclass(frozen=True)
class HostAddr:
    """One emulated GPU: ``name`` such as ``east-h0``, its namespace and address."""

    name: str
    dc: str
    index: int
    netns: str
    ip: ipaddress.IPv4Address
    gateway: ipaddress.IPv4Address
    subnet: ipaddress.IPv4Network


@dataclass(frozen=True)
class RouterAddr:
    dc: str
    netns: str
    ip: ipaddress.IPv4Address
    subnet: ipaddress.IPv4Network


@dataclass(frozen=True)
class WanEnd:
    """One end of a WAN link: the interface in ``dc``'s router namespace facing ``peer``."""

    link: LinkSpec
    dc: str
    peer: str
    ifname: str
    ip: ipaddress.IPv4Interface
    peer_ip: ipaddress.IPv4Address


def _dc_subnet(spec: TopologySpec, i: int) -> ipaddress.IPv4Network:
    size = 2 ** (32 - spec.dc_prefix_len)
    return ipaddress.IPv4Network((int(spec.dc_pool.network_address) + i * size, spec.dc_prefix_len))


def _wan_subnet(spec: TopologySpec, j: int) -> ipaddress.IPv4Network:
    return ipaddress.IPv4Network((int(spec.wan_pool.network_address) + 4 * j, 30))


def max_hosts_per_dc(prefix_len: int) -> int:
    """Hosts a DC subnet holds: all addresses but network, broadcast and the router."""
    return 2 ** (32 - prefix_len) - 3


def check_address_pools(spec: TopologySpec) -> None:
    """Raise SpecError, naming the field, if the DCs, their hosts or the links do not fit the
    address pools (the address plan of ``addressing.py``)."""
    src = spec.source
    if spec.dc_prefix_len < spec.dc_pool.prefixlen:
        raise SpecError(
            src,
            "addressing.dc_prefix_len",
            spec.dc_prefix_len,
            f"is shorter than dc_pool's /{spec.dc_pool.prefixlen}",
            "use a longer prefix length",
        )
    n_subnets = 2 ** (spec.dc_prefix_len - spec.dc_pool.prefixlen)
    if len(spec.dcs) > n_subnets:
        raise SpecError(
            src,
            "dcs",
            len(spec.dcs),
            f"DCs do not fit addressing.dc_pool {spec.dc_pool} ({n_subnets} subnets of /{spec.dc_prefix_len})",
            "use a larger dc_pool",
        )
    cap = max_hosts_per_dc(spec.dc_prefix_len)
    for i, dc in enumerate(spec.dcs):
        if dc.hosts > cap:
            raise SpecError(
                src,
                f"dcs[{i}].hosts",
                dc.hosts,
                f"is more than a /{spec.dc_prefix_len} DC subnet holds ({cap} hosts)",
                f"use at most {cap} hosts or a shorter addressing.dc_prefix_len",
            )
    if spec.wan_pool.prefixlen > 30 or len(spec.links) > 2 ** (30 - spec.wan_pool.prefixlen):
        raise SpecError(
            src,
            "addressing.wan_pool",
            str(spec.wan_pool),
            f"holds fewer /30 subnets than the {len(spec.links)} links",
            "use a larger wan_pool",
        )
    if spec.dc_pool.overlaps(spec.wan_pool):
        raise SpecError(
            src,
            "addressing.wan_pool",
            str(spec.wan_pool),
            f"overlaps dc_pool {spec.dc_pool}",
            "give the two pools disjoint ranges",
        )


class AddressPlan:
    """Names and addresses of every host, router and WAN link end of one run of a topology."""

    def __init__(self, spec: TopologySpec, prefix: str) -> None:
        self.spec, self.prefix = spec, prefix
        self.routers: dict[str, RouterAddr] = {}
        self.hosts: dict[str, HostAddr] = {}
        self.wan_ends: dict[tuple[str, str], WanEnd] = {}
        for i, dc in enumerate(spec.dcs):
            subnet = _dc_subnet(spec, i)
            gw = subnet.network_address + 1
            self.routers[dc.name] = RouterAddr(dc.name, f"{prefix}-{dc.name}-r", gw, subnet)
            for k in range(dc.hosts):
                name = host_name(dc.name, k)
                self.hosts[name] = HostAddr(
                    name, dc.name, k, f"{prefix}-{name}", subnet.network_address + 2 + k, gw, subnet
                )
        for j, link in enumerate(spec.links):
            net = _wan_subnet(spec, j)
            a_ip, b_ip = net.network_address + 1, net.network_address + 2
            self.wan_ends[(link.a, link.b)] = WanEnd(
                link, link.a, link.b, wan_ifname(link.b), ipaddress.IPv4Interface(f"{a_ip}/30"), b_ip
            )
            self.wan_ends[(link.b, link.a)] = WanEnd(
                link, link.b, link.a, wan_ifname(link.a), ipaddress.IPv4Interface(f"{b_ip}/30"), a_ip
            )

    @property
    def namespaces(self) -> list[str]:
        """Every namespace of the run: routers first, then hosts."""
        return [r.netns for r in self.routers.values()] + [h.netns for h in self.hosts.values()]

    def host(self, name: str) -> HostAddr:
        """The host named ``name`` (such as ``east-h0``). Raises KeyError listing the hosts."""
        try:
            return self.hosts[name]
        except KeyError:
            raise KeyError(f"no host {name!r}; hosts are {', '.join(self.hosts)}") from None

    def hosts_of(self, dc: str) -> list[HostAddr]:
        return [h for h in self.hosts.values() if h.dc == dc]

    def first_host(self, dc: str) -> HostAddr:
        return self.hosts_of(dc)[0]
