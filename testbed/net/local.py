"""A topology realised on this machine: the netns and Mininet backends.

Layout: one namespace per host (interface ``eth0``) and one router namespace per DC holding the
DC switch (bridge ``br0``, the hosts' gateway) and one interface per WAN link to a peer DC's
router (``w-<peer>``). Routers forward along least-delay routes (``spec/routing.py``). Every kernel
object lives inside the run's namespaces, named with the run prefix, and the run is registered
before anything is created, so ``testbed clean`` can finish a teardown after ``kill -9``.

A :class:`LocalNetwork` is composed of parts: a *realiser* that creates the namespaces, links,
addresses and routes (``netns.NetnsRealiser`` through netlink, the default, or
``mininet_backend.MininetRealiser`` through Mininet's API), the namespaces' netlink handles
(``namespaces.py``), the processes in the hosts (``hostproc.HostProcesses``; what a process of this
machine may do with them: ``local_hosts.LocalHostProcesses``), the WAN shaping with
its live changes (``wan_shaper.WanShaper``: the ``shaping`` capability) and the delay mechanism
(``delay_element.DelayQueues``). Use::

    with LocalNetwork(load_topology("three_dc"), out_dir=Path("results/x")) as net:
        net.run("east-h0", ["ping", "-c1", str(net.host("west-h0").ip)])
        net.shaping.set_wan_class_rate("east", "central", 0x10, 50_000_000)
"""

from __future__ import annotations

import gc
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

from testbed.errors import BuildError
from testbed.net import netlink
from testbed.net.capacity import check_rates
from testbed.net.delay_element import DelayQueues
from testbed.net.failover import FailoverAgent
from testbed.net.features import (
    check_delay_mechanism,
    default_congestion,
    detect_delay_mechanism,
    require_congestion,
    require_root,
    require_tools,
)
from testbed.net.hostproc import HostProcesses
from testbed.net.local_files import LocalFiles
from testbed.net.local_hosts import LocalHostProcesses
from testbed.net.namespaces import NamespaceHandles
from testbed.net.netns import (
    NetnsRealiser,
    RealiseContext,
    Realiser,
    pin_wan_neighbours,
    tcp_buffer_bytes,
)
from testbed.net.network import ManagedNetwork
from testbed.net.profile_player import ProfilePlayer
from testbed.net.registry import RunRecord, control_sockets, unused_run_prefix
from testbed.net.shaping import ShapingPlan, plan_shaping
from testbed.net.topology_record import default_out_dir, write_topology_record
from testbed.net.wan_shaper import WanShaper
from testbed.spec.addressing import AddressPlan, HostAddr
from testbed.spec.routing import RoutingTable
from testbed.spec.topology import DCSpec, TopologySpec
from testbed.spec.wire import MIN_SOCKET_BUFFER_BYTES


