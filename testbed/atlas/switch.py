"""Applying Atlas's grants in the kernel: each grant, compiled ahead into one netlink buffer, is
sent in one system call on a plain rtnetlink socket in the link's router namespace, and logged
(``controller.jsonl``, and one ``shaping.jsonl`` line per changed class)."""

from __future__ import annotations

import socket
import time
from pathlib import Path

from testbed.atlas.classes import CLASS_BASE
from testbed.net import rtnl_raw
from testbed.net.shaping import ROOT_HANDLE
from testbed.plan.grant_plan import Hop
from testbed.trace.jsonl import open_jsonl, write_row
from testbed.trace.shaping_log import class_minor, shaping_record


class GrantSwitch:
    """Applies grants: for each link direction (hop) and pipeline, the class changes of that grant,
    compiled once into one netlink buffer, sent in one system call on a plain rtnetlink socket in
    the hop's router namespace. Every applied grant is a line of ``controller.jsonl`` and one line
    per changed class of ``shaping.jsonl``.

    ``batches``: ``{hop: {replica or "open": {"netns", "ifname", "data", "classes"}}}``, as made by
    ``LiveShaping.compile_wan_class_rates`` ("open": every class at the full rate, fair sharing)."""

    def __init__(self, batches: dict[Hop, dict], log_path: Path, shaping_log_path: Path) -> None:
        self.batches = batches
        self.log = open_jsonl(log_path)
        self.shaping_log = open_jsonl(shaping_log_path)
        self._socks: dict[str, socket.socket] = {}

    def _sock(self, netns: str) -> socket.socket:
        if netns not in self._socks:
            self._socks[netns] = rtnl_raw.rtnl_socket(netns)
        return self._socks[netns]

    def apply(self, hop: Hop, replica: int | str, t_ready_ns: int | None = None, event: str = "grant") -> int:
        """Apply one compiled grant (``replica``, or "open"); returns CLOCK_MONOTONIC ns when the
        kernel had acknowledged every class change."""
        b = self.batches[hop][replica]
        t0 = time.monotonic_ns()
        rtnl_raw.send_batch(self._sock(b["netns"]), b["data"], len(b["classes"]))
        t1 = time.monotonic_ns()
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
                "t_applied_ns": t1,
                "link": f"{hop.src}->{hop.dst}",
                "replica": replica,
            },
        )
        return t1

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
            },
        )

    def class_bytes(self, hop: Hop, replica: int) -> int:
        """Bytes ``replica``'s class on ``hop`` has sent (its HTB byte counter, read now)."""
        b = self.batches[hop][replica]
        return rtnl_raw.class_tx_bytes(self._sock(b["netns"]), b["ifindex"], ROOT_HANDLE | (CLASS_BASE + replica))

    def close(self) -> None:
        for s in self._socks.values():
            s.close()
        self._socks.clear()
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
