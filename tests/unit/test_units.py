"""Unit parsing: explicit SI rate units (as tc), us/ms/s durations, percentages, and refusals."""

import pytest

from testbed.spec.units import (
    UnitError,
    format_duration_us,
    format_rate,
    parse_duration_us,
    parse_percent,
    parse_rate_bps,
)


@pytest.mark.parametrize(
    "text, bps",
    [
        ("64kbit", 64 * 10**3),
        ("100mbit", 100 * 10**6),
        ("1.5gbit", 15 * 10**8),
        ("10gbit", 10 * 10**9),
        ("100 Mbit", 100 * 10**6),  # case and inner spaces are ignored
        (" 2.5MBIT ", 25 * 10**5),
    ],
)
def test_rates_are_si_bits_per_second(text, bps):
    assert parse_rate_bps(text) == bps


@pytest.mark.parametrize(
    "text, us",
    [
        ("250us", 250),
        ("25ms", 25 * 1000),
        ("1.5s", 15 * 10**5),
        (".5ms", 500),
        ("0ms", 0),
    ],
)
def test_durations_in_microseconds(text, us):
    assert parse_duration_us(text) == us


@pytest.mark.parametrize("text, pct", [("0.1%", 0.1), ("5%", 5.0), ("0%", 0.0)])
def test_percent(text, pct):
    assert parse_percent(text) == pytest.approx(pct)


@pytest.mark.parametrize(
    "parse, value, words",
    [
        (parse_rate_bps, "100", ["no unit", "100mbit"]),
        (parse_rate_bps, 100, ["no unit", "100mbit"]),  # a bare YAML number has no unit either
        (parse_duration_us, "25", ["no unit", "25ms"]),
        (parse_percent, "0.1", ["no unit", "0.1%"]),
        (parse_rate_bps, "100furlongs", ["unknown unit 'furlongs'", "kbit", "mbit", "gbit"]),
        (parse_duration_us, "3min", ["unknown unit 'min'", "us", "ms"]),
        (parse_rate_bps, "-5mbit", ["negative", "100mbit"]),
        (parse_duration_us, "-1ms", ["negative", "25ms"]),
        (parse_rate_bps, "fast", ["not a rate", "100mbit"]),
        (parse_duration_us, "1e3ms", ["not a duration", "25ms"]),  # no exponent notation: write 1s
        (parse_rate_bps, None, ["not a rate"]),
        (parse_rate_bps, True, ["not a rate"]),  # YAML 'yes' is not a rate
        (parse_rate_bps, [100, "mbit"], ["not a rate"]),
    ],
)
def test_bad_values_are_refused_with_a_fix(parse, value, words):
    with pytest.raises(UnitError) as e:
        parse(value)
    for w in words:
        assert w in str(e.value)


@pytest.mark.parametrize("text", ["100mbps", "10Gbps", "500kbps"])
def test_byte_rate_suffix_gets_the_megabyte_hint(text):
    with pytest.raises(UnitError) as e:
        parse_rate_bps(text)
    msg = str(e.value)
    assert "megaBYTES" in msg and "'mbit'" in msg


@pytest.mark.parametrize("bps", [0, 500, 1500, 64 * 10**3, 100 * 10**6, 15 * 10**8])
def test_format_rate_parses_back(bps):
    assert parse_rate_bps(format_rate(bps)) == bps


@pytest.mark.parametrize("us", [0, 300, 1500, 25 * 1000, 15 * 10**5])
def test_format_duration_parses_back(us):
    assert parse_duration_us(format_duration_us(us)) == us


def test_format_rate_never_uses_exponents():
    assert format_rate(999999 * 10**12) == "999999tbit"
    assert format_rate(1.5e9) == "1.5gbit" and format_rate(0) == "0bit"
