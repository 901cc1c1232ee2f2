"""Traffic-shaping plans as data: HTB trees, netem leaves, NFQUEUE delay queues.

Nothing here touches the kernel: ``wan_shaper.py`` applies these plans (through ``netlink_tc.py``);
``shaping_text.py`` renders them as tc(8) command lines and as the fallback delay element's
iptables rules.

Model (per direction of every link, on the sending end's egress):
  root qdisc ``1:`` htb, default class ``1:10``
    class ``1:1``  rate = ceil = link rate          (the link)
      class ``1:10`` rate = ceil = link rate       (default: all traffic not matched by a filter)
      class ``1:N``  rate/ceil set live             (added later, e.g. one per DP pipeline)
  each leaf: pfifo (limit = queue) or, with netem, netem (delay, jitter, loss, limit).
Without netem, delay, jitter and loss move to the receiving namespace's ``raw PREROUTING`` chain:
an iptables ``statistic`` drop for loss, then NFQUEUE to a userspace delay element
(DESIGN.md section 3).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from testbed.spec.addressing import BRIDGE_IFNAME, HOST_IFNAME, AddressPlan, host_port_ifname
from testbed.spec.topology import LinkSpec, TopologySpec
from testbed.spec.wire import ETH_HLEN, MTU, bdp_packets

ROOT_HANDLE = 0x1_0000  # "1:"
LINK_CLASS_MINOR = 0x1  # "1:1"
DEFAULT_CLASS_MINOR = 0x10  # "1:10"
MECHANISMS = ("netem", "nfqueue")


def htb_burst_bytes(rate_bps: int) -> int:
    """HTB burst (and cburst) for a rate: about 1 ms of data, at least two full frames.

    Below ~1 ms of data HTB falls short of its rate at 1 Gbit/s and above (DESIGN.md section 3).
    """
    return max(rate_bps // 8 // 1000, 2 * (MTU + ETH_HLEN))


def htb_quantum_bytes(rate_bps: int) -> int:
    """DRR quantum: rate/r2q with tc's default r2q = 10, kept within [one frame, 200000 bytes]
    so the kernel's 'quantum is big' warning never fires (tc-htb(8))."""
    return min(max(rate_bps // 8 // 10, MTU + ETH_HLEN), 200_000)


@dataclass(frozen=True)
class Pfifo:
    limit_packets: int


@dataclass(frozen=True)
class Netem:
    """A netem leaf; netem's jitter reorders packets (tc-netem(8)). ``limit_packets`` covers the
    packets held for the delay as well as the queue."""

    delay_us: int
    jitter_us: int = 0
    loss_pct: float = 0.0
    limit_packets: int = 1000


@dataclass(frozen=True)
class HtbClass:
    minor: int
    parent_minor: int  # 0: directly under the root qdisc
    rate_bps: int
    ceil_bps: int
    leaf: Pfifo | Netem | None = None

    @property
    def classid(self) -> int:
        return ROOT_HANDLE | self.minor

    @property
    def burst_bytes(self) -> int:
        return htb_burst_bytes(self.rate_bps)

    @property
    def cburst_bytes(self) -> int:
        return htb_burst_bytes(self.ceil_bps)

    @property
    def quantum_bytes(self) -> int:
        return htb_quantum_bytes(self.rate_bps)


@dataclass(frozen=True)
class U32Filter:
    """Send IPv4 packets from ``src`` to ``dst`` (either may be None: any) to class ``1:flow_minor``."""

    prio: int
    flow_minor: int
    src: str | None = None  # dotted IPv4 address, matched exactly
    dst: str | None = None

    def keys(self) -> list[str]:
        """pyroute2 u32 keys, ``value/mask+offset`` (IPv4 source at offset 12, destination 16)."""
        out = []
        for ip, off in ((self.src, 12), (self.dst, 16)):
            if ip is not None:
                out.append(f"0x{_ip_hex(ip)}/0xffffffff+{off}")
        return out or ["0x0/0x0+0"]


def _ip_hex(ip: str) -> str:
    return "".join(f"{int(octet):02x}" for octet in ip.split("."))


@dataclass(frozen=True)
class EgressPlan:
    """What goes on one interface's egress: an HTB tree, or a bare netem root, or nothing."""

    netns: str
    ifname: str
    classes: tuple[HtbClass, ...] = ()
    filters: tuple[U32Filter, ...] = ()
    root_netem: Netem | None = None

    @property
    def empty(self) -> bool:
        return not self.classes and self.root_netem is None


@dataclass(frozen=True)
class DelayQueue:
    """One NFQUEUE queue of a userspace delay element, and the rule that feeds it.

    Matches packets entering ``in_ifname`` of ``netns`` (optionally only those whose source is in
    the inclusive address range ``src_range``); drops ``loss_pct`` of them, then holds the rest
    ``delay_us`` (+- jitter). A packet goes to the first queue (in plan order) that matches it.
    A ``live`` queue (a link with a profile) may change while the run is up: it always has an
    element, which takes changes on its control socket and drops the loss itself (an iptables
    rule's probability cannot change in place).
    """

    netns: str
    queue_num: int
    in_ifname: str
    delay_us: int
    jitter_us: int = 0
    loss_pct: float = 0.0
    maxlen: int = 1024
    src_range: tuple[str, str] | None = None
    live: bool = False

    @property
    def needs_element(self) -> bool:
        return self.live or self.delay_us > 0 or self.jitter_us > 0

    @property
    def element_drops(self) -> bool:
        """Whether the element drops this queue's loss (else an iptables rule does)."""
        return self.live

    def element_arg(self) -> str:
        arg = f"{self.queue_num}:{self.delay_us}:{self.jitter_us}:{self.maxlen}"
        return f"{arg}:{round(self.loss_pct * 10_000)}" if self.element_drops else arg


def delay_queue_maxlen(rate_bps: int | None, delay_us: int) -> int:
    """Queue length for a delay element: four times the packets in flight (ACKs and small
    packets outnumber full frames), at least the kernel's default of 1024."""
    rate = rate_bps if rate_bps is not None else 10 * 10**9
    return max(1024, 4 * bdp_packets(rate, delay_us) + 64)


@dataclass(frozen=True)
class ShapingPlan:
    """Every egress plan and delay queue of one realised topology."""

    mechanism: str
    egress: tuple[EgressPlan, ...]
    delay_queues: tuple[DelayQueue, ...] = field(default=())

    def egress_of(self, netns: str, ifname: str) -> EgressPlan:
        for e in self.egress:
            if (e.netns, e.ifname) == (netns, ifname):
                return e
        raise KeyError((netns, ifname))


def _shaped_egress(
    netns: str,
    ifname: str,
    rate_bps: int | None,
    delay_us: int,
    jitter_us: int,
    loss_pct: float,
    queue: int,
    mechanism: str,
    held_for: tuple[int, int] | None = None,
) -> EgressPlan:
    """``held_for``: (rate, delay + jitter) whose packets in flight a netem leaf must hold, where
    larger than the link's own (a profile's largest)."""
    netem = None
    live = held_for is not None and held_for != (rate_bps, delay_us + jitter_us)
    if mechanism == "netem" and (delay_us or jitter_us or loss_pct or live):
        rate, delay = held_for or (rate_bps if rate_bps else 10 * 10**9, delay_us + jitter_us)
        held = bdp_packets(rate, delay)
        netem = Netem(delay_us, jitter_us, loss_pct, queue + held)
    if rate_bps is None:
        return EgressPlan(netns, ifname, root_netem=netem)
    leaf = netem or Pfifo(queue)
    return EgressPlan(
        netns,
        ifname,
        classes=(
            HtbClass(LINK_CLASS_MINOR, 0, rate_bps, rate_bps),
            HtbClass(DEFAULT_CLASS_MINOR, LINK_CLASS_MINOR, rate_bps, rate_bps, leaf),
        ),
    )


def plan_shaping(spec: TopologySpec, plan: AddressPlan, mechanism: str) -> ShapingPlan:
    """The shaping of a whole topology under ``mechanism`` (``netem`` or ``nfqueue``)."""
    if mechanism not in MECHANISMS:
        raise ValueError(f"unknown delay mechanism {mechanism!r}")
    egress: list[EgressPlan] = []
    queues: list[DelayQueue] = []
    for (dc, _peer), end in plan.wan_ends.items():
        link = end.link
        router = plan.routers[dc]
        egress.append(
            _shaped_egress(
                router.netns,
                end.ifname,
                link.rate_bps,
                link.delay_us,
                link.jitter_us,
                link.loss_pct,
                link.queue_packets,
                mechanism,
                held_for=_largest(link),
            )
        )
    for dc in spec.dcs:
        router = plan.routers[dc.name]
        for h in plan.hosts_of(dc.name):
            for netns, ifname in ((h.netns, HOST_IFNAME), (router.netns, host_port_ifname(h.index))):
                e = _shaped_egress(netns, ifname, dc.intra_rate_bps, dc.intra_delay_us, 0, 0.0, 1000, mechanism)
                if not e.empty:
                    egress.append(e)
    if mechanism == "nfqueue":
        queues = _nfqueue_plan(spec, plan)
    return ShapingPlan(mechanism, tuple(egress), tuple(q for q in queues if q.needs_element or q.loss_pct))


def _largest(link: LinkSpec) -> tuple[int, int]:
    """The largest rate and delay + jitter the link takes (over its profile's steps, if any)."""
    states = [link.state] + ([s.state for s in link.profile.steps] if link.profile else [])
    return max(s.rate_bps for s in states), max(s.delay_us + s.jitter_us for s in states)


def _nfqueue_plan(spec: TopologySpec, plan: AddressPlan) -> list[DelayQueue]:
    """Delay at the receiving end of every link (the access-link model of topology.py)."""
    queues: list[DelayQueue] = []
    for dc in spec.dcs:
        router = plan.routers[dc.name]
        num = 0
        for (at, _peer), end in sorted(plan.wan_ends.items()):
            if at != dc.name:
                continue
            link = end.link
            queues.append(
                DelayQueue(
                    router.netns,
                    num,
                    end.ifname,
                    link.delay_us,
                    link.jitter_us,
                    link.loss_pct,
                    delay_queue_maxlen(*_largest(link)),
                    live=link.profile is not None and link.profile.varies_delay,
                )
            )
            num += 1
        d = dc.intra_delay_us
        if d:
            queues.append(
                DelayQueue(router.netns, num, BRIDGE_IFNAME, d, maxlen=delay_queue_maxlen(dc.intra_rate_bps, d))
            )
            hosts = plan.hosts_of(dc.name)
            same_dc = (str(hosts[0].ip), str(hosts[-1].ip))
            for h in hosts:
                # from a host of the same DC: two access links; via the router (other DCs): one
                queues.append(
                    DelayQueue(
                        h.netns,
                        0,
                        HOST_IFNAME,
                        2 * d,
                        src_range=same_dc,
                        maxlen=delay_queue_maxlen(dc.intra_rate_bps, 2 * d),
                    )
                )
                queues.append(DelayQueue(h.netns, 1, HOST_IFNAME, d, maxlen=delay_queue_maxlen(dc.intra_rate_bps, d)))
    return queues


def with_class(egress: EgressPlan, cls: HtbClass, filters: tuple[U32Filter, ...]) -> EgressPlan:
    """The plan with one more HTB class (leaf copied from the default class) and its filters."""
    default = next(c for c in egress.classes if c.minor == DEFAULT_CLASS_MINOR)
    cls = cls if cls.leaf is not None else replace(cls, leaf=default.leaf)
    return replace(egress, classes=egress.classes + (cls,), filters=egress.filters + filters)
