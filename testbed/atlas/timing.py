"""What the grant loop needs of a grant plan, per link direction, in ns and bytes (``HopTiming``),
and its JSON form: the runner hands it to the controller process in ``controller_plan.json``, and
in a ``replan`` file once the first iteration's compute is profiled (real compute). Pure data."""

from __future__ import annotations

from dataclasses import dataclass, field

from testbed.plan.grant_plan import GrantPlan, Hop, Transfer


@dataclass(frozen=True)
class HopTiming:
    """What the loop needs of one hop's plan, in ns and bytes: how long a transfer needs the link,
    the link's one-way delay, a grant's deadline, the wire bytes a transfer puts through its class,
    the link's rate and the plan's order (position by transfer)."""

    transfer_ns: int
    delay_ns: int
    deadline_ns: int
    wire_bytes: int
    rate_bps: int
    position: dict[Transfer, int] = field(default_factory=dict)

    @staticmethod
    def from_plan(plan: GrantPlan, goodput_fraction: float) -> dict[Hop, HopTiming]:
        """Each hop's timing from a grant plan; wire bytes are the payload over TCP's share of a frame."""
        return {
            h.hop: HopTiming(
                int(h.transfer_s * 1e9),
                int(h.delay_s * 1e9),
                int(h.deadline_s * 1e9),
                int(plan.bytes_per_transfer / goodput_fraction),
                h.rate_bps,
                {t: i for i, t in enumerate(h.order)},
            )
            for h in plan.hops
        }


def timing_to_json(timing: dict[Hop, HopTiming]) -> list[dict]:
    """``timing`` as JSON rows (one per hop; the order as ``[kind, stage, microbatch, replica]``)."""
    return [
        {
            "src": h.src,
            "dst": h.dst,
            "transfer_ns": t.transfer_ns,
            "delay_ns": t.delay_ns,
            "deadline_ns": t.deadline_ns,
            "wire_bytes": t.wire_bytes,
            "rate_bps": t.rate_bps,
            "order": [
                [x.kind, x.stage, x.microbatch, x.replica] for x in sorted(t.position, key=lambda x: t.position[x])
            ],
        }
        for h, t in timing.items()
    ]


def timing_from_json(rows: list[dict]) -> dict[Hop, HopTiming]:
    """``timing_to_json``'s rows back. Raises KeyError or TypeError for rows of another form."""
    return {
        Hop(t["src"], t["dst"]): HopTiming(
            t["transfer_ns"],
            t["delay_ns"],
            t["deadline_ns"],
            t["wire_bytes"],
            t["rate_bps"],
            {Transfer(*x): i for i, x in enumerate(t["order"])},
        )
        for t in rows
    }
