"""The regions table: measured round trips and throughputs between public cloud regions (AWS, Azure,
GCP), as the testbed ships them (``testbed/data/regions/``), for ``testbed topo regions``
(``regions.py``).

The figures are Skyplane's (skyplane-project/skyplane, ``profiles/latency.csv`` and
``profiles/throughput.csv`` as of 2022-11-01; Jain et al., "Skyplane: Optimizing Transfer Cost and
Throughput Using Cloud-Aware Overlays", NSDI 2023; Apache-2.0, whose text and the attribution ship
beside the table). ``derive_rows`` reduces the published files to the table
(``scripts/regions_table.py`` runs it); the package reads only its own copy.

What the table keeps, per ordered pair of regions (source ``a``, destination ``b``):

- ``rtt_ab_ms``: ping's **minimum** RTT (``min_rtt``) from a VM in ``a`` to one in ``b``. The
  minimum is the path's propagation floor; the samples above it are queueing at the time of the
  measurement, which an emulated link adds by itself when loaded (its queue), so ``avg_rtt`` would
  count it twice (the two differ by 0.16 ms at the median).
- ``throughput_ab_bps``: iperf3's goodput at the receiver (``throughput_received``, bit/s; 64
  connections for 5 s between VMs of 32 vCPUs: m5.8xlarge, Standard_D32_v5, n2-standard-32, one
  instance class per cloud) of successful runs.

Both only between the clouds' **PREMIUM** network tiers (AWS and Azure have no other; GCP's
STANDARD tier, which leaves Google's network early, is left out), and the median over the rows of
one ordered pair (only throughputs repeat: 61 ordered pairs to or from azure:germanywestcentral,
measured twice).

A pair's two directions are combined when it is looked up (:meth:`RegionPair.rtt_ms`,
:meth:`RegionPair.throughput_bps`); where only one direction was measured, that one is used.
"""

from __future__ import annotations

import csv
import difflib
import io
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources

from testbed.errors import TestbedError

#: the shipped table, under the package (``setup.cfg``: package data)
TABLE_PARTS = ("data", "regions", "skyplane_2022.csv")
#: the table's columns: the pair (``region_a`` < ``region_b``), then each figure per direction
#: (``ab``: measured from ``region_a`` to ``region_b``); an empty cell was not measured
COLUMNS = ("region_a", "region_b", "rtt_ab_ms", "rtt_ba_ms", "throughput_ab_bps", "throughput_ba_bps")
#: the network tier both ends of a kept measurement are on
TIER = "PREMIUM"


class RegionError(TestbedError):
    """A region is not in the regions table, a pair of regions was not measured, or a topology from
    regions asks for rates the emulator cannot carry."""


class UnknownRegionError(RegionError):
    """A region name is not in the regions table; the message lists the nearest known names."""


class UnmeasuredPairError(RegionError):
    """The regions table has no RTT or no throughput for a pair of regions."""


@dataclass(frozen=True)
class RegionPair:
    """The measurements between regions ``a`` and ``b`` in both directions (None: not measured):
    ``rtt_ab_ms`` from a ping in ``a``, ``throughput_ab_bps`` for data sent from ``a`` to ``b``."""

    a: str
    b: str
    rtt_ab_ms: float | None
    rtt_ba_ms: float | None
    throughput_ab_bps: float | None
    throughput_ba_bps: float | None

    @property
    def rtt_ms(self) -> float | None:
        """The pair's RTT (ms): the **larger** of the two directions' minima. About one direction in
        25 (almost all pings from GCP VMs) has a minimum far below the other direction's and below
        what the distance allows (aws:ap-east-1 to gcp:northamerica-northeast2-a: 26.9 ms from
        Toronto, 194.2 ms from Hong Kong); elsewhere the two agree (0.3% apart at the median)."""
        return _combined(self.rtt_ab_ms, self.rtt_ba_ms, larger=True)

    @property
    def throughput_bps(self) -> float | None:
        """The pair's throughput (bit/s): the **smaller** of the two directions, as an emulated link
        has one rate for both directions and both directions carried at least this much."""
        return _combined(self.throughput_ab_bps, self.throughput_ba_bps, larger=False)

    def reversed(self) -> RegionPair:
        return RegionPair(
            self.b, self.a, self.rtt_ba_ms, self.rtt_ab_ms, self.throughput_ba_bps, self.throughput_ab_bps
        )


