"""iperf3 measurements between two emulated hosts (server and client in their namespaces)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from testbed.errors import CheckError
from testbed.net.network import Network, Process

PORT = 5201


@dataclass(frozen=True)
class IperfResult:
    """Receiver-side figures; omitted warm-up seconds are excluded (iperf3 -O)."""

    bits_per_second: float
    packets: int | None = None
    lost_percent: float | None = None
    retransmits: int | None = None
    #: the client's per-interval figures (bit/s, one per second by default, omitted ones included)
    interval_bps: tuple[float, ...] = ()


def _start_server(net: Network, host: str) -> Process:
    """Start a one-shot iperf3 server in ``host`` and wait until it listens (its log says so).
    Its output goes to the host's log, never to a pipe that nobody reads on a long test."""
    log = net.log_path(host)
    offset = log.stat().st_size if log.exists() else 0
    srv = net.popen(host, ["iperf3", "-s", "-1", "--forceflush", "-p", str(PORT)])
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and srv.poll() is None:
        if log.exists():  # on the remote backend the log arrives with the next copy from the machine
            with open(log, "rb") as f:
                f.seek(offset)
                if b"listening" in f.read():
                    return srv
        time.sleep(0.02)
    srv.kill()
    srv.wait()
    raise CheckError(f"iperf3 server in {host} did not start; see {log}")


def iperf(
    net: Network,
    src: str,
    dst: str,
    duration_s: float,
    omit_s: float,
    udp_rate_bps: int | None = None,
    extra: list[str] | None = None,
) -> IperfResult:
    """Send from host ``src`` to host ``dst`` for ``duration_s`` seconds after ``omit_s`` seconds of
    warm-up; TCP by default, UDP at ``udp_rate_bps`` when given (1200-byte datagrams)."""
    srv = _start_server(net, dst)
    try:
        argv = [
            "iperf3",
            "-c",
            str(net.host(dst).ip),
            "-p",
            str(PORT),
            "-t",
            f"{duration_s:g}",
            "-O",
            f"{omit_s:g}",
            "-J",
            "--connect-timeout",
            "5000",
            *(extra or []),
        ]
        if udp_rate_bps:
            argv += ["-u", "-b", str(int(udp_rate_bps)), "-l", "1200"]
        proc = net.run(src, argv, timeout_s=duration_s + omit_s + 30)
    finally:
        if srv.poll() is None:
            srv.kill()
        srv.wait()
    try:
        data = json.loads(proc.stdout)
    except ValueError:
        raise CheckError(f"iperf3 {src}->{dst} gave no JSON (exit {proc.returncode}): {proc.stderr[-300:]}") from None
    if "error" in data:
        raise CheckError(f"iperf3 {src}->{dst} failed: {data['error']}")
    end = data["end"]
    intervals = tuple(iv["sum"]["bits_per_second"] for iv in data.get("intervals", []))
    if udp_rate_bps:
        s = end["sum"]
        return IperfResult(
            s["bits_per_second"] * (1 - s["lost_percent"] / 100),
            s["packets"],
            s["lost_percent"],
            interval_bps=intervals,
        )
    return IperfResult(
        end["sum_received"]["bits_per_second"], retransmits=end["sum_sent"].get("retransmits"), interval_bps=intervals
    )
