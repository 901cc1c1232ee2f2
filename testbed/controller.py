"""Atlas's temporal bandwidth sharing (DESIGN.md section 1, item 4), applied through HTB.

On every WAN egress that a stage boundary's traffic crosses, each data-parallel pipeline gets its
own HTB class (``1:(0x20 + replica)``) selected by u32 filters on the pipeline's (sender, receiver)
host pairs. The controller grants a link direction to one pipeline's transfer at a time: the
granted class runs at the full link rate, the others are held at a small floor rate (starving a
TCP flow to zero sends it into retransmission back-off that wastes its next grant, so held
classes keep ``FLOOR_SHARE`` of the link). Order: earliest ready first, which follows the pipeline
schedule and staggers the pipelines (one computes while another transmits).

The grant loop runs in its own process (no GIL shared with the runner's threads, higher priority),
and each grant is compiled ahead into one netlink buffer sent in one system call. Workers report
over a control channel outside the emulated WAN (a Unix datagram socket in the testbed's state
folder): the sender says ``ready`` when it starts a send and the receiver ``recv``
when it posts the receive (gloo moves data only once both are there, so a transfer is ready when
both messages have come); the receiver says ``done`` when the data has arrived. Workers never wait
for the controller; if it dies, ``fall_back`` opens every class to the full rate (fair sharing by
TCP) and the run says so; the runner does the same if the process is killed.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from . import netlink
from .placement import WorkerSpec
from .routing import RoutingTable

CLASS_BASE = 0x20
FLOOR_SHARE = 0.05


def floor_bps(link_rate_bps: int, share: float = FLOOR_SHARE) -> int:
    """Rate a held class keeps: ``share`` of the link, at least 8 kbit/s (HTB needs a rate)."""
    return max(int(link_rate_bps * share), 8000)


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


class GrantSwitch:
    """Applies grants: for each link direction (hop) and pipeline, the class changes of that grant,
    compiled once into one netlink buffer, sent in one system call on a plain rtnetlink socket in
    the hop's router namespace. Every applied grant is a line of ``controller.jsonl`` and one line
    per changed class of ``shaping.jsonl``.

    ``batches``: ``{hop: {replica or "open": {"netns", "ifname", "data", "classes"}}}``, as made by
    ``Emulation.compile_wan_class_rates`` ("open": every class at the full rate, fair sharing)."""

    def __init__(self, batches: dict[Hop, dict], log_path: Path, shaping_log_path: Path) -> None:
        self.batches = batches
        self.log = open(log_path, "a", buffering=1)
        self.shaping_log = open(shaping_log_path, "a", buffering=1)
        self._socks: dict[str, socket.socket] = {}

    def _sock(self, netns: str) -> socket.socket:
        if netns not in self._socks:
            self._socks[netns] = netlink.rtnl_socket(netns)
        return self._socks[netns]

    def apply(self, hop: Hop, replica: int | str, t_ready_ns: int | None = None, event: str = "grant") -> int:
        """Apply one compiled grant (``replica``, or "open"); returns CLOCK_MONOTONIC ns when the
        kernel had acknowledged every class change."""
        b = self.batches[hop][replica]
        t0 = time.monotonic_ns()
        netlink.send_batch(self._sock(b["netns"]), b["data"], len(b["classes"]))
        t1 = time.monotonic_ns()
        for classid, rate in b["classes"]:
            self.shaping_log.write(json.dumps({"t_ns": t0, "event": "change", "netns": b["netns"],
                                               "ifname": b["ifname"], "classid": classid, "rate_bps": rate,
                                               "ceil_bps": rate, "duration_ns": t1 - t0}) + "\n")
        self.log.write(json.dumps({"event": event, "t_ready_ns": t_ready_ns or t0, "t_applied_ns": t1,
                                   "link": f"{hop.src}->{hop.dst}", "replica": replica}) + "\n")
        return t1

    def release(self, hop: Hop, replica: int, t_ns: int, handover: bool) -> None:
        """Log that ``replica``'s granted transfer on ``hop`` completed (its receiver reported it) and
        whether another transfer was waiting for the link (a handover)."""
        self.log.write(json.dumps({"event": "release", "t_ns": t_ns, "link": f"{hop.src}->{hop.dst}",
                                   "replica": replica, "handover": handover}) + "\n")

    def close(self) -> None:
        for s in self._socks.values():
            s.close()
        self._socks.clear()
        self.log.close()
        self.shaping_log.close()

    # the controller process receives the switch as JSON
    def to_json(self) -> list:
        return [{"src": h.src, "dst": h.dst, "batches": {str(k): {**b, "data": b["data"].hex()} for k, b in v.items()}}
                for h, v in self.batches.items()]

    @staticmethod
    def batches_from_json(rows: list) -> dict[Hop, dict]:
        return {Hop(r["src"], r["dst"]): {(k if k == "open" else int(k)): {**b, "data": bytes.fromhex(b["data"])}
                                          for k, b in r["batches"].items()} for r in rows}


class GrantLoop:
    """The controller's state machine over control messages (pure, apart from ``switch.apply``):
    a transfer is ready once its sender (``ready``) and receiver (``recv``) have both reported;
    ``done`` ends it. Each crossed hop's GrantQueue decides who holds the hop."""

    def __init__(self, switch, replica_of: dict[int, int], hops: dict[tuple[int, int], list[Hop]]) -> None:
        self.switch, self.replica_of, self.hops = switch, replica_of, hops
        self.queues = {h: GrantQueue() for hs in hops.values() for h in hs}
        self.granted: dict[Hop, int | None] = {h: None for h in self.queues}
        self._half: dict[tuple, set[str]] = {}

    def handle(self, msg: dict, t_ns: int) -> None:
        key = (msg["src"], msg["dst"], msg["it"], msg["mb"])
        if msg["ev"] in ("ready", "recv"):
            sides = self._half.setdefault(key, set())
            sides.add(msg["ev"])
            if len(sides) < 2:
                return
            del self._half[key]
        elif msg["ev"] != "done":
            raise ValueError(f"unknown control message {msg!r}")
        replica = self.replica_of[msg["src"]]
        for hop in self.hops.get((msg["src"], msg["dst"]), []):
            q = self.queues[hop]
            if msg["ev"] == "done":
                holder = q.current
                nxt = q.done(key)
                if holder is not None and holder[1] == key:
                    self.switch.release(hop, holder[0], t_ns, handover=nxt is not None)
            else:
                nxt = q.ready(replica, key)
            if nxt is not None and nxt != self.granted[hop]:
                self.switch.apply(hop, nxt, t_ns)
                self.granted[hop] = nxt


