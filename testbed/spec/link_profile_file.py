"""Reading a WAN link's ``profile`` (``link_profile.LinkProfile``) from a topology file; every
error names the file, the field (or the CSV row and column), the value and the fix.

A link's ``profile`` is one of::

    profile: profiles/flapping.csv                 # a CSV of steps, relative to the topology file
    profile: {file: traces/lte.up, granularity: 100ms, loop: true}   # a Mahimahi trace
    profile: profiles/diurnal.yaml                 # a YAML file holding one of these mappings
    profile: {generator: diurnal, period: 120s, low: 20mbit, high: 100mbit, step: 5s}

A CSV's first line names its columns: ``time`` and any of ``rate``, ``delay``, ``jitter``,
``loss``; each cell a value with its unit (``30s``, ``50mbit``, ``15ms``, ``0.1%``), ``down`` for
the rate of an outage and ``up`` for the link's own rate, empty for the row before's value (the
link's own in the first row). A file
whose name does not end in ``.csv``, ``.yaml`` or ``.yml`` is a Mahimahi packet-delivery trace
(mm-link(1)): one line per opportunity to deliver one 1500-byte packet, its time in whole
milliseconds; it is turned into rate steps of ``granularity`` (the bytes of the opportunities in
each step, over the step), and the conversion's error is stated in the profile's ``note``.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from testbed.errors import SpecError
from testbed.spec import link_profile_generators as gen
from testbed.spec.link_profile import MIN_RATE_BPS, LinkProfile, LinkState, ProfileStep
from testbed.spec.link_profile_fields import GENERATOR_FIELDS, GENERATORS, PROFILE_FILE_FIELDS
from testbed.spec.specfile import FieldReader, SpecLoader, split_unit_error
from testbed.spec.topology import MAX_DELAY_US
from testbed.spec.units import UnitError, format_rate, parse_duration_us, parse_percent, parse_rate_bps

#: bytes one Mahimahi delivery opportunity carries (mm-link(1): "an MTU-sized packet"; Mahimahi's
#: traces are written for 1500-byte packets, Netravali et al., USENIX ATC 2015, section 3)
MAHIMAHI_PACKET_BYTES = 1500
CSV_COLUMNS = ("time", "rate", "delay", "jitter", "loss")


def read_profile(source: str, raw: Any, where: str, base: LinkState, folder: Path) -> LinkProfile:
    """The profile a link's ``profile`` value gives (module doc); ``base``: the link's own
    figures; ``folder``: where relative paths start. Raises SpecError naming the field (or the
    file, row and column), the value and the fix."""
    if isinstance(raw, str):
        raw = {"file": raw}
    if not isinstance(raw, dict):
        raise SpecError(
            source, where, raw, "is not a file name or a mapping", "write a path, or {generator: NAME, ...}"
        )
    if "generator" in raw:
        name = raw["generator"]
        if name not in GENERATOR_FIELDS:
            raise SpecError(
                source, f"{where}.generator", name, "is not a known generator", f"use one of {', '.join(GENERATORS)}"
            )
        return _generated(FieldReader(source, raw, where, GENERATOR_FIELDS[name]), name, base)
    r = FieldReader(source, raw, where, PROFILE_FILE_FIELDS)
    path = Path(str(raw["file"]))
    path = path if path.is_absolute() else folder / path
    if not path.is_file():
        raise r.fail("file", f"does not exist (looked for {path})", "give a path relative to the topology file")
    loop, period = r.value("loop"), r.value("period")
    if path.suffix in (".yaml", ".yml"):
        import yaml

        try:
            inner = yaml.load(path.read_text(), Loader=SpecLoader)
        except (yaml.YAMLError, UnicodeDecodeError) as e:
            raise r.fail("file", f"is not valid YAML ({type(e).__name__})", "fix the file's syntax") from None
        if isinstance(inner, dict) and "file" in inner:
            raise SpecError(
                str(path), "file", inner["file"], "names another file", "give the profile itself: {generator: ...}"
            )
        return read_profile(str(path), inner, "(profile)", base, path.parent)
    if path.suffix == ".csv":
        steps = read_csv_steps(path, base)
        if loop and period is None:
            raise r.fail("loop", "is true but no 'period' is given", "add period: (longer than the last row's time)")
        if period is not None and not loop:
            raise r.fail("period", "is given but 'loop' is not true", "add loop: true, or leave period out")
        if period is not None and period <= steps[-1].t_us:
            raise r.fail(
                "period", f"is not longer than the last row's time ({steps[-1].t_us} us)", "give a longer period"
            )
        return LinkProfile(steps, period if loop else None, str(path))
    if period is not None:
        raise r.fail(
            "period", "is given for a Mahimahi trace, whose period is its last line's time", "leave period out"
        )
    return read_mahimahi(path, base, r.value("granularity"), True if loop is None else loop)


def _generated(r: FieldReader, name: str, base: LinkState) -> LinkProfile:
    v = {k: r.value(k) for k in r.table.keys}
    text = f"{name}(" + ", ".join(f"{k}={r.data[k]}" for k in r.table.keys if k in r.data and k != "generator") + ")"
    if "low" in v and v["high"] < v["low"]:
        raise r.fail("high", f"is below low ({format_rate(v['low'])})", "give a high rate of at least the low one")
    if name == "diurnal":
        step_us = v["step"] or max(1, v["period"] // 24)
        if step_us > v["period"]:
            raise r.fail("step", "is longer than the period", "give a step no longer than the period")
        return gen.diurnal(base, v["period"], v["low"], v["high"], step_us, text)
    if name == "random_walk":
        start = v["start"] if v["start"] is not None else min(max(base.rate_bps, v["low"]), v["high"])
        if not v["low"] <= start <= v["high"]:
            raise r.fail("start", "is outside [low, high]", "give a start rate between low and high")
        return gen.random_walk(base, start, v["low"], v["high"], v["sigma"], v["step"], v["duration"], v["seed"], text)
    if name == "on_off":
        return gen.on_off(base, v["up"], v["down"], v["start"] == "up", text)
    after = LinkState(
        v["rate"] if v["rate"] is not None else base.rate_bps,
        v["delay"] if v["delay"] is not None else base.delay_us,
        v["jitter"] if v["jitter"] is not None else base.jitter_us,
        v["loss"] if v["loss"] is not None else base.loss_pct,
    )
    if after.jitter_us > after.delay_us:
        raise r.fail(
            "jitter", f"is larger than the delay ({after.delay_us} us)", "use a jitter no larger than the delay"
        )
    return gen.step(base, v["at"], after, text)


def read_csv_steps(path: Path, base: LinkState) -> tuple[ProfileStep, ...]:
    """The steps of a CSV profile (module doc); a first row after 0 s is preceded by ``base``.
    Raises SpecError naming the file, the row (its line number) and the column."""
    source = str(path)
    try:
        cells = list(csv.reader(io.StringIO(path.read_text())))
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(source, "(file)", path.name, f"cannot be read ({e})", "give a UTF-8 CSV file") from None
    rows = [(n, row) for n, row in enumerate(cells, 1) if any(c.strip() for c in row)]
    if not rows:
        raise SpecError(source, "(file)", path.name, "is empty", f"write a header ({', '.join(CSV_COLUMNS)}) and rows")
    header = [c.strip().lower() for c in rows[0][1]]
    for c in header:
        if c not in CSV_COLUMNS:
            raise SpecError(source, "line 1", c, "is not a known column", f"use columns among {', '.join(CSV_COLUMNS)}")
    if "time" not in header or len(header) < 2 or len(set(header)) != len(header):
        raise SpecError(
            source,
            "line 1",
            ",".join(header),
            "does not name 'time' and at least one other column once each",
            "write e.g. time,rate,delay",
        )
    if len(rows) < 2:
        raise SpecError(source, "(file)", path.name, "has a header and no rows", "add one row per step")
    parsers = {
        "time": parse_duration_us,
        "rate": _csv_rate,
        "delay": parse_duration_us,
        "jitter": parse_duration_us,
        "loss": parse_percent,
    }
    state, last_t = base, -1
    steps: list[ProfileStep] = []
    for n, row in rows[1:]:
        if len(row) != len(header):
            raise SpecError(
                source,
                f"line {n}",
                ",".join(row),
                f"has {len(row)} cells for {len(header)} columns",
                "give one cell per column (empty keeps the value)",
            )
        got: dict[str, Any] = {}
        for col, cell in zip(header, row):
            cell = cell.strip()
            if not cell:
                continue
            if col == "rate" and cell.lower() == "up":  # the link's own rate
                got[col] = base.rate_bps
                continue
            try:
                got[col] = parsers[col](cell)
            except UnitError as e:
                raise SpecError(source, f"line {n}, column {col}", cell, *split_unit_error(e)) from None
        if "time" not in got:
            raise SpecError(source, f"line {n}, column time", "", "is empty", "give each row its time, such as 30s")
        t = got.pop("time")
        if t <= last_t:
            raise SpecError(
                source,
                f"line {n}, column time",
                t,
                f"is not after the row before ({last_t} us)",
                "give rows in increasing time",
            )
        state = LinkState(
            got.get("rate", state.rate_bps),
            got.get("delay", state.delay_us),
            got.get("jitter", state.jitter_us),
            got.get("loss", state.loss_pct),
        )
        _check_state(source, f"line {n}", state)
        if t > 0 and not steps:
            steps.append(ProfileStep(0, base))
        steps.append(ProfileStep(t, state))
        last_t = t
    return tuple(steps)


def _csv_rate(cell: str) -> int:
    if cell.lower() == "down":
        return 0
    rate = parse_rate_bps(cell)
    if rate < MIN_RATE_BPS:
        raise UnitError(
            f"is below {format_rate(MIN_RATE_BPS)}, the least rate of a link that is up; "
            "write 'down' for an outage, or a larger rate"
        )
    return rate


def _check_state(source: str, where: str, s: LinkState) -> None:
    if s.delay_us > MAX_DELAY_US:
        raise SpecError(
            source, f"{where}, column delay", s.delay_us, "is above 10s", "write a delay between 0ms and 10s"
        )
    if s.jitter_us > s.delay_us:
        raise SpecError(
            source,
            f"{where}, column jitter",
            s.jitter_us,
            f"is larger than the delay ({s.delay_us} us)",
            "use a jitter no larger than the delay",
        )
    if not 0 <= s.loss_pct < 100:
        raise SpecError(
            source,
            f"{where}, column loss",
            s.loss_pct,
            "is not below 100%",
            "write a loss from 0% up to (not including) 100%",
        )


def mahimahi_rates(times_ms: list[int], granularity_us: int) -> tuple[list[int], int, dict[str, float]]:
    """A Mahimahi trace's delivery opportunities (ms, non-decreasing) as rates (bit/s) per step
    of ``granularity_us``, the trace's period (µs: its last time, as mm-link repeats it), and
    the conversion's error: ``gap_bytes``, the largest difference at any opportunity between the
    bytes the trace has delivered and those the steps have; ``gap_ms``, that gap at the trace's
    mean rate; ``empty_steps``, steps with no opportunity (set to ``MIN_RATE_BPS``, as a link that
    is up cannot carry less); ``mean_rate_error``, the steps' mean rate over the trace's, minus 1.
    Raises ValueError for an empty trace or one whose last time is 0."""
    if not times_ms or times_ms[-1] <= 0:
        raise ValueError("a trace needs opportunities after 0 ms")
    period_us = times_ms[-1] * 1000
    n = -(-period_us // granularity_us)
    counts = [0] * n
    for t in times_ms:  # an opportunity at t ms is the step's that ends at or after t
        counts[min(max(0, t * 1000 - 1) // granularity_us, n - 1)] += 1
    widths = [min(granularity_us, period_us - i * granularity_us) for i in range(n)]
    rates = [max(MIN_RATE_BPS, round(c * MAHIMAHI_PACKET_BYTES * 8 * 1e6 / w)) for c, w in zip(counts, widths)]
    # cumulative delivery at each opportunity: the trace's, and the steps' (piecewise linear)
    before = [0.0]  # the steps' bytes before each step
    for r, w in zip(rates, widths):
        before.append(before[-1] + r * w / 8e6)
    gap, delivered = 0.0, 0
    for t in times_ms:
        delivered += MAHIMAHI_PACKET_BYTES
        t_us = t * 1000
        i = min(max(0, t_us - 1) // granularity_us, n - 1)
        stepped = before[i] + rates[i] * (t_us - i * granularity_us) / 8e6
        gap = max(gap, abs(delivered - stepped))
    mean_bps = len(times_ms) * MAHIMAHI_PACKET_BYTES * 8 * 1e6 / period_us
    steps_bps = sum(r * w for r, w in zip(rates, widths)) / period_us
    error = {
        "gap_bytes": gap,
        "gap_ms": gap * 8 / mean_bps * 1e3,
        "empty_steps": float(sum(1 for c in counts if c == 0)),
        "mean_rate_error": steps_bps / mean_bps - 1,
    }
    return rates, period_us, error


def read_mahimahi(path: Path, base: LinkState, granularity_us: int, loop: bool) -> LinkProfile:
    """A Mahimahi trace as rate steps (the link's own delay, jitter and loss), its conversion's
    error in ``note``. Raises SpecError naming the line of a time that is not a whole number of
    milliseconds or goes back."""
    source = str(path)
    times: list[int] = []
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(
            source, "(file)", path.name, f"cannot be read ({e})", "give a Mahimahi trace: one time in ms per line"
        ) from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            t = int(line.strip())
        except ValueError:
            raise SpecError(
                source,
                f"line {n}",
                line.strip()[:40],
                "is not a whole number of milliseconds",
                "write one delivery time (ms) per line, or a CSV profile (.csv)",
            ) from None
        if t < 0 or (times and t < times[-1]):
            raise SpecError(source, f"line {n}", t, "goes back in time", "give times that never decrease")
        times.append(t)
    try:
        rates, period_us, err = mahimahi_rates(times, granularity_us)
    except ValueError as e:
        raise SpecError(
            source,
            "(file)",
            path.name,
            f"holds no usable trace ({e})",
            "give a Mahimahi trace: one time in ms per line",
        ) from None
    steps = tuple(
        ProfileStep(i * granularity_us, LinkState(r, base.delay_us, base.jitter_us, base.loss_pct))
        for i, r in enumerate(rates)
    )
    note = (
        f"Mahimahi trace {path.name}: {len(times)} opportunities over {period_us / 1e6:g} s "
        f"(mean {format_rate(len(times) * MAHIMAHI_PACKET_BYTES * 8e6 / period_us)}) as {len(rates)} steps of "
        f"{granularity_us / 1000:g} ms; largest gap in delivered bytes {err['gap_bytes']:.0f} B "
        f"({err['gap_ms']:.2f} ms at the mean rate); {int(err['empty_steps'])} empty step(s) at "
        f"{format_rate(MIN_RATE_BPS)}; mean rate {err['mean_rate_error']:+.3%}"
    )
    return LinkProfile(steps, period_us if loop else None, source, note)
