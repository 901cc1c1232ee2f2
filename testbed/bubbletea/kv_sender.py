"""Handing finished KV caches to the decode host of a worker's DC (BubbleTea), from a thread of
the worker's prefill stream (``prefill_stream.py``), so that prefill never waits on the network:
one TCP connection, reconnected when the decode host drops it; a cache's bytes stay held against
the worker's memory budget (``decisions.KVBudget``) until they are handed off or given up
(``release``). The frame: two big-endian lengths (``FRAME``: header, payload), the JSON header,
the cache's bytes (``kv_cache.KVCache``).
"""

from __future__ import annotations

import json
import queue
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from testbed.bubbletea.kv_cache import KVCache
from testbed.trace.clock import now_ns
from testbed.trace.task_names import name_this_thread

DECODE_PORT = 29600
FRAME = struct.Struct(">II")
SEND_ATTEMPTS = 4  # tries to deliver one KV cache to the decode host before the request is given up


class KVSender:
    """Sends each ``put`` cache to ``addr``'s ``DECODE_PORT`` in order (None: no decode host, the
    caches are dropped), calling ``release`` with its held bytes once done; its thread names
    itself ``name`` (``trace.task_names.KV_SENDER``), where given."""

    def __init__(self, addr: str | None, release: Callable[[int], None], name: str | None = None) -> None:
        self.addr, self.release, self.name = addr, release, name
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def put(self, header: dict[str, Any], cache: KVCache | None, held_bytes: int) -> None:
        self._queue.put((header, cache, held_bytes))

    def close(self, timeout_s: float = 30.0) -> None:
        """Send what is queued, then stop."""
        self._queue.put(None)
        self._thread.join(timeout=timeout_s)

    def _loop(self) -> None:
        if self.name is not None:
            name_this_thread(self.name)
        sock = None
        while True:
            item = self._queue.get()
            if item is None:
                break
            header, cache, held = item
            if self.addr is None or cache is None:
                self.release(held)
                continue
            payload = cache.buffers()  # no copy: the stream's thread is not kept from the lock
            size = sum(b.nbytes for b in payload)
            header = {**header, "kv_bytes": size, "sent_ns": now_ns()}
            data = json.dumps(header).encode()
            for attempt in range(SEND_ATTEMPTS):  # reconnect if the decode host dropped the connection
                try:
                    if sock is None:
                        sock = socket.create_connection((self.addr, DECODE_PORT), timeout=30)
                    sock.sendall(FRAME.pack(len(data), size) + data)
                    for buf in payload:
                        sock.sendall(buf)
                    break
                except OSError as e:
                    if sock is not None:
                        sock.close()
                    sock = None
                    if attempt + 1 == SEND_ATTEMPTS:
                        print(f"request {header['rid']}: KV cache not delivered to {self.addr}: {e}", file=sys.stderr)
                    else:
                        time.sleep(0.1 * (attempt + 1))
            self.release(held)  # handed off (or given up): the GPU no longer holds it
        if sock is not None:
            sock.close()
