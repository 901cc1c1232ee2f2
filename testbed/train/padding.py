"""Padding an operation to its target duration (the emulated GPU, DESIGN.md section 2)."""

from __future__ import annotations

from testbed.trace.clock import now_ns, sleep_until


class Padder:
    """Pads an operation to its target duration (emulated GPU); records real and padded time.
    ``targets_ms``: the target of each operation kind (ms); ``enabled`` False: no padding."""

    def __init__(self, targets_ms: dict[str, float], enabled: bool) -> None:
        self.targets_ns = {k: int(v * 1e6) for k, v in targets_ms.items()}
        self.enabled = enabled

    def finish(self, kind: str, start_ns: int) -> tuple[int, int]:
        """Sleep out the rest of ``kind``'s target; return (real_ns, padded_ns)."""
        real = now_ns() - start_ns
        if not self.enabled:
            return real, real
        target = self.targets_ns[kind]
        sleep_until(start_ns + target)
        return real, max(real, target)
