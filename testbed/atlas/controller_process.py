"""Atlas's controller process: the grant loop (``grants.GrantLoop``) fed by the workers' control
datagrams (``channel.py``), applying grants through ``switch.GrantSwitch``. It runs in its own
interpreter (no GIL shared with the runner's threads) at a higher scheduling priority, started by
``controller.Controller``; if it fails it opens every class (fair sharing) and says why.

``python -m testbed.atlas.controller_process PLAN.json``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

from testbed.atlas.channel import MAX_MESSAGE_BYTES, STOP, parse_message
from testbed.atlas.grants import GrantLoop, Hop
from testbed.atlas.switch import GrantSwitch


def serve_messages(loop: GrantLoop, recv: Callable[[int], bytes], clock: Callable[[], int] = time.monotonic_ns) -> int:
    """Feed ``loop`` every datagram ``recv`` returns, each stamped with ``clock`` as it arrives,
    until a ``stop`` message; returns how many messages were handled. Raises what a bad message
    raises (ValueError, KeyError): the caller falls back to fair sharing."""
    handled = 0
    while True:
        data = recv(MAX_MESSAGE_BYTES)
        t = clock()
        msg = parse_message(data)
        if msg["ev"] == STOP:
            return handled
        loop.handle(msg, t)
        handled += 1


def serve(plan_path: str) -> None:
    """The controller process: ``python -m testbed.atlas.controller_process PLAN.json``. Reads control datagrams
    until a ``stop`` message; on any failure it opens every class (fair sharing), writes the reason
    to the plan's ``error_file`` and exits with status 1."""
    plan = json.loads(Path(plan_path).read_text())
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the runner handles Ctrl-C and stops us
    _die_with_parent()
    try:
        os.setpriority(os.PRIO_PROCESS, 0, -10)  # grants must not wait behind the workers
    except OSError:
        pass
    switch = GrantSwitch(GrantSwitch.batches_from_json(plan["switch"]), Path(plan["log"]), Path(plan["shaping_log"]))
    loop = GrantLoop(
        switch,
        {int(k): v for k, v in plan["replica_of"].items()},
        {(h["src"], h["dst"]): [Hop(*x) for x in h["hops"]] for h in plan["hops"]},
    )
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM, fileno=plan["fd"])  # bound by the runner
    try:
        serve_messages(loop, sock.recv)
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


if __name__ == "__main__":
    serve(sys.argv[1])
