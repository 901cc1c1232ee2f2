"""A worker's two Unix datagram sockets to BubbleTea's dispatcher (``dispatcher.py``), outside the
emulated network: the inbox requests come in on, and the one its profiles go out from."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

#: the largest message to a worker (bytes): a request's id and lengths, or a new prior of its
#: bubbles (``PRIOR``), as JSON
MAX_REQUEST_BYTES = 16384
#: the key of a message that gives a worker's bubble predictor a new prior (slot -> s)
PRIOR = "prior"


class DispatcherLink:
    """Requests in at ``inbox`` (a socket path this binds), profiles out to ``dispatcher``'s."""

    def __init__(self, inbox: str, dispatcher: str) -> None:
        self.dispatcher = dispatcher
        self.inbox = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.inbox.bind(inbox)
        self.inbox.setblocking(False)
        self.out = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.out.setblocking(False)

    def requests(self) -> Iterator[dict[str, Any]]:
        """The requests come in since last looked at, oldest first (never blocks)."""
        while True:
            try:
                yield json.loads(self.inbox.recv(MAX_REQUEST_BYTES))
            except BlockingIOError:
                return

    def send(self, msg: dict[str, Any]) -> None:
        """Send ``msg`` to the dispatcher; dropped if it cannot take it now (it is not there yet,
        or its socket is full): the next profile says the same, newer."""
        try:
            self.out.sendto(json.dumps(msg).encode(), self.dispatcher)
        except OSError:
            pass

    def close(self) -> None:
        self.inbox.close()
        self.out.close()
