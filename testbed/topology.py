"""Topology description: datacenters (DCs), their hosts and the WAN links between them.

Pure data, loaded and validated without root (STYLE.md: describe the network, then build it).
A host is one emulated GPU. A WAN link joins two DCs; its ``rate`` shapes each direction and its
``delay`` is one way (a path's RTT is twice the sum of its one-way delays, DESIGN.md section 2).
Each DC may give its hosts' access links (host to DC switch) a rate and a one-way delay: a packet
between two hosts of one DC crosses two access links, a packet between DCs crosses the access link
at each end.

File format (YAML)::

    name: three_dc
    dcs:
      - {name: east, hosts: 4}                 # optional: intra_rate, intra_delay
    links:
      - {between: [east, central], rate: 100mbit, delay: 10ms}  # optional: jitter, loss, queue
    # or, instead of links, a symmetric matrix (null = no link):
    # matrix: {dcs: [east, central], rate: [[null, 100mbit], [100mbit, null]],
    #          delay: [[null, 10ms], [10ms, null]]}
    addressing: {dc_pool: 10.100.0.0/16, dc_prefix_len: 24, wan_pool: 10.101.0.0/16}  # optional
"""
from __future__ import annotations

import difflib
import ipaddress
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import SpecError
from .specfile import REQUIRED, FieldReader, read_spec_file, split_unit_error
from .units import UnitError, parse_duration_us, parse_percent, parse_rate_bps