def _combined(x: float | None, y: float | None, larger: bool) -> float | None:
    measured = [v for v in (x, y) if v is not None]
    if not measured:
        return None
    return max(measured) if larger else min(measured)


class RegionsTable:
    """Every measured pair of regions, looked up in either order. Raises UnknownRegionError for a
    name it does not hold and UnmeasuredPairError for a figure no direction has."""

    def __init__(self, pairs: Iterable[RegionPair], source: str = "<memory>") -> None:
        self.source = source
        self._pairs: dict[tuple[str, str], RegionPair] = {}
        for p in pairs:
            self._pairs[(p.a, p.b)] = p
            self._pairs[(p.b, p.a)] = p.reversed()
        self.names: tuple[str, ...] = tuple(sorted({a for a, _ in self._pairs}))

    def check(self, name: str) -> str:
        """``name`` if the table holds it; else UnknownRegionError naming the nearest names."""
        if name in self.names:
            return name
        near = nearest_names(name, self.names)
        raise UnknownRegionError(
            f"unknown region {name!r}: the regions table ({len(self.names)} regions of AWS, Azure and GCP, "
            f"measured by Skyplane in 2022) has no such name; the nearest are {', '.join(near)} "
            "(`testbed topo regions --list` prints them all; a region is written cloud:region, such as "
            "aws:us-east-1, azure:eastus, gcp:europe-west4-a)"
        )

    def pair(self, a: str, b: str) -> RegionPair:
        """The measurements between ``a`` and ``b``, oriented as asked (any order). Raises
        UnknownRegionError for an unknown name, RegionError for ``a == b``."""
        self.check(a)
        self.check(b)
        if a == b:
            raise RegionError(f"region {a!r} is given twice: name each region once")
        return self._pairs.get((a, b)) or RegionPair(a, b, None, None, None, None)

    def rtt_ms(self, a: str, b: str) -> float:
        """The RTT between ``a`` and ``b`` (ms; :attr:`RegionPair.rtt_ms`). Raises UnmeasuredPairError."""
        rtt = self.pair(a, b).rtt_ms
        if rtt is None:
            lacking = next((r for r in (b, a) if not self.has_rtt(r)), b)
            other = a if lacking == b else b
            known = [n for n in self.names if n not in (a, b) and self._pairs.get((other, n), _NONE).rtt_ms]
            none_at_all = f"; {lacking} has none to any region" if not self.has_rtt(lacking) else ""
            raise UnmeasuredPairError(
                f"no RTT was measured between {a} and {b} (Skyplane's latency.csv has neither direction "
                f"between their PREMIUM tiers{none_at_all}); choose a region in place of {lacking} whose "
                f"RTT to {other} was measured, such as {', '.join(nearest_names(lacking, known, 3))}"
            )
        return rtt

    def has_rtt(self, region: str) -> bool:
        """Whether any RTT from or to ``region`` was measured."""
        return any(self._pairs.get((region, n), _NONE).rtt_ms is not None for n in self.names)

    def throughput_bps(self, a: str, b: str) -> float | None:
        """The throughput between ``a`` and ``b`` (bit/s; :attr:`RegionPair.throughput_bps`), None
        where neither direction was measured (:meth:`measured_stand_ins` names regions nearby that were)."""
        return self.pair(a, b).throughput_bps

    def measured_stand_ins(self, region: str, other: str, n: int = 3) -> list[tuple[str, float]]:
        """Up to ``n`` regions whose throughput to ``other`` was measured, nearest to ``region`` by
        RTT first: ``(name, RTT from region in ms)``, for an error's fix."""
        near = []
        for name in self.names:
            if name in (region, other):
                continue
            rtt = self._pairs.get((region, name), _NONE).rtt_ms
            if rtt is not None and self._pairs.get((name, other), _NONE).throughput_bps is not None:
                near.append((rtt, name))
        return [(name, rtt) for rtt, name in sorted(near)[:n]]