class LocalNetwork(LocalFiles, LocalHostProcesses, ManagedNetwork):
    """A topology realised on this machine (see the module docstring); a context manager that
    always tears it down.

    ``realiser``: what builds the namespaces and links (default: ``netns.NetnsRealiser``, the netns
    backend).
    ``delay_mechanism``: ``auto`` (netem where the kernel has it, else nfqueue), ``netem`` or
    ``nfqueue``. ``out_dir`` receives per-host logs (``logs/``), the shaping-change log
    (``shaping.jsonl``) and ``topology.json``. ``capacity_bps``: what this machine carries through a
    mechanism, in bit/s (``capacity_probe.machine_capacity_bps``); links above it are refused
    (None: no check). ``tcp_buffer_bytes`` caps every host's socket buffers (tcp_rmem/tcp_wmem
    maximum) to model the share of a long link one TCP connection can fill (DESIGN.md section
    2a); by default they are large enough for one connection to fill any path. One machine's part
    of a topology spread over several (``--backend remote``, ``remote/agent.py``): only the DCs
    ``dcs_here`` are built; a WAN link to a DC elsewhere is a VXLAN tunnel ``tunnels[(here,
    there)]``; ``mtu`` leaves room for the tunnel's headers; ``clock_offset_ns`` is this machine's
    offset from the runner's clock. Raises PrivilegeError without root, FeatureError for a
    missing kernel feature or tool, BuildError when the machine cannot carry the topology or
    ``tcp_buffer_bytes`` is below the least socket buffer the kernel takes
    (``MIN_SOCKET_BUFFER_BYTES``).
    """

    offers_live_shaping: ClassVar[bool] = True
    #: every step of a build creates and registers something; it takes seconds at most
    defer_signals_while_building: ClassVar[bool] = True

    def __init__(
        self,
        spec: TopologySpec,
        *,
        realiser: Realiser | None = None,
        delay_mechanism: str = "auto",
        out_dir: Path | None = None,
        prefix: str | None = None,
        capacity_bps: Callable[[str], int] | None = None,
        tcp_buffer_bytes: int | None = None,
        dcs_here: Sequence[str] | None = None,
        tunnels: dict[tuple[str, str], dict] | None = None,
        mtu: int | None = None,
        clock_offset_ns: int = 0,
    ) -> None:
        check_delay_mechanism(delay_mechanism)
        if tcp_buffer_bytes is not None and tcp_buffer_bytes < MIN_SOCKET_BUFFER_BYTES:
            raise BuildError(
                f"a socket-buffer cap of {tcp_buffer_bytes} bytes is below the {MIN_SOCKET_BUFFER_BYTES} bytes the "
                "kernel's tcp_rmem and tcp_wmem take at least: give a larger cap (a larger window)"
            )
        self.spec = spec
        self.realiser = realiser or NetnsRealiser()
        self.prefix = prefix or unused_run_prefix()
        self.out_dir = Path(out_dir) if out_dir else default_out_dir(self.prefix)
        self.requested_mechanism = delay_mechanism
        self.capacity_bps = capacity_bps
        self.tcp_buffer_bytes = tcp_buffer_bytes
        self.plan = AddressPlan(spec, self.prefix)
        self.routes = RoutingTable(spec)
        self.dcs_here = set(dcs_here) if dcs_here is not None else {dc.name for dc in spec.dcs}
        self.tunnels = tunnels or {}
        self.mtu = mtu
        self.clock_offset_ns = clock_offset_ns
        self.mechanism = ""
        self.build_s = 0.0
        #: namespaces added to the run after it was built (``management.add_management_network``),
        #: in its record and removed with its own
        self.extra_namespaces: list[str] = []
        self.handles = NamespaceHandles()
        self.processes = HostProcesses(lambda host: self.host(host).netns, self.out_dir / "logs")
        self.shaping: WanShaper | None = None
        self.delay: DelayQueues | None = None
        self.record: RunRecord | None = None
        self.shaping_plan: ShapingPlan | None = None
        #: replays the links' profiles from the end of the build (None: no link has one)
        self.profiles: ProfilePlayer | None = None
        #: moves routes off failed ``failover`` links (None: no link is marked)
        self.failover: FailoverAgent | None = None

    # ----------------------------------------------------------------- lifecycle
    @property
    def backend(self) -> str:
        return self.realiser.backend

    def build(self) -> None:
        require_root("building a topology")
        require_tools(["nsenter"], "building a topology")
        require_congestion(self.spec.tcp_congestion)
        self.realiser.prepare(self.prefix)  # before anything, even the run folder, is made
        t0 = time.perf_counter()
        self._register()
        assert self.record is not None
        self.realiser.realise(
            RealiseContext(
                self.spec,
                self.plan,
                self.routes,
                self.dcs,
                self.dcs_here,
                self.tunnels,
                self.mtu,
                self.tcp_bytes,
                self.handles,
                self.record,
            )
        )
        pin_wan_neighbours(self.handles, self.plan, self.dcs_here)
        self._shape_and_check()
        self.apply_shaping()
        self.build_s = time.perf_counter() - t0
        write_topology_record(
            self,
            tcp_congestion=self.spec.tcp_congestion or default_congestion(),
            tcp_congestion_stated=self.spec.tcp_congestion is not None,  # else the machine's default
        )
        self._start_failover()
        self._play_profiles()

    def _start_failover(self) -> None:
        """Start moving routes off failed ``failover`` links (``failover.py``), where any is marked
        and the whole topology is on this machine."""
        if not any(link.failover for link in self.spec.links):
            return
        if self.dcs_here != {dc.name for dc in self.spec.dcs}:
            raise BuildError(
                "route failover runs on a topology built on one machine (netns, mininet backends); this "
                "machine builds part of it: remove the links' failover fields for a run over several machines"
            )
        self.failover = FailoverAgent(self.spec, self.plan, self.out_dir, self.now_ns, self.fail)
        self.failover.start()

    def _play_profiles(self) -> None:
        """Start replaying the links' profiles, their time 0 now (``profile_player.py``). Raises
        BuildError where the topology is spread over several machines (each would play its own
        ends on its own clock: not supported yet)."""
        if not any(link.profile for link in self.spec.links):
            return
        if self.dcs_here != {dc.name for dc in self.spec.dcs}:
            raise BuildError(
                "link profiles are replayed on a topology built on one machine (netns, mininet backends); "
                "this machine builds part of it: remove the links' profile fields for a run over several machines"
            )
        assert self.shaping is not None and self.shaping_plan is not None
        # the objects made so far last the run: the collector leaves them out from now on. A full
        # collection walked them for 44 ms (more under load) in a step's way: the first step of
        # test_link_profile.py's alternating link came 19 ms late, a 100 ms interval 45% over
        gc.freeze()
        self.profiles = ProfilePlayer(
            self.spec,
            self.plan,
            self.shaping_plan,
            self.shaping.set_link_rate,
            self.shaping.netem_leaves,
            self.out_dir,
            self.now_ns,
            self.now_ns(),
            self.fail,
        )
        self.profiles.start()

    def _register(self) -> None:
        (self.out_dir / "logs").mkdir(parents=True, exist_ok=True)
        self.record = RunRecord.new(self.prefix, kind=self.backend, out_dir=str(self.out_dir.absolute()))
        self.record.add_namespaces(self.namespaces)
        self.processes.record = self.record

    def _shape_and_check(self) -> None:
        """Choose the delay mechanism and check the topology's rates against this machine."""
        self.mechanism = detect_delay_mechanism(self.requested_mechanism, self.handles.any())
        if self.mechanism == "nfqueue":
            require_tools(["iptables-restore"], "the nfqueue delay mechanism")
        if self.capacity_bps is not None:
            check_rates(self.spec, self.mechanism, self.capacity_bps(self.mechanism))

    def apply_shaping(self) -> None:
        """Install the shaping plan on the interfaces here and start the delay mechanism."""
        assert self.record is not None  # registered by build
        plan = self.shaping_plan = plan_shaping(self.spec, self.plan, self.mechanism)
        here = set(self.namespaces)
        self.shaping = WanShaper(self.plan, self.handles, self.out_dir, self.now_ns, self.processes)
        for e in plan.egress:
            if e.netns in here:
                self.shaping.install(e)
        self.delay = DelayQueues(self.out_dir / "logs", self.record, self.fail)
        self.delay.start([q for q in plan.delay_queues if q.netns in here])

    def teardown(self) -> None:
        """Stop every process of the run, remove its namespaces and its registry entry. Idempotent.
        A step that fails does not skip the others; the registry entry stays unless every step
        succeeded (``testbed clean`` finishes the job), and the first error is raised at the end."""
        errors: list[Exception] = []

        def step(fn: Callable[..., Any], *args: Any) -> None:
            try:
                fn(*args)
            except Exception as e:  # noqa: BLE001 - raised once every step was tried
                errors.append(e)

        for thread in (self.profiles, self.failover):
            if thread is not None:
                step(thread.stop)
                step(thread.join, 5.0)
        if self.delay is not None:
            step(self.delay.stop_watching)  # the processes stop first; their ending is not a failure
        step(self.processes.stop_all)
        if self.delay is not None:
            step(self.delay.stop)
        step(self.handles.close)
        step(self.realiser.stop)
        for ns in [*self.namespaces, *self.extra_namespaces]:
            step(netlink.remove_netns, ns)
        for sock in control_sockets(self.prefix):  # the controller's and BubbleTea's, if left
            step(sock.unlink, True)
        if self.record is not None:  # a tracefs instance the run could not remove (--sched-trace)
            for path in list(self.record.trace_instances):
                step(self._remove_trace_instance, path)
        if self.record is not None and not errors:
            self.record.delete()
            self.record = None
        if self.shaping is not None:
            step(self.shaping.close)
        if errors:
            raise errors[0]

    @property
    def tcp_bytes(self) -> int:
        return self.tcp_buffer_bytes or tcp_buffer_bytes(self.spec, self.routes)

    @property
    def dcs(self) -> list[DCSpec]:
        return [dc for dc in self.spec.dcs if dc.name in self.dcs_here]

    @property
    def namespaces(self) -> list[str]:
        """The namespaces this network creates: routers first, then hosts (all of the plan's, or
        those of ``dcs_here``)."""
        mine = {self.plan.routers[d].netns for d in self.dcs_here}
        mine |= {h.netns for h in self.plan.hosts.values() if h.dc in self.dcs_here}
        return [ns for ns in self.plan.namespaces if ns in mine]

    @property
    def backend_info(self) -> dict[str, Any]:
        """What the backend found on the machine (recorded in ``env.json``)."""
        return self.realiser.info()

    def now_ns(self) -> int:
        """CLOCK_MONOTONIC in the run's reference clock (the runner's, for --backend remote)."""
        return time.monotonic_ns() - self.clock_offset_ns

    # ----------------------------------------------------------------- hosts
    @property
    def hosts(self) -> dict[str, HostAddr]:
        return self.plan.hosts

    def host(self, name: str) -> HostAddr:
        return self.plan.host(name)

    def host_machine(self, host: str) -> str | None:
        """Every host runs on this machine."""
        return None

    def popen(self, host: str, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen:
        """Start ``argv`` inside ``host``; stdout and stderr go to the host's log unless given.
        The process is registered (for ``testbed clean``) and stopped at teardown."""
        self.host(host)
        self._require_built()
        return self.processes.popen(host, argv, **kwargs)

    def run(self, host: str, argv: Sequence[str], timeout_s: float = 60) -> subprocess.CompletedProcess:
        """Run ``argv`` inside ``host`` to completion; output returned and appended to the host's log."""
        self.check_alive()
        self.host(host)
        self._require_built()
        return self.processes.run(host, argv, timeout_s)

    # ----------------------------------------------------------------- links
    def wan_counters(self) -> dict[tuple[str, str], dict[int, dict[str, int]]]:
        """Every WAN egress here, its HTB classes with their counters, by (src DC, dst DC)."""
        assert self.shaping is not None, "not built"
        return self.shaping.counters([k for k in self.plan.wan_ends if k[0] in self.dcs_here])

    def wait_quiet(self, timeout_s: float = 60.0) -> float:
        """Wait until no shaped interface holds queued packets, so that what follows measures an idle
        network. Returns the seconds waited; raises CheckError after ``timeout_s``."""
        assert self.shaping is not None, "not built"
        return self.shaping.wait_quiet(timeout_s)
