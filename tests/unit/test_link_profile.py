"""Link profiles: the CSV, Mahimahi and generator forms, their validation, and the steps' times."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from testbed.errors import SpecError
from testbed.spec.link_profile import MIN_RATE_BPS, LinkProfile, LinkState, ProfileStep
from testbed.spec.link_profile_file import MAHIMAHI_PACKET_BYTES, mahimahi_rates, read_profile
from testbed.spec.topology import TopologySpec
from testbed.spec.topology_file import parse_topology

BASE = LinkState(100_000_000, 10_000)
PROFILES = Path(__file__).resolve().parents[2] / "profiles"


def _csv(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "p.csv"
    path.write_text(text)
    return path


def test_a_csv_fills_empty_cells_from_the_row_before_and_starts_from_the_link(tmp_path):
    path = _csv(tmp_path, "time,rate,delay,loss\n2s,20mbit,,\n3s,down,,\n4s,up,30ms,0.5%\n")
    p = read_profile("t.yaml", str(path), "links[0].profile", BASE, tmp_path)
    assert [s.t_us for s in p.steps] == [0, 2_000_000, 3_000_000, 4_000_000]
    assert p.steps[0].state == BASE  # before the first row: the link's own figures
    assert p.steps[1].state == LinkState(20_000_000, 10_000)
    assert not p.steps[2].state.up and p.has_outage
    assert p.steps[3].state == LinkState(100_000_000, 30_000, 0, 0.5)
    assert p.period_us is None and p.state_at(99e6) == p.steps[3].state
    assert p.varies_delay


@pytest.mark.parametrize(
    ("text", "where", "says"),
    [
        ("time,rate\n2s,20mbit\n1s,30mbit\n", "line 3, column time", "is not after the row before"),
        ("time,bandwidth\n0s,20mbit\n", "line 1", "is not a known column"),
        ("time,rate\n0s,20mbps\n", "line 2, column rate", "megaBYTES"),
        ("time,rate\n0s,1kbit\n", "line 2, column rate", "below 8kbit"),
        ("time,delay,jitter\n0s,5ms,6ms\n", "line 2, column jitter", "larger than the delay"),
        ("time,rate\n0s,20mbit,3\n", "line 2", "has 3 cells for 2 columns"),
        ("time,rate\n", "(file)", "has a header and no rows"),
        ("time\n0s\n", "line 1", "at least one other column"),
    ],
)
def test_a_bad_csv_names_its_line_and_column(tmp_path, text, where, says):
    path = _csv(tmp_path, text)
    with pytest.raises(SpecError) as e:
        read_profile("t.yaml", str(path), "links[0].profile", BASE, tmp_path)
    assert e.value.field == where and says in str(e.value), str(e.value)
    assert e.value.source == str(path)


def test_a_looping_csv_needs_its_period_and_the_period_its_loop(tmp_path):
    _csv(tmp_path, "time,rate\n0s,20mbit\n5s,up\n")
    with pytest.raises(SpecError, match="add period"):
        read_profile("t.yaml", {"file": "p.csv", "loop": True}, "links[0].profile", BASE, tmp_path)
    with pytest.raises(SpecError, match="not longer than the last row"):
        read_profile("t.yaml", {"file": "p.csv", "loop": True, "period": "5s"}, "links[0].profile", BASE, tmp_path)
    p = read_profile("t.yaml", {"file": "p.csv", "loop": True, "period": "8s"}, "links[0].profile", BASE, tmp_path)
    # unrolled: 20 at 0, up at 5, 20 again at 8, up at 13; a step repeating its state is left out
    assert [(c.t_us, c.state.rate_bps) for c in p.changes(14_000_000)] == [
        (0, 20_000_000),
        (5_000_000, 100_000_000),
        (8_000_000, 20_000_000),
        (13_000_000, 100_000_000),
    ]
    assert p.state_at(9e6).rate_bps == 20_000_000


def test_a_missing_file_and_an_unknown_generator_are_named(tmp_path):
    with pytest.raises(SpecError) as e:
        read_profile("t.yaml", "nothere.csv", "links[1].profile", BASE, tmp_path)
    assert e.value.field == "links[1].profile.file" and "does not exist" in str(e.value)
    with pytest.raises(SpecError) as e:
        read_profile("t.yaml", {"generator": "sine"}, "links[1].profile", BASE, tmp_path)
    assert e.value.field == "links[1].profile.generator" and "diurnal" in e.value.fix
    with pytest.raises(SpecError) as e:
        read_profile(
            "t.yaml", {"generator": "diurnal", "period": "60s", "low": "10mbit"}, "links[1].profile", BASE, tmp_path
        )
    assert e.value.field == "links[1].profile.high" and "is missing" in str(e.value)


def test_the_diurnal_curve_is_lowest_at_the_start_and_highest_half_a_period_in():
    p = read_profile(
        "t",
        {"generator": "diurnal", "period": "24s", "low": "10mbit", "high": "90mbit", "step": "1s"},
        "x",
        BASE,
        Path(),
    )
    rates = [s.state.rate_bps for s in p.steps]
    assert len(rates) == 24 and p.period_us == 24_000_000
    assert rates.index(min(rates)) in (0, 23) and rates.index(max(rates)) in (11, 12)
    assert all(10_000_000 <= r <= 90_000_000 for r in rates)
    # each step takes the curve at its middle
    mid = 10e6 + 80e6 * (1 - math.cos(2 * math.pi * 5.5 / 24)) / 2
    assert rates[5] == round(mid)
    assert p.state_at(24e6 + 5.5e6).rate_bps == rates[5]  # it loops
    with pytest.raises(SpecError, match="below low"):
        read_profile(
            "t", {"generator": "diurnal", "period": "24s", "low": "90mbit", "high": "10mbit"}, "x", BASE, Path()
        )


def test_on_off_flaps_and_loops():
    p = read_profile("t", {"generator": "on_off", "up": "8s", "down": "2s"}, "x", BASE, Path())
    assert [(c.t_us, c.state.up) for c in p.changes(25_000_000)] == [
        (0, True),
        (8_000_000, False),
        (10_000_000, True),
        (18_000_000, False),
        (20_000_000, True),
    ]
    assert p.changes(1)[0].state == BASE


def test_the_random_walk_is_seeded_and_stays_within_its_bounds():
    raw = {
        "generator": "random_walk",
        "low": "10mbit",
        "high": "50mbit",
        "step": "1s",
        "duration": "200s",
        "sigma": 0.5,
    }
    a = read_profile("t", raw, "x", BASE, Path())
    assert a == read_profile("t", raw, "x", BASE, Path())
    assert a != read_profile("t", {**raw, "seed": 2}, "x", BASE, Path())
    rates = [s.state.rate_bps for s in a.steps]
    assert len(rates) == 200 and all(10_000_000 <= r <= 50_000_000 for r in rates)
    assert rates[0] == 50_000_000  # the link's rate, brought within the bounds
    assert len(set(rates)) > 100


def test_a_step_changes_only_what_it_names():
    p = read_profile("t", {"generator": "step", "at": "30s", "delay": "40ms"}, "x", BASE, Path())
    assert p.steps == (ProfileStep(0, BASE), ProfileStep(30_000_000, LinkState(100_000_000, 40_000)))
    with pytest.raises(SpecError, match="larger than the delay"):
        read_profile("t", {"generator": "step", "at": "1s", "jitter": "20ms"}, "x", BASE, Path())


def test_a_constant_mahimahi_trace_becomes_its_rate():
    # one 1500-byte opportunity per ms: 12 Mbit/s, mm-link's constant-rate trace
    rates, period_us, err = mahimahi_rates(list(range(1, 1001)), 100_000)
    assert period_us == 1_000_000 and rates == [12_000_000] * 10
    assert err["mean_rate_error"] == pytest.approx(0, abs=1e-12)
    assert err["gap_bytes"] <= MAHIMAHI_PACKET_BYTES and err["empty_steps"] == 0


def test_a_bursty_trace_states_its_conversion_error(tmp_path):
    # 100 opportunities at once every 100 ms, none between: each step delivers the burst evenly,
    # so the steps run up to a burst behind the trace
    times = [t for k in range(1, 11) for t in [100 * k - 50] * 100]
    path = tmp_path / "bursty.up"
    path.write_text("\n".join(map(str, times)) + "\n")
    p = read_profile("t", {"file": "bursty.up", "granularity": "100ms"}, "x", BASE, tmp_path)
    assert p.period_us == 950_000 and p.steps[0].state.rate_bps == 12_000_000
    assert "largest gap in delivered bytes" in p.note
    _, _, err = mahimahi_rates(times, 100_000)
    assert 0.4 * 100 * MAHIMAHI_PACKET_BYTES <= err["gap_bytes"] <= 100 * MAHIMAHI_PACKET_BYTES
    gaps = [t for k in range(1, 4) for t in [300 * k] * 10]  # 200 ms with nothing between bursts
    _, _, err = mahimahi_rates(gaps, 100_000)
    assert err["empty_steps"] == 6
    path.write_text("5\n3\n")
    with pytest.raises(SpecError) as e:
        read_profile("t", "bursty.up", "x", BASE, tmp_path)
    assert e.value.field == "line 2" and "goes back in time" in str(e.value)


def test_a_profile_rejects_steps_out_of_order():
    with pytest.raises(ValueError):
        LinkProfile((ProfileStep(1, BASE),))
    with pytest.raises(ValueError):
        LinkProfile((ProfileStep(0, BASE), ProfileStep(5, BASE)), period_us=5)


def test_a_topology_carries_its_profile_through_its_records(tmp_path):
    (tmp_path / "p.csv").write_text("time,rate,delay\n1s,down,\n2s,up,20ms\n")
    data = {
        "dcs": [{"name": "a", "hosts": 1}, {"name": "b", "hosts": 1}],
        "links": [{"between": ["a", "b"], "rate": "50mbit", "delay": "10ms", "profile": "p.csv"}],
    }
    (tmp_path / "t.yaml").write_text(json.dumps(data))
    spec = parse_topology(data, str(tmp_path / "t.yaml"))
    profile = spec.links[0].profile
    assert profile is not None and profile.steps[0].state == LinkState(50_000_000, 10_000)
    assert TopologySpec.from_dict(json.loads(json.dumps(spec.to_dict()))).links == spec.links
    assert parse_topology(spec.to_file_dict(), "elsewhere.yaml").links == spec.links


def test_the_shipped_profiles_load():
    diurnal = read_profile("t", "diurnal.yaml", "x", BASE, PROFILES)
    assert diurnal.period_us == 120_000_000 and len(diurnal.steps) == 24
    assert min(s.state.rate_bps for s in diurnal.steps) >= 20_000_000
    flapping = read_profile("t", {"file": "flapping.csv", "loop": True, "period": "30s"}, "x", BASE, PROFILES)
    assert flapping.has_outage and all(s.state.rate_bps in (0, BASE.rate_bps) for s in flapping.steps)
    assert MIN_RATE_BPS == 8_000
