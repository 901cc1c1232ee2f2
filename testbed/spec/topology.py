"""Topology description: datacenters (DCs), their hosts and the WAN links between them.

Pure data, loaded and validated without root (STYLE.md: describe the network, then build it).
A host is one emulated GPU. A WAN link joins two DCs; its ``rate`` shapes each direction and its
``delay`` is one way (a path's RTT is twice the sum of its one-way delays, DESIGN.md section 2).
Each DC may give its hosts' access links (host to DC switch) a rate and a one-way delay: a packet
between two hosts of one DC crosses two access links, a packet between DCs crosses the access link
at each end.

Files are read by ``topology_file.py`` (the format is described there).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any

from testbed.spec.link_profile import LinkProfile, LinkState

#: Linux IFNAMSIZ minus the terminating NUL (include/uapi/linux/if.h).
IFNAME_MAX = 15
#: WAN interfaces inside a router namespace are named after the peer DC: ``w-<dc>``.
WAN_IFNAME_PREFIX = "w-"
MAX_DELAY_US = 10_000_000
#: Linux's default transmit queue length (ip-link(8) txqueuelen), used as the default queue limit.
DEFAULT_QUEUE_PACKETS = 1000


@dataclass(frozen=True)
class DCSpec:
    """One datacenter: ``hosts`` emulated GPUs behind one switch.

    ``intra_rate_bps`` (None: unshaped) and ``intra_delay_us`` (one way) apply to each host's
    access link, in both directions.
    """

    name: str
    hosts: int
    intra_rate_bps: int | None = None
    intra_delay_us: int = 0
    #: the last ``decode_hosts`` hosts serve BubbleTea's decode steps and never train
    decode_hosts: int = 0

    @property
    def training_hosts(self) -> int:
        return self.hosts - self.decode_hosts


@dataclass(frozen=True)
class LinkSpec:
    """A WAN link between DCs ``a`` and ``b``; every figure applies to each direction.

    ``delay_us`` is one way; ``jitter_us`` is the half-width of a uniform spread around it;
    ``loss_pct`` is the per-packet drop probability in percent; ``queue_packets`` is the
    bottleneck queue (HTB leaf) length in packets. ``profile``: how the rate, delay, jitter and
    loss change while the link is up (None: they do not); the figures above are the link's own,
    which a profile's steps start from. ``route_us``: the one-way delay routes were chosen by,
    where it is not ``delay_us`` (the topology as built, planned for while a profile has changed
    the link's delay: the routes stay where they were built). ``failover``: when the link goes
    down, the routers move its routes to the other path ``failover_after_us`` later (a BFD-driven
    routing protocol's detection time), and back as long after it returns.
    """

    a: str
    b: str
    rate_bps: int
    delay_us: int
    jitter_us: int = 0
    loss_pct: float = 0.0
    queue_packets: int = DEFAULT_QUEUE_PACKETS
    profile: LinkProfile | None = None
    route_us: int | None = None
    failover: bool = False
    failover_after_us: int = 300_000

    @property
    def route_metric_us(self) -> int:
        """What routing weighs the link by: ``route_us`` where set, else its one-way delay."""
        return self.delay_us if self.route_us is None else self.route_us

    @property
    def name(self) -> str:
        return f"{self.a}-{self.b}"

    @property
    def state(self) -> LinkState:
        """The link's own figures (before any profile step)."""
        return LinkState(self.rate_bps, self.delay_us, self.jitter_us, self.loss_pct)

    def to_dict(self) -> dict[str, Any]:
        out = vars(self).copy()
        out["profile"] = self.profile.to_dict() if self.profile else None
        return out

    @staticmethod
    def from_dict(d: dict[str, Any]) -> LinkSpec:
        profile = d.get("profile")
        return LinkSpec(**{**d, "profile": LinkProfile.from_dict(profile) if profile else None})

    def other(self, dc: str) -> str:
        return self.b if dc == self.a else self.a


@dataclass(frozen=True)
class TopologySpec:
    """A validated topology. ``source`` is the file it came from (for messages and records)."""

    name: str
    dcs: tuple[DCSpec, ...]
    links: tuple[LinkSpec, ...]
    source: str = "<memory>"
    dc_pool: ipaddress.IPv4Network = ipaddress.IPv4Network("10.100.0.0/16")
    dc_prefix_len: int = 24
    wan_pool: ipaddress.IPv4Network = ipaddress.IPv4Network("10.101.0.0/16")
    description: str = ""
    #: the hosts' TCP congestion control (net.ipv4.tcp_congestion_control in every namespace);
    #: None: the machine's default, which new namespaces inherit (cubic on most Linux machines,
    #: bbr on some), recorded in every run's topology.json
    tcp_congestion: str | None = None
    _by_name: dict[str, DCSpec] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._by_name.update({dc.name: dc for dc in self.dcs})

    def dc(self, name: str) -> DCSpec:
        return self._by_name[name]

    def link_between(self, a: str, b: str) -> LinkSpec | None:
        for link in self.links:
            if {link.a, link.b} == {a, b}:
                return link
        return None

    @property
    def host_count(self) -> int:
        return sum(dc.hosts for dc in self.dcs)

    def to_dict(self) -> dict[str, Any]:
        """The resolved topology as plain data (units in field names), for config records."""
        return {
            "name": self.name,
            "source": self.source,
            "dcs": [vars(dc).copy() for dc in self.dcs],
            "links": [link.to_dict() for link in self.links],
            "addressing": {
                "dc_pool": str(self.dc_pool),
                "dc_prefix_len": self.dc_prefix_len,
                "wan_pool": str(self.wan_pool),
            },
            "tcp_congestion": self.tcp_congestion,
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> TopologySpec:
        """``to_dict``'s record back (a run folder's ``config.json``). Raises KeyError or TypeError
        for data of another form."""
        a = d["addressing"]
        return TopologySpec(
            d["name"],
            tuple(DCSpec(**x) for x in d["dcs"]),
            tuple(LinkSpec.from_dict(x) for x in d["links"]),
            source=d.get("source", "<memory>"),
            dc_pool=ipaddress.IPv4Network(a["dc_pool"]),
            dc_prefix_len=a["dc_prefix_len"],
            wan_pool=ipaddress.IPv4Network(a["wan_pool"]),
            tcp_congestion=d.get("tcp_congestion"),
        )

    def to_file_dict(self) -> dict[str, Any]:
        """The topology in the file format (``topology_file.parse_topology(spec.to_file_dict(), spec.source)``
        gives it back), e.g. to ship it to another machine."""

        def dc(d: DCSpec) -> dict:
            out: dict[str, Any] = {"name": d.name, "hosts": d.hosts}
            if d.intra_rate_bps:
                out["intra_rate"] = f"{d.intra_rate_bps}bit"
            if d.intra_delay_us:
                out["intra_delay"] = f"{d.intra_delay_us}us"
            if d.decode_hosts:
                out["decode_hosts"] = d.decode_hosts
            return out

        return {
            "name": self.name,
            "description": self.description,
            "dcs": [dc(d) for d in self.dcs],
            "links": [
                {
                    "between": [k.a, k.b],
                    "rate": f"{k.rate_bps}bit",
                    "delay": f"{k.delay_us}us",
                    "jitter": f"{k.jitter_us}us",
                    "loss": f"{k.loss_pct!r}%",
                    "queue": k.queue_packets,
                    **({"profile": k.profile.to_dict()} if k.profile else {}),
                    **({"failover": True, "failover_after": f"{k.failover_after_us}us"} if k.failover else {}),
                }
                for k in self.links
            ],
            "addressing": {
                "dc_pool": str(self.dc_pool),
                "dc_prefix_len": self.dc_prefix_len,
                "wan_pool": str(self.wan_pool),
            },
            **({"tcp_congestion": self.tcp_congestion} if self.tcp_congestion else {}),
        }
