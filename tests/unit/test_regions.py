"""The regions table (``spec/regions_table.py``) and topologies of real regions (``spec/regions.py``,
``testbed topo regions``): the shipped copy is what Skyplane's files give, a pair's figures are the
copy's combined as documented, in either order; unknown names and unmeasured pairs are errors that
say what to do; rates are scaled and kept within what the emulator carries; the topology written
parses back with its delays half the RTTs; the shipped topologies are what the command writes."""

from __future__ import annotations

import csv
import itertools
import re
import shlex
import warnings
from pathlib import Path

import pytest
import yaml

from testbed.cli import build_parser, main
from testbed.errors import TestbedError
from testbed.spec.regions import MAX_RATE_BPS, MIN_RATE_BPS, dc_name, dc_names, regions_topology
from testbed.spec.regions_table import (
    RegionError,
    RegionPair,
    RegionsTable,
    UnknownRegionError,
    UnmeasuredPairError,
    derive_rows,
    load_regions_table,
    table_text,
)
from testbed.spec.topology_file import TOPOLOGY_DIR, load_topology, parse_topology

REPO = Path(__file__).resolve().parents[2]
COPY = REPO / "testbed" / "data" / "regions" / "skyplane_2022.csv"
SKYPLANE = REPO.parent / "shared" / "data" / "skyplane-2022"
US_EU = ["aws:us-east-1", "azure:westus", "gcp:europe-west4-a"]


def copy_figures(a: str, b: str) -> tuple[float, float]:
    """(RTT ms, throughput bit/s) of a pair, read from the shipped CSV here, apart from the module:
    the larger of the two directions' RTTs, the smaller of their throughputs."""
    with COPY.open(newline="") as f:
        for row in csv.DictReader(f):
            if {row["region_a"], row["region_b"]} == {a, b}:
                rtts = [float(row[c]) for c in ("rtt_ab_ms", "rtt_ba_ms") if row[c]]
                rates = [float(row[c]) for c in ("throughput_ab_bps", "throughput_ba_bps") if row[c]]
                return max(rtts), min(rates)
    raise AssertionError(f"{a} - {b} is not in {COPY}")


def test_the_table_loads_with_every_cloud():
    table = load_regions_table()
    assert len(table.names) == 72
    assert {n.partition(":")[0] for n in table.names} == {"aws", "azure", "gcp"}
    assert {"aws:us-east-1", "gcp:europe-west4-a", "azure:eastasia"} <= set(table.names)
    assert COPY.stat().st_size < 300_000  # a compact copy


def test_the_shipped_copy_is_what_skyplanes_files_give():
    if not (SKYPLANE / "latency.csv").exists():
        pytest.skip(f"Skyplane's published files are not at {SKYPLANE} (shared data, optional)")
    with (SKYPLANE / "latency.csv").open(newline="") as lat, (SKYPLANE / "throughput.csv").open(newline="") as thr:
        text = table_text(derive_rows(csv.DictReader(lat), csv.DictReader(thr)))
    assert text == COPY.read_text(), "stale copy: run .venv/bin/python scripts/regions_table.py"


def test_a_known_pairs_figures_are_the_copys():
    table = load_regions_table()
    rtt, rate = copy_figures("aws:us-east-1", "gcp:europe-west4-a")
    assert table.rtt_ms("aws:us-east-1", "gcp:europe-west4-a") == rtt
    assert table.throughput_bps("aws:us-east-1", "gcp:europe-west4-a") == rate
    assert 70 < rtt < 110  # Virginia to the Netherlands, across the Atlantic
    assert 1e9 < rate < 20e9


def test_rows_are_derived_as_documented():
    """PREMIUM tier only, successful runs only, a region to itself left out, the median of several rows."""
    lat = [
        {"src_region": "x:a", "src_tier": "PREMIUM", "dst_region": "x:b", "dst_tier": "PREMIUM", "min_rtt": "10.0"},
        {"src_region": "x:a", "src_tier": "STANDARD", "dst_region": "x:b", "dst_tier": "PREMIUM", "min_rtt": "1.0"},
        {"src_region": "x:a", "src_tier": "PREMIUM", "dst_region": "x:a", "dst_tier": "PREMIUM", "min_rtt": "0.5"},
    ]
    row = {"src_region": "x:b", "src_tier": "PREMIUM", "dst_region": "x:a", "dst_tier": "PREMIUM", "success": "True"}
    thr = [
        {**row, "throughput_received": "1e9"},
        {**row, "throughput_received": "3e9"},
        {**row, "throughput_received": "9e9", "success": "False"},
        {**row, "throughput_received": "7e9", "dst_tier": "STANDARD"},
    ]
    assert derive_rows(lat, thr) == [
        {
            "region_a": "x:a",
            "region_b": "x:b",
            "rtt_ab_ms": "10.000",
            "rtt_ba_ms": "",
            "throughput_ab_bps": "",
            "throughput_ba_bps": "2000000000",
        }
    ]


