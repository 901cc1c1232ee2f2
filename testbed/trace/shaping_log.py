"""The shaping-change log (``shaping.jsonl``): one line per HTB class added or changed, by the
network backend or by Atlas's controller, with the CLOCK_MONOTONIC time it was issued."""

from __future__ import annotations

from typing import Any

SHAPING_LOG = "shaping.jsonl"
#: across machines, the control relays' log of the grants they applied on their machine, in the
#: runner's clock, and of their counts at the end (``net/remote/control_relay.py``)
RELAY_LOG = "relay.jsonl"
#: the other lines' events: a WAN link taken down and brought up, or given a rate by ``testbed
#: link rate`` (``net/link_control.py``), a step of a link's profile applied
#: (``net/profile_player.py``), and routes moved off links seen down or back onto them
#: (``net/failover.py``)
LINK_DOWN, LINK_UP, LINK_RATE = "link_down", "link_up", "link_rate"
PROFILE_STEP, REROUTE = "profile_step", "reroute"


def class_id(minor: int) -> str:
    """An HTB class's id as tc(8) writes it: ``1:<minor in hex>`` (``1:20``)."""
    return f"1:{minor:x}"


def class_minor(classid: str) -> int:
    """The minor of a ``class_id`` text (``"1:20"`` -> 0x20). Raises ValueError for anything else."""
    major, _, minor = classid.partition(":")
    if major != "1" or not minor:
        raise ValueError(f"not an HTB class id of the testbed's tree: {classid!r}")
    return int(minor, 16)


def shaping_record(
    t_ns: int, event: str, netns: str, ifname: str, minor: int, rate_bps: int, ceil_bps: int, duration_ns: int
) -> dict[str, Any]:
    """One line of ``shaping.jsonl``: ``event`` ``add`` or ``change`` of HTB class ``1:minor`` on
    ``ifname`` in ``netns``, issued at ``t_ns`` and acknowledged by the kernel ``duration_ns`` later;
    rates in bit/s."""
    return {
        "t_ns": t_ns,
        "event": event,
        "netns": netns,
        "ifname": ifname,
        "classid": class_id(minor),
        "rate_bps": rate_bps,
        "ceil_bps": ceil_bps,
        "duration_ns": duration_ns,
    }
