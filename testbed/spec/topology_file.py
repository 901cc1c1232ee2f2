"""Reading topology files into :class:`topology.TopologySpec`: every field checked at load time,
every error naming the file, the field (a dotted path), the value and the fix.

File format (YAML)::

    name: three_dc
    dcs:
      - {name: east, hosts: 4}                 # optional: intra_rate, intra_delay, decode_hosts
    links:
      - {between: [east, central], rate: 100mbit, delay: 10ms}  # optional: jitter, loss, queue
    # or, instead of links, a symmetric matrix (null = no link):
    # matrix: {dcs: [east, central], rate: [[null, 100mbit], [100mbit, null]],
    #          delay: [[null, 10ms], [10ms, null]]}
    addressing: {dc_pool: 10.100.0.0/16, dc_prefix_len: 24, wan_pool: 10.101.0.0/16}  # optional
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

from testbed.errors import SpecError, TestbedWarning
from testbed.spec.addressing import check_address_pools
from testbed.spec.queues import queue_shortfalls
from testbed.spec.specfile import FieldReader, read_spec_file
from testbed.spec.topology import IFNAME_MAX, WAN_IFNAME_PREFIX, DCSpec, LinkSpec, TopologySpec
from testbed.spec.topology_fields import ADDRESSING_FIELDS, DC_FIELDS, TOPOLOGY_FIELDS
from testbed.spec.topology_links import read_link, read_matrix

TOPOLOGY_DIR = Path(__file__).resolve().parents[2] / "topologies"
DEFAULT_TOPOLOGY = "three_dc"
_DC_NAME = re.compile(r"[a-z][a-z0-9-]*\Z")


def _read_dc(source: str, raw: Any, i: int) -> DCSpec:
    r = FieldReader(source, raw, f"dcs[{i}]", DC_FIELDS)
    name = raw["name"]
    if not isinstance(name, str) or not _DC_NAME.match(name):
        raise r.fail(
            "name",
            "is not a valid DC name",
            "use lowercase letters, digits and '-', starting with a letter, such as 'east'",
        )
    ifname = WAN_IFNAME_PREFIX + name
    if len(ifname) > IFNAME_MAX:
        raise r.fail(
            "name",
            f"makes the WAN interface name {ifname!r} ({len(ifname)} characters), over "
            f"Linux's {IFNAME_MAX}-character limit (IFNAMSIZ)",
            f"use a DC name of at most {IFNAME_MAX - len(WAN_IFNAME_PREFIX)} characters",
        )
    hosts, rate, delay, decode = (r.value(k) for k in ("hosts", "intra_rate", "intra_delay", "decode_hosts"))
    if decode >= hosts:
        raise r.fail(
            "decode_hosts",
            f"is not between 0 and hosts - 1 ({hosts - 1})",
            "keep at least one host for training, e.g. decode_hosts: 1 with hosts: 3",
        )
    return DCSpec(name=name, hosts=hosts, intra_rate_bps=rate, intra_delay_us=delay, decode_hosts=decode)


def _read_addressing(source: str, raw: Any) -> dict[str, Any]:
    r = FieldReader(source, raw or {}, "addressing", ADDRESSING_FIELDS)
    return r.values(ADDRESSING_FIELDS.keys)


def _folder(source: str) -> Path:
    """Where a topology's relative paths (link profiles) start: its file's folder."""
    path = Path(source)
    return path.parent if source != "<memory>" and path.exists() else Path(".")


def parse_topology(data: Any, source: str = "<memory>") -> TopologySpec:
    """Validate parsed YAML ``data`` into a TopologySpec. Raises SpecError naming field, value and fix."""
    top = FieldReader(source, data, "", TOPOLOGY_FIELDS)
    raw_dcs = data["dcs"]
    if not isinstance(raw_dcs, list) or not raw_dcs:
        raise top.fail("dcs", "is not a non-empty list", "list at least one DC: - {name: east, hosts: 2}")
    dcs: list[DCSpec] = []
    for i, raw in enumerate(raw_dcs):
        dc = _read_dc(source, raw, i)
        if any(d.name == dc.name for d in dcs):
            raise SpecError(source, f"dcs[{i}].name", dc.name, "is a duplicate DC name", "give every DC its own name")
        dcs.append(dc)
    names = [dc.name for dc in dcs]
    if "links" in data and "matrix" in data:
        raise top.fail("matrix", "is given together with 'links'", "describe the WAN with either links or matrix")
    raw_links = [] if data.get("links") is None else data["links"]
    if not isinstance(raw_links, list):
        raise top.fail("links", "is not a list", "list links as - {between: [a, b], rate: 100mbit, delay: 10ms}")
    read = (
        read_matrix(source, data["matrix"], names)
        if "matrix" in data
        else [read_link(source, raw, i, names, folder=_folder(source)) for i, raw in enumerate(raw_links)]
    )
    links: list[LinkSpec] = []
    seen: dict[frozenset[str], int] = {}
    for i, link in enumerate(read):
        pair = frozenset((link.a, link.b))
        if pair in seen:
            raise SpecError(
                source,
                f"links[{i}].between",
                [link.a, link.b],
                f"duplicates links[{seen[pair]}]",
                "keep one link per DC pair",
            )
        seen[pair] = i
        links.append(link)
    name = top.value("name") or (Path(source).stem if source != "<memory>" else "topology")
    spec = TopologySpec(
        name=str(name),
        dcs=tuple(dcs),
        links=tuple(links),
        source=source,
        description=top.value("description"),
        tcp_congestion=_read_congestion(top, data.get("tcp_congestion")),
        **_read_addressing(source, data.get("addressing")),
    )
    _check_connected(spec)
    _check_failover(spec)
    check_address_pools(spec)
    return spec


#: what a congestion control's name looks like (Linux's tcp_<name>.ko); whether the kernel has it
#: and lets namespaces choose it is checked when a network is built (``net/features.py``)
CONGESTION_NAME = re.compile(r"[a-z][a-z0-9_]{0,15}")


def _read_congestion(top: FieldReader, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not CONGESTION_NAME.fullmatch(value):
        raise top.fail(
            "tcp_congestion",
            "is not the name of a TCP congestion control",
            "name one the kernel has (cat /proc/sys/net/ipv4/tcp_available_congestion_control), e.g. cubic",
        )
    return value


def _reachable(links: list[LinkSpec], start: str) -> set[str]:
    """The DCs ``links`` join to ``start`` (itself included)."""
    seen, todo = {start}, [start]
    while todo:
        here = todo.pop()
        for link in links:
            if here in (link.a, link.b) and link.other(here) not in seen:
                seen.add(link.other(here))
                todo.append(link.other(here))
    return seen


def _check_connected(spec: TopologySpec) -> None:
    seen = _reachable(list(spec.links), spec.dcs[0].name)
    for i, dc in enumerate(spec.dcs):
        if dc.name not in seen:
            raise SpecError(
                spec.source,
                f"dcs[{i}].name",
                dc.name,
                f"is not reachable from {spec.dcs[0].name!r}",
                "add a link that joins it to the other DCs",
            )


def _check_failover(spec: TopologySpec) -> None:
    """A link marked ``failover`` must leave its DCs connected when it is down."""
    for i, link in enumerate(spec.links):
        if link.failover and link.b not in _reachable([x for x in spec.links if x is not link], link.a):
            raise SpecError(
                spec.source,
                f"links[{i}].failover",
                True,
                f"has no other path: without this link {link.a} and {link.b} are not connected",
                "mark failover only on a link whose DCs another path joins (three_dc's triangle)",
            )


def load_topology(name_or_path: str | Path | None = None) -> TopologySpec:
    """Load and validate a topology file (or a shipped topology by name; default ``three_dc``).

    Needs no root. Raises SpecError for a missing file, bad YAML or any invalid field; warns
    (TestbedWarning) of a WAN queue below the bandwidth-delay product of a path through it.
    """
    path, data = read_spec_file(name_or_path or DEFAULT_TOPOLOGY, TOPOLOGY_DIR, "topology")
    spec = parse_topology(data, str(path))
    for shortfall in queue_shortfalls(spec):
        warnings.warn(shortfall.message(spec.source), TestbedWarning, stacklevel=2)
    return spec
