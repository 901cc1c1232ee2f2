"""The runner's end of the control channels across machines (``control_relay.py`` holds the
machines' end): the framing every datagram shares (the run's token first; a delivery's path), the
controller's client of a machine's relay (requests with ids, resent until answered), and the
deliberate faults tests ask the relays for."""

from __future__ import annotations

import json
import select
import socket
import time
from typing import Any

from testbed.errors import RemoteError

#: length of the run's token at the start of every control datagram across machines
TOKEN_BYTES = 16
#: a request unanswered this long is sent again (the wait doubles each time), ``ATTEMPTS`` in all
RETRY_S = 0.01
ATTEMPTS = 6
#: the largest datagram read (a grant's batch as hex, a worker's message)
MAX_DATAGRAM = 65507
#: the first byte of a datagram's payload (after the token) that is a delivery: path, NUL, the datagram
DELIVER = b"\x00"
#: the environment variable that asks the relays for deliberate faults (tests): "drop=P,duplicate=P,seed=S"
FAULTS_ENV = "TESTBED_CONTROL_FAULTS"


def parse_faults(text: str | None) -> dict[str, float]:
    """``FAULTS_ENV``'s value as ``{"drop", "duplicate", "seed"}`` (missing parts 0). Raises
    ValueError naming a part it does not know or a share outside 0-1."""
    out = {"drop": 0.0, "duplicate": 0.0, "seed": 0.0}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        key, _, value = part.partition("=")
        key = key.strip()
        if key not in out:
            raise ValueError(f"{FAULTS_ENV}: unknown part {key!r} (drop=P,duplicate=P,seed=S)")
        out[key] = float(value)
        if key != "seed" and not 0 <= out[key] <= 1:
            raise ValueError(f"{FAULTS_ENV}: {key}={value} is not a share between 0 and 1")
    return out


def framed(token: bytes, payload: dict[str, Any] | bytes) -> bytes:
    """A datagram: the token, then the payload (JSON, or bytes as they are)."""
    return token + (payload if isinstance(payload, bytes) else json.dumps(payload).encode())


def unframed(token: bytes, data: bytes) -> bytes | None:
    """The payload of a datagram that starts with ``token``; None for any other."""
    return data[len(token) :] if data[: len(token)] == token else None


class RelayClient:
    """The controller's end of one machine's relay: requests over UDP, each resent until answered
    (``control_relay.py``'s module doc). Not thread-safe: one per process."""

    def __init__(self, machine: str, addr: tuple[str, int], token: bytes) -> None:
        self.machine, self.addr, self.token = machine, addr, token
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setblocking(False)
        #: requests sent again, over the client's life
        self.resent = 0
        #: how old the last byte count read was when it arrived here (ns)
        self.last_age_ns = 0

    def request(self, op: str, **fields: Any) -> dict[str, Any]:
        """Send ``op`` and return its reply. Raises RemoteError when no reply came after
        ``ATTEMPTS`` sends, or when the relay reports an error."""
        rid = time.monotonic_ns()
        data = framed(self.token, {"id": rid, "op": op, **fields})
        wait = RETRY_S
        for attempt in range(ATTEMPTS):
            if attempt:
                self.resent += 1
            self.sock.sendto(data, self.addr)
            deadline = time.monotonic() + wait
            while (left := deadline - time.monotonic()) > 0:
                if not select.select([self.sock], [], [], left)[0]:
                    break
                payload = unframed(self.token, self.sock.recv(MAX_DATAGRAM))
                if payload is None:
                    continue
                reply = json.loads(payload)
                if reply.get("id") != rid:
                    continue  # the reply to an earlier attempt of an earlier request
                if "error" in reply:
                    raise RemoteError(f"machine {self.machine}: the control relay's {op} failed: {reply['error']}")
                return reply
            wait *= 2
        raise RemoteError(
            f"machine {self.machine}: the control relay at {self.addr[0]}:{self.addr[1]} did not answer {op!r} "
            f"after {ATTEMPTS} tries over {RETRY_S * (2**ATTEMPTS - 1):g} s: its machine or the management "
            "network between is down"
        )

    def apply(self, netns: str, ifindex: int, data: bytes, count: int) -> tuple[int, int]:
        """Apply a compiled batch of ``count`` requests on interface ``ifindex`` of ``netns`` there;
        returns (when the kernel acknowledged it there, in this machine's clock; the request's id,
        which is when it was decided)."""
        reply = self.request("apply", netns=netns, ifindex=ifindex, data=data.hex(), count=count)
        return reply["t_ns"], reply["id"]

    def class_bytes(self, netns: str, ifindex: int, classid: int) -> int:
        """An HTB class's byte counter there; its age on arrival is kept in ``last_age_ns``."""
        reply = self.request("bytes", netns=netns, ifindex=ifindex, classid=classid)
        self.last_age_ns = time.monotonic_ns() - reply["t_ns"]
        return reply["bytes"]

    def close(self) -> None:
        self.sock.close()
