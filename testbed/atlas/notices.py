"""When a WAN transfer's bytes can go, as gloo's ready notices allow (for ``grants.GrantLoop``'s
planned grants): gloo sends a tensor only once the receiver's ready notice has crossed back, one
one-way delay after the receive was posted, and its tcp transport writes that notice to the
socket that carries the receiver's own bytes to the sender. So while such bytes were leaving
when the receive was posted, the notice comes behind them: it reaches the sender with their last
byte, at the end of their whole path (on a path of several hops they may wait at a later hop, the
notice with them), as ``plan/grant_sim.py`` has it. Pure bookkeeping; times are CLOCK_MONOTONIC
ns.
"""

from __future__ import annotations

from testbed.atlas.channel import TransferKey

#: a start not yet known (the notice waits behind bytes still leaving)
NEVER = 2**62


class ReadyNotices:
    """Per (sender, receiver) pair, its transfers whose bytes have not yet passed their first hop,
    with when they could start, and the notices queued behind such bytes. ``notice_ns``: the
    one-way delay from each pair's receiver back to its sender."""

    def __init__(self, notice_ns: dict[tuple[int, int], int]) -> None:
        self.notice_ns = notice_ns
        self._leaving: dict[tuple[int, int], dict[TransferKey, int]] = {}
        # transfer -> its sender's time and the transfers still ahead of its notice
        self._queued: dict[TransferKey, tuple[int, set[TransferKey]]] = {}

    def _start(self, key: TransferKey, t_sender: int, t_notice_ns: int) -> int:
        return max(t_sender, t_notice_ns + self.notice_ns.get((key[0], key[1]), 0))

    def ready(self, key: TransferKey, t_sender: int, t_receiver: int) -> int:
        """``key`` has both sides ready (sender at ``t_sender``, receiver at ``t_receiver``): when
        its bytes can start, or ``NEVER`` while its notice waits behind the receiver's own bytes
        to the sender that were leaving when the receive was posted (``passed`` tells when)."""
        back = self._leaving.get((key[1], key[0]), {})
        ahead = {k for k, since in back.items() if since <= t_receiver}
        start = NEVER if ahead else self._start(key, t_sender, t_receiver)
        if ahead:
            self._queued[key] = (t_sender, ahead)
        self._leaving.setdefault((key[0], key[1]), {})[key] = start
        return start

    def passed(self, key: TransferKey, t_ns: int) -> list[tuple[TransferKey, int]]:
        """``key``'s bytes have reached its receiver at ``t_ns`` (its last hop's release plus that
        hop's delay, or the receiver's message that they are in): the transfers whose notices were
        queued behind it and nothing else, each with when its bytes can now start (the notice came
        with them)."""
        if self._leaving.get((key[0], key[1]), {}).pop(key, None) is None:
            return []
        freed = []
        for other, (t_sender, ahead) in list(self._queued.items()):
            ahead.discard(key)
            if ahead:
                continue
            del self._queued[other]
            start = max(t_sender, t_ns)
            self._leaving[(other[0], other[1])][other] = start
            freed.append((other, start))
        return freed
