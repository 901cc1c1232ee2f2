"""Checking a topology's WAN queues against its paths at load time: a bottleneck queue shorter than
the bandwidth-delay product of a path through it cannot hold one TCP flow's window, so the flow
loses packets in slow start and the link runs below its rate (the rule of thumb of one BDP of
buffering for a single flow: Villamizar and Song 1994; Appenzeller et al. 2004 for many flows).
Pure: ``load_topology`` turns each shortfall into a :class:`~testbed.errors.TestbedWarning`."""

from __future__ import annotations

from dataclasses import dataclass

from testbed.spec.routing import RoutingTable
from testbed.spec.topology import LinkSpec, TopologySpec
from testbed.spec.units import format_duration_us, format_rate
from testbed.spec.wire import FRAME_BYTES, bdp_packets


@dataclass(frozen=True)
class QueueShortfall:
    """A WAN link whose queue is below the bandwidth-delay product of the longest path for which it
    is the bottleneck (``src`` -> ``dst``, round trip ``rtt_us``): ``bdp_packets`` full frames."""

    index: int  # the link's position in the topology's links
    link: LinkSpec
    src: str
    dst: str
    rtt_us: int
    bdp_packets: int

    def message(self, source: str) -> str:
        link = self.link
        return (
            f"{source}: links[{self.index}] ({link.a}-{link.b}): queue {link.queue_packets} packets is below the "
            f"bandwidth-delay product of the path {self.src}->{self.dst} ({self.bdp_packets} frames of "
            f"{FRAME_BYTES} bytes: {format_rate(link.rate_bps)} over a {format_duration_us(self.rtt_us)} RTT), so one "
            f"TCP flow cannot fill the link and its queue drops in slow start; give the link 'queue: "
            f"{self.bdp_packets}' or more to emulate a deep-buffered WAN"
        )


def queue_shortfalls(spec: TopologySpec) -> list[QueueShortfall]:
    """Every WAN link whose queue is shorter than the BDP of a path it is the bottleneck of (the
    path whose BDP is largest), in the order of the topology's links."""
    routes = RoutingTable(spec)
    worst: dict[int, QueueShortfall] = {}
    for src in spec.dcs:
        for dst in spec.dcs:
            if src.name == dst.name:
                continue
            route = routes.route(src.name, dst.name)
            link = min(route.links, key=lambda k: k.rate_bps)
            if routes.bottleneck_bps(src.name, dst.name) != link.rate_bps:
                continue  # an access link is slower: the WAN queue does not fill
            rtt = routes.rtt_us(src.name, dst.name)
            need = bdp_packets(link.rate_bps, rtt)
            index = spec.links.index(link)
            if link.queue_packets < need and (index not in worst or worst[index].bdp_packets < need):
                worst[index] = QueueShortfall(index, link, src.name, dst.name, rtt, need)
    return [worst[i] for i in sorted(worst)]
