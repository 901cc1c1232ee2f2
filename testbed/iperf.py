"""iperf3 measurements between two emulated hosts (server and client in their namespaces)."""
from __future__ import annotations

import json
import subprocess
import select
import time
from dataclasses import dataclass

from .errors import CheckError

PORT = 5201


@dataclass(frozen=True)
class IperfResult:
    """Receiver-side figures; omitted warm-up seconds are excluded (iperf3 -O)."""

    bits_per_second: float
    packets: int | None = None
    lost_percent: float | None = None
    retransmits: int | None = None


def _start_server(emu, host: str):
    srv = emu.popen(host, ["iperf3", "-s", "-1", "--forceflush", "-p", str(PORT)], stdout=subprocess.PIPE)
    deadline = time.monotonic() + 5
    buf = b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([srv.stdout], [], [], 0.1)
        if ready:
            chunk = srv.stdout.read1(4096) if hasattr(srv.stdout, "read1") else srv.stdout.readline()
            if not chunk:
                break
            buf += chunk
            if b"listening" in buf:
                return srv
    srv.kill()
    raise CheckError(f"iperf3 server in {host} did not start: {buf.decode(errors='replace')[-300:]}")


def iperf(emu, src: str, dst: str, duration_s: float, omit_s: float, udp_rate_bps: int | None = None,
          extra: list[str] | None = None) -> IperfResult:
    """Send from host ``src`` to host ``dst`` for ``duration_s`` seconds after ``omit_s`` seconds of
    warm-up; TCP by default, UDP at ``udp_rate_bps`` when given (1200-byte datagrams)."""
    srv = _start_server(emu, dst)
    try:
        argv = ["iperf3", "-c", str(emu.host(dst).ip), "-p", str(PORT), "-t", f"{duration_s:g}", "-O", f"{omit_s:g}",
                "-J", "--connect-timeout", "5000", *(extra or [])]
        if udp_rate_bps:
            argv += ["-u", "-b", str(int(udp_rate_bps)), "-l", "1200"]
        proc = emu.run(src, argv, timeout_s=duration_s + omit_s + 30)
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
    if udp_rate_bps:
        s = end["sum"]
        return IperfResult(s["bits_per_second"] * (1 - s["lost_percent"] / 100), s["packets"], s["lost_percent"])
    return IperfResult(end["sum_received"]["bits_per_second"], retransmits=end["sum_sent"].get("retransmits"))
