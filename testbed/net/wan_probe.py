"""What one TCP connection carries on each WAN path of a built network, measured before training
(``testbed run --profile-wan``): per path direction, from a host of one DC to a host of the other,
the idle round trip, the time of one message of the pipeline's size and one connection's bulk
goodput, under the hosts' own socket buffers and congestion control (``wan_probe_peer.py`` runs
the two ends). The result is ``spec.wan_profile.WanProfile``, which the simulator uses in place of
the modelled window.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from pathlib import Path

from testbed.errors import CheckError
from testbed.net import wan_probe_peer
from testbed.net.network import Network
from testbed.spec.wan_profile import PathProfile, WanProfile

PORT = 5301
#: the probe's two ends, run as ``python -c SOURCE``: nothing of the package needs to be importable
#: in the hosts (on the remote backend, another machine's)
PEER_SOURCE = Path(wan_probe_peer.__file__).read_text()
#: seconds of the bulk transfer (its second half is measured)
BULK_S = 1.5
#: how long a server whose probe completed may take to exit before it is killed (s). A probe cut
#: short (an error, Ctrl-C, SIGTERM) kills its server at once: waiting for it there held a run's
#: SIGTERM back 10 s, the server waiting for a client that was gone
SERVER_EXIT_S = 10
#: the shortest message time a profile records (s): on a path without delay a message's time
#: beyond the round trip can round to nothing
SHORTEST_S = 1e-6


def _first_host(net: Network, dc: str) -> str:
    hosts = sorted((h for h in net.hosts.values() if h.dc == dc), key=lambda h: h.index)
    if not hosts:
        raise CheckError(f"DC {dc} has no host to probe its WAN paths from")
    return hosts[0].name


def probe_path(
    net: Network, src: str, dst: str, message_bytes: int, gap_s: float, bulk_s: float = BULK_S
) -> PathProfile:
    """One direction of the path from DC ``src`` to DC ``dst`` (see the module doc), between the
    first host of each; ``gap_s`` between timed messages. Raises CheckError when a probe end
    fails."""
    a, b = _first_host(net, src), _first_host(net, dst)
    server = net.popen(b, [net.python(b), "-c", PEER_SOURCE, "serve", str(PORT)])
    try:
        argv = [
            net.python(a),
            "-c",
            PEER_SOURCE,
            "probe",
            str(net.host(b).ip),
            str(PORT),
            str(message_bytes),
            f"{gap_s:g}",
            f"{bulk_s:g}",
        ]
        timeout = 60 + 2 * 20 * (gap_s + 1.0) + bulk_s
        try:
            done = net.run(a, argv, timeout_s=timeout)
        except subprocess.TimeoutExpired as e:
            raise CheckError(f"the WAN probe {src} -> {dst} did not finish within {timeout:.0f} s") from e
        if done.returncode != 0:
            raise CheckError(
                f"the WAN probe {src} -> {dst} failed (rc {done.returncode}): {done.stderr.strip()[-500:]}"
            )
        m = json.loads(done.stdout)
    except BaseException:  # a failed probe, or Ctrl-C or SIGTERM: the server waits for nothing more
        server.kill()
        server.wait()
        raise
    try:
        server.wait(timeout=SERVER_EXIT_S)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()
    return PathProfile(
        src,
        dst,
        m["rtt_s"],
        message_bytes,
        max(SHORTEST_S, m["message_round_trip_s"] - m["rtt_s"]),
        m["bulk_bps"],
    )


def profile_wan(
    net: Network,
    pairs: Sequence[tuple[str, str]],
    message_bytes: int,
    gap_s: float,
    socket_buffer_bytes: int | None = None,
    bulk_s: float = BULK_S,
) -> WanProfile:
    """Both directions of every DC pair in ``pairs``, one after the other (a probe alone on the
    WAN), and the hosts' congestion control. Raises CheckError when a probe fails."""
    paths = [probe_path(net, x, y, message_bytes, gap_s, bulk_s) for a, b in pairs for x, y in ((a, b), (b, a))]
    congestion = None
    if pairs:
        host = _first_host(net, pairs[0][0])
        # /proc, not sysctl(8): procps is not among the packages the set-up installs
        out = net.run(host, ["cat", "/proc/sys/net/ipv4/tcp_congestion_control"], timeout_s=10)
        congestion = out.stdout.strip() or None
    return WanProfile(tuple(paths), congestion, socket_buffer_bytes)
