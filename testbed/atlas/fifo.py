"""One link direction's FIFO of transfers: earliest ready first, one at a time (Atlas's ``fifo``
sharing, kept as the ablation's step before the grant plan; ``grants.GrantLoop`` drives it)."""

from __future__ import annotations

from testbed.atlas.channel import TransferKey


class GrantQueue:
    """Pure grant logic for one link direction: earliest ready first, one transfer at a time.
    ``ready``/``done`` return the replica that should hold the grant now (or None: no change)."""

    def __init__(self) -> None:
        self.waiting: list[tuple[int, TransferKey]] = []  # (replica, transfer key)
        self.current: tuple[int, TransferKey] | None = None

    def ready(self, replica: int, key: TransferKey) -> int | None:
        if self.current is None:
            self.current = (replica, key)
            return replica
        self.waiting.append((replica, key))
        return None

    def done(self, key: TransferKey) -> int | None:
        if self.current is not None and self.current[1] == key:
            self.current = self.waiting.pop(0) if self.waiting else None
            return self.current[0] if self.current else None
        self.waiting = [x for x in self.waiting if x[1] != key]  # finished before its grant
        return None
