"""Parsing of explicit units, once, at the edge (topology and experiment files).

Rates are SI bits per second as in tc(8): ``kbit`` = 10^3 bit/s, ``mbit`` = 10^6, ``gbit`` = 10^9.
tc's byte-rate suffixes (``mbps`` = megabytes per second) are refused because they are a common
source of 8x mistakes. Times take ``us``, ``ms`` or ``s``; sizes ``B``, ``kB``/``MB``/``GB`` (SI) or
``KiB``/``MiB``/``GiB`` (binary); loss takes ``%``.
"""

from __future__ import annotations

import re

_NUM = r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
_RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}
_TIME_UNITS_US = {"us": 1, "ms": 1_000, "s": 1_000_000}
_SIZE_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}


class UnitError(ValueError):
    """A value has no unit, an unknown unit, or is not a number; ``args[0]`` says which and the fix."""


def _split(text: object, kind: str, units: dict[str, int], example: str) -> tuple[float, str]:
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise UnitError(f"is not a {kind}; write it as a string with a unit, such as {example}")
    s = str(text).strip().lower().replace(" ", "")
    m = re.fullmatch(_NUM + r"([a-z/%]*)", s)
    if m is None:
        if s.startswith("-"):
            raise UnitError(f"is negative; write a {kind} of zero or more, such as {example}")
        raise UnitError(f"is not a {kind}; write a number and a unit, such as {example}")
    number, unit = float(m.group(1)), m.group(2)
    if unit == "":
        raise UnitError(f"has no unit; write the unit explicitly, such as {example}")
    if unit not in units:
        hint = ""
        if unit in ("mbps", "kbps", "gbps", "bps"):
            hint = " (tc reads 'mbps' as megaBYTES per second; write 'mbit' for megabits)"
        raise UnitError(f"has unknown unit {unit!r}{hint}; use one of {', '.join(units)}, such as {example}")
    return number, unit


def _whole(value: float, resolution: str, unit: str) -> int:
    """Round to the integer resolution, refusing a nonzero value that would round to zero."""
    if value > 1e18:
        raise UnitError(f"is too large; write a realistic value in {unit}")
    if value != round(value) and value < 1:
        raise UnitError(f"is below the resolution of {resolution}; write 0 or at least {resolution}")
    return round(value)


def parse_rate_bps(text: object) -> int:
    """Parse a rate such as ``100mbit`` into bits per second (int). Raises UnitError."""
    number, unit = _split(text, "rate", _RATE_UNITS, "100mbit")
    return _whole(number * _RATE_UNITS[unit], "1bit", "bit/s")


def parse_duration_us(text: object) -> int:
    """Parse a duration such as ``25ms`` into microseconds (int). Raises UnitError."""
    number, unit = _split(text, "duration", _TIME_UNITS_US, "25ms")
    return _whole(number * _TIME_UNITS_US[unit], "1us", "microseconds")


def parse_bytes(text: object) -> int:
    """Parse a size such as ``64MiB`` (binary) or ``80GB`` (SI) into bytes (int). Raises UnitError."""
    number, unit = _split(text, "size", _SIZE_UNITS, "64MiB")
    return _whole(number * _SIZE_UNITS[unit], "1B", "bytes")


def parse_percent(text: object) -> float:
    """Parse a percentage such as ``0.1%`` into a float in percent (0.1). Raises UnitError."""
    number, _ = _split(text, "percentage", {"%": 1}, "0.1%")
    return number


def format_rate(bps: int | float) -> str:
    """Human form of a rate in bit/s, as a topology file would write it, to six significant digits
    and never in exponent notation: ``100mbit``, ``1.5gbit``, ``18.3296gbit``, ``999999tbit``."""
    unit, factor = next(
        ((u, f) for u, f in (("tbit", 10**12), ("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)) if bps >= f),
        ("bit", 1),
    )
    number = bps / factor  # below 1000 but in tbit
    return (f"{number:.6g}" if number < 10**6 else f"{number:.0f}") + unit


def format_duration_us(us: int | float) -> str:
    """Human form of a duration in microseconds: ``25ms``, ``1.5s``, ``300us``."""
    if us >= 1_000_000:
        return f"{us / 1_000_000:g}s"
    if us >= 1000 or us == 0:
        return f"{us / 1000:g}ms"
    return f"{us:g}us"
