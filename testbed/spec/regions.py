"""A topology of real cloud regions (``testbed topo regions``): one DC per region, a full mesh of WAN
links whose delay and rate come from the regions table (``regions_table.py``: Skyplane's 2022
measurements), the rates scaled down by a factor the user gives.

- **Delay** (one way) = half the pair's RTT (ping's minimum, :attr:`RegionPair.rtt_ms`), not scaled.
- **Rate** = the pair's measured throughput (iperf3 goodput with 64 connections,
  :attr:`RegionPair.throughput_bps`) x ``scale``, to 3 significant digits. The clouds carried 0.1 to
  16 Gbit/s between regions (4.0 at the median); this emulator cannot run links at tens of Gbit/s,
  so every rate is scaled by the same factor: the ratios between links survive, the
  bandwidth-delay products shrink by the factor (DESIGN.md section 2a). A scaled rate above
  ``MAX_RATE_BPS`` or below ``MIN_RATE_BPS`` is refused with the scale that fits.
- **Queue**: at least one bandwidth-delay product of the longest path each link is the bottleneck of
  (``queues.py``), so that the topology loads without a queue warning.
- **DC names** are short forms of the regions (:func:`dc_name`), as a DC's name becomes an interface
  name of at most 15 characters.

Pure: builds the topology file's data and text; ``topology_file.parse_topology`` reads it back.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import textwrap
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import yaml

from testbed.spec.queues import queue_shortfalls
from testbed.spec.regions_table import RegionError, RegionsTable, UnmeasuredPairError, load_regions_table
from testbed.spec.routing import RoutingTable
from testbed.spec.topology import DEFAULT_QUEUE_PACKETS, DCSpec, LinkSpec, TopologySpec
from testbed.spec.units import format_duration_us, format_rate

#: the highest rate a link of a topology from regions may have (bit/s): what the emulator was
#: measured to carry accurately on one link (HTB within 5% up to 1 Gbit/s, DESIGN.md section 3; the
#: delay elements carry about 1 Gbit/s on the development machines, docs/backends.md; Mininet's
#: TCLink stops at 1 Gbit/s). Building a topology checks each rate against the machine's own
#: measured figure as well (``net/capacity.py``, ``testbed doctor``).
MAX_RATE_BPS = 1_000_000_000
#: the lowest (bit/s): below it one full frame takes over 0.12 s to send, longer than most WAN
#: delays being emulated, so the link's serialisation rather than its delay would set the RTT
MIN_RATE_BPS = 100_000
#: the default factor from measured to emulated rates: the table's 0.12-16 Gbit/s become 1.2-160 Mbit/s
DEFAULT_SCALE = 0.01
DEFAULT_HOSTS = 2
#: the source of every figure, for headers, descriptions and docs
SOURCE = (
    "Skyplane's inter-region measurements (skyplane-project/skyplane, profiles/latency.csv and "
    'throughput.csv as of 2022-11-01; Jain et al., "Skyplane: Optimizing Transfer Cost and Throughput '
    'Using Cloud-Aware Overlays", NSDI 2023; Apache-2.0; the copy, its licence and how it was derived: '
    "testbed/data/regions/)"
)

#: how :func:`dc_name` shortens the words of a region's name
DIRECTIONS = {"north": "n", "south": "s", "east": "e", "west": "w", "central": "c"}
PLACES = {
    "africa": "af",
    "america": "a",
    "asia": "as",
    "australia": "au",
    "brazil": "br",
    "canada": "ca",
    "europe": "eu",
    "france": "fr",
    "germany": "de",
    "india": "in",
    "japan": "jp",
    "korea": "kr",
    "norway": "no",
    "sweden": "se",
    "switzerland": "ch",
    "uae": "ae",
}
#: a DC name at most this long (``w-<dc>`` within Linux's 15-character interface names)
DC_NAME_MAX = 13
_CLOUD_PREFIX = {"aws": "aws", "azure": "az", "gcp": "gcp"}


def dc_name(region: str) -> str:
    """A region's short name, as AWS's and Azure's own short forms go: the cloud and a GCP zone's
    letter dropped, each direction (north, south, east, west, central) shortened to its initial
    letter, each place to two letters (``PLACES``; others kept whole), digits kept:
    ``aws:us-east-1`` -> ``use1``, ``aws:ap-northeast-2`` -> ``apne2``, ``gcp:europe-west4-a`` ->
    ``euw4``, ``azure:eastasia`` -> ``eas``, ``azure:germanywestcentral`` -> ``dewc``. Unique within
    a cloud; :func:`dc_names` tells the clouds apart where two regions share a name."""
    cloud, _, place = region.partition(":")
    if cloud == "gcp":
        place = re.sub(r"-[a-z]$", "", place)
    words = []
    for token in re.findall(r"[a-z]+|[0-9]+", place.lower()):
        for piece in re.split(r"(north|south|east|west|central)", token):
            if piece:
                words.append(DIRECTIONS.get(piece) or PLACES.get(piece, piece))
    name = "".join(words) or "dc"
    return (name if name[0].isalpha() else "r" + name)[:DC_NAME_MAX]


def dc_names(regions: Sequence[str]) -> dict[str, str]:
    """Each region's DC name (:func:`dc_name`); where two of ``regions`` share one
    (``aws:us-east-1`` and ``gcp:us-east1-b`` are both ``use1``), each of those is prefixed with
    its cloud (``aws-use1``, ``gcp-use1``; Azure ``az-``)."""
    short = {r: dc_name(r) for r in regions}
    shared = {n for n, count in Counter(short.values()).items() if count > 1}
    names = {}
    for region, name in short.items():
        if name in shared:
            cloud = region.partition(":")[0]
            name = f"{_CLOUD_PREFIX.get(cloud, cloud[:3])}-{name}"[:DC_NAME_MAX]
        names[region] = name
    if len(set(names.values())) < len(names):  # only for names the table does not hold
        raise RegionError(f"regions {list(regions)} give DC names {list(names.values())} that are not unique")
    return names


@dataclass(frozen=True)
class RegionLink:
    """The WAN link between the DCs of regions ``region_a`` and ``region_b``: ``rtt_ms`` and
    ``measured_bps``, the table's figures (None: no throughput measured, ``rate_bps`` given by the
    user); ``rate_bps``, ``delay_us`` and ``queue_packets``, what the emulated link runs."""

    region_a: str
    region_b: str
    dc_a: str
    dc_b: str
    rtt_ms: float
    measured_bps: float | None
    rate_bps: int
    delay_us: int
    queue_packets: int = DEFAULT_QUEUE_PACKETS


@dataclass(frozen=True)
class RegionsTopology:
    """A topology of real regions: the file's data (:meth:`to_file_dict`) and text (:meth:`to_yaml`)."""

    name: str
    regions: tuple[str, ...]
    dcs: dict[str, str]  # region -> DC name
    hosts: int
    scale: float
    links: tuple[RegionLink, ...]
    unmeasured_rate_bps: int | None = None

    @property
    def command(self) -> str:
        """The command line that writes this topology."""
        words = ["testbed topo regions", *self.regions, f"--scale {self.scale:g}"]
        if self.hosts != DEFAULT_HOSTS:
            words.append(f"--hosts {self.hosts}")
        if self.unmeasured_rate_bps is not None:
            words.append(f"--unmeasured-rate {format_rate(self.unmeasured_rate_bps)}")
        return " ".join([*words, f"--name {shlex.quote(self.name)}"])

    @property
    def description(self) -> str:
        """One paragraph: the regions, the measured figures of every link, the scale."""
        regions = ", ".join(f"{r} ({self.dcs[r]})" for r in self.regions)
        figures = "; ".join(
            f"{k.dc_a}:{k.dc_b} {k.rtt_ms:.1f} ms, "
            + (f"{_gbit(k.measured_bps)} Gbit/s" if k.measured_bps is not None else "not measured")
            for k in self.links
        )
        return (
            f"Cloud regions {regions}, measured by Skyplane in 2022 (RTT, goodput): {figures}. "
            f"Delays are half the RTT; rates are the goodput x {self.scale:g}"
            + (
                f" ({format_rate(self.unmeasured_rate_bps)} where none was measured)"
                if self.unmeasured_rate_bps is not None
                else ""
            )
            + ", as the emulator cannot run links at tens of Gbit/s."
        )

    def to_file_dict(self) -> dict[str, Any]:
        """The topology file's data (``topology_file.parse_topology`` reads it)."""

        def link(k: RegionLink) -> dict[str, Any]:
            out: dict[str, Any] = {
                "between": [k.dc_a, k.dc_b],
                "rate": format_rate(k.rate_bps),
                "delay": format_duration_us(k.delay_us),
            }
            if k.queue_packets != DEFAULT_QUEUE_PACKETS:
                out["queue"] = k.queue_packets
            return out

        return {
            "name": self.name,
            "description": self.description,
            "dcs": [{"name": self.dcs[r], "hosts": self.hosts} for r in self.regions],
            "links": [link(k) for k in self.links],
        }

    def header(self) -> list[str]:
        """The file's opening comment: how it was written, where its figures come from, each link's
        figures, and any pair routed around its direct link."""
        text = (
            f"WAN links from {SOURCE}, written by testbed/spec/regions.py. Each link's delay is half the RTT "
            "(ping's minimum, the larger of the two directions), its rate the iperf3 goodput (64 connections, "
            f"PREMIUM tier, the smaller of the two directions) x {self.scale:g}: this emulator cannot run links "
            "at tens of Gbit/s."
        )
        out = [f"# Written by: {self.command}", *(f"# {line}" for line in _wrap(text))]
        width = max(len(f"{k.dc_a}:{k.dc_b}") for k in self.links)
        pairs = max(len(f"{k.region_a} - {k.region_b}") for k in self.links)
        out.append(f"#   {'link':<{width}}  {'regions':<{pairs}}  {'RTT':>9}  {'measured':>12}  rate")
        for k in self.links:
            measured = f"{_gbit(k.measured_bps)} Gbit/s" if k.measured_bps is not None else "none"
            out.append(
                f"#   {f'{k.dc_a}:{k.dc_b}':<{width}}  {f'{k.region_a} - {k.region_b}':<{pairs}}  "
                f"{k.rtt_ms:6.1f} ms  {measured:>12}  {format_rate(k.rate_bps)}"
            )
        out += [f"# {line}" for line in self.detours()]
        return out

    def detours(self) -> list[str]:
        """A line for each pair of DCs whose least-delay route is not its direct link (measured RTTs
        need not obey the triangle inequality)."""
        routes = RoutingTable(self.spec())
        lines = []
        for k in self.links:
            path = routes.route(k.dc_a, k.dc_b).dcs
            if len(path) > 2:
                lines.append(
                    f"{k.dc_a} -> {k.dc_b} is routed through {' -> '.join(path[1:-1])} (less total delay "
                    "than the direct link)"
                )
        return lines

    def spec(self) -> TopologySpec:
        """The topology as a TopologySpec (as ``parse_topology(self.to_file_dict())`` gives it)."""
        return TopologySpec(
            self.name,
            tuple(DCSpec(self.dcs[r], self.hosts) for r in self.regions),
            tuple(LinkSpec(k.dc_a, k.dc_b, k.rate_bps, k.delay_us, queue_packets=k.queue_packets) for k in self.links),
            description=self.description,
        )

    def to_yaml(self) -> str:
        """The topology file's text: the header, then the fields in the shipped files' layout."""
        data = self.to_file_dict()
        lines = [*self.header(), f"name: {_scalar(data['name'])}", "description: >-"]
        lines += [f"  {line}" for line in _wrap(data["description"])]
        lines.append("dcs:")
        lines += [f"  - {{name: {d['name']}, hosts: {d['hosts']}}}" for d in data["dcs"]]
        lines.append("links:")
        for k in data["links"]:
            fields = [f"between: [{', '.join(k['between'])}]", f"rate: {k['rate']}", f"delay: {k['delay']}"]
            fields += [f"queue: {k['queue']}"] if "queue" in k else []
            lines.append(f"  - {{{', '.join(fields)}}}")
        return "\n".join(lines) + "\n"