def serve(plan_path: str) -> None:
    """The controller process: ``python -m testbed.controller PLAN.json``. Reads control datagrams
    until a ``stop`` message; on any failure it opens every class (fair sharing), writes the reason
    to the plan's ``error_file`` and exits with status 1."""
    plan = json.loads(Path(plan_path).read_text())
    signal.signal(signal.SIGINT, signal.SIG_IGN)          # the runner handles Ctrl-C and stops us
    _die_with_parent()
    try:
        os.setpriority(os.PRIO_PROCESS, 0, -10)           # grants must not wait behind the workers
    except OSError:
        pass
    switch = GrantSwitch(GrantSwitch.batches_from_json(plan["switch"]), Path(plan["log"]), Path(plan["shaping_log"]))
    loop = GrantLoop(switch, {int(k): v for k, v in plan["replica_of"].items()},
                     {(h["src"], h["dst"]): [Hop(*x) for x in h["hops"]] for h in plan["hops"]})
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM, fileno=plan["fd"])   # bound by the runner
    try:
        while True:
            data = sock.recv(512)
            t = time.monotonic_ns()
            msg = json.loads(data)
            if msg.get("ev") == "stop":
                break
            loop.handle(msg, t)
    except BaseException as e:  # noqa: BLE001 - any failure must fall back, never deadlock
        Path(plan["error_file"]).write_text(repr(e))
        for hop in switch.batches:
            try:
                switch.apply(hop, "open", event="fall_back")
            except Exception:  # noqa: BLE001 - the network may be going down
                break
        switch.close()
        sys.exit(1)
    switch.close()