#: Linux IFNAMSIZ minus the terminating NUL (include/uapi/linux/if.h).
IFNAME_MAX = 15
#: WAN interfaces inside a router namespace are named after the peer DC: ``w-<dc>``.
WAN_IFNAME_PREFIX = "w-"
MAX_DELAY_US = 10_000_000
#: Linux's default transmit queue length (ip-link(8) txqueuelen), used as the default queue limit.
DEFAULT_QUEUE_PACKETS = 1000
TOPOLOGY_DIR = Path(__file__).resolve().parent.parent / "topologies"
DEFAULT_TOPOLOGY = "three_dc"
_DC_NAME = re.compile(r"[a-z][a-z0-9-]*\Z")


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
    bottleneck queue (HTB leaf) length in packets.
    """

    a: str
    b: str
    rate_bps: int
    delay_us: int
    jitter_us: int = 0
    loss_pct: float = 0.0
    queue_packets: int = DEFAULT_QUEUE_PACKETS

    @property
    def name(self) -> str:
        return f"{self.a}-{self.b}"

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
            "links": [vars(link).copy() for link in self.links],
            "addressing": {"dc_pool": str(self.dc_pool), "dc_prefix_len": self.dc_prefix_len,
                           "wan_pool": str(self.wan_pool)},
        }

    def to_file_dict(self) -> dict[str, Any]:
        """The topology in the file format (``parse_topology(spec.to_file_dict(), spec.source)``
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
        return {"name": self.name, "description": self.description, "dcs": [dc(d) for d in self.dcs],
                "links": [{"between": [k.a, k.b], "rate": f"{k.rate_bps}bit", "delay": f"{k.delay_us}us",
                           "jitter": f"{k.jitter_us}us", "loss": f"{k.loss_pct!r}%", "queue": k.queue_packets}
                          for k in self.links],
                "addressing": {"dc_pool": str(self.dc_pool), "dc_prefix_len": self.dc_prefix_len,
                               "wan_pool": str(self.wan_pool)}}


def _positive_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise UnitError("is not a whole number; write a count such as 4")
    return value


def _check_delay(r: FieldReader, key: str, us: int) -> None:
    if us > MAX_DELAY_US:
        raise r.fail(key, "is above the 10 s limit for a one-way delay", "write a delay between 0ms and 10s")


def _read_dc(source: str, raw: Any, i: int) -> DCSpec:
    r = FieldReader(source, raw, f"dcs[{i}]", ("name", "hosts", "intra_rate", "intra_delay", "decode_hosts"),
                    ("name", "hosts"))
    name = raw["name"]
    if not isinstance(name, str) or not _DC_NAME.match(name):
        raise r.fail("name", "is not a valid DC name",
                     "use lowercase letters, digits and '-', starting with a letter, such as 'east'")
    ifname = WAN_IFNAME_PREFIX + name
    if len(ifname) > IFNAME_MAX:
        raise r.fail("name", f"makes the WAN interface name {ifname!r} ({len(ifname)} characters), over "
                     f"Linux's {IFNAME_MAX}-character limit (IFNAMSIZ)",
                     f"use a DC name of at most {IFNAME_MAX - len(WAN_IFNAME_PREFIX)} characters")
    hosts = r.get("hosts", _positive_int, REQUIRED)
    if hosts < 1:
        raise r.fail("hosts", "is not a positive number of hosts", "give each DC at least 1 host")
    rate = r.get("intra_rate", parse_rate_bps)
    if rate is not None and rate <= 0:
        raise r.fail("intra_rate", "is not a positive rate", "write a rate above 0, such as 10gbit, or omit it")
    delay = r.get("intra_delay", parse_duration_us, 0)
    _check_delay(r, "intra_delay", delay)
    decode = r.get("decode_hosts", _positive_int, 0)
    if not 0 <= decode < hosts:
        raise r.fail("decode_hosts", f"is not between 0 and hosts - 1 ({hosts - 1})",
                     "keep at least one host for training, e.g. decode_hosts: 1 with hosts: 3")
    return DCSpec(name=name, hosts=hosts, intra_rate_bps=rate, intra_delay_us=delay, decode_hosts=decode)


def _read_link(source: str, raw: Any, i: int, dc_names: list[str], fields: dict[str, str] | None = None) -> LinkSpec:
    r = FieldReader(source, raw, f"links[{i}]", ("between", "rate", "delay", "jitter", "loss", "queue"),
                ("between", "rate", "delay"), fields)
    between = raw["between"]
    if not (isinstance(between, list) and len(between) == 2 and all(isinstance(x, str) for x in between)):
        raise r.fail("between", "is not a pair of DC names", "write it as [dc1, dc2]")
    for name in between:
        if name not in dc_names:
            close = difflib.get_close_matches(name, dc_names, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise r.fail("between", f"names unknown DC {name!r}", f"{hint}known DCs are {', '.join(dc_names)}")
    if between[0] == between[1]:
        raise r.fail("between", "joins a DC to itself", "name two different DCs")
    rate = r.get("rate", parse_rate_bps, REQUIRED)
    if rate <= 0:
        raise r.fail("rate", "is not a positive rate", "write a rate above 0, such as 100mbit")
    delay = r.get("delay", parse_duration_us, REQUIRED)
    _check_delay(r, "delay", delay)
    jitter = r.get("jitter", parse_duration_us, 0)
    if jitter > delay:
        raise r.fail("jitter", f"is larger than the delay ({delay} us), which would need negative delays",
                     "use a jitter no larger than the delay")
    loss = r.get("loss", parse_percent, 0.0)
    if not 0 <= loss < 100:
        raise r.fail("loss", "is outside 0-100%", "write a loss probability from 0% up to (not including) 100%")
    queue = r.get("queue", _positive_int, DEFAULT_QUEUE_PACKETS)
    if queue < 1:
        raise r.fail("queue", "is not a positive queue limit", "write a number of packets, such as 1000")
    return LinkSpec(a=between[0], b=between[1], rate_bps=rate, delay_us=delay, jitter_us=jitter,
                    loss_pct=loss, queue_packets=queue)


def _read_matrix(source: str, raw: Any, dc_names: list[str]) -> list[LinkSpec]:
    """Turn a symmetric rate/delay matrix into links; errors name the matrix cell."""
    r = FieldReader(source, raw, "matrix", ("dcs", "rate", "delay"), ("dcs", "rate", "delay"))
    order = raw["dcs"]
    if not isinstance(order, list) or sorted(map(str, order)) != sorted(dc_names):
        raise r.fail("dcs", "does not list exactly the DCs of 'dcs'", f"list {', '.join(dc_names)} in any order")
    n = len(order)
    parsers = {"rate": parse_rate_bps, "delay": parse_duration_us}
    values: dict[str, list[list[Any]]] = {}
    for key, parse in parsers.items():
        m = raw[key]
        if not (isinstance(m, list) and len(m) == n and all(isinstance(row, list) and len(row) == n for row in m)):
            raise r.fail(key, f"is not a {n}x{n} matrix", f"write {n} rows of {n} entries (null for no link)")
        values[key] = [[None] * n for _ in range(n)]
        for i in range(n):
            for j in range(n):
                cell = m[i][j]
                if cell is None:
                    continue
                if i == j:
                    raise SpecError(source, f"matrix.{key}[{i}][{i}]", cell, "links a DC to itself",
                                    "write null on the diagonal")
                try:
                    values[key][i][j] = parse(cell)
                except UnitError as e:
                    raise SpecError(source, f"matrix.{key}[{i}][{j}]", cell, *split_unit_error(e)) from None
    links = []
    for i in range(n):
        for j in range(i + 1, n):
            for key in parsers:
                if values[key][i][j] != values[key][j][i]:
                    raise SpecError(source, f"matrix.{key}[{i}][{j}]", raw[key][i][j],
                                    f"differs from matrix.{key}[{j}][{i}] = {raw[key][j][i]!r}",
                                    "links are symmetric: make the matrix symmetric")
            rate, delay = raw["rate"][i][j], raw["delay"][i][j]
            if (rate is None) != (delay is None):
                raise SpecError(source, f"matrix.rate[{i}][{j}]", rate, f"goes with delay {delay!r}: a link "
                                "needs both", "give both a rate and a delay, or null for both (no link)")
            if rate is not None:
                fields = {"rate": f"matrix.rate[{i}][{j}]", "delay": f"matrix.delay[{i}][{j}]",
                          "between": "matrix.dcs"}
                links.append(_read_link(source, {"between": [order[i], order[j]], "rate": rate, "delay": delay},
                                        len(links), dc_names, fields))
    return links


def _read_addressing(source: str, raw: Any) -> dict[str, Any]:
    r = FieldReader(source, raw or {}, "addressing", ("dc_pool", "dc_prefix_len", "wan_pool"))
    out: dict[str, Any] = {}
    for key in ("dc_pool", "wan_pool"):
        if key in r.data:
            try:
                net = ipaddress.IPv4Network(str(r.data[key]))
            except ValueError:
                raise r.fail(key, "is not an IPv4 network", "write it as address/prefix, such as 10.100.0.0/16") from None
            out[key] = net
    if "dc_prefix_len" in r.data:
        plen = r.data["dc_prefix_len"]
        if isinstance(plen, bool) or not isinstance(plen, int) or not 16 <= plen <= 29:
            raise r.fail("dc_prefix_len", "is not a prefix length from 16 to 29", "write a number such as 24")
        out["dc_prefix_len"] = plen
    return out


def parse_topology(data: Any, source: str = "<memory>") -> TopologySpec:
    """Validate parsed YAML ``data`` into a TopologySpec. Raises SpecError naming field, value and fix."""
    top = FieldReader(source, data, "", ("name", "description", "dcs", "links", "matrix", "addressing"), ("dcs",))
    raw_dcs = data["dcs"]
    if not isinstance(raw_dcs, list) or not raw_dcs:
        raise top.fail("dcs", "is not a non-empty list", "list at least one DC: - {name: east, hosts: 2}")
    dcs = []
    for i, raw in enumerate(raw_dcs):
        dc = _read_dc(source, raw, i)
        if any(d.name == dc.name for d in dcs):
            raise SpecError(source, f"dcs[{i}].name", dc.name, "is a duplicate DC name", "give every DC its own name")
        dcs.append(dc)
    names = [dc.name for dc in dcs]
    if "links" in data and "matrix" in data:
        raise top.fail("matrix", "is given together with 'links'", "describe the WAN with either links or matrix")
    raw_links = data.get("links") or []
    if not isinstance(raw_links, list):
        raise top.fail("links", "is not a list", "list links as - {between: [a, b], rate: 100mbit, delay: 10ms}")
    read = _read_matrix(source, data["matrix"], names) if "matrix" in data else [
        _read_link(source, raw, i, names) for i, raw in enumerate(raw_links)]
    links: list[LinkSpec] = []
    seen: dict[frozenset[str], int] = {}
    for i, link in enumerate(read):
        pair = frozenset((link.a, link.b))
        if pair in seen:
            raise SpecError(source, f"links[{i}].between", [link.a, link.b],
                            f"duplicates links[{seen[pair]}]", "keep one link per DC pair")
        seen[pair] = i
        links.append(link)
    name = data.get("name") or (Path(source).stem if source != "<memory>" else "topology")
    spec = TopologySpec(name=str(name), dcs=tuple(dcs), links=tuple(links), source=source,
                        description=str(data.get("description") or ""),
                        **_read_addressing(source, data.get("addressing")))
    _check_connected(spec)
    from .addressing import check_capacity  # the address plan's own limits, named per field

    check_capacity(spec)
    return spec


def _check_connected(spec: TopologySpec) -> None:
    seen, todo = {spec.dcs[0].name}, [spec.dcs[0].name]
    while todo:
        here = todo.pop()
        for link in spec.links:
            if here in (link.a, link.b) and link.other(here) not in seen:
                seen.add(link.other(here))
                todo.append(link.other(here))
    for i, dc in enumerate(spec.dcs):
        if dc.name not in seen:
            raise SpecError(spec.source, f"dcs[{i}].name", dc.name, f"is not reachable from {spec.dcs[0].name!r}",
                            "add a link that joins it to the other DCs")


def load_topology(name_or_path: str | Path | None = None) -> TopologySpec:
    """Load and validate a topology file (or a shipped topology by name; default ``three_dc``).

    Needs no root. Raises SpecError for a missing file, bad YAML or any invalid field.
    """
    path, data = read_spec_file(name_or_path or DEFAULT_TOPOLOGY, TOPOLOGY_DIR, "topology")
    return parse_topology(data, str(path))