def _wrap(text: str) -> list[str]:
    """``text`` in lines of at most 98 characters, broken only at spaces (a folded YAML scalar joins
    them back with one space each)."""
    return textwrap.wrap(text, 98, break_long_words=False, break_on_hyphens=False)


def _scalar(text: str) -> str:
    """``text`` as a YAML scalar: plain where YAML reads it back unchanged, else double-quoted."""
    plain = re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]*", text) and yaml.safe_load(text) == text
    return text if plain else json.dumps(text)


def _gbit(bps: float) -> str:
    return f"{bps / 1e9:.3g}"


def _round_rate(bps: float) -> int:
    """A rate to 3 significant digits (a 2022 measurement of a few seconds is no more precise)."""
    return int(float(f"{bps:.3g}"))


def _scale_hint(limit_bps: float, measured_bps: float, down: bool) -> str:
    """A one-significant-digit scale that keeps ``measured_bps`` within ``limit_bps``."""
    exact = limit_bps / measured_bps
    power = 10 ** math.floor(math.log10(exact))
    step = math.floor(exact / power) if down else math.ceil(exact / power)
    return f"{step * power:.1g}"


def regions_topology(
    regions: Sequence[str],
    scale: float = DEFAULT_SCALE,
    hosts: int = DEFAULT_HOSTS,
    name: str | None = None,
    unmeasured_rate_bps: int | None = None,
    table: RegionsTable | None = None,
) -> RegionsTopology:
    """The topology of ``regions`` (at least two, in the order given): ``hosts`` per DC, a full mesh
    of links, each rate the measured throughput x ``scale`` (0 < scale <= 1). A pair with no
    throughput measured runs at ``unmeasured_rate_bps`` (already scaled), or is refused without it.

    Raises UnknownRegionError (the nearest names), UnmeasuredPairError (the pair and what to do),
    RegionError for a repeated region, a bad scale or host count, or a scaled rate outside
    ``MIN_RATE_BPS``..``MAX_RATE_BPS`` (with the scale that fits)."""
    table = table or load_regions_table()
    regions = tuple(table.check(r) for r in regions)
    if len(regions) < 2:
        raise RegionError(f"{len(regions)} region given: name at least two, such as aws:us-east-1 gcp:europe-west4-a")
    repeated = sorted(r for r, count in Counter(regions).items() if count > 1)
    if repeated:
        raise RegionError(f"region {repeated[0]!r} is given twice: name each region once")
    if not 0 < scale <= 1:
        raise RegionError(
            f"scale {scale:g} is outside (0, 1]: give the factor measured rates are multiplied by, e.g. 0.01"
        )
    if hosts < 1:
        raise RegionError(f"hosts {hosts} is below 1: give each DC at least one host")
    dcs = dc_names(regions)
    links = []
    for i, a in enumerate(regions):
        for b in regions[i + 1 :]:
            rtt = table.rtt_ms(a, b)
            measured = table.throughput_bps(a, b)
            if measured is not None:
                rate = _round_rate(measured * scale)
            elif unmeasured_rate_bps is not None:
                rate = unmeasured_rate_bps
            else:
                raise _unmeasured(table, a, b)
            links.append(RegionLink(a, b, dcs[a], dcs[b], rtt, measured, rate, round(rtt * 1000 / 2)))
    _check_rates(links, scale, unmeasured_rate_bps)
    topo = RegionsTopology(
        name or "regions_" + "_".join(dcs[r] for r in regions),
        regions,
        dcs,
        hosts,
        scale,
        tuple(links),
        unmeasured_rate_bps,
    )
    return _with_queues(topo)