_NONE = RegionPair("", "", None, None, None, None)


def nearest_names(name: str, names: Iterable[str], n: int = 5) -> list[str]:
    """Up to ``n`` of ``names`` most like ``name`` (difflib's ratio), comparing the part after
    ``cloud:`` too, so that ``us-east-1`` finds ``aws:us-east-1``."""
    query = name.strip().lower()

    def likeness(candidate: str) -> float:
        forms = (candidate, candidate.partition(":")[2]) if ":" not in query else (candidate,)
        return max(difflib.SequenceMatcher(None, query, form).ratio() for form in forms)

    return sorted(names, key=lambda c: (-likeness(c), c))[:n]


def read_table(text: str, source: str = "<memory>") -> RegionsTable:
    """The table from its CSV text (``COLUMNS``). Raises RegionError naming the row of a bad cell."""
    reader = csv.DictReader(io.StringIO(text))
    if tuple(reader.fieldnames or ()) != COLUMNS:
        raise RegionError(
            f"{source}: columns {reader.fieldnames} are not the regions table's {list(COLUMNS)}; "
            "rebuild it with scripts/regions_table.py"
        )
    pairs = []
    for row in reader:
        try:
            figures = [float(row[c]) if row[c] else None for c in COLUMNS[2:]]
        except ValueError:
            raise RegionError(
                f"{source}: line {reader.line_num}: a figure is not a number: {row}; "
                "rebuild the table with scripts/regions_table.py"
            ) from None
        pairs.append(RegionPair(row["region_a"], row["region_b"], *figures))
    return RegionsTable(pairs, source)


@cache
def load_regions_table() -> RegionsTable:
    """The shipped regions table (read once per process)."""
    path = resources.files("testbed").joinpath(*TABLE_PARTS)
    return read_table(path.read_text(encoding="utf-8"), "testbed/" + "/".join(TABLE_PARTS))


def derive_rows(latency: Iterable[Mapping[str, str]], throughput: Iterable[Mapping[str, str]]) -> list[dict[str, str]]:
    """The table's rows (``COLUMNS``, as text) from the rows of Skyplane's ``latency.csv`` and
    ``throughput.csv``: PREMIUM tier at both ends, successful throughput runs, a region to itself
    left out; per ordered pair the median of ``min_rtt`` and of ``throughput_received`` over its rows.
    Sorted by pair; RTTs to the microsecond (as published), throughputs to the bit/s."""
    rtts: dict[tuple[str, str], list[float]] = defaultdict(list)
    rates: dict[tuple[str, str], list[float]] = defaultdict(list)
    for row in latency:
        if row["src_tier"] == row["dst_tier"] == TIER and row["src_region"] != row["dst_region"]:
            rtts[(row["src_region"], row["dst_region"])].append(float(row["min_rtt"]))
    for row in throughput:
        if (
            row["src_tier"] == row["dst_tier"] == TIER
            and row["src_region"] != row["dst_region"]
            and row["success"].strip().lower() == "true"
        ):
            rates[(row["src_region"], row["dst_region"])].append(float(row["throughput_received"]))
    rtt = {k: statistics.median(v) for k, v in rtts.items()}
    rate = {k: statistics.median(v) for k, v in rates.items()}
    pairs = sorted({tuple(sorted(k)) for k in (*rtt, *rate)})

    def cell(table: dict[tuple[str, str], float], key: tuple[str, str], text: str) -> str:
        return text.format(table[key]) if key in table else ""

    return [
        dict(
            zip(
                COLUMNS,
                (
                    a,
                    b,
                    cell(rtt, (a, b), "{:.3f}"),
                    cell(rtt, (b, a), "{:.3f}"),
                    cell(rate, (a, b), "{:.0f}"),
                    cell(rate, (b, a), "{:.0f}"),
                ),
            )
        )
        for a, b in pairs
    ]


def table_text(rows: Iterable[Mapping[str, str]]) -> str:
    """The CSV text of the table's rows (``COLUMNS``), with Unix line ends."""
    out = io.StringIO()
    writer = csv.DictWriter(out, COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()
