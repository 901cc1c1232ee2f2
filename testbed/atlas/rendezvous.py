"""The two reports of each WAN transfer, paired: the sender's ``ready`` and the receiver's ``recv``
(``channel.py``). A transfer is ready once both have come; one whose other report was lost counts
as ready once its first has waited its expiry; transfers paired and transfers done are remembered
(the last ``DONE_MEMORY`` of each), so that a late or repeated report about one is ignored (a
control message duplicated on its way, as a relay across machines may: ``net/remote/control_relay.py``).
Pure bookkeeping; times are CLOCK_MONOTONIC ns."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from testbed.atlas.channel import READY, RECV, TransferKey

#: transfers remembered as done, so that a late or repeated message about one is ignored
DONE_MEMORY = 4096


class Rendezvous:
    """Half-reported transfers and the ones done (see the module doc)."""

    def __init__(self) -> None:
        self.half: dict[TransferKey, dict[str, int]] = {}
        self._done: OrderedDict[TransferKey, None] = OrderedDict()
        self._paired: OrderedDict[TransferKey, None] = OrderedDict()
        #: reports ignored because their transfer was already paired (repeated messages)
        self.repeated = 0
        #: transfers taken as ready because their other report never came
        self.expired = 0

    def is_done(self, key: TransferKey) -> bool:
        return key in self._done

    def report(self, key: TransferKey, ev: str, t_ns: int) -> tuple[int, int] | None:
        """Record ``ev`` (READY or RECV) of ``key`` at ``t_ns``; (sender's time, receiver's time)
        once both have come, else None (also for a report of a transfer already paired)."""
        if key in self._paired:
            self.repeated += 1
            return None
        sides = self.half.setdefault(key, {})
        sides[ev] = t_ns
        if len(sides) < 2:
            return None
        del self.half[key]
        self._pair(key)
        return sides[READY], sides[RECV]

    def _pair(self, key: TransferKey) -> None:
        self._paired[key] = None
        if len(self._paired) > DONE_MEMORY:
            self._paired.popitem(last=False)

    def finish(self, key: TransferKey) -> None:
        """``key`` is done: forget its half, remember it as done."""
        self.half.pop(key, None)
        self._done[key] = None
        if len(self._done) > DONE_MEMORY:
            self._done.popitem(last=False)

    def expire(self, t_ns: int, expiry_ns: Callable[[TransferKey], int]) -> list[tuple[TransferKey, int, int]]:
        """The half-reported transfers whose first report has waited ``expiry_ns(key)`` by ``t_ns``,
        as (key, sender's time, receiver's time), the missing side's time taken as the other's;
        they are no longer half-reported."""
        out = []
        for key, sides in list(self.half.items()):
            first = min(sides.values())
            if t_ns - first >= expiry_ns(key):
                del self.half[key]
                self._pair(key)
                self.expired += 1
                out.append((key, sides.get(READY, first), sides.get(RECV, first)))
        return out

    def expiries_ns(self, expiry_ns: Callable[[TransferKey], int]) -> list[int]:
        """When each half-reported transfer expires."""
        return [min(sides.values()) + expiry_ns(key) for key, sides in self.half.items()]
