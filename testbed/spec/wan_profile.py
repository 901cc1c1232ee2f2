"""What one TCP connection carries on each WAN path, as measured on the emulator
(``testbed run --profile-wan``, ``net/wan_probe.py``), for the simulator to use in place of the
modelled window (``plan/connections.one_connection_bps``).

The modelled window (``plan/connections.connection_window_bytes``, which the hosts' socket-buffer
cap is sized to hold) rests on a figure of the kernel: Linux before 6.6 advertised half of a
socket's receive buffer (tcp_adv_win_scale = 1); later kernels advertise the payload-to-buffer
ratio of the packets received, whose median the testbed measured (``window_per_buffer_byte``) but
which varies from path to path; and a congestion control such as BBR paces a burst at its own
estimate rather than sending a window at once. A profile measures instead, on each path, one connection's bulk
goodput and the time of one message of the pipeline's size, under the run's own socket buffers
and congestion control; this is the network profiling that simulators validated against real
runs do (Sailor, Strati et al. 2025, profiles the network between each pair of zones).

Pure data: a run folder's ``wan_profile.json`` (``to_dict``/``from_dict``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

#: a run folder's profile (``testbed run --profile-wan``)
WAN_PROFILE_FILE = "wan_profile.json"


@dataclass(frozen=True)
class PathProfile:
    """One connection on the WAN path from DC ``src`` to DC ``dst``, measured alone on the path:
    ``rtt_s``, the median round trip of one byte and its one-byte reply (s); ``message_bytes``, the
    size of the messages timed (the experiment's activation bytes); ``message_s``, the median time
    one such message takes beyond that round trip (s: from its first byte sent to its last byte
    received, less the one-way delay); ``bulk_bps``, the connection's goodput on a long transfer
    (payload bit/s, measured at the receiver after the first half of the transfer)."""

    src: str
    dst: str
    rtt_s: float
    message_bytes: int
    message_s: float
    bulk_bps: float

    def __post_init__(self) -> None:
        for name in ("rtt_s", "message_s", "bulk_bps"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{self.src}->{self.dst}: {name} = {getattr(self, name)!r} is not positive")
        if self.message_bytes < 1:
            raise ValueError(f"{self.src}->{self.dst}: message_bytes = {self.message_bytes!r} is not positive")

    @property
    def message_bps(self) -> float:
        """The payload rate of one timed message (bit/s): its bits over ``message_s``."""
        return self.message_bytes * 8 / self.message_s

    @property
    def window_bytes(self) -> float:
        """What the connection keeps in flight in bulk (bytes): its bulk goodput over one round
        trip (Little's law)."""
        return self.bulk_bps * self.rtt_s / 8

    def one_connection_bps(self, nbytes: float) -> float:
        """What one connection carries on this path for a transfer of ``nbytes`` (payload bit/s):
        a transfer up to the timed message's size at the message's rate; a larger one moves its
        first ``message_bytes`` at that rate and the rest at the bulk rate."""
        if nbytes <= self.message_bytes:
            return self.message_bps
        seconds = self.message_s + (nbytes - self.message_bytes) * 8 / self.bulk_bps
        return nbytes * 8 / seconds


@dataclass(frozen=True)
class WanProfile:
    """The measured paths (each direction measured on its own) and how: ``congestion``, the TCP
    congestion control the hosts used; ``socket_buffer_bytes``, their socket-buffer cap (None:
    the network's default)."""

    paths: tuple[PathProfile, ...]
    congestion: str | None = None
    socket_buffer_bytes: int | None = None

    def path(self, src: str, dst: str) -> PathProfile | None:
        """The measured path ``src`` -> ``dst``, or None when it was not measured."""
        return next((p for p in self.paths if (p.src, p.dst) == (src, dst)), None)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> WanProfile:
        """``to_dict``'s record back. Raises KeyError, TypeError or ValueError for data of another
        form (a path without a field, a field that is not a positive number)."""
        return WanProfile(
            tuple(PathProfile(**p) for p in d["paths"]), d.get("congestion"), d.get("socket_buffer_bytes")
        )
