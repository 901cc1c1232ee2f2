"""iperf3 measurements between two emulated hosts (server and client in their namespaces)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from testbed.errors import CheckError
from testbed.net.network import Network, Process

PORT = 5201
#: how long an iperf3 server may take to listen (s)
SERVER_START_S = 5.0


@dataclass(frozen=True)
class IperfResult:
    """What an iperf3 test measured; omitted warm-up seconds are excluded (iperf3 -O).

    TCP ``bits_per_second`` is the receiver's goodput over its whole measured intervals (one per
    second; ``receiver_goodput``), not iperf3's own summary, which divides by a receiver window
    that is not aligned with the data (about 0.75 s too long at 400 ms RTT, 15% of a 5 s test;
    measured with ``scripts/bench_wire.py``). UDP ``bits_per_second``: the sent rate less the loss
    the receiver counted (``lost_percent``, of ``packets``)."""

    bits_per_second: float
    packets: int | None = None
    lost_percent: float | None = None
    retransmits: int | None = None
    #: the receiver's per-interval goodput (bit/s, one per second; omitted ones included, in order)
    interval_bps: tuple[float, ...] = ()


def _start_server(net: Network, host: str) -> Process:
    """Start a one-shot iperf3 server in ``host`` (JSON output, handed to the client with
    ``--get-server-output``) and wait until its port listens (``ss``; on the remote backend each
    look is one request to the machine's agent). Its output goes to the host's log, never to a
    pipe that nobody reads on a long test."""
    srv = net.popen(host, ["iperf3", "-s", "-1", "-J", "-p", str(PORT)])
    deadline = time.monotonic() + SERVER_START_S
    while (left := deadline - time.monotonic()) > 0 and srv.poll() is None:
        if f":{PORT} " in net.run(host, ["ss", "-Hltn", f"sport = :{PORT}"], timeout_s=max(left, 0.5)).stdout:
            return srv
        time.sleep(0.05)
    srv.kill()
    srv.wait()
    raise CheckError(f"iperf3 server in {host} did not listen within {SERVER_START_S:g} s; see {net.log_path(host)}")


def receiver_goodput(server: dict) -> tuple[float | None, tuple[float, ...]]:
    """(goodput in bit/s over the receiver's measured whole intervals, or None when it measured
    none; every interval's bit/s, omitted ones included, in order) from the server's JSON.
    Omitted intervals and partial ones (under 0.9 s) do not count. An interval's length is end -
    start: iperf3 3.12 reports the interval at the end of the omitted seconds as start = end with
    "seconds": 2.0 and one second's bytes; it is left out of both figures."""
    sums = [iv["sum"] for iv in server.get("intervals", []) if iv["sum"]["end"] > iv["sum"]["start"]]
    whole = [s for s in sums if not s.get("omitted") and s["end"] - s["start"] >= 0.9]
    seconds = sum(s["end"] - s["start"] for s in whole)
    goodput = sum(s["bytes"] for s in whole) * 8 / seconds if seconds > 0 else None
    return goodput, tuple(s["bytes"] * 8 / (s["end"] - s["start"]) for s in sums)


#: iperf3 sets up a UDP stream with one datagram each way and no retransmission, so on a lossy
#: link the setup itself fails now and then ("unable to read from stream socket", esnet/iperf#862)
UDP_SETUP_FAILURE = "unable to read from stream socket"
UDP_SETUP_ATTEMPTS = 4


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
    warm-up; TCP by default, UDP at ``udp_rate_bps`` when given (1200-byte datagrams; a test whose
    stream setup datagram was lost is run again, up to ``UDP_SETUP_ATTEMPTS`` times). Raises
    CheckError when iperf3 fails."""
    for attempt in range(UDP_SETUP_ATTEMPTS if udp_rate_bps else 1):
        try:
            return _iperf_once(net, src, dst, duration_s, omit_s, udp_rate_bps, extra)
        except CheckError as e:
            if UDP_SETUP_FAILURE not in str(e) or attempt + 1 == UDP_SETUP_ATTEMPTS:
                raise
    raise AssertionError("unreachable")


def _iperf_once(
    net: Network,
    src: str,
    dst: str,
    duration_s: float,
    omit_s: float,
    udp_rate_bps: int | None,
    extra: list[str] | None,
) -> IperfResult:
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
            "--get-server-output",
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
    if "server_output_json" not in data:
        raise CheckError(
            f"iperf3 {src}->{dst}: the server's results did not come back (--get-server-output needs iperf3 3.1 "
            f"or newer on both hosts, and the server alive to the end); see {net.log_path(dst)}"
        )
    goodput, intervals = receiver_goodput(data["server_output_json"])
    if udp_rate_bps:
        s = end["sum"]
        return IperfResult(
            s["bits_per_second"] * (1 - s["lost_percent"] / 100),
            s["packets"],
            s["lost_percent"],
            interval_bps=intervals,
        )
    if goodput is None:
        raise CheckError(
            f"iperf3 {src}->{dst}: the receiver measured no whole second (duration {duration_s:g} s after "
            f"{omit_s:g} s omitted): measure for at least 2 s"
        )
    return IperfResult(goodput, retransmits=end["sum_sent"].get("retransmits"), interval_bps=intervals)
