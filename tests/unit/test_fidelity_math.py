"""Tolerances of the fidelity check and the ping parser (pure helpers, no measurement)."""

import math
from types import SimpleNamespace

import pytest

from testbed.net import fidelity
from testbed.net.fidelity import loss_within, parse_ping_ms, rate_within, rtt_within
from testbed.spec.wire import TCP_GOODPUT_FRACTION


def test_goodput_fraction_is_payload_over_frame():
    # MSS with timestamps: 1500 - 20 (IPv4) - 20 (TCP) - 12 (timestamps) = 1448; frame 1500 + 14 = 1514
    assert TCP_GOODPUT_FRACTION == pytest.approx(1448 / 1514)
    assert round(100 * TCP_GOODPUT_FRACTION, 1) == 95.6


def test_rate_within_five_percent():
    expected = 100 * TCP_GOODPUT_FRACTION  # Mbit/s on a 100 Mbit/s link
    assert rate_within(expected * 1.049, expected)
    assert rate_within(expected * 0.951, expected)
    assert not rate_within(expected * 1.051, expected)
    assert not rate_within(expected * 0.949, expected)


@pytest.mark.parametrize("expected_ms", [0.2, 10.0, 20.0])
def test_rtt_small_delays_get_one_ms(expected_ms):
    # 5% of 20 ms is 1 ms: up to there the 1 ms floor applies
    assert rtt_within(expected_ms + 0.99, expected_ms)
    assert rtt_within(expected_ms - 0.99, expected_ms)
    assert not rtt_within(expected_ms + 1.01, expected_ms)


def test_rtt_large_delays_get_five_percent():
    expected = 120.0  # 5% = 6 ms
    assert rtt_within(expected + 5.9, expected)
    assert rtt_within(expected - 5.9, expected)
    assert not rtt_within(expected + 6.1, expected)


def test_loss_within_binomial_error():
    expected_pct, packets = 1.0, 10_000
    p = expected_pct / 100
    tol_pct = 100 * (4 * math.sqrt(p * (1 - p) / packets) + 0.1 * p)  # about 0.498 points
    assert loss_within(expected_pct + 0.99 * tol_pct, expected_pct, packets)
    assert loss_within(expected_pct - 0.99 * tol_pct, expected_pct, packets)
    assert not loss_within(expected_pct + 1.01 * tol_pct, expected_pct, packets)
    assert not loss_within(expected_pct - 1.01 * tol_pct, expected_pct, packets)


def test_loss_tolerance_shrinks_with_more_packets():
    # 1.3% measured against 1% expected: too far for 100k packets (tol ~0.23 points), fine for 1k (tol ~1.36)
    assert loss_within(1.3, 1.0, 1_000)
    assert not loss_within(1.3, 1.0, 100_000)


def test_no_expected_loss_tolerates_almost_none():
    assert loss_within(0.0, 0.0, 1000)
    assert not loss_within(0.5, 0.0, 1000)


PING = """\
PING 10.100.1.2 (10.100.1.2) 56(84) bytes of data.
64 bytes from 10.100.1.2: icmp_seq=1 ttl=62 time=40.3 ms
64 bytes from 10.100.1.2: icmp_seq=2 ttl=62 time=40.1 ms
From 10.100.0.1 icmp_seq=3 Destination Host Unreachable
64 bytes from 10.100.1.2: icmp_seq=4 ttl=62 time=0.045 ms
64 bytes from 10.100.1.2: icmp_seq=5 ttl=62 time=1002 ms

--- 10.100.1.2 ping statistics ---
5 packets transmitted, 4 received, +1 errors, 20% packet loss, time 4005ms
rtt min/avg/max/mdev = 0.045/270.611/1002.000/422.389 ms, pipe 2
"""


def test_parse_ping_reply_lines_only():
    assert parse_ping_ms(PING) == [40.3, 40.1, 0.045, 1002.0]
    assert parse_ping_ms("PING x\n--- x ping statistics ---\n1 packets transmitted, 0 received\n") == []


def test_rtt_floor_widens_the_tolerance_by_itself():
    assert not rtt_within(21.5, 20.0) and rtt_within(21.5, 20.0, floor_ms=0.6)
    assert not rtt_within(21.7, 20.0, floor_ms=0.6)


def _direction(rate_mbit: float):
    """A LinkCheck of one east->west measurement at ``rate_mbit`` of 95.6 expected."""
    return fidelity.LinkCheck(
        "east", "west", ["east", "west"], 100.0, 95.6, rate_mbit, 10.0, 20.0, 20.1, 20, 0.0, None,
        rate_within(rate_mbit, 95.6), True, True,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("rates", "attempts", "measured", "ok"),
    [
        ([80.0, 95.0], 2, 2, True),  # the second measurement passes: judged by it
        ([80.0, 81.0, 95.0], 2, 2, False),  # two failing of two allowed: the direction fails
        ([95.0, 80.0], 3, 1, True),  # a passing direction is not measured again
        ([80.0, 95.0], 1, 1, False),  # the default: one measurement
    ],
)
def test_a_failing_direction_is_measured_again_up_to_attempts(monkeypatch, rates, attempts, measured, ok):
    taken = []

    def measure(net, src_dc, dst_dc, *args):
        taken.append((src_dc, args[-1]))
        return _direction(rates[len(taken) - 1] if src_dc == "east" else 95.0)  # west->east passes

    monkeypatch.setattr(fidelity, "check_direction", measure)
    spec = SimpleNamespace(name="t", source="t.yaml", links=[SimpleNamespace(a="east", b="west")])
    net = SimpleNamespace(spec=spec, mechanism="nfqueue")
    report = fidelity.check_fidelity(net, attempts=attempts, rtt_floor_ms=0.5)
    first = report["links"][0]
    assert taken == [("east", 0.5)] * measured + [("west", 0.5)]
    assert first["ok"] is ok and len(first["earlier"]) == measured - 1
    assert all("earlier" not in e for e in first["earlier"])  # each earlier measurement once
    assert [e["measured_rate_mbit"] for e in first["earlier"]] == rates[: measured - 1]
    assert first["measured_rate_mbit"] == rates[measured - 1]
    assert report["attempts"] == attempts and report["ok"] is ok and report["links"][1]["earlier"] == []


@pytest.mark.parametrize(
    ("kw", "named"),
    [
        ({"attempts": 0}, "attempts=0"),
        ({"attempts": 2.5}, "attempts=2.5"),
        ({"attempts": True}, "attempts=True"),
        ({"rtt_floor_ms": -1.0}, "rtt_floor_ms=-1.0"),
        ({"rtt_floor_ms": float("nan")}, "rtt_floor_ms=nan"),
    ],
)
def test_bad_attempts_and_floors_are_refused(kw, named):
    with pytest.raises(ValueError, match=named):
        fidelity.check_fidelity(SimpleNamespace(), **kw)
