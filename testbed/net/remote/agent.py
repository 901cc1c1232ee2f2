"""The machine end of ``--backend remote``: one agent per machine, started over SSH by the runner.

It builds this machine's DCs (the netns backend's code, with WAN links to DCs elsewhere as VXLAN
tunnels), starts and watches processes in their hosts, reads link counters, and hands back what the
processes write, all on request. Protocol: one JSON request per line on stdin, one JSON reply per
line on the original stdout (``{"ok": true, ...}`` or ``{"ok": false, "error": ..., "type": ...}``);
anything else printed goes to stderr. When stdin closes (the runner exited or died, or its SSH
connection dropped), when no request came for 30 s (the runner asks several times a second, so
silence means it or the network is gone even where TCP never reports it), or on SIGTERM/SIGHUP, the
agent tears everything down and exits; its run is in
this machine's registry, so ``testbed clean`` here finishes the job if the agent itself is killed.

Run as ``python -m testbed.net.remote.agent`` with the deployed package on PYTHONPATH.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from testbed.errors import TestbedError


class Agent:
    def __init__(self, reply) -> None:
        self.reply = reply
        self.net: Any = None
        self.procs: dict[int, subprocess.Popen] = {}
        self.offsets: dict[str, int] = {}
        self.run_dir: Path | None = None
        self.busy = False
        self.last_request = time.monotonic()

    # ------------------------------------------------------------------ requests
    def op_hello(self, req: dict) -> dict:
        import platform

        return {
            "pid": os.getpid(),
            "t_ns": time.monotonic_ns(),
            "python": platform.python_version(),
            "kernel": platform.release(),
            "hostname": platform.node(),
        }

    def op_clock(self, req: dict) -> dict:
        return {"t_ns": time.monotonic_ns()}

    def op_build(self, req: dict) -> dict:
        from testbed.net.capacity_probe import capacity_bps
        from testbed.net.local import LocalNetwork
        from testbed.spec.topology_file import parse_topology

        spec = parse_topology(req["spec"], req["source"])
        tunnels = {(t["here"], t["there"]): t for t in req["tunnels"]}
        self.run_dir = Path(req["out_dir"])
        self.net = LocalNetwork(
            spec,
            delay_mechanism=req["delay_mechanism"],
            out_dir=self.run_dir,
            prefix=req["prefix"],
            capacity_bps=capacity_bps if req["check_capacity"] else None,
            tcp_buffer_bytes=req.get("tcp_buffer_bytes"),
            dcs_here=req["dcs"],
            tunnels=tunnels,
            mtu=req["mtu"],
            clock_offset_ns=req["clock_offset_ns"],
        )
        try:
            self.net.build()  # not __enter__: no signal handler; failures are reported on request
        except BaseException:
            self.net.teardown()
            self.net = None
            raise
        return {"mechanism": self.net.mechanism, "build_s": self.net.build_s}

    def op_popen(self, req: dict) -> dict:
        proc = self.net.popen(req["host"], req["argv"], env={**os.environ, **req.get("env", {})})
        self.procs[proc.pid] = proc
        return {"pid": proc.pid}

    def op_poll(self, req: dict) -> dict:
        return {"codes": {str(pid): self.procs[pid].poll() for pid in req["pids"]}}

    def op_signal(self, req: dict) -> dict:
        proc = self.procs[req["pid"]]
        if proc.poll() is None:
            proc.send_signal(req["signal"])
        return {}

    def op_wait(self, req: dict) -> dict:
        try:
            return {"code": self.procs[req["pid"]].wait(timeout=req.get("limit_s"))}
        except subprocess.TimeoutExpired:
            return {"code": None}

    def op_run(self, req: dict) -> dict:
        p = self.net.run(req["host"], req["argv"], timeout_s=req["limit_s"])
        return {"returncode": p.returncode, "stdout": p.stdout, "stderr": p.stderr}

    def op_alive(self, req: dict) -> dict:
        failure = self.net.failure if self.net is not None else None
        return {"failure": str(failure) if failure else None}

    def op_counters(self, req: dict) -> dict:
        return {
            "links": [
                [src, dst, {str(m): c for m, c in classes.items()}]
                for (src, dst), classes in self.net.wan_counters().items()
            ]
        }

    def op_queued(self, req: dict) -> dict:
        return {"packets": self.net.shaping.queued_packets()}

    #: the live-shaping calls a runner may make here (``network.LiveShaping``; ``remote/live_shaping.py``)
    SHAPING_CALLS = frozenset(
        (
            "add_wan_class",
            "set_wan_class_rate",
            "compile_wan_class_rates",
            "set_link_rate",
            "wan_classes",
            "wan_tc_argv",
        )
    )

    def op_shape(self, req: dict) -> dict:
        """One live-shaping call on this machine's WAN egresses; bytes come back as hex, a class
        table's minors as strings."""
        call = req["call"]
        if call not in self.SHAPING_CALLS:
            raise ValueError(f"unknown shaping call {call!r}")
        args = req.get("args", {})
        if "pairs" in args:
            args["pairs"] = [tuple(p) for p in args["pairs"]]
        if "rates_bps" in args:
            args["rates_bps"] = [tuple(r) for r in args["rates_bps"]]
        result = getattr(self.net.shaping, call)(**args)
        if isinstance(result, dict) and isinstance(result.get("data"), bytes):
            result = {**result, "data": result["data"].hex()}
        elif call == "wan_classes":
            result = {str(k): v for k, v in result.items()}
        return {"result": result}

    def op_relay(self, req: dict) -> dict:
        """Start this machine's control relay (``control_relay.py``), with no path bound yet (the
        runner asks it for those); returns its UDP port. Stopped at teardown like every helper of
        the run."""
        from testbed.net.remote.control_relay import start_relay
        from testbed.trace.shaping_log import RELAY_LOG

        assert self.run_dir is not None and self.net is not None
        config = Path("relay.json").absolute()  # beside the run folder: its token is not a trace
        config.touch(mode=0o600)
        config.write_text(
            json.dumps(
                {
                    "token": req["token"],
                    "offset_ns": req["offset_ns"],
                    "log": str((self.run_dir / RELAY_LOG).absolute()),
                    "faults": req.get("faults"),
                    "machine": req.get("machine", ""),
                }
            )
        )
        log = open(self.run_dir / "logs" / f"relay-{req.get('machine', 'here')}.log", "ab")
        try:
            port = start_relay(
                config,
                lambda argv: self.net.shaping.start_helper(argv, "control relay", stdout=log, stderr=subprocess.STDOUT),
            )
        finally:
            log.close()
        return {"port": port}

    def op_read(self, req: dict) -> dict:
        """What the run's processes appended to the files of the run folder since the last read:
        whole lines of ``.jsonl`` files, everything of others; bytes as latin-1 text."""
        out = {}
        if self.run_dir is None or not self.run_dir.exists():
            return {"files": out}
        for path in sorted(self.run_dir.rglob("*")):
            if not path.is_file():
                continue
            rel = str(path.relative_to(self.run_dir))
            at = self.offsets.get(rel, 0)
            with open(path, "rb") as f:
                f.seek(at)
                data = f.read(req.get("max_bytes", 8 << 20))
            if path.suffix == ".jsonl":
                data = data[: data.rfind(b"\n") + 1]
            if data:
                self.offsets[rel] = at + len(data)
                out[rel] = data.decode("latin-1")
        return {"files": out}

    def op_teardown(self, req: dict) -> dict:
        self.teardown()
        return {}

    # ------------------------------------------------------------------ lifecycle
    def teardown(self) -> None:
        if self.net is not None:
            self.net.teardown()
            self.net = None
        self.procs.clear()

    def serve(self, lines) -> None:
        for line in lines:
            if not line.strip():
                continue
            self.busy = True
            req = json.loads(line)
            op = getattr(self, "op_" + req.get("op", ""), None)
            try:
                if op is None:
                    raise ValueError(f"unknown request {req.get('op')!r}")
                result = {"ok": True, **op(req)}
            except (TestbedError, OSError, KeyError, ValueError, subprocess.SubprocessError) as e:
                result = {"ok": False, "type": type(e).__name__, "error": str(e)}
            except Exception as e:  # a library's own error type (pyroute2's NetlinkError, ...)
                traceback.print_exc()
                result = {"ok": False, "type": type(e).__name__, "error": str(e)}
            result["id"] = req.get("id")
            self.reply(result)
            self.last_request = time.monotonic()
            self.busy = False

    def watchdog(self, idle_s: float) -> None:
        """Tear down (SIGTERM to this process) when no request came for ``idle_s`` seconds while
        idle: the runner polls every fraction of a second, so silence means it, its machine or the
        network between is gone, even where TCP never delivers the close."""
        while True:
            time.sleep(1.0)
            if not self.busy and time.monotonic() - self.last_request > idle_s:
                print(f"testbed agent: no request for {idle_s:g} s; the runner is gone: tearing down", flush=True)
                os.kill(os.getpid(), signal.SIGTERM)
                return


def _on_signal(signum, frame) -> None:
    raise SystemExit(128 + signum)


def main() -> int:
    # the protocol owns the original stdout; stray prints (warnings, errors) go to stderr
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def reply(obj: dict) -> None:
        proto.write(json.dumps(obj) + "\n")

    agent = Agent(reply)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, _on_signal)
    threading.Thread(
        target=agent.watchdog, args=(float(os.environ.get("TESTBED_AGENT_IDLE_S", "30")),), name="watchdog", daemon=True
    ).start()
    try:
        agent.serve(sys.stdin)
    finally:
        agent.teardown()
        if os.environ.get("TESTBED_AGENT_REMOVE"):  # the deployed code, never the traces (see remote/backend.py)
            shutil.rmtree(os.environ["TESTBED_AGENT_REMOVE"], ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
