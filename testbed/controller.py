"""Atlas's temporal bandwidth sharing (DESIGN.md section 1, item 4), applied through HTB.

On every WAN egress that a stage boundary's traffic crosses, each data-parallel pipeline gets its
own HTB class (``1:(0x20 + replica)``) selected by u32 filters on the pipeline's (sender, receiver)
host pairs. The controller grants a link direction to one pipeline's transfer at a time: the
granted class runs at the full link rate, the others are held at a small floor rate (starving a
TCP flow to zero sends it into retransmission back-off that wastes its next grant, so held
classes keep ``FLOOR_SHARE`` of the link). Order: earliest ready first, which follows the pipeline
schedule and staggers the pipelines (one computes while another transmits).

Workers report over a control channel outside the emulated WAN (a Unix datagram socket in the
testbed's state folder): the sender says ``ready`` when it starts a send and the receiver ``recv``
when it posts the receive (gloo moves data only once both are there, so a transfer is ready when
both messages have come); the receiver says ``done`` when the data has arrived. Workers never wait
for the controller; if it dies, ``fall_back`` opens every class to the full rate (fair sharing by
TCP) and the run says so.
"""
from __future__ import annotations

import json
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from .placement import WorkerSpec
from .routing import RoutingTable

CLASS_BASE = 0x20
FLOOR_SHARE = 0.05


def floor_bps(link_rate_bps: int) -> int:
    """Rate a held class keeps: FLOOR_SHARE of the link, at least 8 kbit/s."""
    return max(int(link_rate_bps * FLOOR_SHARE), 8000)


@dataclass(frozen=True)
class Hop:
    """One WAN egress (router of ``src`` towards neighbour ``dst``) crossed by a boundary's flows."""

    src: str
    dst: str


def boundary_hops(workers: list[WorkerSpec], routes: RoutingTable) -> dict[tuple[int, int], list[Hop]]:
    """For each (sender rank, receiver rank) pair of neighbouring stages in different DCs (both
    directions), the WAN egresses its packets cross, in order."""
    by = {(w.stage, w.replica): w for w in workers}
    out = {}
    for w in workers:
        nxt = by.get((w.stage + 1, w.replica))
        if nxt is None or nxt.dc == w.dc:
            continue
        for a, b in ((w, nxt), (nxt, w)):
            dcs = routes.route(a.dc, b.dc).dcs
            out[(a.rank, b.rank)] = [Hop(x, y) for x, y in zip(dcs, dcs[1:])]
    return out


class GrantQueue:
    """Pure grant logic for one link direction: earliest ready first, one transfer at a time.
    ``ready``/``done`` return the replica that should hold the grant now (or None: no change)."""

    def __init__(self) -> None:
        self.waiting: deque[tuple[int, tuple]] = deque()  # (replica, transfer key)
        self.current: tuple[int, tuple] | None = None

    def ready(self, replica: int, key: tuple) -> int | None:
        if self.current is None:
            self.current = (replica, key)
            return replica
        self.waiting.append((replica, key))
        return None

    def done(self, key: tuple) -> int | None:
        if self.current is not None and self.current[1] == key:
            self.current = self.waiting.popleft() if self.waiting else None
            return self.current[0] if self.current else None
        self.waiting = deque(x for x in self.waiting if x[1] != key)  # finished before its grant
        return None


