"""The HTB classes Atlas's grants act on, as pure data: one class per data-parallel pipeline on
every crossed WAN egress (``1:(CLASS_BASE + replica)``), the floor a held class keeps
(``floor_bps``), and what applies the grant loop's decisions to them (``Switch``:
``switch.GrantSwitch`` in the controller process, a recorder in tests)."""

from __future__ import annotations

from typing import Protocol

from testbed.atlas.channel import DONE
from testbed.plan.grant_plan import FLOOR_SHARE, Hop

#: the minor number of replica 0's class; replica r's is CLASS_BASE + r
CLASS_BASE = 0x20


def floor_bps(link_rate_bps: int, share: float = FLOOR_SHARE) -> int:
    """Rate a held class keeps: ``share`` of the link, at least 8 kbit/s (HTB needs a rate)."""
    return max(int(link_rate_bps * share), 8000)


class Switch(Protocol):
    """What applies the grant loop's decisions (``switch.GrantSwitch``; a recorder in tests)."""

    def apply(self, hop: Hop, replica: int | str, t_ready_ns: int | None = None, event: str = "grant") -> int: ...

    def keep(self, hop: Hop, replica: int, t_ready_ns: int) -> None: ...

    def relink(self, batches: dict[Hop, dict]) -> None: ...

    def release(
        self,
        hop: Hop,
        replica: int,
        t_ns: int,
        handover: bool,
        reason: str = DONE,
        held_ns: int | None = None,
        sent_bytes: int | None = None,
        rate_bps: int | None = None,
    ) -> None: ...