def test_lookups_are_symmetric():
    table = load_regions_table()
    for a, b in itertools.combinations(table.names, 2):
        ab, ba = table.pair(a, b), table.pair(b, a)
        assert (ab.rtt_ms, ab.throughput_bps) == (ba.rtt_ms, ba.throughput_bps)
        assert (ab.rtt_ab_ms, ab.throughput_ab_bps) == (ba.rtt_ba_ms, ba.throughput_ba_bps)


def test_one_direction_measured_is_used_and_two_are_combined():
    table = RegionsTable([RegionPair("x:a", "x:b", 50.0, None, None, 2e9), RegionPair("x:a", "x:c", 40, 90, 3e9, 1e9)])
    assert (table.rtt_ms("x:b", "x:a"), table.throughput_bps("x:b", "x:a")) == (50.0, 2e9)
    assert (table.rtt_ms("x:c", "x:a"), table.throughput_bps("x:a", "x:c")) == (90, 1e9)  # larger RTT, smaller rate


@pytest.mark.parametrize(
    "name, near", [("aws:us-east-7", ["aws:us-east-1", "aws:us-east-2"]), ("us-east-1", ["aws:us-east-1"])]
)
def test_an_unknown_region_names_the_nearest(name, near):
    with pytest.raises(UnknownRegionError) as e:
        regions_topology([name, "gcp:europe-west4-a"])
    assert isinstance(e.value, TestbedError)
    nearest = re.search(r"the nearest are ([^(]+) \(", str(e.value))
    assert nearest, str(e.value)
    assert set(near) <= set(nearest.group(1).split(", ")), str(e.value)
    assert "--list" in str(e.value)


def test_a_pair_without_throughput_names_stand_ins_or_takes_a_rate():
    with pytest.raises(UnmeasuredPairError) as e:
        regions_topology(["aws:us-east-1", "azure:eastasia"])
    message = str(e.value)
    assert "between aws:us-east-1 and azure:eastasia" in message and "--unmeasured-rate" in message
    assert "aws:ap-east-1" in message  # Hong Kong, as eastasia
    topo = regions_topology(["aws:us-east-1", "azure:eastasia"], unmeasured_rate_bps=30_000_000)
    (link,) = topo.links
    assert (link.rate_bps, link.measured_bps) == (30_000_000, None)
    assert "not measured" in topo.description and "30mbit where none was measured" in topo.description


def test_a_pair_without_rtt_is_named():
    with pytest.raises(UnmeasuredPairError, match=r"no RTT was measured between aws:us-east-1 and aws:eu-west-3.*"):
        regions_topology(["aws:us-east-1", "aws:eu-west-3"])


@pytest.mark.parametrize(
    "regions, kwargs, match",
    [
        (["aws:us-east-1"], {}, "at least two"),
        (["aws:us-east-1", "aws:us-east-1"], {}, "given twice"),
        (US_EU, {"scale": 0}, "outside"),
        (US_EU, {"scale": 1.5}, "outside"),
        (US_EU, {"hosts": 0}, "at least one host"),
    ],
)
def test_bad_arguments_are_refused(regions, kwargs, match):
    with pytest.raises(RegionError, match=match):
        regions_topology(regions, **kwargs)


def test_rates_are_the_measured_throughput_times_the_scale():
    topo = regions_topology(US_EU, scale=0.02)
    assert len(topo.links) == 3  # a full mesh
    for link in topo.links:
        _, rate = copy_figures(link.region_a, link.region_b)
        assert link.rate_bps == pytest.approx(rate * 0.02, rel=0.005)  # to 3 significant digits
        assert link.measured_bps == rate


