"""The netns backend: realise a TopologySpec with network namespaces, veths, bridges and tc.

Layout: one namespace per host (interface ``eth0``) and one router namespace per DC holding the
DC switch (bridge ``br0``, the hosts' gateway) and one veth per WAN link to a peer DC's router
(``w-<peer>``). Routers forward along least-delay routes (routing.py). Every kernel object lives
inside the run's namespaces, named with the run prefix, and the run is registered before anything
is created, so ``testbed clean`` can finish a teardown after ``kill -9``.

Use::

    with Emulation(load_topology("three_dc"), out_dir=Path("results/x")) as emu:
        emu.run("east-h0", ["ping", "-c1", str(emu.host("west-h0").ip)])
        emu.set_wan_class_rate("east", "central", 0x10, 50_000_000)
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from pyroute2 import IPRoute

from . import netlink
from .addressing import BRIDGE_IFNAME, HOST_IFNAME, AddressPlan, HostAddr, host_port_ifname, new_run_prefix
from .delay_element import DelayElement, Supervisor
from .errors import BuildError, CheckError, DelayElementError
from .features import cached_features, require_root, require_tools, resolve_delay_mechanism, store_feature
from .hostproc import netns_argv, open_log, run_logged
from .registry import RunRecord, stale_runs
from .routing import RoutingTable
from .shaping import (DEFAULT_CLASS_MINOR, LINK_CLASS_MINOR, EgressPlan, HtbClass, U32Filter, iptables_restore_text,
                      plan_shaping, tc_argv, with_class)
from .topology import TopologySpec

#: Smallest socket-buffer ceiling the hosts get (Linux's default tcp_rmem maximum, 6 MiB).
MIN_TCP_BUFFER_BYTES = 6 * 2**20
#: Largest: the sysctl holds an int; 1 GiB is far above any path the testbed can carry.
MAX_TCP_BUFFER_BYTES = 2**30


def _tcp_buffer_bytes(spec: TopologySpec, routes: RoutingTable) -> int:
    """Per-socket buffer ceiling so one TCP connection can fill any path: 4x the largest
    bandwidth-delay product (rate x RTT), at least Linux's default. Experiments that model a
    per-connection share lower it (DESIGN.md section 2a)."""
    bdp = 0
    for a in spec.dcs:
        for b in spec.dcs:
            rate = routes.bottleneck_bps(a.name, b.name)
            if rate is not None:
                bdp = max(bdp, rate / 8 * 2 * routes.one_way_delay_us(a.name, b.name) / 1e6)
    return int(min(MAX_TCP_BUFFER_BYTES, max(MIN_TCP_BUFFER_BYTES, 4 * bdp)))


class Emulation:
    """A topology realised on this machine; a context manager that always tears it down.

    ``delay_mechanism``: ``auto`` (netem where the kernel has it, else nfqueue), ``netem`` or
    ``nfqueue``. ``out_dir`` receives per-host logs (``logs/``), the shaping-change log
    (``shaping.jsonl``) and ``topology.json``. ``tcp_buffer_bytes`` caps every host's socket
    buffers (tcp_rmem/tcp_wmem maximum) to model the share of a long link one TCP connection can
    fill (DESIGN.md section 2a); by default they are large enough for one connection to fill any path. Raises PrivilegeError without root, FeatureError
    for a missing kernel feature or tool, BuildError when the machine cannot carry the topology.
    """

    #: what realises the topology (``--backend``)
    backend = "netns"

    def __init__(self, spec: TopologySpec, *, delay_mechanism: str = "auto", out_dir: Path | None = None,
                 prefix: str | None = None, check_capacity: bool = True,
                 tcp_buffer_bytes: int | None = None, dcs_here: Sequence[str] | None = None,
                 tunnels: dict[tuple[str, str], dict] | None = None, mtu: int | None = None,
                 clock_offset_ns: int = 0) -> None:
        self.spec = spec
        self.prefix = prefix or new_run_prefix()
        self.out_dir = Path(out_dir) if out_dir else Path("results") / f"topo-{time.strftime('%Y%m%d-%H%M%S')}-{self.prefix}"
        self.requested_mechanism = delay_mechanism
        self.check_capacity = check_capacity
        self.tcp_buffer_bytes = tcp_buffer_bytes
        self.plan = AddressPlan(spec, self.prefix)
        # one machine's part of a topology spread over several (--backend remote, agent.py): only the
        # DCs here are built; a WAN link to a DC elsewhere is a VXLAN tunnel, ``tunnels[(here, there)]``
        # = {"vni", "local", "remote", "port"}; ``mtu`` leaves room for the tunnel's headers
        self.dcs_here = set(dcs_here) if dcs_here is not None else {dc.name for dc in spec.dcs}
        self.tunnels = tunnels or {}
        self.mtu = mtu
        self.clock_offset_ns = clock_offset_ns
        self.routes = RoutingTable(spec)
        self.mechanism = ""
        self.failure: DelayElementError | None = None
        self.build_s = 0.0
        self._ipr: dict[str, IPRoute] = {}
        self._egress: dict[tuple[str, str], EgressPlan] = {}
        self._elements: list[DelayElement] = []
        self._supervisor: Supervisor | None = None
        self._procs: list[subprocess.Popen] = []
        self._record: RunRecord | None = None
        self._shaping_log = None
        self._lock = threading.Lock()
        self._old_usr1 = None
        self._builder_tid = threading.get_ident()
        self._bound: set[tuple[int, str]] = set()
        self._ifindex: dict[tuple[str, str], int] = {}

    # ----------------------------------------------------------------- lifecycle
    def __enter__(self) -> "Emulation":
        if threading.current_thread() is threading.main_thread():
            self._old_usr1 = signal.signal(signal.SIGUSR1, self._on_usr1)
        try:
            self.build()
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.teardown()
        if self.failure is not None and exc[0] is None:
            raise self.failure

    def _on_usr1(self, signum, frame) -> None:
        if self.failure is not None:
            raise self.failure

    def _fail(self, err: DelayElementError) -> None:
        """Called by the supervisor thread: record the error and interrupt the main thread."""
        self.failure = err
        print(f"testbed: error: {err}", flush=True)
        if self._old_usr1 is not None:
            signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)

    def check_alive(self) -> None:
        """Raise DelayElementError if a delay element has died."""
        if self.failure is not None:
            raise self.failure

    def build(self) -> None:
        require_root("building a topology")
        require_tools(["nsenter"], "building a topology")
        t0 = time.perf_counter()
        (self.out_dir / "logs").mkdir(parents=True, exist_ok=True)
        self._shaping_log = open(self.out_dir / "shaping.jsonl", "a", buffering=1)
        self._record = RunRecord.new(self.prefix, kind=self.backend, out_dir=str(self.out_dir.absolute()))
        self._record.add_namespaces(self.namespaces)
        self._create_namespaces()
        self.mechanism = self._detect_mechanism()
        if self.mechanism == "nfqueue":
            require_tools(["iptables-restore"], "the nfqueue delay mechanism")
        if self.check_capacity:
            from .capacity import check_rates  # measuring builds a small emulation of its own

            check_rates(self.spec, self.mechanism)
        self._build_dcs()
        self._build_wan()
        self._add_routes()
        self._apply_shaping()
        self.build_s = time.perf_counter() - t0
        (self.out_dir / "topology.json").write_text(json.dumps(
            {**self.spec.to_dict(), "prefix": self.prefix, "backend": self.backend, "delay_mechanism": self.mechanism,
             "hosts": {h.name: {"dc": h.dc, "ip": str(h.ip), "netns": h.netns} for h in self.plan.hosts.values()}},
            indent=1))

    def _sysctls(self) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
        """(every namespace's sysctls, a router's extra ones, a router's optional ones)."""
        tcp = self.tcp_buffer_bytes or _tcp_buffer_bytes(self.spec, self.routes)
        # pipeline traffic is bursty: an idle connection must not restart from slow start (RFC 2861's
        # cwnd validation would shrink it between microbatches)
        base = {"net.ipv6.conf.all.disable_ipv6": "1", "net.ipv6.conf.default.disable_ipv6": "1",
                "net.ipv4.tcp_slow_start_after_idle": "0",
                "net.ipv4.tcp_rmem": f"4096 {min(131072, tcp)} {tcp}", "net.ipv4.tcp_wmem": f"4096 {min(16384, tcp)} {tcp}"}
        # br_netfilter (where loaded) would pass bridged frames through the router's iptables
        # chains and delay intra-DC traffic twice; the DC switch is a plain switch
        no_br_nf = {f"net.bridge.bridge-nf-call-{t}": "0" for t in ("iptables", "ip6tables", "arptables")}
        return base, {"net.ipv4.ip_forward": "1"}, no_br_nf

    def _create_namespaces(self) -> None:
        base, router, no_br_nf = self._sysctls()
        for dc in self._dcs():
            r = self.plan.routers[dc.name]
            self._ipr[r.netns] = netlink.create_netns(r.netns, {**base, **router}, no_br_nf)
            for h in self.plan.hosts_of(dc.name):
                self._ipr[h.netns] = netlink.create_netns(h.netns, base)

    def _detect_mechanism(self) -> str:
        feats = cached_features()
        if "netem" not in feats:
            feats["netem"] = netlink.netem_available(next(iter(self._ipr.values())))
            store_feature("netem", feats["netem"])
        return resolve_delay_mechanism(self.requested_mechanism, feats["netem"])

    @property
    def namespaces(self) -> list[str]:
        """The namespaces this emulation creates: routers first, then hosts (all of the plan's, or
        those of ``dcs_here``)."""
        return [ns for ns in self.plan.namespaces if ns in {self.plan.routers[d].netns for d in self.dcs_here}
                or any(h.netns == ns and h.dc in self.dcs_here for h in self.plan.hosts.values())]

    def _dcs(self) -> list:
        return [dc for dc in self.spec.dcs if dc.name in self.dcs_here]

    def now_ns(self) -> int:
        """CLOCK_MONOTONIC in the run's reference clock (the runner's, for --backend remote)."""
        return time.monotonic_ns() - self.clock_offset_ns

    def _build_dcs(self) -> None:
        for dc in self._dcs():
            router = self.plan.routers[dc.name]
            r = self._ipr[router.netns]
            netlink.up(r, netlink.ifindex(r, "lo"))
            br = netlink.add_bridge(r, BRIDGE_IFNAME)
            netlink.add_address(r, br, str(router.ip), router.subnet.prefixlen)
            for h in self.plan.hosts_of(dc.name):
                port = netlink.add_veth(r, host_port_ifname(h.index), HOST_IFNAME, h.netns, self.mtu)
                netlink.set_master(r, port, br)
                netlink.up(r, port)
                hi = self._ipr[h.netns]
                eth = netlink.ifindex(hi, HOST_IFNAME)
                netlink.add_address(hi, eth, str(h.ip), h.subnet.prefixlen)
                netlink.up(hi, eth)
                netlink.up(hi, netlink.ifindex(hi, "lo"))
                netlink.add_route(hi, "default", str(h.gateway))
            netlink.up(r, br)

    def _build_wan(self) -> None:
        for link in self.spec.links:
            ea, eb = self.plan.wan_ends[(link.a, link.b)], self.plan.wan_ends[(link.b, link.a)]
            ra, rb = self.plan.routers[link.a], self.plan.routers[link.b]
            ends = [end for end in (ea, eb) if end.dc in self.dcs_here]
            if len(ends) == 2:
                netlink.add_veth(self._ipr[ra.netns], ea.ifname, eb.ifname, rb.netns, self.mtu)
            elif len(ends) == 1:
                t = self.tunnels[(ends[0].dc, ends[0].peer)]
                netlink.add_vxlan(ends[0].ifname, self.plan.routers[ends[0].dc].netns, t["vni"], t["local"],
                                  t["remote"], t["port"], self.mtu or 1450)
            for end in ends:
                ipr = self._ipr[self.plan.routers[end.dc].netns]
                idx = netlink.ifindex(ipr, end.ifname)
                netlink.add_address(ipr, idx, str(end.ip.ip), 30)
                netlink.up(ipr, idx)

    def _add_routes(self) -> None:
        for dc in self._dcs():
            r = self._ipr[self.plan.routers[dc.name].netns]
            for other in self.spec.dcs:
                if other.name == dc.name:
                    continue
                nh, _ = self.routes.next_hop(dc.name, other.name)
                end = self.plan.wan_ends[(dc.name, nh)]
                netlink.add_route(r, str(self.plan.routers[other.name].subnet), str(end.peer_ip))

    def _apply_shaping(self) -> None:
        shaping = plan_shaping(self.spec, self.plan, self.mechanism)
        here = set(self.namespaces)
        for e in (e for e in shaping.egress if e.netns in here):
            netlink.apply_egress(self._ipr[e.netns], e)
            self._egress[(e.netns, e.ifname)] = e
            for cls in e.classes:
                self._log_shaping("add", e.netns, e.ifname, cls, 0)
        by_ns: dict[str, list] = defaultdict(list)
        for q in shaping.delay_queues:
            if q.netns in here:
                by_ns[q.netns].append(q)
        for i, (ns, queues) in enumerate(by_ns.items()):
            elementary = [q for q in queues if q.needs_element]
            if elementary:
                el = DelayElement(ns, elementary, self.out_dir / "logs" / f"nfq_delay-{ns}.log", seed=i + 1)
                self._elements.append(el)
                proc = el.start()
                self._record.add_process(proc.pid, f"nfq_delay in {ns}")
            text = iptables_restore_text(queues)
            proc = subprocess.run(netns_argv(ns, ["iptables-restore"]), input=text, capture_output=True, text=True)
            if proc.returncode != 0:
                raise BuildError(f"iptables-restore in {ns} failed: {proc.stderr.strip()}\ninput:\n{text}")
        if self._elements:
            self._supervisor = Supervisor(self._elements, self._fail)
            self._supervisor.start()

    def teardown(self) -> None:
        """Stop every process of the run, remove its namespaces and its registry entry. Idempotent."""
        if self._supervisor is not None:
            self._supervisor.stop()
        for p in self._procs:
            if p.poll() is None:
                p.terminate()
        for p in self._procs:
            try:
                p.wait(timeout=2)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self._procs.clear()
        for el in self._elements:
            el.stop()
        self._elements.clear()
        for ipr in self._ipr.values():
            ipr.close()
        self._ipr.clear()
        self._stop_backend()
        for ns in self.namespaces:
            netlink.remove_netns(ns)
        if self._record is not None:
            self._record.delete()
            self._record = None
        if self._shaping_log is not None:
            self._shaping_log.close()
            self._shaping_log = None
        if self._old_usr1 is not None:
            signal.signal(signal.SIGUSR1, self._old_usr1)
            self._old_usr1 = None

    @property
    def backend_info(self) -> dict:
        """What the backend found on the machines (recorded in ``env.json``)."""
        return {}

    def _stop_backend(self) -> None:
        """Backends that own the namespaces' processes (Mininet) stop them here, before the
        namespaces' names are removed."""

    # ----------------------------------------------------------------- hosts
    @property
    def hosts(self) -> dict[str, HostAddr]:
        return self.plan.hosts

    def host(self, name: str) -> HostAddr:
        try:
            return self.plan.hosts[name]
        except KeyError:
            raise KeyError(f"no host {name!r}; hosts are {', '.join(self.plan.hosts)}") from None

    def log_path(self, host: str) -> Path:
        return self.out_dir / "logs" / f"{host}.log"

    def popen(self, host: str, argv: Sequence[str], **kwargs) -> subprocess.Popen:
        """Start ``argv`` inside ``host``; stdout and stderr go to the host's log unless given.
        The process is registered (for ``testbed clean``) and stopped at teardown."""
        h = self.host(host)
        log = open_log(self.log_path(host), argv)
        kwargs.setdefault("stdout", log)
        kwargs.setdefault("stderr", subprocess.STDOUT)
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        proc = subprocess.Popen(netns_argv(h.netns, argv), **kwargs)
        log.close()
        self._procs.append(proc)
        self._record.add_process(proc.pid, f"{argv[0]} in {host}")
        return proc

    def python(self, host: str) -> str:
        """The Python interpreter processes in ``host`` run with (this one)."""
        return sys.executable

    def process_env(self, extra: dict[str, str]) -> dict[str, str]:
        """The environment of a testbed process (worker, decode host) in a host: this one's, with
        the package on PYTHONPATH, plus ``extra``."""
        return {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent), **extra}

    def share_file(self, path: Path) -> str:
        """``path`` (a file written here, such as the workers' configuration) as the hosts'
        processes see it; here the same path."""
        return str(path)

    def share_corpus(self, path: Path | None) -> str | None:
        """The training text (``--data``; None: the default corpus) as the hosts' processes name it;
        here unchanged."""
        return str(path) if path is not None else None

    @property
    def host_out_dir(self) -> str:
        """The run folder as the hosts' processes see it (they write their events and logs there)."""
        return str(self.out_dir)

    def wan_counters(self) -> dict[tuple[str, str], dict[int, dict]]:
        """Every WAN egress's HTB classes with their counters (netlink.read_classes), by (src DC,
        dst DC)."""
        out = {}
        for (src, dst), end in self.plan.wan_ends.items():
            if src in self.dcs_here:
                out[(src, dst)] = netlink.read_classes(self.ipr(self.plan.routers[src].netns), end.ifname)
        return out

    def run(self, host: str, argv: Sequence[str], timeout_s: float = 60) -> subprocess.CompletedProcess:
        """Run ``argv`` inside ``host`` to completion; output returned and appended to the host's log."""
        self.check_alive()
        return run_logged(self.host(host).netns, argv, self.log_path(host), timeout_s)

    # ----------------------------------------------------------------- shaping
    def _index(self, netns: str, ifname: str) -> int:
        key = (netns, ifname)
        if key not in self._ifindex:
            self._ifindex[key] = netlink.ifindex(self.ipr(netns), ifname)
        return self._ifindex[key]

    def _wan(self, src_dc: str, dst_dc: str) -> tuple[IPRoute, EgressPlan]:
        """The egress plan of the WAN link from ``src_dc`` towards its neighbour ``dst_dc``."""
        end = self.plan.wan_ends.get((src_dc, dst_dc))
        if end is None:
            raise KeyError(f"no WAN link between {src_dc} and {dst_dc}")
        ns = self.plan.routers[src_dc].netns
        return self.ipr(ns), self._egress[(ns, end.ifname)]

    def _log_shaping(self, event: str, netns: str, ifname: str, cls: HtbClass, duration_ns: int,
                     t_ns: int | None = None) -> None:
        """One line of ``shaping.jsonl``: ``t_ns`` is CLOCK_MONOTONIC when the change was issued."""
        if self._shaping_log is not None:
            self._shaping_log.write(json.dumps(
                {"t_ns": t_ns or self.now_ns(), "event": event, "netns": netns, "ifname": ifname,
                 "classid": f"1:{cls.minor:x}", "rate_bps": cls.rate_bps, "ceil_bps": cls.ceil_bps,
                 "duration_ns": duration_ns}) + "\n")

    def add_wan_class(self, src_dc: str, dst_dc: str, minor: int, rate_bps: int, ceil_bps: int | None = None,
                      pairs: Sequence[tuple[str | None, str | None]] = ()) -> None:
        """Add HTB class ``1:minor`` on the WAN egress ``src_dc`` -> ``dst_dc`` and send to it the
        packets of each (source host, destination host) pair (a None side matches any host).
        The class borrows nothing beyond ``ceil_bps`` (default: ``rate_bps``)."""
        ipr, egress = self._wan(src_dc, dst_dc)
        if any(c.minor == minor for c in egress.classes) or minor <= DEFAULT_CLASS_MINOR:
            raise ValueError(f"class 1:{minor:x} exists or is reserved; use minors above 0x{DEFAULT_CLASS_MINOR:x}")
        cls = HtbClass(minor, LINK_CLASS_MINOR, rate_bps, ceil_bps or rate_bps)
        filters = tuple(U32Filter(prio=minor * 16 + i, flow_minor=minor,
                                  src=str(self.host(s).ip) if s else None, dst=str(self.host(d).ip) if d else None)
                        for i, (s, d) in enumerate(pairs))
        new = with_class(egress, cls, filters)
        idx = self._index(egress.netns, egress.ifname)
        with self._lock:
            t0 = self.now_ns()
            netlink.add_class(ipr, idx, new.classes[-1], egress.ifname)
            for f in filters:
                netlink.add_filter(ipr, idx, f, egress.ifname)
            self._egress[(egress.netns, egress.ifname)] = new
            self._log_shaping("add", egress.netns, egress.ifname, new.classes[-1], self.now_ns() - t0, t0)

    def set_wan_class_rate(self, src_dc: str, dst_dc: str, minor: int, rate_bps: int,
                           ceil_bps: int | None = None) -> int:
        """Change class ``1:minor`` on the WAN egress ``src_dc`` -> ``dst_dc`` in place (no delete,
        no unshaped window). Logged with its CLOCK_MONOTONIC time; returns that time (ns)."""
        ipr, egress = self._wan(src_dc, dst_dc)
        old = next((c for c in egress.classes if c.minor == minor), None)
        if old is None:
            raise KeyError(f"no class 1:{minor:x} on {src_dc}->{dst_dc}")
        new = replace(old, rate_bps=rate_bps, ceil_bps=ceil_bps or rate_bps)
        with self._lock:
            t0 = self.now_ns()
            netlink.change_class(ipr, self._index(egress.netns, egress.ifname), new)
            dt = self.now_ns() - t0
            self._egress[(egress.netns, egress.ifname)] = replace(
                egress, classes=tuple(new if c.minor == minor else c for c in egress.classes))
            self._log_shaping("change", egress.netns, egress.ifname, new, dt, t0)
        return t0

    def compile_wan_class_rates(self, src_dc: str, dst_dc: str, rates_bps: Sequence[tuple[int, int]]) -> dict:
        """Compile in-place changes of classes ``1:minor`` on the WAN egress ``src_dc`` -> ``dst_dc``
        to ``rate_bps`` (= ceil), applied in the given order, without applying them. Returns
        ``{"netns", "ifname", "data" (bytes, for netlink.send_batch), "classes": [[classid, rate_bps],
        ...]}``; whoever applies it logs it (``shaping.jsonl`` lines)."""
        _, egress = self._wan(src_dc, dst_dc)
        idx = self._index(egress.netns, egress.ifname)
        by_minor = {c.minor: c for c in egress.classes}
        missing = [m for m, _ in rates_bps if m not in by_minor]
        if missing:
            raise KeyError(f"no class 1:{missing[0]:x} on {src_dc}->{dst_dc}")
        changes = [(idx, replace(by_minor[m], rate_bps=r, ceil_bps=r)) for m, r in rates_bps]
        return {"netns": egress.netns, "ifname": egress.ifname, "data": netlink.compile_class_changes(changes),
                "classes": [[f"1:{m:x}", r] for m, r in rates_bps]}

    @property
    def shaping_log_path(self) -> Path | None:
        return self.out_dir / "shaping.jsonl" if self.out_dir is not None else None

    def popen_root(self, argv: Sequence[str], what: str, **kwargs) -> subprocess.Popen:
        """Start a helper of the run (e.g. the Atlas controller) in the root namespace; registered for
        ``testbed clean`` and stopped at teardown like the hosts' processes."""
        proc = subprocess.Popen(list(argv), **kwargs)
        self._procs.append(proc)
        self._record.add_process(proc.pid, what)
        return proc

    def set_link_rate(self, a: str, b: str, rate_bps: int) -> None:
        """Change a WAN link's rate in both directions, in place (link and default classes)."""
        for src, dst in ((a, b), (b, a)):
            for minor in (LINK_CLASS_MINOR, DEFAULT_CLASS_MINOR):
                self.set_wan_class_rate(src, dst, minor, rate_bps)

    def wait_quiet(self, timeout_s: float = 60.0) -> float:
        """Wait until no shaped interface holds queued packets (e.g. after a bulk transfer filled
        a deep queue), so that what follows measures an idle network. Returns the seconds waited;
        raises CheckError if the queues have not drained within ``timeout_s``."""
        t0 = time.monotonic()
        while True:
            queued = sum(netlink.queued_packets(self.ipr(ns), ifname) for ns, ifname in self._egress)
            waited = time.monotonic() - t0
            if queued == 0:
                return waited
            if waited > timeout_s:
                raise CheckError(f"{queued} packets still queued after {timeout_s:g} s: the network is not idle")
            time.sleep(0.05)

    def wan_classes(self, src_dc: str, dst_dc: str) -> dict[int, dict]:
        """HTB classes on the WAN egress ``src_dc`` -> ``dst_dc`` as read back from the kernel."""
        ipr, egress = self._wan(src_dc, dst_dc)
        return netlink.read_classes(ipr, egress.ifname)

    def wan_tc_argv(self, src_dc: str, dst_dc: str) -> list[list[str]]:
        """The tc(8) commands equivalent to the current shaping of one WAN egress."""
        return tc_argv(self._wan(src_dc, dst_dc)[1])

    def ipr(self, netns: str) -> IPRoute:
        """The rtnetlink handle of one of the run's namespaces, usable from the calling thread."""
        ipr, tid = self._ipr[netns], threading.get_ident()
        if tid != self._builder_tid and (tid, netns) not in self._bound:
            netlink.bind_thread(ipr, netns)
            self._bound.add((tid, netns))
        return ipr


def warn_stale_runs() -> str | None:
    """A warning if earlier runs left namespaces or processes behind (their owner is gone)."""
    stale = stale_runs()
    if not stale:
        return None
    n_ns = sum(len(r.namespaces) for r in stale)
    return (f"{len(stale)} earlier run(s) ({', '.join(r.prefix for r in stale)}) died without tearing down "
            f"(up to {n_ns} namespaces): run 'sudo testbed clean' to remove their leftovers")