class Controller(threading.Thread):
    """Owns the per-pipeline HTB classes of every WAN egress the pipelines cross."""

    def __init__(self, emu, workers: list[WorkerSpec], replicas: int, sock_path: Path, log_path: Path) -> None:
        super().__init__(name="atlas-controller", daemon=True)
        self.emu, self.workers, self.replicas = emu, {w.rank: w for w in workers}, replicas
        self.sock_path, self.log = sock_path, open(log_path, "a", buffering=1)
        self.hops = boundary_hops(workers, emu.routes)
        self.queues: dict[Hop, GrantQueue] = {}
        self.granted: dict[Hop, int | None] = {}
        self._half: dict[tuple, set[str]] = {}
        self._halt = threading.Event()
        self.failed: BaseException | None = None

    def link_rate(self, hop: Hop) -> int:
        return self.emu.plan.wan_ends[(hop.src, hop.dst)].link.rate_bps

    def install(self) -> None:
        """One class per pipeline on every crossed egress, all open (fair) until the first grant."""
        pairs: dict[tuple[Hop, int], list[tuple[str, str]]] = {}
        for (s, d), hops in self.hops.items():
            for hop in hops:
                pairs.setdefault((hop, self.workers[s].replica), []).append((self.workers[s].host, self.workers[d].host))
        for (hop, replica), host_pairs in sorted(pairs.items(), key=lambda x: (x[0][0].src, x[0][0].dst, x[0][1])):
            rate = self.link_rate(hop)
            self.emu.add_wan_class(hop.src, hop.dst, CLASS_BASE + replica, rate, rate, host_pairs)
            self.queues.setdefault(hop, GrantQueue())
            self.granted[hop] = None

    def grant(self, hop: Hop, replica: int, t_ready_ns: int | None = None) -> None:
        """Give ``hop`` to ``replica``: its class gets the link minus the others' floors, the others
        their floor (held, never starved). Old holder first, so the link is never oversubscribed."""
        rate = self.link_rate(hop)
        floor = floor_bps(rate)
        full = rate - floor * (self.replicas - 1)
        order = sorted(range(self.replicas), key=lambda r: r == replica)  # the new holder last
        for r in order:
            want = full if r == replica else floor
            self.emu.set_wan_class_rate(hop.src, hop.dst, CLASS_BASE + r, want, want)
        t_ready_ns = t_ready_ns or time.monotonic_ns()
        self.granted[hop] = replica
        self.log.write(json.dumps({"t_ready_ns": t_ready_ns, "t_applied_ns": time.monotonic_ns(),
                                   "link": f"{hop.src}->{hop.dst}", "replica": replica}) + "\n")

    def run(self) -> None:
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            sock.bind(str(self.sock_path))
            sock.settimeout(0.2)
            while not self._halt.is_set():
                try:
                    msg = json.loads(sock.recv(512))
                except socket.timeout:
                    continue
                t = time.monotonic_ns()
                key = (msg["src"], msg["dst"], msg["it"], msg["mb"])
                if msg["ev"] in ("ready", "recv"):
                    sides = self._half.setdefault(key, set())
                    sides.add(msg["ev"])
                    if len(sides) < 2:
                        continue
                    del self._half[key]
                replica = self.workers[msg["src"]].replica
                for hop in self.hops.get((msg["src"], msg["dst"]), []):
                    q = self.queues[hop]
                    nxt = q.done(key) if msg["ev"] == "done" else q.ready(replica, key)
                    if nxt is not None and nxt != self.granted[hop]:
                        self.grant(hop, nxt, t)
            sock.close()
        except BaseException as e:  # noqa: BLE001 - any failure must fall back, never deadlock
            self.failed = e
            self.fall_back()

    def fall_back(self) -> None:
        """Open every class to the full link rate: the pipelines share links as TCP does."""
        for hop in self.queues:
            rate = self.link_rate(hop)
            for r in range(self.replicas):
                try:
                    self.emu.set_wan_class_rate(hop.src, hop.dst, CLASS_BASE + r, rate, rate)
                except Exception:  # noqa: BLE001 - the network may be going down
                    return

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=2)
        self.log.close()
        self.sock_path.unlink(missing_ok=True)


class ControlClient:
    """The worker's side: fire-and-forget datagrams; a dead controller costs nothing."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) if path else None
        if self.sock:
            self.sock.setblocking(False)

    def send(self, ev: str, src: int, dst: int, it: int, mb: int) -> None:
        if not self.sock:
            return
        try:
            self.sock.sendto(json.dumps({"ev": ev, "src": src, "dst": dst, "it": it, "mb": mb}).encode(), self.path)
        except OSError:
            pass
