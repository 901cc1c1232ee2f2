"""Routing between DCs: traffic takes the path of least total one-way delay (each link's
``route_metric_us``: its delay, or the delay the network was built with where a profile has
changed it since).

Ties are broken first by fewer hops, then by the name of the next DC, so that every router's
choice is deterministic and the routers' next hops compose into loop-free paths (a plain
name-based tie break can loop over zero-delay links).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from testbed.spec.topology import LinkSpec, TopologySpec


@dataclass(frozen=True)
class Route:
    """The routed path from ``src`` to ``dst`` DC: the DCs visited and the links crossed, in order."""

    src: str
    dst: str
    dcs: tuple[str, ...]
    links: tuple[LinkSpec, ...]

    @property
    def wan_delay_us(self) -> int:
        """Sum of the one-way delays of the WAN links on the path (microseconds)."""
        return sum(link.delay_us for link in self.links)

    @property
    def bottleneck_bps(self) -> int | None:
        """Lowest WAN link rate on the path (bit/s); None for a DC to itself."""
        return min((link.rate_bps for link in self.links), default=None)

    @property
    def delivery_probability(self) -> float:
        """Probability that a packet crosses every WAN link of the path (1 - path loss)."""
        p = 1.0
        for link in self.links:
            p *= 1 - link.loss_pct / 100
        return p


class RoutingTable:
    """Least-delay routes between every pair of DCs of a topology."""

    def __init__(self, spec: TopologySpec) -> None:
        self.spec = spec
        self._adj: dict[str, list[tuple[str, LinkSpec]]] = {dc.name: [] for dc in spec.dcs}
        for link in spec.links:
            self._adj[link.a].append((link.b, link))
            self._adj[link.b].append((link.a, link))
        self._dist = {dc.name: self._dijkstra(dc.name) for dc in spec.dcs}
        self._routes: dict[tuple[str, str], Route] = {}  # each pair's, once asked for

    def _dijkstra(self, dst: str) -> dict[str, tuple[int, int]]:
        """(delay_us, hops) of the best path from every DC to ``dst``."""
        dist = {dst: (0, 0)}
        heap = [(0, 0, dst)]
        while heap:
            d, h, here = heapq.heappop(heap)
            if (d, h) > dist[here]:
                continue
            for nbr, link in self._adj[here]:
                cand = (d + link.route_metric_us, h + 1)
                if nbr not in dist or cand < dist[nbr]:
                    dist[nbr] = cand
                    heapq.heappush(heap, (*cand, nbr))
        return dist

    def next_hop(self, at: str, dst: str) -> tuple[str, LinkSpec]:
        """The neighbour DC (and the link to it) that ``at`` forwards ``dst``-bound traffic to."""
        if at == dst:
            raise ValueError(f"{at} is the destination")
        dist = self._dist[dst]
        return min(self._adj[at], key=lambda nl: (nl[1].route_metric_us + dist[nl[0]][0], dist[nl[0]][1] + 1, nl[0]))

    def route(self, src: str, dst: str) -> Route:
        known = self._routes.get((src, dst))
        if known is not None:
            return known
        dcs, links, here = [src], [], src
        while here != dst:
            here, link = self.next_hop(here, dst)
            dcs.append(here)
            links.append(link)
        self._routes[(src, dst)] = made = Route(src, dst, tuple(dcs), tuple(links))
        return made

    def one_way_delay_us(self, src: str, dst: str) -> int:
        """One-way delay between a host of ``src`` and a host of ``dst`` (access links included)."""
        if src == dst:
            return 2 * self.spec.dc(src).intra_delay_us
        r = self.route(src, dst)
        return self.spec.dc(src).intra_delay_us + r.wan_delay_us + self.spec.dc(dst).intra_delay_us

    def rtt_us(self, src: str, dst: str) -> int:
        """Round-trip time between a host of ``src`` and a host of ``dst``: twice the one-way delay
        (DESIGN.md section 2, "One-way delay"), in microseconds."""
        return 2 * self.one_way_delay_us(src, dst)

    def wan_rate_bps(self, src: str, dst: str) -> int:
        """Lowest shaped rate between a host of ``src`` and a host of another DC ``dst``: the WAN
        path's bottleneck, or an access link's rate where that is lower. Raises ValueError for
        ``src == dst``."""
        if src == dst:
            raise ValueError(f"{src} to itself crosses no WAN link")
        rate = self.bottleneck_bps(src, dst)
        assert rate is not None  # a path between two DCs crosses at least one (shaped) WAN link
        return rate

    def bottleneck_bps(self, src: str, dst: str) -> int | None:
        """Lowest shaped rate between a host of ``src`` and a host of ``dst`` (None: unshaped)."""
        rates = [self.spec.dc(src).intra_rate_bps, self.spec.dc(dst).intra_rate_bps]
        if src != dst:
            rates.append(self.route(src, dst).bottleneck_bps)
        return min((r for r in rates if r is not None), default=None)


def routes_without(spec: TopologySpec, down: set[str]) -> RoutingTable:
    """The routes once the links named in ``down`` (``a:b``) are gone: what routers move to when
    they see those links fail (``LinkSpec.failover``). Raises KeyError where a DC is then cut off."""
    from dataclasses import replace

    return RoutingTable(replace(spec, links=tuple(x for x in spec.links if f"{x.a}:{x.b}" not in down)))
