"""The WAN shaping of a run's namespaces on this machine: installing the shaping plan's HTB trees,
reading their counters, and changing them live (:class:`network.LiveShaping`, used by Atlas).

Every change is made in place through netlink (``tc change``: no delete, no unshaped window) and
logged in ``shaping.jsonl`` with its CLOCK_MONOTONIC time (``trace/shaping_log.py``).
"""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from pyroute2 import IPRoute

from testbed.errors import CheckError
from testbed.net import netlink_tc, rtnl_raw
from testbed.net.hostproc import HostProcesses
from testbed.net.namespaces import NamespaceHandles
from testbed.net.shaping import (
    DEFAULT_CLASS_MINOR,
    LINK_CLASS_MINOR,
    EgressPlan,
    HtbClass,
    Netem,
    U32Filter,
    with_class,
)
from testbed.net.shaping_text import tc_argv
from testbed.spec.addressing import AddressPlan
from testbed.trace.jsonl import open_jsonl, write_row
from testbed.trace.shaping_log import SHAPING_LOG, class_id, shaping_record


class WanShaper:
    """Shaping of the namespaces in ``handles``. ``out_dir`` receives ``shaping.jsonl``; ``now_ns``
    is the run's clock; ``processes`` starts helpers beside the shaping (``start_helper``)."""

    def __init__(
        self,
        plan: AddressPlan,
        handles: NamespaceHandles,
        out_dir: Path,
        now_ns: Callable[[], int],
        processes: HostProcesses,
    ) -> None:
        self.plan, self.handles, self.now_ns, self.processes = plan, handles, now_ns, processes
        self.shaping_log_path = out_dir / SHAPING_LOG
        self._log = open_jsonl(self.shaping_log_path)
        self._egress: dict[tuple[str, str], EgressPlan] = {}
        self._lock = threading.Lock()
        self._rtnl: dict[str, socket.socket] = {}  # plain rtnetlink sockets by namespace, for batches
        #: the counters' own sockets by namespace (``counters`` is called from the link sampler's
        #: thread while batches go out on the others), used under ``_counters_lock``
        self._counter_socks: dict[str, socket.socket] = {}
        self._counters_lock = threading.Lock()

    # ----------------------------------------------------------------- installing and reading
    def install(self, egress: EgressPlan) -> None:
        """Install one interface's egress plan (its HTB tree, or a bare netem root)."""
        netlink_tc.apply_egress(self.handles.ipr(egress.netns), egress)
        self._egress[(egress.netns, egress.ifname)] = egress
        for cls in egress.classes:
            self._write(self.now_ns(), "add", egress.netns, egress.ifname, cls, 0)
        if any(self.plan.routers[src].netns == egress.netns for src, _ in self.plan.wan_ends):
            # what a live change needs, found now rather than by the first change: the router's
            # socket and the interface's index (a pyroute2 look-up). The first change took 4.4 ms
            # on an idle machine against 0.4 ms each after, and a link profile's first step came 25
            # ms late under the test suite's load; now the first takes 0.4 ms too
            self._rtnl_socket(egress.netns)
            self.handles.ifindex(egress.netns, egress.ifname)

    def counters(self, wan_ends: Sequence[tuple[str, str]]) -> dict[tuple[str, str], dict[int, dict[str, int]]]:
        """The HTB classes with their counters of the WAN egresses ``(src DC, dst DC)``, in
        ``netlink_tc.read_classes``' form, read on plain rtnetlink sockets
        (``rtnl_raw.read_htb_classes``: this is the link sampler's read, ten times a second)."""
        out = {}
        with self._counters_lock:
            for src, dst in wan_ends:
                netns, ifname = self.plan.routers[src].netns, self.plan.wan_ends[(src, dst)].ifname
                if netns not in self._counter_socks:
                    self._counter_socks[netns] = rtnl_raw.rtnl_socket(netns)
                index = self.handles.ifindex(netns, ifname)
                out[(src, dst)] = rtnl_raw.read_htb_classes(self._counter_socks[netns], index)
        return out

    def queued_packets(self) -> int:
        """Packets queued on every shaped interface."""
        return sum(netlink_tc.queued_packets(self.handles.ipr(ns), ifname) for ns, ifname in self._egress)

    def wait_quiet(self, timeout_s: float = 60.0) -> float:
        """Wait until no shaped interface holds queued packets (e.g. after a bulk transfer filled a
        deep queue). Returns the seconds waited; raises CheckError after ``timeout_s``."""
        t0 = time.monotonic()
        while True:
            queued = self.queued_packets()
            waited = time.monotonic() - t0
            if queued == 0:
                return waited
            if waited > timeout_s:
                raise CheckError(f"{queued} packets still queued after {timeout_s:g} s: the network is not idle")
            time.sleep(0.05)

    def close(self) -> None:
        for sock in self._rtnl.values():
            sock.close()
        self._rtnl.clear()
        with self._counters_lock:
            for sock in self._counter_socks.values():
                sock.close()
            self._counter_socks.clear()
        self._log.close()

    def _rtnl_socket(self, netns: str) -> socket.socket:
        if netns not in self._rtnl:
            self._rtnl[netns] = rtnl_raw.rtnl_socket(netns)
        return self._rtnl[netns]

    # ----------------------------------------------------------------- live changes (LiveShaping)
    def _wan(self, src_dc: str, dst_dc: str) -> tuple[IPRoute, EgressPlan]:
        """The pyroute2 handle of the router's namespace (usable from the calling thread) and the
        egress plan of the WAN link from ``src_dc`` towards its neighbour ``dst_dc``."""
        egress = self._wan_egress(src_dc, dst_dc)
        return self.handles.ipr(egress.netns), egress

    def _wan_egress(self, src_dc: str, dst_dc: str) -> EgressPlan:
        """The egress plan of the WAN link from ``src_dc`` towards its neighbour ``dst_dc``, without
        the pyroute2 handle: a thread's first use of that enters the namespace (``handles.ipr``),
        which live changes on their own sockets do not need (it made a link profile's first step,
        the first change from its thread, 7-25 ms late)."""
        end = self.plan.wan_ends.get((src_dc, dst_dc))
        if end is None:
            raise KeyError(f"no WAN link between {src_dc} and {dst_dc}")
        ns = self.plan.routers[src_dc].netns
        return self._egress[(ns, end.ifname)]

    def _write(self, t_ns: int, event: str, netns: str, ifname: str, cls: HtbClass, duration_ns: int) -> None:
        write_row(
            self._log, shaping_record(t_ns, event, netns, ifname, cls.minor, cls.rate_bps, cls.ceil_bps, duration_ns)
        )

    def add_wan_class(
        self,
        src_dc: str,
        dst_dc: str,
        minor: int,
        rate_bps: int,
        ceil_bps: int | None = None,
        pairs: Sequence[tuple[str | None, str | None]] = (),
    ) -> None:
        """Add HTB class ``1:minor`` on the WAN egress ``src_dc`` -> ``dst_dc`` and send to it the
        packets of each (source host, destination host) pair (a None side matches any host).
        The class borrows nothing beyond ``ceil_bps`` (default: ``rate_bps``). Raises ValueError
        for a minor that exists or is reserved, KeyError for an unknown link or host."""
        ipr, egress = self._wan(src_dc, dst_dc)
        if any(c.minor == minor for c in egress.classes) or minor <= DEFAULT_CLASS_MINOR:
            raise ValueError(f"class 1:{minor:x} exists or is reserved; use minors above 0x{DEFAULT_CLASS_MINOR:x}")
        cls = HtbClass(minor, LINK_CLASS_MINOR, rate_bps, ceil_bps or rate_bps)
        ip = {h.name: str(h.ip) for h in self.plan.hosts.values()}
        filters = tuple(
            U32Filter(prio=minor * 16 + i, flow_minor=minor, src=ip[s] if s else None, dst=ip[d] if d else None)
            for i, (s, d) in enumerate(pairs)
        )
        new = with_class(egress, cls, filters)
        idx = self.handles.ifindex(egress.netns, egress.ifname)
        with self._lock:
            t0 = self.now_ns()
            netlink_tc.add_class(ipr, idx, new.classes[-1], egress.ifname)
            for f in filters:
                netlink_tc.add_filter(ipr, idx, f, egress.ifname)
            self._egress[(egress.netns, egress.ifname)] = new
            self._write(t0, "add", egress.netns, egress.ifname, new.classes[-1], self.now_ns() - t0)

    def set_wan_class_rate(
        self, src_dc: str, dst_dc: str, minor: int, rate_bps: int, ceil_bps: int | None = None
    ) -> int:
        """Change class ``1:minor`` on the WAN egress ``src_dc`` -> ``dst_dc`` in place, in one
        netlink message on the router's own socket. Logged with its CLOCK_MONOTONIC time; returns
        that time (ns). Raises KeyError for an unknown class, BuildError if the kernel refuses."""
        egress = self._wan_egress(src_dc, dst_dc)
        old = next((c for c in egress.classes if c.minor == minor), None)
        if old is None:
            raise KeyError(f"no class 1:{minor:x} on {src_dc}->{dst_dc}")
        new = replace(old, rate_bps=rate_bps, ceil_bps=ceil_bps or rate_bps)
        data = netlink_tc.class_change_message(self.handles.ifindex(egress.netns, egress.ifname), new)
        with self._lock:
            sock = self._rtnl_socket(egress.netns)
            t0 = self.now_ns()
            rtnl_raw.send_batch(sock, data, 1)
            dt = self.now_ns() - t0
            self._egress[(egress.netns, egress.ifname)] = replace(
                egress, classes=tuple(new if c.minor == minor else c for c in egress.classes)
            )
            self._write(t0, "change", egress.netns, egress.ifname, new, dt)
        return t0

    def compile_wan_class_rates(
        self, src_dc: str, dst_dc: str, rates_bps: Sequence[tuple[int, int] | tuple[int, int, int]]
    ) -> dict[str, Any]:
        """Compile in-place changes of classes ``1:minor`` on the WAN egress ``src_dc`` -> ``dst_dc``,
        each ``(minor, rate_bps)`` (ceil = rate) or ``(minor, rate_bps, ceil_bps)``, applied in the
        given order, without applying them. Returns ``{"netns", "ifname", "ifindex", "data" (bytes,
        for rtnl_raw.send_batch), "classes": [[classid, rate_bps, ceil_bps], ...]}``; whoever applies
        it logs it (``shaping.jsonl`` lines). Raises KeyError for an unknown class."""
        egress = self._wan_egress(src_dc, dst_dc)
        idx = self.handles.ifindex(egress.netns, egress.ifname)
        by_minor = {c.minor: c for c in egress.classes}
        wanted = [(c[0], c[1], c[2] if len(c) == 3 else c[1]) for c in rates_bps]
        missing = [m for m, _, _ in wanted if m not in by_minor]
        if missing:
            raise KeyError(f"no class 1:{missing[0]:x} on {src_dc}->{dst_dc}")
        changes = [(idx, replace(by_minor[m], rate_bps=r, ceil_bps=c)) for m, r, c in wanted]
        return {
            "netns": egress.netns,
            "ifname": egress.ifname,
            "ifindex": idx,
            "data": netlink_tc.compile_class_changes(changes),
            "classes": [[class_id(m), r, c] for m, r, c in wanted],
        }

    def set_link_rate(self, a: str, b: str, rate_bps: int) -> None:
        """Change a WAN link's rate in both directions, in place (link and default classes): one
        netlink batch per router namespace, both sent before either acknowledgement is awaited, so
        the two directions change within one system call of each other. Logged like every change.
        Raises KeyError for an unknown link, BuildError if the kernel refuses a change."""
        minors = (LINK_CLASS_MINOR, DEFAULT_CLASS_MINOR)
        classes = [(minor, rate_bps) for minor in minors]
        batches = [self.compile_wan_class_rates(src, dst, classes) for src, dst in ((a, b), (b, a))]
        with self._lock:
            socks = [self._rtnl_socket(batch["netns"]) for batch in batches]
            t0 = self.now_ns()
            for sock, batch in zip(socks, batches):
                sock.send(batch["data"])
            for sock, batch in zip(socks, batches):
                rtnl_raw.await_acks(sock, len(batch["classes"]))
            dt = self.now_ns() - t0
            for src, dst in ((a, b), (b, a)):
                egress = self._wan_egress(src, dst)
                changed = tuple(
                    replace(c, rate_bps=rate_bps, ceil_bps=rate_bps) if c.minor in minors else c for c in egress.classes
                )
                self._egress[(egress.netns, egress.ifname)] = replace(egress, classes=changed)
                for cls in changed:
                    if cls.minor in minors:
                        self._write(t0, "change", egress.netns, egress.ifname, cls, dt)

    def netem_leaves(self, src_dc: str, dst_dc: str) -> list[tuple[int, Netem]]:
        """The netem leaves of the WAN egress ``src_dc`` -> ``dst_dc`` as installed or last changed:
        ``(class minor, leaf)`` each (none under the nfqueue mechanism)."""
        return [(c.minor, c.leaf) for c in self._wan_egress(src_dc, dst_dc).classes if isinstance(c.leaf, Netem)]

    def wan_classes(self, src_dc: str, dst_dc: str) -> dict[int, dict[str, int]]:
        """HTB classes on the WAN egress ``src_dc`` -> ``dst_dc`` as read back from the kernel."""
        ipr, egress = self._wan(src_dc, dst_dc)
        return netlink_tc.read_classes(ipr, self.handles.ifindex(egress.netns, egress.ifname))

    def wan_tc_argv(self, src_dc: str, dst_dc: str) -> list[list[str]]:
        """The tc(8) commands equivalent to the current shaping of one WAN egress."""
        return tc_argv(self._wan_egress(src_dc, dst_dc))

    def start_helper(self, argv: Sequence[str], what: str, **kwargs: Any) -> subprocess.Popen:
        """Start a helper of the run beside the shaping (Atlas's controller, which applies grants
        in these namespaces), registered for ``testbed clean`` and stopped at teardown."""
        return self.processes.popen_root(argv, what, **kwargs)
