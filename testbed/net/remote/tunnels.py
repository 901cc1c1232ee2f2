"""WAN links between DCs on two machines of ``--backend remote``: VXLAN tunnels (UDP 4789) between
the machines, one per link, shaped at each end like any WAN link."""

from __future__ import annotations

from testbed.net.remote.inventory import Inventory
from testbed.spec.topology import TopologySpec

VXLAN_PORT = 4789
#: 1500 minus VXLAN's outer headers (Ethernet 14, IPv4 20, UDP 8, VXLAN 8)
TUNNEL_MTU = 1450


def tunnel_mac(vni: int, side: int) -> str:
    """The link-layer address of one end of the tunnel with ``vni`` (``side`` 0: the link's first
    DC, 1: its second): locally administered, unique per run and link, so that each end knows its
    peer's without asking and pins it (no ARP round trip across the delayed link: ``netns.py``)."""
    return f"02:{(vni >> 16) & 0xFF:02x}:{(vni >> 8) & 0xFF:02x}:{vni & 0xFF:02x}:{side:02x}:01"


def tunnel_plan(spec: TopologySpec, inv: Inventory, prefix: str) -> dict[str, list[dict]]:
    """For every machine, the VXLAN tunnels of its WAN links to DCs on other machines:
    ``{"here", "there", "vni", "local", "remote", "port", "mac", "peer_mac"}``. A link's VNI is
    derived from the run prefix and the link's index (so concurrent runs on the same machines
    differ); both ends use it, and each end's link-layer address from it (``tunnel_mac``).
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
                "mac": tunnel_mac(vni, 0),
                "peer_mac": tunnel_mac(vni, 1),
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
                "mac": tunnel_mac(vni, 1),
                "peer_mac": tunnel_mac(vni, 0),
            }
        )
    return out
