"""A WAN link's profile: how its rate, one-way delay, jitter and loss change over time, as a list
of steps from the moment the link comes up.

Pure data. A profile is read from a topology's link (``profile:``, ``link_profile_file.py``): a CSV
of steps, a Mahimahi packet-delivery trace turned into rate steps, or a generator
(``link_profile_generators.py``). Every step is a whole state of the link (the link's own values
filled in where the source leaves a figure out), so a player applies a step without knowing the
steps before it. A rate of 0 is an outage: the link carries nothing either way
(``net/link_control.py``). A profile that loops starts again at ``period_us``; one that does not
holds its last step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: the least rate a step may set on a link that is up: HTB's floor as the testbed sets it
#: (``net/link_control.set_rate``), 8 kbit/s
MIN_RATE_BPS = 8_000


@dataclass(frozen=True)
class LinkState:
    """A link's figures at one time, each direction: ``rate_bps`` (0: down), one-way ``delay_us``,
    ``jitter_us`` (half-width of a uniform spread) and ``loss_pct`` (per-packet drop probability,
    percent)."""

    rate_bps: int
    delay_us: int
    jitter_us: int = 0
    loss_pct: float = 0.0

    @property
    def up(self) -> bool:
        return self.rate_bps > 0

    def differs(self, other: LinkState) -> tuple[str, ...]:
        """The figures that differ from ``other``'s: a subset of ``rate``, ``delay`` (delay or
        jitter), ``loss``, in that order."""
        out = []
        if self.rate_bps != other.rate_bps:
            out.append("rate")
        if (self.delay_us, self.jitter_us) != (other.delay_us, other.jitter_us):
            out.append("delay")
        if self.loss_pct != other.loss_pct:
            out.append("loss")
        return tuple(out)


@dataclass(frozen=True)
class ProfileStep:
    """From ``t_us`` after the link came up (µs), the link is in ``state``."""

    t_us: int
    state: LinkState


@dataclass(frozen=True)
class LinkProfile:
    """Steps in increasing time, the first at 0 µs. ``period_us``: the profile starts again after
    this long (at least the last step's time; None: it holds its last step). ``source``: what it
    was read from (a file, or a generator with its parameters); ``note``: what reading it cost
    (a Mahimahi trace's conversion error), for records and the summary."""

    steps: tuple[ProfileStep, ...]
    period_us: int | None = None
    source: str = ""
    note: str = ""

    def __post_init__(self) -> None:
        if not self.steps or self.steps[0].t_us != 0:
            raise ValueError("a profile's first step is at 0 us")
        times = [s.t_us for s in self.steps]
        if any(b <= a for a, b in zip(times, times[1:])):
            raise ValueError("a profile's step times increase")
        if self.period_us is not None and self.period_us <= times[-1]:
            raise ValueError("a looping profile's period is longer than its last step's time")

    @property
    def has_outage(self) -> bool:
        return any(not s.state.up for s in self.steps)

    @property
    def varies_delay(self) -> bool:
        """Whether the delay, jitter or loss ever changes (the delay mechanism must take changes)."""
        first = self.steps[0].state
        return any(set(s.state.differs(first)) & {"delay", "loss"} for s in self.steps)

    def state_at(self, t_us: float) -> LinkState:
        """The link's state ``t_us`` after it came up."""
        if self.period_us is not None:
            t_us %= self.period_us
        state = self.steps[0].state
        for step in self.steps:
            if step.t_us > t_us:
                break
            state = step.state
        return state

    def changes(self, until_us: int) -> list[ProfileStep]:
        """Each change from the start up to ``until_us`` (loops unrolled), the first step (0 µs)
        included; a step that repeats the state before it is left out."""
        out: list[ProfileStep] = []
        base = 0
        while base < until_us:
            for step in self.steps:
                t = base + step.t_us
                if t >= until_us:
                    break
                if not out or out[-1].state != step.state:
                    out.append(ProfileStep(t, step.state))
            if self.period_us is None:
                break
            base += self.period_us
        return out

    def phases(self, until_us: int) -> list[tuple[int, int, LinkState]]:
        """``(start_us, end_us, state)`` of each stretch of constant state up to ``until_us``."""
        changes = self.changes(until_us)
        ends = [c.t_us for c in changes[1:]] + [until_us]
        return [(c.t_us, end, c.state) for c, end in zip(changes, ends)]

    def to_dict(self) -> dict[str, Any]:
        return {
            "steps": [
                [s.t_us, s.state.rate_bps, s.state.delay_us, s.state.jitter_us, s.state.loss_pct] for s in self.steps
            ],
            "period_us": self.period_us,
            "source": self.source,
            "note": self.note,
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> LinkProfile:
        """``to_dict``'s record back. Raises KeyError, TypeError or ValueError for data of another form."""
        steps = tuple(
            ProfileStep(int(t), LinkState(int(r), int(dl), int(j), float(lo))) for t, r, dl, j, lo in d["steps"]
        )
        return LinkProfile(steps, d.get("period_us"), d.get("source", ""), d.get("note", ""))