def _die_with_parent() -> None:
    """prctl(PR_SET_PDEATHSIG, SIGTERM): if the runner is killed (even with kill -9), so is this."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.prctl(1, signal.SIGTERM)


class Controller:
    """The runner's side of Atlas's controller: installs one HTB class per pipeline on every crossed
    egress (all open, fair, until the first grant), compiles every grant, and runs the grant loop
    in its own process (``serve``: its own interpreter, no GIL shared with the runner's threads, a
    higher scheduling priority), fed by workers over a Unix datagram socket bound here before any
    worker starts. ``grant`` applies a grant from this process (tests, tools)."""

    def __init__(self, emu, workers: list[WorkerSpec], replicas: int, sock_path: Path, log_path: Path,
                 floor_share: float = FLOOR_SHARE) -> None:
        self.emu, self.workers, self.replicas = emu, {w.rank: w for w in workers}, replicas
        self.floor_share = floor_share
        self.sock_path, self.log_path = Path(sock_path), Path(log_path)
        self.error_file = self.log_path.with_name("controller_error.txt")
        self.hops = boundary_hops(workers, emu.routes)
        self.switch: GrantSwitch | None = None
        self.proc = None
        self._sock: socket.socket | None = None
        self._stopping = False
        self._failure: str | None = None

    def link_rate(self, hop: Hop) -> int:
        return self.emu.plan.wan_ends[(hop.src, hop.dst)].link.rate_bps

    def install(self) -> None:
        """One class per pipeline on every crossed egress, all open (fair) until the first grant;
        compile each grant: the granted class gets the link minus the others' floors, the others
        their floor (held, never starved), the old holders first so the link is never
        oversubscribed."""
        pairs: dict[tuple[Hop, int], list[tuple[str, str]]] = {}
        for (s, d), hops in self.hops.items():
            for hop in hops:
                pairs.setdefault((hop, self.workers[s].replica), []).append((self.workers[s].host, self.workers[d].host))
        hops = sorted({h for h, _ in pairs}, key=lambda h: (h.src, h.dst))
        for (hop, replica), host_pairs in sorted(pairs.items(), key=lambda x: (x[0][0].src, x[0][0].dst, x[0][1])):
            rate = self.link_rate(hop)
            self.emu.add_wan_class(hop.src, hop.dst, CLASS_BASE + replica, rate, rate, host_pairs)
        batches: dict[Hop, dict] = {}
        for hop in hops:
            rate = self.link_rate(hop)
            floor = floor_bps(rate, self.floor_share)
            full = rate - floor * (self.replicas - 1)
            minors = sorted(CLASS_BASE + r for (h, r) in pairs if h == hop)
            batches[hop] = {"open": self.emu.compile_wan_class_rates(hop.src, hop.dst, [(m, rate) for m in minors])}
            for m in minors:
                order = [(o, floor) for o in minors if o != m] + [(m, full)]
                batches[hop][m - CLASS_BASE] = self.emu.compile_wan_class_rates(hop.src, hop.dst, order)
        self.switch = GrantSwitch(batches, self.log_path, self.emu.shaping_log_path)

    def grant(self, hop: Hop, replica: int, t_ready_ns: int | None = None) -> int:
        """Give ``hop`` to ``replica`` now, from this process; returns when the kernel acknowledged."""
        return self.switch.apply(hop, replica, t_ready_ns)

    def start(self) -> None:
        """Bind the control socket and start the controller process."""
        self.sock_path.unlink(missing_ok=True)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(str(self.sock_path))
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        plan = {"switch": self.switch.to_json(), "log": str(self.log_path),
                "shaping_log": str(self.emu.shaping_log_path), "error_file": str(self.error_file),
                "replica_of": {str(r): w.replica for r, w in self.workers.items()},
                "hops": [{"src": s, "dst": d, "hops": [[h.src, h.dst] for h in hs]} for (s, d), hs in self.hops.items()],
                "fd": self._sock.fileno()}
        plan_path = self.log_path.with_name("controller_plan.json")
        plan_path.write_text(json.dumps(plan))
        with open(self.log_path.with_name("controller.log"), "a") as out:
            self.proc = self.emu.popen_root(
                [sys.executable, "-m", "testbed.controller", str(plan_path)], "atlas controller",
                pass_fds=(self._sock.fileno(),), stdout=out, stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})

    def poll_failure(self) -> str | None:
        """If the controller process has died during the run, open every class (fair sharing; the
        process may have been killed before it could) and return why; else None. Reported once."""
        if self._failure is not None or self.proc is None or self._stopping or self.proc.poll() is None:
            return None
        why = self.error_file.read_text() if self.error_file.exists() else f"exit status {self.proc.returncode}"
        self._failure = why
        self.fall_back()
        return why

    def fall_back(self) -> None:
        """Open every class to the full link rate: the pipelines share links as TCP does."""
        for hop in self.switch.batches:
            try:
                self.switch.apply(hop, "open", event="fall_back")
            except Exception:  # noqa: BLE001 - the network may be going down
                return

    def stop(self) -> None:
        self._stopping = True
        if self.proc is not None and self.proc.poll() is None:
            try:
                self._sock.sendto(json.dumps({"ev": "stop"}).encode(), str(self.sock_path))
                self.proc.wait(timeout=2)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.terminate()
        if self.switch is not None:
            self.switch.close()
        if self._sock is not None:
            self._sock.close()
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


if __name__ == "__main__":
    serve(sys.argv[1])
