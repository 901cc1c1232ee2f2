"""The control channel between training workers and Atlas's controller: Unix datagrams outside the
emulated WAN (DESIGN.md section 2), so control traffic never perturbs what is measured.

Per cross-DC transfer (sender rank ``src``, receiver rank ``dst``, iteration ``it``, microbatch
``mb`` and ``vs``, the virtual stage on the boundary's lower side, ``Transfer.stage``, which tells
apart two transfers of one microbatch between the same workers under an interleaved schedule; the
workers always send it, and a message without it, -1, names the lower worker's stage) the sender says
``ready`` when it starts the send, the receiver ``recv`` when it posts the receive (gloo moves data
only once both are there) and ``done`` once the data has arrived, right after the operation it
feeds has started (``train/worker.py``'s ``operation_started``).
Workers never wait for the controller: a message that cannot be sent is dropped. The runner ends
the controller with ``stop``, and with ``replan`` tells it to read the plan made from the first
iteration's profiled compute (real compute only) from ``REPLAN_FILE`` beside its log.
This module imports nothing of the kernel-facing code: workers use it.
"""

from __future__ import annotations

import json
import socket
from typing import Any

from testbed.trace.clock import now_ns

READY, RECV, DONE, STOP, REPLAN = "ready", "recv", "done", "stop", "replan"
#: where the runner writes a new plan for ``replan`` (beside the controller's log)
REPLAN_FILE = "controller_replan.json"
#: (sender rank, receiver rank, iteration, microbatch, boundary's virtual stage or -1): one transfer
TransferKey = tuple[int, int, int, int, int]
#: largest datagram the controller reads
MAX_MESSAGE_BYTES = 512


def encode_message(
    ev: str, src: int = -1, dst: int = -1, it: int = -1, mb: int = -1, t: int | None = None, vs: int = -1
) -> bytes:
    """One control datagram; ``t``: when it was sent (the run's clock, ``trace/clock.py``: the
    controller uses it instead of when it read the datagram); ``vs``: the boundary's virtual stage
    (written where not -1)."""
    msg: dict[str, Any] = {"ev": ev, "src": src, "dst": dst, "it": it, "mb": mb}
    if vs != -1:
        msg["vs"] = vs
    if t is not None:
        msg["t"] = t
    return json.dumps(msg).encode()


def parse_message(data: bytes) -> dict[str, Any]:
    """A datagram back as ``{"ev", "src", "dst", "it", "mb"[, "t"][, "vs"]}``. Raises ValueError for
    anything else (not JSON, no event, a field that is not an integer)."""
    msg = json.loads(data)
    if not isinstance(msg, dict) or not isinstance(msg.get("ev"), str):
        raise ValueError(f"not a control message: {data[:100]!r}")
    for k in ("src", "dst", "it", "mb", *(x for x in ("t", "vs") if x in msg)):
        if not isinstance(msg.get(k), int):
            raise ValueError(f"control message field {k!r} is not an integer: {data[:100]!r}")
    return msg


def transfer_key(msg: dict[str, Any]) -> TransferKey:
    return (msg["src"], msg["dst"], msg["it"], msg["mb"], msg.get("vs", -1))


class ControlClient:
    """The worker's side: fire-and-forget datagrams; a dead controller costs nothing."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) if path else None
        if self.sock:
            self.sock.setblocking(False)

    def send(self, ev: str, src: int, dst: int, it: int, mb: int, vs: int = -1) -> None:
        """Say ``ev`` of the transfer (``src``, ``dst``, ``it``, ``mb``, ``vs``), stamped now (the
        run's clock: on another machine, corrected by its offset)."""
        if self.sock is None or self.path is None:
            return
        try:
            self.sock.sendto(encode_message(ev, src, dst, it, mb, now_ns(), vs), self.path)
        except OSError:
            pass
