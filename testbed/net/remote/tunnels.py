"""WAN links between DCs on two machines of ``--backend remote``: VXLAN tunnels (UDP 4789) between
the machines, one per link, shaped at each end like any WAN link."""

from __future__ import annotations

from testbed.net.remote.inventory import Inventory
from testbed.spec.topology import TopologySpec

VXLAN_PORT = 4789
#: 1500 minus VXLAN's outer headers (Ethernet 14, IPv4 20, UDP 8, VXLAN 8)
TUNNEL_MTU = 1450


def tunnel_plan(spec: TopologySpec, inv: Inventory, prefix: str) -> dict[str, list[dict]]:
    """For every machine, the VXLAN tunnels of its WAN links to DCs on other machines:
    ``{"here", "there", "vni", "local", "remote", "port"}``. A link's VNI is derived from the run
    prefix and the link's index (so concurrent runs on the same machines differ); both ends use it.
    Pure: unit-tested."""
    out: dict[str, list[dict]] = {m.name: [] for m in inv.machines}
    base = (int(prefix[2:], 16) & 0xFFFF) << 8
    for j, link in enumerate(spec.links):
        ma, mb = inv.machine_of(link.a), inv.machine_of(link.b)
        if ma.name == mb.name:
            continue
        vni = base + j + 1
        out[ma.name].append(
            {
                "here": link.a,
                "there": link.b,
                "vni": vni,
                "local": ma.tunnel_address,
                "remote": mb.tunnel_address,
                "port": VXLAN_PORT,
            }
        )
        out[mb.name].append(
            {
                "here": link.b,
                "there": link.a,
                "vni": vni,
                "local": mb.tunnel_address,
                "remote": ma.tunnel_address,
                "port": VXLAN_PORT,
            }
        )
    return out
