"""The control channels across machines (``--backend remote``): a relay on every machine and a hub
on the runner's machine (the controller's client of a relay and the datagrams' framing are in
``relay_client.py``). Control traffic goes over the machines' own management network, never over
the emulated WAN (DESIGN.md section 6, "Across machines").

On one machine the run's processes talk over Unix datagram sockets in ``registry.control_dir()``:
the workers to Atlas's controller (``<prefix>.sock``) and to BubbleTea's dispatcher
(``<prefix>-bt.sock``, also the decode hosts), the dispatcher and the runner to each worker's
inbox (``<prefix>-w<rank>.sock``). Across machines the same paths are used on every machine, and a
relay (``python -m testbed.net.remote.control_relay CONFIG.json``, at a real-time priority in the
machine's root namespace, started by its agent) bridges them:

- **Forwarding.** It binds a path on its machine and sends each datagram that comes in on it by
  UDP to the other side: as it came, to the controller's UDP socket (``<prefix>.sock``), or framed
  for delivery at the same path there (``<prefix>-bt.sock``, to the runner's hub, which binds
  each remote worker's inbox path here and forwards the same way to the relay of the worker's
  machine). A delivery goes only to a path the runner named (``deliver_to``). Senders stamp their
  messages in the run's clock (``trace/clock.py``), so nothing is rewritten on the way. A lost
  datagram costs what it costs on one machine (for Atlas at most one deadline: ``atlas/grants.py``);
  a duplicated one is ignored (``atlas/rendezvous.py``) or, for BubbleTea, is a profile said twice.
- **Requests.** It answers the runner's requests on its UDP port: ``apply`` sends a compiled
  netlink batch (a grant, compiled on this machine) in one system call on a plain rtnetlink
  socket in the link's router namespace and replies when the kernel has acknowledged it, with that
  time in the runner's clock; ``bytes`` reads one HTB class's byte counter and replies with it and
  when it was read; ``forward`` and ``deliver_to`` add paths; ``ping`` replies with the time (a
  liveness check). Requests carry ids: the client resends a request unanswered after ``RETRY_S``
  (doubling), and the relay answers a repeated ``apply`` from its memory without applying it
  again (a read is answered afresh). An ``apply`` older than the last one applied on its link (by
  id: the client's CLOCK_MONOTONIC at its first send, one clock for every process of the runner's
  machine) is not applied: a late duplicate never undoes a newer grant.

Every datagram either way starts with the run's token (``TOKEN_BYTES`` random bytes, handed to the
relay over SSH and to the controller and the hub in their files); one without it is dropped and
counted.

For tests, ``faults`` (``{"drop": p, "duplicate": p, "seed": s}``, from ``TESTBED_CONTROL_FAULTS``
on the runner's side) drops or doubles that share of the relays' forwards and replies on purpose.
Each relay logs the grants it applied (``relay.jsonl``, merged into the run folder with the other
traces) and its counts, every second and at its end.
"""

from __future__ import annotations

import json
import os
import random
import select
import signal
import socket
import subprocess
import sys
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from testbed.lifetime import die_with_parent
from testbed.net import rtnl_raw
from testbed.net.remote.relay_client import DELIVER, MAX_DATAGRAM, framed, unframed
from testbed.thread_slice import control_priority
from testbed.trace.jsonl import open_jsonl, write_row

#: replies remembered by id, for requests that come again
REPLY_MEMORY = 256
#: how often a relay logs its counts (s)
COUNTS_EVERY_S = 1.0


