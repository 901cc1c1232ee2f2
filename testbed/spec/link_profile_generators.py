"""Link profiles made from a few parameters (``profile: {generator: NAME, ...}`` in a topology):

- ``diurnal``: the rate follows a day's curve, lowest at the start and highest half a period in,
  ``low + (high - low) (1 - cos(2 pi t / period)) / 2``, held in steps of ``step`` (each step takes
  the curve's value at its middle); loops every period. Capacity left to a tenant over a day is
  of this shape (the peak of other tenants' traffic is the trough of what is left).
- ``random_walk``: the rate moves each ``step`` by a factor ``exp(N(0, sigma))`` (seeded),
  reflected into ``[low, high]``, for ``duration``; then holds.
- ``on_off``: the link is up for ``up``, down for ``down``, and again (a flapping link); loops.
- ``step``: one change at ``at`` to the rate, delay, jitter or loss given (the others as the
  link's own); then holds.

Pure: each function takes the link's own state and the parameters already parsed (µs, bit/s,
percent) and returns a ``LinkProfile``.
"""

from __future__ import annotations

import math
import random

from testbed.spec.link_profile import LinkProfile, LinkState, ProfileStep


def diurnal(base: LinkState, period_us: int, low_bps: int, high_bps: int, step_us: int, source: str) -> LinkProfile:
    """The diurnal curve (module doc) in ``ceil(period / step)`` steps, looping every period."""
    steps = []
    n = math.ceil(period_us / step_us)
    for i in range(n):
        mid = (i + 0.5) * step_us
        frac = (1 - math.cos(2 * math.pi * min(mid, period_us) / period_us)) / 2
        rate = round(low_bps + (high_bps - low_bps) * frac)
        steps.append(ProfileStep(i * step_us, LinkState(rate, base.delay_us, base.jitter_us, base.loss_pct)))
    return LinkProfile(tuple(steps), period_us, source)


def random_walk(
    base: LinkState,
    start_bps: int,
    low_bps: int,
    high_bps: int,
    sigma: float,
    step_us: int,
    duration_us: int,
    seed: int,
    source: str,
) -> LinkProfile:
    """A seeded random walk of the rate in log space (module doc), reflected into [low, high]."""
    rng = random.Random(seed)
    lo, hi = math.log(low_bps), math.log(high_bps)
    x = math.log(start_bps)
    steps = []
    for i in range(max(1, math.ceil(duration_us / step_us))):
        steps.append(
            ProfileStep(i * step_us, LinkState(round(math.exp(x)), base.delay_us, base.jitter_us, base.loss_pct))
        )
        x += rng.gauss(0.0, sigma)
        while not lo <= x <= hi and hi > lo:  # reflect at the bounds
            x = 2 * lo - x if x < lo else 2 * hi - x
    return LinkProfile(tuple(steps), None, source)


def on_off(base: LinkState, up_us: int, down_us: int, start_up: bool, source: str) -> LinkProfile:
    """Up for ``up_us``, down for ``down_us``, looping (``start_up``: which comes first)."""
    up, down = base, LinkState(0, base.delay_us, base.jitter_us, base.loss_pct)
    first, second = (up, down) if start_up else (down, up)
    first_us = up_us if start_up else down_us
    return LinkProfile((ProfileStep(0, first), ProfileStep(first_us, second)), up_us + down_us, source)


def step(base: LinkState, at_us: int, after: LinkState, source: str) -> LinkProfile:
    """The link's own state, then ``after`` from ``at_us`` on."""
    if at_us == 0:
        return LinkProfile((ProfileStep(0, after),), None, source)
    return LinkProfile((ProfileStep(0, base), ProfileStep(at_us, after)), None, source)
