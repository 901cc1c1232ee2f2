"""The fields of a link's ``profile`` (``fields.FieldTable``): the file form and each generator's
mapping. Read by ``link_profile_file.py`` and listed on the reference page."""

from __future__ import annotations

from typing import Any

from testbed.spec.fields import REQUIRED, Field, FieldTable
from testbed.spec.link_profile import MIN_RATE_BPS
from testbed.spec.topology import MAX_DELAY_US
from testbed.spec.units import format_rate

GENERATORS = ("diurnal", "random_walk", "on_off", "step")

_RATE: dict[str, Any] = {"low": MIN_RATE_BPS, "fix": f"write a rate of at least {format_rate(MIN_RATE_BPS)}"}

PROFILE_FILE_FIELDS = FieldTable(
    "topology: links[i].profile (file)",
    "links[i].profile",
    "A profile read from a file: a CSV of steps, or a Mahimahi packet-delivery trace.",
    (
        Field("file", "path", "the file, relative to the topology file", default=REQUIRED),
        Field(
            "granularity",
            "duration",
            "a Mahimahi trace's rate steps (its conversion error grows with it)",
            "µs",
            100_000,
            low=1_000,
            high=60_000_000,
            fix="write a step between 1ms and 60s, such as 100ms",
        ),
        Field("period", "duration", "a looping CSV starts again after this long", "µs", low=0, low_open=True),
        Field("loop", "bool", "start the profile again after its period", default_text="a trace: true; a CSV: false"),
    ),
)

GENERATOR_FIELDS = {
    "diurnal": FieldTable(
        "topology: links[i].profile (diurnal)",
        "links[i].profile",
        "The rate over a day: lowest at the start, highest half a period in, in steps; loops.",
        (
            Field("generator", "choice", "`diurnal`", default=REQUIRED, choices=GENERATORS),
            Field("period", "duration", "the day's length (compress it: 120s)", "µs", REQUIRED, low=0, low_open=True),
            Field("low", "rate", "the lowest rate", "bit/s", REQUIRED, **_RATE),
            Field("high", "rate", "the highest rate", "bit/s", REQUIRED, rule="at least `low`", **_RATE),
            Field(
                "step", "duration", "how long each rate holds", "µs", default_text="period / 24", low=0, low_open=True
            ),
        ),
    ),
    "random_walk": FieldTable(
        "topology: links[i].profile (random_walk)",
        "links[i].profile",
        "The rate moving at random (seeded) within bounds, then holding.",
        (
            Field("generator", "choice", "`random_walk`", default=REQUIRED, choices=GENERATORS),
            Field("low", "rate", "the lowest rate", "bit/s", REQUIRED, **_RATE),
            Field("high", "rate", "the highest rate", "bit/s", REQUIRED, rule="at least `low`", **_RATE),
            Field(
                "start", "rate", "the first rate", "bit/s", default_text="the link's rate, within the bounds", **_RATE
            ),
            Field("sigma", "number", "each step's spread of the rate's logarithm", "", 0.1, low=0, high=2),
            Field("step", "duration", "how long each rate holds", "µs", REQUIRED, low=0, low_open=True),
            Field("duration", "duration", "how long the walk goes on", "µs", REQUIRED, low=0, low_open=True),
            Field("seed", "int", "the walk's random seed", "", 1, low=0),
        ),
    ),
    "on_off": FieldTable(
        "topology: links[i].profile (on_off)",
        "links[i].profile",
        "A flapping link: up, then down (carrying nothing), again and again.",
        (
            Field("generator", "choice", "`on_off`", default=REQUIRED, choices=GENERATORS),
            Field("up", "duration", "how long the link is up", "µs", REQUIRED, low=0, low_open=True),
            Field("down", "duration", "how long the link is down", "µs", REQUIRED, low=0, low_open=True),
            Field("start", "choice", "which comes first", "", "up", choices=("up", "down")),
        ),
    ),
    "step": FieldTable(
        "topology: links[i].profile (step)",
        "links[i].profile",
        "One change at a given time; the link holds it from then on.",
        (
            Field("generator", "choice", "`step`", default=REQUIRED, choices=GENERATORS),
            Field("at", "duration", "when the change comes", "µs", REQUIRED, low=0),
            Field("rate", "rate", "the rate from then on", "bit/s", default_text="the link's", **_RATE),
            Field(
                "delay",
                "duration",
                "the one-way delay from then on",
                "µs",
                default_text="the link's",
                low=0,
                high=MAX_DELAY_US,
            ),
            Field(
                "jitter",
                "duration",
                "the jitter from then on",
                "µs",
                default_text="the link's",
                low=0,
                high=MAX_DELAY_US,
            ),
            Field(
                "loss",
                "percent",
                "the loss from then on",
                "%",
                default_text="the link's",
                low=0,
                high=100,
                high_open=True,
            ),
        ),
    ),
}