class Relay:
    """One end of the bridge (see the module doc): a machine's relay, or the runner's hub.
    ``config``: ``{"token" (hex), "offset_ns", "log", "machine", "faults", "forward": [{"path",
    "to": [addr, port], "deliver"}], "deliver_to": [path, ...]}``; more forwards and deliveries come
    by request (``forward``, ``deliver_to``)."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.token = bytes.fromhex(config["token"])
        self.offset_ns = int(config.get("offset_ns", 0))
        self.faults = config.get("faults") or {}
        self.rng = random.Random(self.faults.get("seed", 0))
        self.requests = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.requests.bind(("0.0.0.0", 0))
        self.requests.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        self.out = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.local_out = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.local_out.setblocking(False)
        #: the Unix sockets bound here, each with where its datagrams go: (path, (addr, port), deliver)
        self.forwards: dict[socket.socket, tuple[str, tuple[str, int], bool]] = {}
        #: the Unix paths here that datagrams from the other side may be delivered to
        self.deliver_to: set[str] = set(config.get("deliver_to", ()))
        self.log = open_jsonl(Path(config["log"]))
        self.machine = config.get("machine", "")
        self._rtnl: dict[str, socket.socket] = {}
        self._replies: OrderedDict[int, bytes] = OrderedDict()
        self._last_apply: dict[tuple[str, int], int] = {}  # by link: the id of the last batch applied there
        names = ("forwarded", "delivered", "undeliverable", "applied", "stale", "repeated", "read", "foreign")
        self.counts = dict.fromkeys(names, 0)
        # deliberate faults (tests), by what they hit: datagrams forwarded, or replies
        self.counts |= dict.fromkeys(
            ("forwards_dropped", "forwards_duplicated", "replies_dropped", "replies_duplicated"), 0
        )
        for f in config.get("forward", ()):
            self.add_forward(f["path"], f["to"], f.get("deliver", False))

    @property
    def port(self) -> int:
        return self.requests.getsockname()[1]

    def now_ns(self) -> int:
        """This machine's clock, corrected into the runner's (``trace/clock.py``)."""
        return time.monotonic_ns() - self.offset_ns

    def add_forward(self, path: str, to: list | tuple, deliver: bool) -> None:
        """Bind the Unix datagram socket ``path`` here and send what comes in on it to ``to``: as it
        came (the controller reads it), or framed for delivery at the same path there."""
        if any(p == path for p, _, _ in self.forwards.values()):
            return  # asked again: already bound
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).unlink(missing_ok=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(path)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        self.forwards[sock] = (path, (to[0], int(to[1])), deliver)

    def _send(self, sock: socket.socket, data: bytes, addr: Any, kind: str) -> None:
        """Send (``kind``: ``forwards`` or ``replies``), with the deliberate faults (tests) if any."""
        if self.faults.get("drop") and self.rng.random() < self.faults["drop"]:
            self.counts[f"{kind}_dropped"] += 1
            return
        copies = 2 if self.faults.get("duplicate") and self.rng.random() < self.faults["duplicate"] else 1
        self.counts[f"{kind}_duplicated"] += copies - 1
        for _ in range(copies):
            try:
                sock.sendto(data, addr)
            except OSError:
                pass  # the other side is gone: the runner ends the run

    def on_local(self, sock: socket.socket, data: bytes) -> None:
        """A datagram on a bound path (a worker's control message, a profile for the dispatcher, a
        request for a worker's inbox; stamped in the run's clock by its sender): forwarded."""
        path, to, deliver = self.forwards[sock]
        self.counts["forwarded"] += 1
        frame = self.token + (DELIVER + path.encode() + b"\0" + data if deliver else data)
        self._send(self.out, frame, to, "forwards")

    def on_udp(self, data: bytes, addr: Any) -> None:
        """A datagram from the other side: a delivery to a path here, or a request."""
        t_received = self.now_ns()
        payload = unframed(self.token, data)
        if payload is None:
            self.counts["foreign"] += 1
            return
        if payload[:1] == DELIVER:
            path, _, body = payload[1:].partition(b"\0")
            if path.decode() not in self.deliver_to:
                self.counts["foreign"] += 1
                return
            try:
                self.local_out.sendto(body, path.decode())
                self.counts["delivered"] += 1
            except OSError:  # not bound (yet, or any more), or full: dropped, as on one machine
                self.counts["undeliverable"] += 1
            return
        req = json.loads(payload)
        rid = req["id"]
        if rid in self._replies:  # a grant asked again: answered from memory, never applied twice
            self.counts["repeated"] += 1
            self._send(self.requests, self._replies[rid], addr, "replies")
            return
        try:
            reply = {"id": rid, **self._do(req, t_received)}
        except (OSError, KeyError, ValueError) as e:
            reply = {"id": rid, "error": f"{type(e).__name__}: {e}"}
        out = framed(self.token, reply)
        if req["op"] == "apply":  # reads are answered afresh when asked again
            self._replies[rid] = out
            if len(self._replies) > REPLY_MEMORY:
                self._replies.popitem(last=False)
        self._send(self.requests, out, addr, "replies")

    def _sock(self, netns: str) -> socket.socket:
        if netns not in self._rtnl:
            self._rtnl[netns] = rtnl_raw.rtnl_socket(netns)
        return self._rtnl[netns]

    def _do(self, req: dict[str, Any], t_received: int) -> dict[str, Any]:
        op = req["op"]
        if op == "ping":
            return {"t_ns": self.now_ns()}
        if op == "forward":
            self.add_forward(req["path"], req["to"], req.get("deliver", False))
            return {}
        if op == "deliver_to":
            self.deliver_to.update(req["paths"])
            return {}
        if op == "bytes":
            self.counts["read"] += 1
            n = rtnl_raw.class_tx_bytes(self._sock(req["netns"]), req["ifindex"], req["classid"])
            return {"bytes": n, "t_ns": self.now_ns()}
        if op == "apply":
            netns, link = req["netns"], (req["netns"], req["ifindex"])
            if req["id"] < self._last_apply.get(link, 0):  # a late copy of an older grant
                self.counts["stale"] += 1
                write_row(self.log, {"event": "stale", "id": req["id"], "netns": netns, "t_ns": t_received})
                return {"t_ns": t_received, "stale": True}
            rtnl_raw.send_batch(self._sock(netns), bytes.fromhex(req["data"]), req["count"])
            t_applied = self.now_ns()
            self._last_apply[link] = req["id"]
            self.counts["applied"] += 1
            write_row(
                self.log,
                {
                    "event": "applied",
                    "machine": self.machine,
                    "id": req["id"],
                    "netns": netns,
                    "t_received_ns": t_received,
                    "t_applied_ns": t_applied,
                },
            )
            return {"t_ns": t_applied}
        raise ValueError(f"unknown request {op!r}")

    def serve(self) -> None:
        """Forward, deliver and answer until SIGTERM (its owner's teardown) or the parent's death;
        the counts are logged every ``COUNTS_EVERY_S`` (a ``relay_counts`` line), so that a relay
        whose last line is lost (killed, or its machine's teardown cut short) still reports them."""
        logged = time.monotonic()
        while True:
            if time.monotonic() - logged >= COUNTS_EVERY_S:
                self._log_counts("relay_counts")
                logged = time.monotonic()
            for sock in select.select([self.requests, *self.forwards], [], [], COUNTS_EVERY_S)[0]:
                if sock is self.requests:
                    data, addr = sock.recvfrom(MAX_DATAGRAM)
                    self.on_udp(data, addr)
                else:
                    self.on_local(sock, sock.recv(MAX_DATAGRAM))

    def _log_counts(self, event: str) -> None:
        write_row(self.log, {"event": event, "machine": self.machine, "t_ns": self.now_ns(), **self.counts})

    def close(self) -> None:
        self._log_counts("relay_end")
        self.log.close()
        for s in (*self._rtnl.values(), self.requests, self.out, self.local_out):
            s.close()
        for sock, (path, _, _) in self.forwards.items():
            sock.close()
            Path(path).unlink(missing_ok=True)


def start_relay(config: Path, popen: Callable[[list[str]], subprocess.Popen], timeout_s: float = 20.0) -> int:
    """Start a relay (or the hub) on its ``config`` file through ``popen`` (which starts and
    registers a helper of the run) and return its UDP port once it is bound. Raises OSError when it
    exits or does not bind within ``timeout_s``."""
    port_file = Path(f"{config}.port")
    port_file.unlink(missing_ok=True)
    proc = popen([sys.executable, "-m", "testbed.net.remote.control_relay", str(config)])
    deadline = time.monotonic() + timeout_s
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise OSError(f"the control relay on {config} did not start (exit status {proc.poll()})")
        time.sleep(0.02)
    return int(port_file.read_text())


def _on_signal(signum, frame) -> None:
    raise SystemExit(0)


def main(config_path: str) -> int:
    """The relay process: bound, its port written to ``<config>.port`` (the agent waits for it),
    then serving until SIGTERM."""
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent()
    control_priority()
    relay = Relay(json.loads(Path(config_path).read_text()))
    port_file = Path(config_path + ".port")
    Path(f"{port_file}.tmp").write_text(str(relay.port))
    os.replace(f"{port_file}.tmp", port_file)  # whole, never read half-written
    try:
        relay.serve()
    finally:
        relay.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
