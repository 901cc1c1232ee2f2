"""Atlas's grant logic as pure code (DESIGN.md section 1, item 4): which WAN egresses a stage
boundary's transfers cross, and, per link direction, which data-parallel pipeline's transfer holds
the link. Each pipeline has its own HTB class (``1:(CLASS_BASE + replica)``) on every crossed
egress; the holder's class gets the link, the others a floor (``floor_bps``).

``GrantQueue``: one link direction, earliest ready first, one transfer at a time. ``GrantLoop``:
the controller's state machine over the workers' control messages (``channel.py``); it tells a
switch (``switch.GrantSwitch`` in the controller process, or any object with ``apply`` and
``release``) what to apply. Nothing here touches the kernel.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Protocol

from testbed.atlas.channel import DONE, READY, RECV, TransferKey, transfer_key
from testbed.plan.placement import WorkerSpec
from testbed.spec.routing import RoutingTable

CLASS_BASE = 0x20
FLOOR_SHARE = 0.05


def floor_bps(link_rate_bps: int, share: float = FLOOR_SHARE) -> int:
    """Rate a held class keeps: ``share`` of the link, at least 8 kbit/s (HTB needs a rate)."""
    return max(int(link_rate_bps * share), 8000)


@dataclass(frozen=True)
class Hop:
    """One WAN egress (router of ``src`` towards neighbour ``dst``) crossed by a boundary's flows."""

    src: str
    dst: str


def boundary_hops(workers: list[WorkerSpec], routes: RoutingTable) -> dict[tuple[int, int], list[Hop]]:
    """For each (sender rank, receiver rank) pair of neighbouring stages in different DCs (both
    directions), the WAN egresses its packets cross, in order."""
    by = {(w.stage, w.replica): w for w in workers}
    out = {}
    for w in workers:
        nxt = by.get((w.stage + 1, w.replica))
        if nxt is None or nxt.dc == w.dc:
            continue
        for a, b in ((w, nxt), (nxt, w)):
            dcs = routes.route(a.dc, b.dc).dcs
            out[(a.rank, b.rank)] = [Hop(x, y) for x, y in zip(dcs, dcs[1:])]
    return out


class GrantQueue:
    """Pure grant logic for one link direction: earliest ready first, one transfer at a time.
    ``ready``/``done`` return the replica that should hold the grant now (or None: no change)."""

    def __init__(self) -> None:
        self.waiting: deque[tuple[int, TransferKey]] = deque()  # (replica, transfer key)
        self.current: tuple[int, TransferKey] | None = None

    def ready(self, replica: int, key: TransferKey) -> int | None:
        if self.current is None:
            self.current = (replica, key)
            return replica
        self.waiting.append((replica, key))
        return None

    def done(self, key: TransferKey) -> int | None:
        if self.current is not None and self.current[1] == key:
            self.current = self.waiting.popleft() if self.waiting else None
            return self.current[0] if self.current else None
        self.waiting = deque(x for x in self.waiting if x[1] != key)  # finished before its grant
        return None


class Switch(Protocol):
    """What applies the grant loop's decisions (``switch.GrantSwitch``; a recorder in tests)."""

    def apply(self, hop: Hop, replica: int | str, t_ready_ns: int | None = None, event: str = "grant") -> int: ...

    def release(self, hop: Hop, replica: int, t_ns: int, handover: bool) -> None: ...


class GrantLoop:
    """The controller's state machine over control messages (pure, apart from ``switch.apply``):
    a transfer is ready once its sender (``ready``) and receiver (``recv``) have both reported;
    ``done`` ends it. Each crossed hop's GrantQueue decides who holds the hop."""

    def __init__(self, switch: Switch, replica_of: dict[int, int], hops: dict[tuple[int, int], list[Hop]]) -> None:
        self.switch, self.replica_of, self.hops = switch, replica_of, hops
        self.queues = {h: GrantQueue() for hs in hops.values() for h in hs}
        self.granted: dict[Hop, int | None] = dict.fromkeys(self.queues)
        self._half: dict[TransferKey, set[str]] = {}

    def handle(self, msg: dict, t_ns: int) -> None:
        """One control message (``channel.parse_message``'s form) received at ``t_ns``. Raises
        ValueError for an unknown event."""
        key = transfer_key(msg)
        if msg["ev"] in (READY, RECV):
            sides = self._half.setdefault(key, set())
            sides.add(msg["ev"])
            if len(sides) < 2:
                return
            del self._half[key]
        elif msg["ev"] != DONE:
            raise ValueError(f"unknown control message {msg!r}")
        replica = self.replica_of[msg["src"]]
        for hop in self.hops.get((msg["src"], msg["dst"]), []):
            q = self.queues[hop]
            if msg["ev"] == DONE:
                holder = q.current
                nxt = q.done(key)
                if holder is not None and holder[1] == key:
                    self.switch.release(hop, holder[0], t_ns, handover=nxt is not None)
            else:
                nxt = q.ready(replica, key)
            if nxt is not None and nxt != self.granted[hop]:
                self.switch.apply(hop, nxt, t_ns)
                self.granted[hop] = nxt
