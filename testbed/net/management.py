"""A management network beside the emulated one, for what should not cross the emulated WAN (a
launched job's rendezvous, ``testbed launch --rendezvous management``), like Mininet's out-of-band
control network: one namespace of the run (``<prefix>-mgmt``) holding a plain bridge, and in every
host a second interface on it (``MGMT_IFNAME``) with an address of ``MGMT_SUBNET``, neither
shaped nor delayed. Only traffic to a host's management address takes it; everything else goes as
before (the hosts' default route, the emulated DCs and WAN). Nothing is created in the root
namespace: removing the run's namespaces removes it all, and ``testbed clean`` finds the
namespace in the run's record.
"""

from __future__ import annotations

import ipaddress

from testbed.errors import SpecError
from testbed.net import netlink
from testbed.net.netns import namespace_sysctls
from testbed.spec.topology import TopologySpec

#: the management addresses: RFC 2544's range for benchmarking networks (198.18.0.0/15), kept
#: apart from the topology's pools (checked)
MGMT_SUBNET = ipaddress.IPv4Network("198.18.0.0/15")
#: a host's management interface
MGMT_IFNAME = "mgmt0"
#: the bridge in the management namespace
MGMT_BRIDGE = "br0"


def management_netns(prefix: str) -> str:
    """The management namespace's name in run ``prefix`` (no DC's router or host is named so)."""
    return f"{prefix}-mgmt"


def management_addresses(spec: TopologySpec, hosts: list[str]) -> dict[str, str]:
    """Each of ``hosts``' management address, in order from ``MGMT_SUBNET``'s first. Raises
    SpecError where the topology's address pools overlap ``MGMT_SUBNET`` or the hosts do not fit."""
    for field, pool in (("addressing.dc_pool", spec.dc_pool), ("addressing.wan_pool", spec.wan_pool)):
        if pool.overlaps(MGMT_SUBNET):
            raise SpecError(
                spec.name, field, str(pool), f"overlaps the management network {MGMT_SUBNET}",
                "give the topology pools outside it, or keep the rendezvous on the emulated network",
            )  # fmt: skip
    if len(hosts) > MGMT_SUBNET.num_addresses - 2:
        raise SpecError(spec.name, "hosts", str(len(hosts)), f"do not fit {MGMT_SUBNET}", "use fewer hosts")
    return {h: str(MGMT_SUBNET.network_address + 1 + k) for k, h in enumerate(hosts)}


def add_management_network(net, hosts: list[str]) -> dict[str, str]:
    """Build the management network of ``net`` (a built ``local.LocalNetwork``) for ``hosts``;
    returns each host's management address. The namespace is recorded before it is made, and
    removed with the network's own at teardown. Raises SpecError as ``management_addresses``."""
    addresses = management_addresses(net.spec, hosts)
    name = management_netns(net.prefix)
    net.record.add_namespaces([name])  # recorded first: a crash now leaves nothing clean cannot find
    net.extra_namespaces.append(name)
    _, _, no_br_nf = namespace_sysctls(net.tcp_bytes)
    ipr = netlink.create_netns(name, {}, no_br_nf)
    net.handles.add(name, ipr)
    netlink.up(ipr, netlink.ifindex(ipr, "lo"))
    br = netlink.add_bridge(ipr, MGMT_BRIDGE)
    for k, host in enumerate(hosts):
        port = netlink.add_veth(ipr, f"m{k}", MGMT_IFNAME, net.host(host).netns)
        netlink.set_master(ipr, port, br)
        netlink.up(ipr, port)
        hi = net.handles.ipr(net.host(host).netns)
        mgmt = netlink.ifindex(hi, MGMT_IFNAME)
        netlink.add_address(hi, mgmt, addresses[host], MGMT_SUBNET.prefixlen)
        netlink.up(hi, mgmt)
    netlink.up(ipr, br)
    return addresses
