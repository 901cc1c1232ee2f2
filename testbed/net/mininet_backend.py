"""The Mininet backend: Mininet's Python API realises the topology, the testbed shapes it.

Mininet (Debian package ``mininet``) starts one shell per node in a new network namespace and
creates the links, addresses, bridges and routes of :class:`mininet_topo.SpecTopo`. Its namespaces
have no names; each is then given the netns backend's name (``ip netns attach``), so everything
else (HTB classes, the delay mechanism, live shaping changes, the shaping log, workers started with
nsenter) is ``local.LocalNetwork``'s, on the interfaces Mininet created: this module is only its
realiser. Mininet's ``TCLink`` is
not used: it cannot change a rate in place, ignores rates over 1 Gbit/s and silently drops delay on
kernels without sch_netem.

No Mininet switches are used (hosts link straight to their DC router, which bridges them), so Open
vSwitch and OpenFlow controllers are not needed; ``openvswitch_status`` reports whether the machine
has them. Cleanup is the testbed's own (registry plus Mininet's ``stop``); ``mn -c`` is never called
(it kills processes by name and deletes files in /tmp). Mininet names ports in the root namespace
when switches are used, and its ``mn`` tool assumes it alone runs, so one Mininet run at a time
holds a lock (``/run/testbed/mininet.lock``); a second gets :class:`BackendBusyError`.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from pathlib import Path
from typing import Any

from testbed.errors import BuildError, FeatureError
from testbed.net import netlink, registry
from testbed.net.features import require_tools
from testbed.net.netns import RealiseContext, namespace_sysctls


class BackendBusyError(BuildError):
    """Another Mininet run holds the machine's Mininet lock."""


def lock_path() -> Path:
    return registry.RUN_DIR / "mininet.lock"


def import_mininet():
    """The ``mininet.net`` module, or FeatureError saying how to install it."""
    try:
        import mininet.net
    except ImportError as e:
        raise FeatureError(
            f"the mininet backend needs Mininet's Python package ({e}): apt-get install mininet, and make "
            "the virtual environment see the system's packages (scripts/setup.sh does both)"
        ) from None
    return mininet.net


def mininet_status() -> str:
    """Mininet's version and tools as found here, or what is missing and how to install it."""
    try:
        net = import_mininet()
    except FeatureError as e:
        return f"missing: {e}"
    tool = shutil.which("mnexec")
    return f"{net.VERSION}" + (f", mnexec {tool}" if tool else ", but no mnexec (apt-get install mininet)")


def openvswitch_status() -> str:
    """``"present"`` if Open vSwitch's tools and kernel module are both here, else what is missing."""
    missing = []
    if shutil.which("ovs-vsctl") is None:
        missing.append("ovs-vsctl (apt-get install openvswitch-switch)")
    if not Path("/sys/module/openvswitch").exists():
        missing.append("the openvswitch kernel module")
    return "present" if not missing else "absent (missing " + ", ".join(missing) + ")"


class MininetLock:
    """An exclusive flock held for a Mininet run's lifetime; released by the kernel if its holder
    dies, so a killed run never blocks the next one."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._fd: int | None = None

    def acquire(self) -> None:
        path = lock_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
            except ValueError:
                holder = {}
            os.close(fd)
            raise BackendBusyError(
                f"another Mininet run is active (run {holder.get('prefix', '?')}, pid {holder.get('pid', '?')}): "
                "Mininet runs one at a time on a machine (it names switch ports in the root namespace); "
                "wait for that run to end, or use --backend netns, which runs alongside others"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"prefix": self.prefix, "pid": os.getpid()}).encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None


class MininetRealiser:
    """The Mininet backend's realiser (``local.Realiser``): Mininet creates the nodes and links (see
    the module docstring). ``prepare`` raises FeatureError without Mininet and BackendBusyError
    while another Mininet run is active."""

    backend = "mininet"

    def __init__(self) -> None:
        self.mn: Any = None
        self._lock: MininetLock | None = None

    def prepare(self, prefix: str) -> None:
        import_mininet()
        require_tools(["mnexec"], "the mininet backend")
        self._lock = MininetLock(prefix)
        self._lock.acquire()

    def realise(self, ctx: RealiseContext) -> None:
        mnet = import_mininet()
        # mininet_topo's classes subclass Mininet's: imported only once Mininet is known to be here
        from testbed.net.mininet_topo import build_topo, router_node

        # Mininet.init() would raise the root namespace's sysctls and rlimits (mininet/util.py,
        # fixLimits); the testbed changes nothing it did not create, and root is checked already
        mnet.Mininet.inited = True
        self.mn = mnet.Mininet(
            topo=None,
            build=False,
            controller=None,
            autoSetMacs=False,
            autoStaticArp=False,
            inNamespace=False,
            waitConnected=False,
        )
        self.mn.topo = build_topo(ctx.spec, ctx.plan.prefix)
        try:
            self.mn.build()
        finally:
            for node in self.mn.hosts:  # even a half-built network's shells are registered
                ctx.record.add_process(node.pid, f"mininet shell of {node.name}")
        base, router, no_br_nf = namespace_sysctls(ctx.tcp_bytes, ctx.spec.tcp_congestion)
        for dc in ctx.spec.dcs:
            r = ctx.plan.routers[dc.name]
            ctx.handles.add(
                r.netns, netlink.attach_netns(r.netns, self.mn[router_node(dc.name)].pid, {**base, **router}, no_br_nf)
            )
            for h in ctx.plan.hosts_of(dc.name):
                ctx.handles.add(h.netns, netlink.attach_netns(h.netns, self.mn[h.name].pid, base))

    def stop(self) -> None:
        if self.mn is not None:
            self.mn.stop()
            self.mn = None
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def info(self) -> dict[str, Any]:
        return {"mininet": mininet_status(), "openvswitch": openvswitch_status()}
