"""The remote backend: a topology's DCs spread over several Linux machines reached over SSH.

``--backend remote --inventory FILE`` (inventory.py). In order, and before anything is built
anywhere: every machine is reached (host key checked against known_hosts, key login) and checked
(root, the tools and Python modules the run needs, VXLAN in its kernel); any problem on any machine
is one RemoteError listing them all. Then, on each machine: the package is copied to
``<workdir>/<run prefix>/code`` (SFTP), an agent is started (``python -m testbed.net.remote.agent``,
``agent.py``),
its CLOCK_MONOTONIC offset from this machine's is estimated (the NTP-style exchange of RFC 5905
section 8 over the SSH channel: offset = t_remote - (t_send + t_receive) / 2 from the exchange with
the smallest round trip, uncertainty half that round trip), and it builds its DCs with the netns
backend's code; a WAN link between DCs on two machines is a VXLAN tunnel between the machines
(UDP 4789, MTU 1450 inside), shaped at each end with the same HTB classes and delay mechanism.

Workers run with ``TESTBED_CLOCK_OFFSET_NS`` so every event is in this machine's clock; the offsets
are recorded in ``clock_offsets.json`` (estimated before and after the run, so drift shows). What
processes write on a machine (events, logs, shaping log) is copied into the local run folder as it
is written (about every 0.3 s), so the runner and the analysis see one run folder. On exit or failure
every agent tears its part down; if this process dies, the agents see their SSH channel close and
do the same, and ``testbed clean`` fetches any traces left on the machines and removes them.
Live shaping (``shaping``, ``live_shaping.RemoteShaping``) changes each link direction on the
machine that holds its egress; Atlas's controller runs here, fed by a control relay on every
machine over the management network (``control_relay.py``), which also applies its grants there.
BubbleTea's dispatcher does not reach workers on other machines yet: runs refuse it before building.

Composed of its parts, by job: ``preflight.py``, ``deploy.py``, ``agent_client.py``, ``clock.py``,
``tunnels.py``, ``sync.py`` and ``clean.py``.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from testbed.errors import BuildError, CheckError, DelayElementError, RemoteError
from testbed.invocation import sudo_testbed
from testbed.net.features import require_root
from testbed.net.network import ManagedNetwork
from testbed.net.registry import RunRecord, unused_run_prefix
from testbed.net.remote.agent_client import AgentClient, RemoteProcess
from testbed.net.remote.clean import finish_machines
from testbed.net.remote.clock import measure_offset, write_clock_offsets
from testbed.net.remote.deploy import deploy, share
from testbed.net.remote.inventory import Inventory, Machine, check_against, load_inventory
from testbed.net.remote.live_shaping import RemoteShaping
from testbed.net.remote.preflight import connect_and_check
from testbed.net.remote.ssh import Connection
from testbed.net.remote.sync import TraceSync
from testbed.net.remote.tunnels import TUNNEL_MTU, tunnel_plan
from testbed.net.topology_record import default_out_dir, write_topology_record
from testbed.spec.addressing import AddressPlan, HostAddr
from testbed.spec.routing import RoutingTable
from testbed.spec.topology import TopologySpec

T = TypeVar("T")


class RemoteNetwork(ManagedNetwork):
    """A topology over several machines (see the module docstring); a context manager.
    ``inventory``: the inventory file (or an Inventory); ``check_capacity``: whether each machine checks
    the links it builds against what it carries; the other arguments as ``local.LocalNetwork``'s.
    Raises SpecError for an inventory that does not fit the topology, RemoteError for a machine
    that cannot be used (before anything is built anywhere), BuildError from a machine's build."""

    backend: ClassVar[str] = "remote"
    offers_live_shaping: ClassVar[bool] = True

    def __init__(
        self,
        spec: TopologySpec,
        *,
        inventory: Path | Inventory,
        delay_mechanism: str = "auto",
        out_dir: Path | None = None,
        prefix: str | None = None,
        check_capacity: bool = True,
        tcp_buffer_bytes: int | None = None,
    ) -> None:
        self.spec = spec
        self.prefix = prefix or unused_run_prefix()
        self.out_dir = Path(out_dir) if out_dir else default_out_dir(self.prefix)
        self.requested_mechanism, self.tcp_buffer_bytes = delay_mechanism, tcp_buffer_bytes
        self.check_capacity = check_capacity
        self.plan = AddressPlan(spec, self.prefix)
        self.routes = RoutingTable(spec)
        self.mtu: int | None = TUNNEL_MTU  # every emulated interface, so TCP's segments fit the tunnels
        self.shaping: RemoteShaping | None = None
        self.mechanism = ""
        self.build_s = 0.0
        self.inventory = inventory if isinstance(inventory, Inventory) else load_inventory(inventory)
        check_against(self.inventory, spec)
        self.conns: dict[str, Connection] = {}
        self.agents: dict[str, AgentClient] = {}
        self.clock: dict[str, dict[str, Any]] = {}
        self.preflight: dict[str, dict[str, Any]] = {}
        self.sync = TraceSync(self.agents, self.out_dir)
        #: an agent tears down after this long without a request (agent.py's watchdog)
        self.agent_idle_s = 30.0
        #: a request to an agent unanswered this long means its machine or the network is gone (s)
        self.agent_answer_s = 30.0
        #: each machine's agent process (its PID there)
        self.agent_pids: dict[str, int] = {}
        self.record: RunRecord | None = None

    def root_of(self, m: Machine) -> str:
        return f"{m.workdir}/{self.prefix}"

    def machine_of_host(self, host: str) -> Machine:
        return self.inventory.machine_of(self.host(host).dc)

    # ----------------------------------------------------------------- lifecycle
    def build(self) -> None:
        require_root("the remote backend's run registry")
        t0 = time.perf_counter()
        (self.out_dir / "logs").mkdir(parents=True, exist_ok=True)
        self.record = RunRecord.new(self.prefix, kind="remote", out_dir=str(self.out_dir.absolute()))
        self.record.remote = {
            "inventory": self.inventory.to_dict(),
            "roots": {m.name: self.root_of(m) for m in self.inventory.machines},
        }
        self.record.save()
        # before anything is built
        connect_and_check(self.inventory, self.conns, self.preflight, self.spec.tcp_congestion)
        for m, pid in self._on_every_machine(self._start_agent).items():
            self.agent_pids[m] = pid
        # one machine at a time: a measurement that shares the cores with another is less certain
        self.clock = {m.name: {"before": measure_offset(self.agents[m.name])} for m in self.inventory.machines}
        self.sync.start()  # the heartbeat runs while the other machines build
        tunnels = tunnel_plan(self.spec, self.inventory, self.prefix)

        def build_there(m: Machine) -> str:
            reply = self.agents[m.name].call(
                "build",
                timeout_s=300,
                spec=self.spec.to_file_dict(),
                source=self.spec.source,
                prefix=self.prefix,
                dcs=list(m.dcs),
                tunnels=tunnels[m.name],
                mtu=TUNNEL_MTU,
                delay_mechanism=self.requested_mechanism,
                check_capacity=self.check_capacity,
                tcp_buffer_bytes=self.tcp_buffer_bytes,
                out_dir="run",
                clock_offset_ns=self.clock[m.name]["before"]["offset_ns"],
            )
            return reply["mechanism"]

        mechanisms = self._on_every_machine(build_there)
        if len(set(mechanisms.values())) > 1:
            raise BuildError(
                f"the machines chose different delay mechanisms ({mechanisms}): pass "
                "--delay-mechanism nfqueue so that every end of a link is shaped alike"
            )
        self.mechanism = next(iter(mechanisms.values()))
        self.shaping = RemoteShaping(self)
        self.build_s = time.perf_counter() - t0
        write_clock_offsets(self.out_dir / "clock_offsets.json", self.clock)
        write_topology_record(
            self,
            inventory=self.inventory.to_dict(),
            preflight=self.preflight,
            tunnel_mtu=TUNNEL_MTU,
            tunnels=tunnels,
            agent_pids=self.agent_pids,  # each machine's agent, by its PID there
            host_extra={h.name: {"machine": self.inventory.machine_of(h.dc).name} for h in self.plan.hosts.values()},
        )

    def _start_agent(self, m: Machine) -> int:
        """Deploy the package on ``m`` and start its agent; returns the agent's PID there."""
        deploy(self.conns[m.name], self.root_of(m))
        self.agents[m.name] = AgentClient(
            self.conns[m.name],
            self.root_of(m),
            self.out_dir / "logs" / f"agent-{m.name}.log",
            self.agent_idle_s,
            self.agent_answer_s,
        )
        return self.agents[m.name].call("hello")["pid"]

    def _on_every_machine(self, step: Callable[[Machine], T]) -> dict[str, T]:
        """``step`` on every machine at once (one thread each: the machines work in parallel, this
        process mostly waits on their SSH channels); every step ends before the first error, if
        any, is raised. Returns each machine's result by name."""
        machines = self.inventory.machines
        with ThreadPoolExecutor(max_workers=len(machines), thread_name_prefix="remote-build") as pool:
            futures = {m.name: pool.submit(step, m) for m in machines}
        errors = [f.exception() for f in futures.values() if f.exception() is not None]
        if errors:
            raise errors[0]  # type: ignore[misc]
        return {name: f.result() for name, f in futures.items()}

    def teardown(self) -> None:
        """Every agent tears its part down; a machine whose agent is gone is cleaned from its own
        registry; every machine's run folder is removed. A machine that cannot be reached keeps
        the run in this machine's registry, for ``testbed clean`` to retry."""
        if self.shaping is not None:
            self.shaping.stop()  # the controller here, before the relays it talks to
        self.sync.stop()
        for name, agent in self.agents.items():
            if agent.gone:
                continue
            try:
                if name in self.clock and "after" not in self.clock[name]:
                    self.clock[name]["after"] = measure_offset(agent)
                agent.call("teardown", timeout_s=120)
            except RemoteError as e:
                print(f"testbed: warning: {e}", flush=True)
        if self.agents:
            self.sync.sync(wait=False)  # the last lines of every machine still answering
            if self.clock:
                write_clock_offsets(self.out_dir / "clock_offsets.json", self.clock)
        gone = {name for name, agent in self.agents.items() if agent.gone}
        for agent in self.agents.values():
            agent.close()
        self.agents.clear()
        conns = [(m, self.conns.pop(m.name)) for m in self.inventory.machines if m.name in self.conns]
        unclean = finish_machines(conns, gone, self.prefix)
        if unclean:
            print(
                f"testbed: warning: could not clean {', '.join(unclean)}: run '{sudo_testbed('clean')}' once the "
                "machines are reachable",
                flush=True,
            )
            self.record = None  # kept in the registry: its owner (this process) is gone once it exits
        elif self.record is not None:
            self.record.delete()
            self.record = None

    def check_alive(self) -> None:
        """Raise DelayElementError when a machine's delay element died."""
        for name, agent in self.agents.items():
            failure = agent.call("alive")["failure"]
            if failure:
                raise DelayElementError(f"machine {name}: {failure}")

    def now_ns(self) -> int:
        """The run's reference clock: this machine's CLOCK_MONOTONIC."""
        return time.monotonic_ns()

    @property
    def backend_info(self) -> dict[str, Any]:
        return {}

    # ----------------------------------------------------------------- hosts
    @property
    def hosts(self) -> dict[str, HostAddr]:
        return self.plan.hosts

    def host(self, name: str) -> HostAddr:
        return self.plan.host(name)

    def log_path(self, host: str) -> Path:
        return self.out_dir / "logs" / f"{host}.log"

    def host_machine(self, host: str) -> str | None:
        return self.machine_of_host(host).name

    def python(self, host: str) -> str:
        return self.machine_of_host(host).python

    def process_env(self, extra: dict[str, str]) -> dict[str, str]:
        """Only ``extra``: the runner's own environment stays here (the agent adds PYTHONPATH and
        the machine's clock offset)."""
        return dict(extra)

    @property
    def local_files(self) -> bool:
        """Processes in the hosts run on other machines: files reach them through ``share_*``."""
        return False

    def share_file(self, path: Path) -> str:
        """Copy the file ``path`` to every machine's ``shared/`` folder; returns the path the hosts'
        processes use (relative to the agent's folder, which they run in)."""
        return self.share_bytes(path.name, path.read_bytes())

    def share_bytes(self, name: str, data: bytes) -> str:
        """Write ``data`` to every machine's ``shared/<name>``; returns the path the hosts use."""
        rel = ""
        for m in self.inventory.machines:
            rel = share(self.conns[m.name], self.root_of(m), name, data)
        return rel

    @property
    def host_out_dir(self) -> str:
        return "run"

    def popen(self, host: str, argv: Sequence[str], env: dict[str, str] | None = None, **kwargs: Any) -> RemoteProcess:
        m = self.machine_of_host(host)
        run_env = {
            **(env or {}),
            "PYTHONPATH": f"{self.root_of(m)}/code",
            "TESTBED_CLOCK_OFFSET_NS": str(self.clock[m.name]["before"]["offset_ns"]),
        }
        pid = self.agents[m.name].call("popen", host=host, argv=list(argv), env=run_env)["pid"]
        return RemoteProcess(self.agents[m.name], pid)

    def run(self, host: str, argv: Sequence[str], timeout_s: float = 60) -> subprocess.CompletedProcess:
        m = self.machine_of_host(host)
        r = self.agents[m.name].call("run", timeout_s=timeout_s + 30, host=host, argv=list(argv), limit_s=timeout_s)
        return subprocess.CompletedProcess(list(argv), r["returncode"], r["stdout"], r["stderr"])

    # ----------------------------------------------------------------- links
    def wan_counters(self) -> dict[tuple[str, str], dict[int, dict[str, int]]]:
        out = {}
        for agent in self.agents.values():
            for src, dst, classes in agent.call("counters")["links"]:
                out[(src, dst)] = {int(k): v for k, v in classes.items()}
        return out

    def wait_quiet(self, timeout_s: float = 60.0) -> float:
        t0 = time.monotonic()
        while True:
            queued = sum(a.call("queued")["packets"] for a in self.agents.values())
            if queued == 0:
                return time.monotonic() - t0
            if time.monotonic() - t0 > timeout_s:
                raise CheckError(f"{queued} packets still queued after {timeout_s:g} s: the network is not idle")
            time.sleep(0.05)