def test_the_topology_parses_back_with_delays_half_the_rtt(tmp_path):
    topo = regions_topology(US_EU, scale=0.02, hosts=3, name="us eu")
    path = tmp_path / "us_eu.yaml"
    path.write_text(topo.to_yaml())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no queue below a path's bandwidth-delay product
        spec = load_topology(path)
    assert spec == parse_topology(topo.to_file_dict(), str(path))
    assert (spec.name, spec.description) == ("us eu", topo.description)
    assert [(dc.name, dc.hosts) for dc in spec.dcs] == [("use1", 3), ("wus", 3), ("euw4", 3)]
    assert "aws:us-east-1 (use1)" in spec.description and "x 0.02" in spec.description
    for link, made in zip(spec.links, topo.links):
        rtt, _ = copy_figures(made.region_a, made.region_b)
        assert link.delay_us == round(rtt * 1000 / 2)
        assert f"{rtt:.1f} ms" in spec.description
        assert link.rate_bps == made.rate_bps


def test_too_high_a_rate_is_refused_with_a_scale_that_fits():
    with pytest.raises(RegionError, match="tens of Gbit/s") as e:
        regions_topology(US_EU, scale=1)
    scale = float(re.search(r"use --scale (\S+) or less", str(e.value)).group(1))
    assert max(k.rate_bps for k in regions_topology(US_EU, scale=scale).links) <= MAX_RATE_BPS


def test_too_low_a_rate_is_refused_with_a_scale_that_fits():
    with pytest.raises(RegionError, match="below") as e:
        regions_topology(US_EU, scale=1e-5)
    scale = float(re.search(r"use --scale (\S+) or more", str(e.value)).group(1))
    assert min(k.rate_bps for k in regions_topology(US_EU, scale=scale).links) >= MIN_RATE_BPS


def test_dc_names_are_short_valid_and_unique():
    names = load_regions_table().names
    assert [dc_name(r) for r in ("aws:us-east-1", "gcp:europe-west4-a", "azure:eastasia", "aws:ap-northeast-2")] == [
        "use1",
        "euw4",
        "eas",
        "apne2",
    ]
    every = dc_names(names)
    assert len(set(every.values())) == len(names)
    for name in every.values():
        assert re.fullmatch(r"[a-z][a-z0-9-]*", name) and len("w-" + name) <= 15, name
    assert dc_names(["aws:us-east-1", "gcp:us-east1-b", "aws:eu-west-1"]) == {
        "aws:us-east-1": "aws-use1",
        "gcp:us-east1-b": "gcp-use1",
        "aws:eu-west-1": "euw1",
    }


def test_the_command_writes_a_file_that_loads(tmp_path, capsys):
    out = tmp_path / "t.yaml"
    args = build_parser().parse_args(["topo", "regions", *US_EU, "--scale", "0.03", "--hosts", "1", "-o", str(out)])
    assert args.func(args) == 0
    spec = load_topology(out)
    assert len(spec.dcs) == 3 and spec.host_count == 3
    assert out.read_text().startswith("# Written by: testbed topo regions aws:us-east-1 azure:westus")
    assert "Skyplane" in out.read_text() and "Apache-2.0" in out.read_text()
    assert "cannot run links at tens of Gbit/s" in capsys.readouterr().err


def test_the_command_prints_errors_and_the_list(capsys):
    assert main(["topo", "regions", "aws:us-east-7", "gcp:europe-west4-a"]) == 1
    assert "aws:us-east-1" in capsys.readouterr().err
    assert main(["topo", "regions", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 + 72 and any(line.split()[:2] == ["aws:us-east-1", "use1"] for line in lines)


@pytest.mark.parametrize("name", ["regions_us_eu", "regions_global"])
def test_the_shipped_topologies_are_what_the_command_writes(name, capsys):
    text = (TOPOLOGY_DIR / f"{name}.yaml").read_text()
    command = text.splitlines()[0].removeprefix("# Written by: ")
    words = shlex.split(command)
    assert words[:3] == ["testbed", "topo", "regions"]
    args = build_parser().parse_args(words[1:])
    assert args.func(args) == 0
    assert capsys.readouterr().out == text, f"stale: rerun `{command} -o topologies/{name}.yaml`"
    spec = load_topology(name)
    assert 3 <= len(spec.dcs) <= 4 and all(10e6 <= k.rate_bps <= 300e6 for k in spec.links)
    assert yaml.safe_load(text)["name"] == name
