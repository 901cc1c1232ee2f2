"""The two ends of one WAN path probe (``wan_probe.py``), run inside emulated hosts; standard
library only.

``serve PORT``: accept one connection and answer its requests until it closes. ``probe ADDRESS
PORT MESSAGE_BYTES GAP_S BULK_S``: over one TCP connection (as gloo's, TCP_NODELAY, socket
buffers left to the host's autotuning), time one-byte round trips, then round trips of one message
of MESSAGE_BYTES answered by one byte, GAP_S apart (as a pipeline's sends are one compute apart),
then send for BULK_S seconds; print one JSON object: ``rtt_s`` and ``message_round_trip_s``
(medians after the warm-up) and ``bulk_bps`` (the server's goodput over the second half of the
bulk transfer).

Requests: one byte of kind and four of length (big-endian), then the payload. ``p``: answered by
one byte once the payload is in; ``b``: the payload is everything until the client stops
sending, answered by the goodput as text.
"""

from __future__ import annotations

import json
import socket
import statistics
import struct
import sys
import time

HEADER = struct.Struct(">cI")
WARMUP = 5
TIMED = 15
CONNECT_S = 10.0
IO_TIMEOUT_S = 60.0


def _read_exactly(conn: socket.socket, view: memoryview, n: int) -> None:
    got = 0
    while got < n:
        k = conn.recv_into(view[got:n])
        if k == 0:
            raise EOFError("the probe's peer closed the connection mid-request")
        got += k


def serve(port: int) -> None:
    """Answer one client's requests (see the module doc), then exit."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("0.0.0.0", port))
    listener.listen(1)
    listener.settimeout(CONNECT_S + IO_TIMEOUT_S)
    conn, _ = listener.accept()
    conn.settimeout(IO_TIMEOUT_S)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = memoryview(bytearray(1 << 22))
    header = memoryview(bytearray(HEADER.size))
    while True:
        try:
            _read_exactly(conn, header, HEADER.size)
        except EOFError:
            return
        kind, length = HEADER.unpack(header)
        if kind == b"p":
            left = length
            while left:
                n = min(left, len(buf))
                _read_exactly(conn, buf, n)
                left -= n
            conn.sendall(b"k")
        elif kind == b"b":
            total, marks = 0, [(time.monotonic(), 0)]
            while (k := conn.recv_into(buf)) > 0:
                total += k
                marks.append((time.monotonic(), total))
            half = marks[0][0] + (marks[-1][0] - marks[0][0]) / 2
            t0, b0 = next(m for m in marks if m[0] >= half)
            t1, b1 = marks[-1]
            conn.sendall(f"{(b1 - b0) * 8 / (t1 - t0) if t1 > t0 else 0.0}".encode())
            conn.shutdown(socket.SHUT_WR)
            return
        else:
            raise ValueError(f"unknown request kind {kind!r}")


def _connect(address: str, port: int) -> socket.socket:
    deadline = time.monotonic() + CONNECT_S
    while True:
        try:
            conn = socket.create_connection((address, port), timeout=IO_TIMEOUT_S)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn


def probe(address: str, port: int, message_bytes: int, gap_s: float, bulk_s: float) -> dict[str, float]:
    """Time the path to ``address`` (see the module doc); returns the JSON object's fields."""
    conn = _connect(address, port)
    reply = bytearray(1)

    def round_trip(payload: bytes) -> float:
        t = time.monotonic()
        conn.sendall(HEADER.pack(b"p", len(payload)) + payload)
        _read_exactly(conn, memoryview(reply), 1)
        return time.monotonic() - t

    def timed(payload: bytes) -> float:
        times = []
        for i in range(WARMUP + TIMED):
            time.sleep(gap_s)
            t = round_trip(payload)
            if i >= WARMUP:
                times.append(t)
        return statistics.median(times)

    rtt = timed(b"")
    message = timed(bytes(message_bytes))
    conn.sendall(HEADER.pack(b"b", 0))
    chunk = bytes(1 << 20)
    end = time.monotonic() + bulk_s
    while time.monotonic() < end:
        conn.sendall(chunk)
    conn.shutdown(socket.SHUT_WR)
    answer = b""
    while data := conn.recv(64):
        answer += data
    conn.close()
    return {"rtt_s": rtt, "message_round_trip_s": message, "bulk_bps": float(answer.decode())}


def main(argv: list[str]) -> None:
    if argv[:1] == ["serve"] and len(argv) == 2:
        serve(int(argv[1]))
    elif argv[:1] == ["probe"] and len(argv) == 6:
        print(json.dumps(probe(argv[1], int(argv[2]), int(argv[3]), float(argv[4]), float(argv[5]))))
    else:
        sys.exit("usage: wan_probe_peer serve PORT | probe ADDRESS PORT MESSAGE_BYTES GAP_S BULK_S")


if __name__ == "__main__":
    main(sys.argv[1:])
