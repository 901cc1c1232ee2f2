"""Applying Atlas's grants in the kernel: each grant, compiled ahead into one netlink buffer, is
sent in one system call on a plain rtnetlink socket in the link's router namespace, and logged
(``controller.jsonl``, and one ``shaping.jsonl`` line per changed class). A grant compiled on
another machine (``--backend remote``: its batch names its ``machine``) is sent to that machine's
control relay, which sends it there in one system call and answers
(``net/remote/control_relay.py``, ``relay_client.py``)."""

from __future__ import annotations

import socket
import time
from pathlib import Path

from testbed.atlas.classes import CLASS_BASE
from testbed.net import rtnl_raw
from testbed.net.remote.relay_client import RelayClient
from testbed.net.shaping import ROOT_HANDLE
from testbed.plan.grant_plan import Hop
from testbed.trace.jsonl import open_jsonl, write_row
from testbed.trace.shaping_log import class_minor, shaping_record


class GrantSwitch:
    """Applies grants: for each link direction (hop) and pipeline, the class changes of that grant,
    compiled once into one netlink buffer, sent in one system call on a plain rtnetlink socket in
    the hop's router namespace. Every applied grant is a line of ``controller.jsonl`` and one line
    per changed class of ``shaping.jsonl``.

    ``batches``: ``{hop: {replica or "open": {"netns", "ifname", "ifindex", "data", "classes"[,
    "machine"]}}}``, as made by ``LiveShaping.compile_wan_class_rates`` ("open": every class at the
    full rate, fair sharing). ``relays``: ``RelayedControl.open_control``'s description of the
    machines' relays, for batches that name a machine.

    A grant's ``controller.jsonl`` line has when it was decided (``t_decided_ns``) and when the
    kernel acknowledged it (``t_applied_ns``); across machines also the machine and when its
    relay's answer came back here (``t_acked_ns``), the applied time being the relay's, corrected
    into this machine's clock (``clock.py``)."""

    def __init__(
        self, batches: dict[Hop, dict], log_path: Path, shaping_log_path: Path, relays: dict | None = None
    ) -> None:
        self.batches = batches
        self.log = open_jsonl(log_path)
        self.shaping_log = open_jsonl(shaping_log_path)
        self._socks: dict[str, socket.socket] = {}
        self.relays = relays or {}
        self._clients: dict[str, RelayClient] = {}

    def _client(self, machine: str) -> RelayClient:
        if machine not in self._clients:
            r = self.relays["relays"][machine]
            self._clients[machine] = RelayClient(machine, (r["addr"], r["port"]), bytes.fromhex(self.relays["token"]))
        return self._clients[machine]

    def _sock(self, netns: str) -> socket.socket:
        if netns not in self._socks:
            self._socks[netns] = rtnl_raw.rtnl_socket(netns)
        return self._socks[netns]

    def apply(self, hop: Hop, replica: int | str, t_ready_ns: int | None = None, event: str = "grant") -> int:
        """Apply one compiled grant (``replica``, or "open"); returns CLOCK_MONOTONIC ns when the
        kernel had acknowledged every class change."""
        b = self.batches[hop][replica]
        where: dict = {}
        if "machine" in b:  # on another machine, through its relay
            t_applied, t0 = self._client(b["machine"]).apply(b["netns"], b["ifindex"], b["data"], len(b["classes"]))
            t1 = time.monotonic_ns()
            where = {"machine": b["machine"], "t_acked_ns": t1}
        else:
            t0 = time.monotonic_ns()
            rtnl_raw.send_batch(self._sock(b["netns"]), b["data"], len(b["classes"]))
            t1 = t_applied = time.monotonic_ns()
        for classid, rate, ceil in b["classes"]:
            write_row(
                self.shaping_log,
                shaping_record(t0, "change", b["netns"], b["ifname"], class_minor(classid), rate, ceil, t1 - t0),
            )
        write_row(
            self.log,
            {
                "event": event,
                "t_ready_ns": t_ready_ns or t0,
                "t_decided_ns": t0,
                "t_applied_ns": t_applied,
                "link": f"{hop.src}->{hop.dst}",
                "replica": replica,
                **where,
            },
        )
        return t_applied

    def relink(self, batches: dict[Hop, dict]) -> None:
        """Every grant compiled again (the links' rates changed): ``batches`` replaces them."""
        self.batches = batches

    def keep(self, hop: Hop, replica: int, t_ready_ns: int) -> None:
        """Log a grant to the pipeline that already holds ``hop`` (nothing to send to the kernel)."""
        t = time.monotonic_ns()
        row = {"event": "grant", "t_ready_ns": t_ready_ns, "t_applied_ns": t, "link": f"{hop.src}->{hop.dst}"}
        write_row(self.log, {**row, "replica": replica, "kept": True})

    def release(
        self,
        hop: Hop,
        replica: int,
        t_ns: int,
        handover: bool,
        reason: str = "done",
        held_ns: int | None = None,
        sent_bytes: int | None = None,
        rate_bps: int | None = None,
    ) -> None:
        """Log that ``replica``'s grant on ``hop`` ended, why (``done``: its receiver reported the data;
        ``bytes``: the class counter showed its bytes had passed; ``deadline``), whether another
        transfer was waiting for the link (a handover), how long it was held, what its class sent
        meanwhile (planned grants) and the link's rate."""
        write_row(
            self.log,
            {
                "event": "release",
                "t_ns": t_ns,
                "link": f"{hop.src}->{hop.dst}",
                "replica": replica,
                "handover": handover,
                "reason": reason,
                "held_ns": held_ns,
                "sent_bytes": sent_bytes,
                "rate_bps": rate_bps,
                **self._counter_age(hop, replica),
            },
        )

    def _counter_age(self, hop: Hop, replica: int) -> dict:
        """Across machines: how old the class's last byte count was when it arrived here (ns)."""
        b = self.batches.get(hop, {}).get(replica)
        if b is None or "machine" not in b or b["machine"] not in self._clients:
            return {}
        return {"counter_age_ns": self._clients[b["machine"]].last_age_ns}

    def class_bytes(self, hop: Hop, replica: int) -> int:
        """Bytes ``replica``'s class on ``hop`` has sent (its HTB byte counter, read now)."""
        b = self.batches[hop][replica]
        classid = ROOT_HANDLE | (CLASS_BASE + replica)
        if "machine" in b:
            return self._client(b["machine"]).class_bytes(b["netns"], b["ifindex"], classid)
        return rtnl_raw.class_tx_bytes(self._sock(b["netns"]), b["ifindex"], classid)

    def end(self, **counts: int) -> None:
        """Log the grant loop's counts at its end (a ``loop_end`` line: messages handled, grants
        released at their deadline, transfers taken as ready once their other report was lost,
        reports repeated), with the requests sent again to the machines' relays."""
        resent = sum(c.resent for c in self._clients.values())
        write_row(
            self.log, {"event": "loop_end", "t_ns": time.monotonic_ns(), **counts, "relay_requests_resent": resent}
        )

    def close(self) -> None:
        for s in self._socks.values():
            s.close()
        self._socks.clear()
        for c in self._clients.values():
            c.close()
        self._clients.clear()
        self.log.close()
        self.shaping_log.close()

    # the controller process receives the switch as JSON
    def to_json(self) -> list:
        return [
            {"src": h.src, "dst": h.dst, "batches": {str(k): {**b, "data": b["data"].hex()} for k, b in v.items()}}
            for h, v in self.batches.items()
        ]

    @staticmethod
    def batches_from_json(rows: list) -> dict[Hop, dict]:
        return {
            Hop(r["src"], r["dst"]): {
                (k if k == "open" else int(k)): {**b, "data": bytes.fromhex(b["data"])} for k, b in r["batches"].items()
            }
            for r in rows
        }
