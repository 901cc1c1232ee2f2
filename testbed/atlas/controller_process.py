"""Atlas's controller process: the grant loop (``grants.GrantLoop``) fed by the workers' control
datagrams (``channel.py``), applying grants through ``switch.GrantSwitch``. It runs in its own
interpreter (no GIL shared with the runner's threads) at a real-time priority, started by
``controller.Controller``; if it fails it opens every class (fair sharing) and says why.

``python -m testbed.atlas.controller_process PLAN.json``.
"""

from __future__ import annotations

import json
import select
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

from testbed.atlas.channel import MAX_MESSAGE_BYTES, REPLAN, REPLAN_FILE, STOP, parse_message
from testbed.atlas.grants import NEVER, GrantLoop, Hop
from testbed.atlas.switch import GrantSwitch
from testbed.atlas.timing import timing_from_json
from testbed.lifetime import die_with_parent
from testbed.thread_slice import control_priority
from testbed.trace import task_names
from testbed.trace.task_names import name_this_thread


def serve_messages(
    loop: GrantLoop,
    recv: Callable[[int, float | None], bytes | None],
    clock: Callable[[], int] = time.monotonic_ns,
    replan_path: Path | None = None,
) -> int:
    """Feed ``loop`` every datagram ``recv(size, timeout_s)`` returns (None: the timeout passed),
    each stamped with ``clock`` as it arrives, and let it act on its timers (``loop.tick``) when they
    are due, until a ``stop`` message; a ``replan`` message swaps in the plan in ``replan_path``;
    returns how many messages were handled. Raises what a bad
    message raises (ValueError, KeyError): the caller falls back to fair sharing."""
    handled = 0
    while True:
        wake = loop.next_wakeup_ns()
        timeout = None if wake is None else max(0.0, (wake - clock()) / 1e9)
        data = recv(MAX_MESSAGE_BYTES, timeout)
        t = clock()
        if data is not None:
            msg = parse_message(data)
            if msg["ev"] == STOP:
                return handled
            if msg["ev"] == REPLAN and replan_path is not None:
                replan = json.loads(replan_path.read_text())
                loop.replan(timing_from_json(replan["timing"]), replan["iteration_ns"], replan.get("sharing"))
                if "switch" in replan:  # the links' rates changed: every grant compiled again
                    loop.relink(GrantSwitch.batches_from_json(replan["switch"]), t)
                if "hops" in replan:  # the routes moved: the transfers' paths and notices with them
                    loop.reroute(_hops_from_json(replan["hops"]), _notice_from_json(replan["notice"]), t)
            else:
                loop.handle(msg, t)
            handled += 1
        loop.tick(t)


def socket_recv(sock: socket.socket, token: bytes = b"") -> Callable[[int, float | None], bytes | None]:
    """``serve_messages``'s ``recv`` over a datagram socket; with ``token`` (UDP across machines),
    a datagram that does not start with it is dropped and the token taken off the others."""

    sock.setblocking(False)

    def recv(size: int, timeout_s: float | None) -> bytes | None:
        # select waits to the microsecond; a socket timeout would round up to whole milliseconds
        readable, _, _ = select.select([sock], [], [], timeout_s)
        if not readable:
            return None
        try:
            data = sock.recv(size + len(token))
        except BlockingIOError:
            return None
        if token:
            return data[len(token) :] if data[: len(token)] == token else None
        return data

    return recv


def serve(plan_path: str) -> None:
    """The controller process: ``python -m testbed.atlas.controller_process PLAN.json``. Reads control datagrams
    until a ``stop`` message; on any failure it opens every class (fair sharing), writes the reason
    to the plan's ``error_file`` and exits with status 1."""
    plan = json.loads(Path(plan_path).read_text())
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the runner handles Ctrl-C and stops us
    die_with_parent()
    name_this_thread(task_names.CONTROLLER)
    control_priority()
    relays = plan.get("relays")
    switch = GrantSwitch(
        GrantSwitch.batches_from_json(plan["switch"]), Path(plan["log"]), Path(plan["shaping_log"]), relays
    )
    loop = grant_loop_from_plan(plan, switch)
    family = socket.AF_INET if relays else socket.AF_UNIX
    sock = socket.socket(family, socket.SOCK_DGRAM, fileno=plan["fd"])  # bound by the runner
    token = bytes.fromhex(relays["token"]) if relays else b""
    handled = 0
    try:
        handled = serve_messages(loop, socket_recv(sock, token), replan_path=Path(plan["log"]).with_name(REPLAN_FILE))
    except BaseException as e:  # noqa: BLE001 - any failure must fall back, never deadlock
        Path(plan["error_file"]).write_text(repr(e))
        for hop in switch.batches:
            try:
                switch.apply(hop, "open", event="fall_back")
            except Exception:  # noqa: BLE001 - the network may be going down
                break
        switch.close()
        sys.exit(1)
    switch.end(
        messages=handled,
        deadline_releases=loop.deadline_releases,
        expired=loop.rendezvous.expired,
        repeated=loop.rendezvous.repeated,
    )
    switch.close()


def grant_loop_from_plan(plan: dict, switch: GrantSwitch) -> GrantLoop:
    """The grant loop ``controller.Controller.start`` described in ``controller_plan.json``."""
    timing = timing_from_json(plan["timing"])
    return GrantLoop(
        switch,
        {int(k): v for k, v in plan["replica_of"].items()},
        _hops_from_json(plan["hops"]),
        sharing=plan["sharing"],
        timing=timing,
        stage_of={int(k): v for k, v in plan["stage_of"].items()},
        notice_ns=_notice_from_json(plan["notice"]),
        counters=switch.class_bytes,
        iteration_ns=plan.get("iteration_ns", NEVER),
        homes=plan.get("stage_homes"),
        links=switch.batches.keys(),
    )


def _hops_from_json(rows: list[dict]) -> dict[tuple[int, int], list[Hop]]:
    """``Controller.hops_json``'s rows: each (sender, receiver) pair's path."""
    return {(h["src"], h["dst"]): [Hop(*x) for x in h["hops"]] for h in rows}


def _notice_from_json(rows: list[dict]) -> dict[tuple[int, int], int]:
    """``Controller.hops_json``'s notice rows: each pair's receiver-to-sender one-way delay (ns)."""
    return {(n["src"], n["dst"]): n["ns"] for n in rows}


if __name__ == "__main__":
    serve(sys.argv[1])
