"""Live shaping across machines (``--backend remote``): ``network.LiveShaping`` and
``network.RelayedControl`` for a topology whose WAN egresses are on other machines.

Each WAN link direction is shaped where its egress is: on the machine holding its source DC.
Installing, compiling and reading a class is one request to that machine's agent over SSH
(``agent.py``'s ``shape``); a compiled grant comes back with the machine's name, and Atlas's
controller applies it through that machine's control relay (``control_relay.py``) in one UDP
round trip, not over SSH. The relays also bridge the run's control sockets (``open_control``
for Atlas, ``open_bridge`` for BubbleTea). Helpers of the run started here (Atlas's controller,
the bridge's hub) are registered in this machine's run record and stopped at teardown.

A link's rate (``set_link_rate``) is changed at each end by its own machine: two requests, one per
direction, so the two directions change a round trip apart rather than within one system call
as on one machine.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from testbed.net.hostproc import HostProcesses
from testbed.net.remote.control_relay import start_relay
from testbed.net.remote.relay_client import FAULTS_ENV, TOKEN_BYTES, RelayClient, parse_faults
from testbed.net.shaping import DEFAULT_CLASS_MINOR, LINK_CLASS_MINOR
from testbed.trace.shaping_log import RELAY_LOG, SHAPING_LOG


def _no_hosts(host: str) -> str:
    raise KeyError(f"{host}: hosts of the remote backend are on other machines")


class RemoteShaping:
    """The live shaping of ``net``'s WAN egresses, each on its machine (see the module doc);
    ``net``: a built ``backend.RemoteNetwork`` (its inventory, agents, connections and clocks)."""

    def __init__(self, net: Any) -> None:
        self.net = net
        self.shaping_log_path: Path = net.out_dir / SHAPING_LOG
        self.processes = HostProcesses(_no_hosts, net.out_dir / "logs")
        self.processes.record = net.record
        self._relays: dict[str, Any] | None = None

    def machine_of_egress(self, src_dc: str) -> str:
        """The machine holding the WAN egresses of ``src_dc``."""
        return self.net.inventory.machine_of(src_dc).name

    def _call(self, call: str, **args: Any) -> Any:
        """``call`` made by the agent of the machine holding the egress of ``args["src_dc"]``."""
        return self.net.agents[self.machine_of_egress(args["src_dc"])].call("shape", call=call, args=args)["result"]

    def add_wan_class(
        self,
        src_dc: str,
        dst_dc: str,
        minor: int,
        rate_bps: int,
        ceil_bps: int | None = None,
        pairs: Sequence[tuple[str | None, str | None]] = (),
    ) -> None:
        self._call(
            "add_wan_class",
            src_dc=src_dc,
            dst_dc=dst_dc,
            minor=minor,
            rate_bps=rate_bps,
            ceil_bps=ceil_bps,
            pairs=[list(p) for p in pairs],
        )

    def set_wan_class_rate(
        self, src_dc: str, dst_dc: str, minor: int, rate_bps: int, ceil_bps: int | None = None
    ) -> int:
        args = {"src_dc": src_dc, "dst_dc": dst_dc, "minor": minor, "rate_bps": rate_bps, "ceil_bps": ceil_bps}
        return self._call("set_wan_class_rate", **args)

    def compile_wan_class_rates(
        self, src_dc: str, dst_dc: str, rates_bps: Sequence[tuple[int, int] | tuple[int, int, int]]
    ) -> dict[str, Any]:
        """As ``wan_shaper.WanShaper``'s, compiled on the egress's machine, which ``machine`` names
        (whoever applies it goes through that machine's relay)."""
        out = self._call("compile_wan_class_rates", src_dc=src_dc, dst_dc=dst_dc, rates_bps=list(rates_bps))
        return {**out, "data": bytes.fromhex(out["data"]), "machine": self.machine_of_egress(src_dc)}

    def set_link_rate(self, a: str, b: str, rate_bps: int) -> None:
        for src, dst in ((a, b), (b, a)):
            for minor in (LINK_CLASS_MINOR, DEFAULT_CLASS_MINOR):
                self.set_wan_class_rate(src, dst, minor, rate_bps)

    def wan_classes(self, src_dc: str, dst_dc: str) -> dict[int, dict[str, int]]:
        return {int(k): v for k, v in self._call("wan_classes", src_dc=src_dc, dst_dc=dst_dc).items()}

    def wan_tc_argv(self, src_dc: str, dst_dc: str) -> list[list[str]]:
        return self._call("wan_tc_argv", src_dc=src_dc, dst_dc=dst_dc)

    def start_helper(self, argv: Sequence[str], what: str, **kwargs: Any) -> subprocess.Popen:
        """Start a helper of the run on this machine (Atlas's controller), registered for
        ``testbed clean`` and stopped at teardown."""
        return self.processes.popen_root(argv, what, **kwargs)

    def relays(self) -> dict[str, Any]:
        """The machines' control relays, started on the first call: ``{"token": hex, "relays":
        {machine: {"addr", "port", "offset_ns", "uncertainty_ns"}}}``. Deliberate faults come from
        ``$TESTBED_CONTROL_FAULTS`` (``relay_client.parse_faults``; tests). Raises RemoteError when
        a machine cannot start its relay, ValueError for faults it cannot read."""
        if self._relays is not None:
            return self._relays
        faults = parse_faults(os.environ.get(FAULTS_ENV))
        token = secrets.token_bytes(TOKEN_BYTES)
        relays = {}
        for m in self.net.inventory.machines:
            _, there = self.net.conns[m.name].addresses()
            clock = self.net.clock[m.name]["before"]
            port = self.net.agents[m.name].call(
                "relay",
                token=token.hex(),
                offset_ns=clock["offset_ns"],
                faults=faults if any(faults[k] for k in ("drop", "duplicate")) else None,
                machine=m.name,
            )["port"]
            relays[m.name] = {
                "addr": there,
                "port": port,
                "offset_ns": clock["offset_ns"],
                "uncertainty_ns": clock["uncertainty_ns"],
            }
        self._relays = {"token": token.hex(), "relays": relays}
        return self._relays

    def _ask(self, machine: str, op: str, **fields: Any) -> dict[str, Any]:
        """A request to ``machine``'s relay (``relay_client.RelayClient``)."""
        r = self.relays()
        client = RelayClient(
            machine, (r["relays"][machine]["addr"], r["relays"][machine]["port"]), bytes.fromhex(r["token"])
        )
        try:
            return client.request(op, **fields)
        finally:
            client.close()

    def open_control(self, path: str) -> tuple[socket.socket, dict[str, Any]]:
        """Atlas's control channel across machines: a UDP socket bound here, to which every
        machine's relay forwards what its workers send to the controller's ``path`` there (the
        path the workers are given on every backend). Returns the socket and ``relays()``."""
        relays = self.relays()
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind(("0.0.0.0", 0))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        try:
            for m in self.net.inventory.machines:
                here, _ = self.net.conns[m.name].addresses()
                self._ask(m.name, "forward", path=path, to=[here, sock.getsockname()[1]])
        except BaseException:
            sock.close()
            raise
        return sock, relays

    def open_bridge(self, here: list[str], there: dict[str, list[str]]) -> None:
        """Bridge Unix datagram paths between this machine and the others (BubbleTea's dispatcher
        and the workers' inboxes): what is sent on a machine to a path of ``here`` is delivered to
        it here; what is sent here to a path of ``there[machine]`` is delivered to it on that machine.
        A hub here (the relay's program, registered like every helper) binds the ``there`` paths;
        each machine's relay binds the ``here`` paths. Raises RemoteError or OSError when a relay
        or the hub cannot start."""
        relays = self.relays()
        forward = [
            {"path": path, "to": [relays["relays"][m]["addr"], relays["relays"][m]["port"]], "deliver": True}
            for m, paths in there.items()
            for path in paths
        ]
        config = self.net.out_dir / "logs" / "hub.json"
        config.touch(mode=0o600)
        config.write_text(
            json.dumps(
                {
                    "token": relays["token"],
                    "log": str(self.net.out_dir / RELAY_LOG),
                    "machine": "runner",
                    "forward": forward,
                    "deliver_to": here,
                }
            )
        )
        with open(self.net.out_dir / "logs" / "hub.log", "ab") as log:
            port = start_relay(
                config,
                lambda argv: self.start_helper(argv, "control hub", stdout=log, stderr=subprocess.STDOUT),
            )
        for m in self.net.inventory.machines:
            addr, _ = self.net.conns[m.name].addresses()
            self._ask(m.name, "deliver_to", paths=there.get(m.name, []))
            for path in here:
                self._ask(m.name, "forward", path=path, to=[addr, port], deliver=True)

    def stop(self) -> None:
        """Stop the helpers started here."""
        self.processes.stop_all()
