"""Padding an operation to its target duration (the emulated GPU, DESIGN.md section 2)."""

from __future__ import annotations

from collections.abc import Callable

from testbed.trace.clock import now_ns, sleep_until


class Padder:
    """Pads an operation to its target duration (emulated GPU); records real and padded time.
    ``targets_ms``: the target of each operation kind (ms); ``enabled`` False: no padding."""

    def __init__(self, targets_ms: dict[str, float], enabled: bool) -> None:
        self.targets_ns = {k: int(v * 1e6) for k, v in targets_ms.items()}
        self.enabled = enabled

    def finish(self, kind: str, start_ns: int, meanwhile: Callable[[], None] | None = None) -> tuple[int, int]:
        """Sleep out the rest of ``kind``'s target; return (real_ns, padded_ns). ``meanwhile``, if
        given, runs once the real compute is measured and before the sleep: host work that
        overlaps the emulated GPU's compute (it lengthens the operation only past its target)."""
        real = now_ns() - start_ns
        if meanwhile is not None:
            meanwhile()
        if not self.enabled:
            return real, real
        target = self.targets_ns[kind]
        sleep_until(start_ns + target)
        return real, max(real, target)