def _unmeasured(table: RegionsTable, a: str, b: str) -> UnmeasuredPairError:
    lacking = next((r for r in (b, a) if not any(table.throughput_bps(r, n) for n in table.names if n != r)), b)
    other = a if lacking == b else b
    stand_ins = ", ".join(f"{n} ({rtt:.0f} ms from it)" for n, rtt in table.measured_stand_ins(lacking, other))
    return UnmeasuredPairError(
        f"no throughput was measured between {a} and {b} (Skyplane's throughput.csv has neither direction "
        f"between their PREMIUM tiers); choose a region near {lacking} whose throughput to {other} was measured"
        + (f", such as {stand_ins}" if stand_ins else "")
        + ", or give --unmeasured-rate RATE (such as 30mbit: the rate, already scaled, of every such link)"
    )


def _check_rates(links: list[RegionLink], scale: float, unmeasured_rate_bps: int | None) -> None:
    if unmeasured_rate_bps is not None and not MIN_RATE_BPS <= unmeasured_rate_bps <= MAX_RATE_BPS:
        raise RegionError(
            f"--unmeasured-rate {format_rate(unmeasured_rate_bps)} is outside what the emulator carries on a link "
            f"({format_rate(MIN_RATE_BPS)} to {format_rate(MAX_RATE_BPS)}); give one within it, such as 30mbit"
        )
    measured = [(k, k.measured_bps) for k in links if k.measured_bps is not None]
    if not measured:
        return
    top, top_bps = max(measured, key=lambda m: m[0].rate_bps)
    low, low_bps = min(measured, key=lambda m: m[0].rate_bps)
    if top.rate_bps > MAX_RATE_BPS:
        raise RegionError(
            f"link {top.dc_a}:{top.dc_b} ({top.region_a} - {top.region_b}) would run at {format_rate(top.rate_bps)} "
            f"({_gbit(top_bps)} Gbit/s measured x {scale:g}), above the {format_rate(MAX_RATE_BPS)} this "
            "emulator carries on one link (HTB and the delay elements were measured accurate up to about "
            "1 Gbit/s: it cannot run links at tens of Gbit/s); use --scale "
            f"{_scale_hint(MAX_RATE_BPS, top_bps, down=True)} or less"
        )
    if low.rate_bps < MIN_RATE_BPS:
        raise RegionError(
            f"link {low.dc_a}:{low.dc_b} ({low.region_a} - {low.region_b}) would run at {format_rate(low.rate_bps)} "
            f"({_gbit(low_bps)} Gbit/s measured x {scale:g}), below the {format_rate(MIN_RATE_BPS)} "
            "under which a frame's sending time rather than the delay sets the RTT; use --scale "
            f"{_scale_hint(MIN_RATE_BPS, low_bps, down=False)} or more"
        )


def _with_queues(topo: RegionsTopology) -> RegionsTopology:
    """``topo`` with each link's queue raised to the bandwidth-delay product of the longest path it
    is the bottleneck of, where the default is shorter."""
    need = {s.link.name: s.bdp_packets for s in queue_shortfalls(topo.spec())}
    links = tuple(replace(k, queue_packets=need.get(f"{k.dc_a}-{k.dc_b}", k.queue_packets)) for k in topo.links)
    return replace(topo, links=links)
