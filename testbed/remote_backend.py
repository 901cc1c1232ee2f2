"""The remote backend: a topology's DCs spread over several Linux machines reached over SSH.

``--backend remote --inventory FILE`` (inventory.py). In order, and before anything is built
anywhere: every machine is reached (host key checked against known_hosts, key login) and checked
(root, the tools and Python modules the run needs, VXLAN in its kernel); any problem on any machine
is one RemoteError listing them all. Then, on each machine: the package is copied to
``<workdir>/<run prefix>/code`` (SFTP), an agent is started (``python -m testbed.agent``, agent.py),
its CLOCK_MONOTONIC offset from this machine's is estimated (the NTP-style exchange of RFC 5905
section 8 over the SSH channel: offset = t_remote - (t_send + t_receive) / 2 from the exchange with
the smallest round trip, uncertainty half that round trip), and it builds its DCs with the netns
backend's code; a WAN link between DCs on two machines is a VXLAN tunnel between the machines
(UDP 4789, MTU 1450 inside), shaped at each end with the same HTB classes and delay mechanism.

Workers run with ``TESTBED_CLOCK_OFFSET_NS`` so every event is in this machine's clock; the offsets
are recorded in ``clock_offsets.json`` (estimated before and after the run, so drift shows). What
processes write on a machine (events, logs, shaping log) is copied into the local run folder as it
is written (about every 0.3 s), so ``_watch`` and the analysis see one run folder. On exit or failure
every agent tears its part down; if this process dies, the agents see their SSH channel close and
do the same, and ``testbed clean`` fetches any traces left on the machines and removes them.
Atlas and BubbleTea need the local control sockets and are refused on this backend.
"""
from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path
from typing import Sequence

from .emulation import Emulation
from .errors import BuildError, RemoteError, SpecError
from .inventory import Inventory, Machine, check_against, load_inventory
from .registry import RunRecord
from .ssh import Connection
from .topology import TopologySpec

VXLAN_PORT = 4789
#: 1500 minus VXLAN's outer headers (Ethernet 14, IPv4 20, UDP 8, VXLAN 8)
TUNNEL_MTU = 1450
CLOCK_SAMPLES = 16
SYNC_INTERVAL_S = 0.3
#: what the agent and the workers import, checked on every machine before anything is built
MODULES = ("torch", "pyroute2", "numpy", "pandas", "yaml")
TOOLS = {"nsenter": "util-linux", "ip": "iproute2", "tc": "iproute2", "iptables-restore": "iptables",
         "iperf3": "iperf3", "ping": "iputils-ping", "unshare": "util-linux"}
#: the NFQUEUE delay element is compiled there when the kernel has no sch_netem
BUILD_TOOLS = {"gcc": "gcc"}

PREFLIGHT = r"""
import json, os, shutil, subprocess, sys
out = {"uid": os.geteuid(), "python": sys.version.split()[0], "modules": {}, "tools": {}}
for m in %(modules)r:
    try:
        out["modules"][m] = getattr(__import__(m), "__version__", "?")
    except Exception as e:
        out["modules"][m] = None
for t in %(tools)r:
    out["tools"][t] = shutil.which(t)
out["nfq_header"] = os.path.exists("/usr/include/libnetfilter_queue/libnetfilter_queue.h")
p = subprocess.run(["unshare", "--net", "ip", "link", "add", "tbprobe", "type", "vxlan", "id", "1", "dstport",
                    "4789"], capture_output=True, text=True)
out["vxlan"] = p.returncode == 0
out["vxlan_error"] = p.stderr.strip()
print(json.dumps(out))
"""


def _last_json_line(text: str) -> dict | None:
    """The last line of ``text`` that is a JSON object (a login banner may come first)."""
    for line in reversed(text.strip().splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        return value if isinstance(value, dict) else None
    return None


def package_files() -> list[Path]:
    """The files deployed to each machine: the package's modules and the delay element's source."""
    pkg = Path(__file__).resolve().parent
    return sorted(pkg.glob("*.py")) + sorted(pkg.glob("*.c"))


def check_machine(name: str, report: dict, torch_version: str, pyroute2_version: str) -> list[str]:
    """Problems of one machine's preflight report (empty: ready). Pure: unit-tested."""
    if not isinstance(report.get("modules"), dict) or not isinstance(report.get("tools"), dict):
        return [f"{name}: its python printed something other than the preflight report: give the inventory's "
                "python as a Python 3 interpreter there"]
    problems = []
    if report.get("uid") != 0:
        problems.append("the login is not root (uid 0): the testbed builds network namespaces there; log in as "
                        "root with a key")
    missing = [f"{m} (install it into that Python, e.g. with scripts/setup.sh)" for m, v in report["modules"].items()
               if v is None]
    if missing:
        problems.append("Python modules missing: " + ", ".join(missing))
    want = {"torch": torch_version, "pyroute2": pyroute2_version}
    for mod, version in want.items():
        got = report["modules"].get(mod)
        if got is not None and got != version:
            problems.append(f"{mod} {got} differs from this machine's {version} (workers must match: install "
                            f"{mod}=={version.split('+')[0]})")
    tools = [f"{t} (apt-get install {pkg})" for t, pkg in {**TOOLS, **BUILD_TOOLS}.items()
             if not report["tools"].get(t)]
    if tools:
        problems.append("tools missing: " + ", ".join(tools))
    if not report.get("nfq_header"):
        problems.append("libnetfilter_queue's header is missing (apt-get install libnetfilter-queue-dev), "
                        "needed to build the delay element where the kernel has no sch_netem")
    if not report.get("vxlan"):
        problems.append(f"the kernel cannot create VXLAN interfaces ({report.get('vxlan_error') or 'no reason given'}): "
                        "load the vxlan module (modprobe vxlan)")
    return [f"{name}: {p}" for p in problems]


def tunnel_plan(spec: TopologySpec, inv: Inventory, prefix: str) -> dict[str, list[dict]]:
    """For every machine, the VXLAN tunnels of its WAN links to DCs on other machines:
    ``{"here", "there", "vni", "local", "remote", "port"}``. A link's VNI is derived from the run
    prefix and the link's index (so concurrent runs on the same machines differ); both ends use it.
    Pure: unit-tested."""
    out: dict[str, list[dict]] = {m.name: [] for m in inv.machines}
    base = (int(prefix[2:], 16) & 0xFFFF) << 8
    for j, link in enumerate(spec.links):
        ma, mb = inv.machine_of(link.a), inv.machine_of(link.b)
        if ma.name == mb.name:
            continue
        vni = base + j + 1
        out[ma.name].append({"here": link.a, "there": link.b, "vni": vni, "local": ma.tunnel_address,
                             "remote": mb.tunnel_address, "port": VXLAN_PORT})
        out[mb.name].append({"here": link.b, "there": link.a, "vni": vni, "local": mb.tunnel_address,
                             "remote": ma.tunnel_address, "port": VXLAN_PORT})
    return out


def estimate_offset(samples: Sequence[tuple[int, int, int]]) -> dict:
    """Clock offset from (t_send, t_remote, t_receive) exchanges, all in ns: the exchange with the
    smallest round trip gives ``offset_ns = t_remote - (t_send + t_receive) / 2`` with an
    uncertainty of half its round trip (RFC 5905, section 8). Pure: unit-tested."""
    if not samples:
        raise ValueError("no clock samples")
    t0, tr, t1 = min(samples, key=lambda s: s[2] - s[0])
    rtt = t1 - t0
    return {"offset_ns": int(tr - (t0 + t1) / 2), "uncertainty_ns": rtt // 2, "rtt_ns": rtt, "samples": len(samples)}


class AgentClient:
    """The request/reply channel to one machine's agent. Thread-safe (one request at a time)."""

    def __init__(self, conn: Connection, root: str, log_path: Path, idle_s: float = 30.0) -> None:
        self.conn = conn
        m = conn.machine
        self.chan = conn.start([m.python, "-m", "testbed.agent"],
                               env={"PYTHONPATH": f"{root}/code", "TESTBED_AGENT_REMOVE": f"{root}/code",
                                    "TESTBED_AGENT_IDLE_S": f"{idle_s:g}"}, cwd=root)
        self._out = self.chan.makefile("rb")
        self._lock = threading.Lock()
        self._next_id = 0
        #: why the agent cannot be used any more ("" while it can)
        self.gone = ""
        self._log = open(log_path, "ab")
        self._drain = threading.Thread(target=self._drain_stderr, name=f"agent-{m.name}-stderr", daemon=True)
        self._drain.start()

    def _drain_stderr(self) -> None:
        f = self.chan.makefile_stderr("rb")
        for line in f:
            self._log.write(line)
            self._log.flush()

    @property
    def busy(self) -> bool:
        return self._lock.locked()

    def call(self, op: str, timeout_s: float = 30.0, **kwargs) -> dict:
        """Send one request and return its reply. Raises RemoteError when the agent reports a
        failure, and (marking the agent gone: later calls fail at once) when it does not answer
        in ``timeout_s``, exits, or the connection breaks."""
        where = self.conn.where
        with self._lock:
            if self.gone:
                raise RemoteError(f"{where}: the agent is gone ({self.gone})")
            self._next_id += 1
            want = self._next_id
            try:
                self.chan.settimeout(timeout_s)
                self.chan.sendall((json.dumps({"op": op, "id": want, **kwargs}) + "\n").encode())
                while True:  # a reply to an earlier, abandoned request (e.g. interrupted) is skipped
                    line = self._out.readline()
                    if not line:
                        self.gone = f"it exited; its output is in {self._log.name}"
                        raise RemoteError(f"{where}: the agent exited or was killed (its output: {self._log.name}); "
                                          "what it built there is removed at teardown")
                    reply = json.loads(line)
                    if reply.get("id") == want:
                        break
            except socket.timeout:
                self.gone = f"no answer to {op!r} within {timeout_s:g} s"
                raise RemoteError(f"{where}: the agent did not answer {op!r} within {timeout_s:g} s") from None
            except OSError as e:
                self.gone = f"connection broke: {e}"
                raise RemoteError(f"{where}: the connection to the agent broke ({e})") from None
        if not reply.pop("ok"):
            raise RemoteError(f"{where}: {op} failed: {reply['type']}: {reply['error']}")
        return reply

    def close(self, timeout_s: float = 30.0) -> None:
        try:
            self.chan.shutdown_write()  # EOF: the agent tears down and exits
            deadline = time.monotonic() + timeout_s
            while not self.chan.exit_status_ready() and time.monotonic() < deadline:
                time.sleep(0.05)
        except (OSError, EOFError):
            pass
        self.chan.close()
        self._drain.join(timeout=2)
        self._log.close()


class RemoteProcess:
    """A process started by an agent, with the subset of ``subprocess.Popen`` the runner uses."""

    def __init__(self, agent: AgentClient, pid: int) -> None:
        self.agent, self.pid, self.returncode = agent, pid, None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.agent.call("poll", pids=[self.pid])["codes"][str(self.pid)]
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        import subprocess

        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = 1.0 if deadline is None else min(1.0, deadline - time.monotonic())
            if left <= 0:
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            self.returncode = self.agent.call("wait", timeout_s=left + 30, pid=self.pid, limit_s=left)["code"]
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            self.agent.call("signal", pid=self.pid, signal=int(sig))

    def terminate(self) -> None:
        self.send_signal(15)

    def kill(self) -> None:
        self.send_signal(9)


class RemoteEmulation(Emulation):
    """:class:`emulation.Emulation` over several machines (see the module docstring). Same use and
    attributes; ``inventory`` is the inventory file (or an Inventory). Raises SpecError for an
    inventory that does not fit the topology, RemoteError for a machine that cannot be used (before
    anything is built anywhere), BuildError from a machine's build."""

    backend = "remote"

    def __init__(self, spec: TopologySpec, *, inventory: Path | Inventory, **kwargs) -> None:
        super().__init__(spec, **kwargs)
        self.mtu = TUNNEL_MTU  # every emulated interface, so TCP's segments fit the tunnels
        self.inventory = inventory if isinstance(inventory, Inventory) else load_inventory(inventory)
        check_against(self.inventory, spec)
        self.conns: dict[str, Connection] = {}
        self.agents: dict[str, AgentClient] = {}
        self.clock: dict[str, dict] = {}
        self.preflight: dict[str, dict] = {}
        self._sync: threading.Thread | None = None
        self._sync_halt = threading.Event()
        self._sync_lock = threading.Lock()
        #: an agent tears down after this long without a request (agent.py's watchdog)
        self.agent_idle_s = 30.0
        #: each machine's agent process (its PID there)
        self.agent_pids: dict[str, int] = {}

    # ----------------------------------------------------------------- lifecycle
    def root_of(self, m: Machine) -> str:
        return f"{m.workdir}/{self.prefix}"

    def machine_of_host(self, host: str) -> Machine:
        return self.inventory.machine_of(self.host(host).dc)

    def build(self) -> None:
        import pyroute2
        import torch

        from .features import require_root

        require_root("the remote backend's run registry")
        t0 = time.perf_counter()
        (self.out_dir / "logs").mkdir(parents=True, exist_ok=True)
        self._record = RunRecord.new(self.prefix, kind="remote", out_dir=str(self.out_dir.absolute()))
        self._record.remote = {"inventory": self.inventory.to_dict(), "roots": {
            m.name: self.root_of(m) for m in self.inventory.machines}}
        self._record.save()
        # 1. every machine reachable, verified and ready, before anything is built anywhere
        problems = []
        for m in self.inventory.machines:
            conn = Connection(m, self.inventory.known_hosts, self.inventory.accept_unknown_host_keys)
            try:
                self.conns[m.name] = conn.open()
            except RemoteError as e:
                problems.append(str(e))
        if problems:
            raise RemoteError("cannot use the inventory's machines; nothing was built:\n  " + "\n  ".join(problems))
        for m in self.inventory.machines:
            conn = self.conns[m.name]
            code, out, err = conn.run(["id", "-u"], timeout_s=30)
            if code != 0 or out.strip().splitlines()[-1:] != ["0"]:
                problems.append(f"{m.name}: the login {m.user} is not root (id -u: {(out or err).strip()[-80:]!r}): the "
                                "testbed builds network namespaces there; log in as root with a key")
                continue
            script = PREFLIGHT % {"modules": MODULES, "tools": tuple({**TOOLS, **BUILD_TOOLS})}
            code, out, err = conn.run([m.python, "-c", script], timeout_s=60)
            report = _last_json_line(out)
            if code != 0 or report is None:
                problems.append(f"{m.name}: {m.python} gave no preflight report (exit {code}): "
                                f"{(err or out).strip()[-300:]!r}; give the inventory's python as a Python 3 "
                                "interpreter there, and make sure the login prints nothing else")
                continue
            self.preflight[m.name] = report
            problems += check_machine(m.name, report, torch.__version__, pyroute2.__version__)
        if problems:
            raise RemoteError("machines are not ready; nothing was built:\n  " + "\n  ".join(problems))
        # 2. deploy and start the agents
        for m in self.inventory.machines:
            self._deploy(m)
            self.agents[m.name] = AgentClient(self.conns[m.name], self.root_of(m),
                                              self.out_dir / "logs" / f"agent-{m.name}.log", self.agent_idle_s)
            self.agent_pids[m.name] = self.agents[m.name].call("hello")["pid"]
        self.clock = {m.name: {"before": self.measure_offset(m.name)} for m in self.inventory.machines}
        # the copying of traces doubles as the agents' heartbeat (agent.py's watchdog), so it runs
        # while other machines build
        self._sync = threading.Thread(target=self._sync_loop, name="remote-sync", daemon=True)
        self._sync.start()
        # 3. each machine builds its DCs
        tunnels = tunnel_plan(self.spec, self.inventory, self.prefix)
        mechanisms = {}
        for m in self.inventory.machines:
            reply = self.agents[m.name].call(
                "build", timeout_s=300, spec=self.spec.to_file_dict(), source=self.spec.source, prefix=self.prefix, dcs=list(m.dcs),
                tunnels=tunnels[m.name], mtu=TUNNEL_MTU, delay_mechanism=self.requested_mechanism,
                check_capacity=self.check_capacity, tcp_buffer_bytes=self.tcp_buffer_bytes, out_dir="run",
                clock_offset_ns=self.clock[m.name]["before"]["offset_ns"])
            mechanisms[m.name] = reply["mechanism"]
        if len(set(mechanisms.values())) > 1:
            raise BuildError(f"the machines chose different delay mechanisms ({mechanisms}): pass "
                             "--delay-mechanism nfqueue so that every end of a link is shaped alike")
        self.mechanism = next(iter(mechanisms.values()))
        self.build_s = time.perf_counter() - t0
        self._write_clock()
        (self.out_dir / "topology.json").write_text(json.dumps(
            {**self.spec.to_dict(), "prefix": self.prefix, "backend": self.backend, "delay_mechanism": self.mechanism,
             "inventory": self.inventory.to_dict(), "preflight": self.preflight, "tunnel_mtu": TUNNEL_MTU,
             "tunnels": tunnels,
             "hosts": {h.name: {"dc": h.dc, "ip": str(h.ip), "netns": h.netns,
                                "machine": self.inventory.machine_of(h.dc).name} for h in self.plan.hosts.values()}},
            indent=1))

    def _deploy(self, m: Machine) -> None:
        root = self.root_of(m)
        conn = self.conns[m.name]
        code, _, err = conn.run(["mkdir", "-p", "--", f"{root}/code/testbed", f"{root}/run", f"{root}/shared"])
        if code != 0:
            raise RemoteError(f"{conn.where}: cannot create {root}: {err.strip()}")
        sftp = conn.sftp()
        try:
            for path in package_files():
                sftp.put(str(path), f"{root}/code/testbed/{path.name}")
        finally:
            sftp.close()

    def measure_offset(self, machine: str, samples: int = CLOCK_SAMPLES) -> dict:
        """This machine's CLOCK_MONOTONIC offset from ours (see estimate_offset)."""
        agent = self.agents[machine]
        got = []
        for _ in range(samples):
            t0 = time.monotonic_ns()
            tr = agent.call("clock")["t_ns"]
            got.append((t0, tr, time.monotonic_ns()))
        return estimate_offset(got)

    def _write_clock(self) -> None:
        (self.out_dir / "clock_offsets.json").write_text(json.dumps(
            {"reference": "the runner's CLOCK_MONOTONIC", "method": "min-RTT exchange over SSH (RFC 5905 section 8)",
             "machines": self.clock}, indent=1))

    def _sync_loop(self) -> None:
        while not self._sync_halt.wait(SYNC_INTERVAL_S):
            self.sync(wait=False)

    def sync(self, wait: bool = True) -> None:
        """Append what the machines' processes wrote since the last call to the local run folder.
        ``wait=False`` skips agents busy with another request (a build, a measurement) and agents
        that are gone (their failure is reported by the request that found it)."""
        with self._sync_lock:
            for name, agent in list(self.agents.items()):
                if not wait and (agent.gone or agent.busy):
                    continue
                try:
                    files = agent.call("read")["files"]
                except RemoteError:
                    if wait:
                        raise
                    continue
                for rel, text in files.items():
                    # traces and logs merge into the run folder; other files (the machine's own
                    # topology.json) keep to machines/<name>/
                    merged = rel.endswith(".jsonl") or rel.startswith("logs/") or rel.startswith("events/")
                    dest = self.out_dir / rel if merged else self.out_dir / "machines" / name / rel
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    with open(dest, "ab") as f:
                        f.write(text.encode("latin-1"))

    def teardown(self) -> None:
        """Every agent tears its part down; a machine whose agent is gone is cleaned from its own
        registry; every machine's run folder is removed. A machine that cannot be reached keeps
        the run in this machine's registry, for ``testbed clean`` to retry."""
        self._sync_halt.set()
        if self._sync is not None:
            self._sync.join(timeout=5)
            self._sync = None
        for name, agent in self.agents.items():
            if agent.gone:
                continue
            try:
                if name in self.clock and "after" not in self.clock[name]:
                    self.clock[name]["after"] = self.measure_offset(name)
                agent.call("teardown", timeout_s=120)
            except RemoteError as e:
                print(f"testbed: warning: {e}", flush=True)
        if self.agents:
            self.sync(wait=False)  # the last lines of every machine still answering
            if self.clock:
                self._write_clock()
        gone = {name for name, agent in self.agents.items() if agent.gone}
        for agent in self.agents.values():
            agent.close()
        self.agents.clear()
        unclean = []
        for m in self.inventory.machines:
            conn = self.conns.pop(m.name, None)
            if conn is None:
                continue
            try:
                if m.name in gone:
                    note = _clean_machine(conn, m, self.root_of(m), self.prefix)
                    print(f"testbed: machine {m.name}: {note}", flush=True)
                else:
                    conn.run(["rm", "-rf", "--", self.root_of(m)], timeout_s=60)
            except RemoteError as e:
                unclean.append(f"{m.name} ({e})")
            conn.close()
        if unclean:
            print(f"testbed: warning: could not clean {', '.join(unclean)}: run 'sudo testbed clean' once the "
                  "machines are reachable", flush=True)
            self._record = None  # kept in the registry: its owner (this process) is gone once it exits
        elif self._record is not None:
            self._record.delete()
            self._record = None

    def check_alive(self) -> None:
        for name, agent in self.agents.items():
            failure = agent.call("alive")["failure"]
            if failure:
                from .errors import DelayElementError

                raise DelayElementError(f"machine {name}: {failure}")

    # ----------------------------------------------------------------- hosts
    def python(self, host: str) -> str:
        return self.machine_of_host(host).python

    def process_env(self, extra: dict[str, str]) -> dict[str, str]:
        """Only ``extra``: the runner's own environment stays here (the agent adds PYTHONPATH and
        the machine's clock offset)."""
        return dict(extra)

    def share_file(self, path: Path) -> str:
        """Copy the file ``path`` to every machine's ``shared/`` folder; returns the path the hosts'
        processes use (relative to the agent's folder, which they run in)."""
        return self._share(path.name, path.read_bytes())

    def share_corpus(self, path: Path | None) -> str:
        """The corpus as read here (data.corpus_bytes: at most 32 MiB, regular files only), copied
        to every machine as one file, so every replica trains on the same bytes whatever the
        machines' own Python libraries (the default corpus) or folders hold."""
        from .data import corpus_bytes

        return self._share("corpus.txt", corpus_bytes(path))

    def _share(self, name: str, data: bytes) -> str:
        rel = f"shared/{name}"
        for m in self.inventory.machines:
            sftp = self.conns[m.name].sftp()
            try:
                with sftp.open(f"{self.root_of(m)}/{rel}", "wb") as f:
                    f.set_pipelined(True)
                    f.write(data)
            finally:
                sftp.close()
        return rel

    @property
    def host_out_dir(self) -> str:
        return "run"

    def popen(self, host: str, argv: Sequence[str], env: dict | None = None, **kwargs) -> RemoteProcess:
        m = self.machine_of_host(host)
        run_env = {**(env or {}), "PYTHONPATH": f"{self.root_of(m)}/code",
                   "TESTBED_CLOCK_OFFSET_NS": str(self.clock[m.name]["before"]["offset_ns"])}
        pid = self.agents[m.name].call("popen", host=host, argv=list(argv), env=run_env)["pid"]
        return RemoteProcess(self.agents[m.name], pid)

    def run(self, host: str, argv: Sequence[str], timeout_s: float = 60):
        import subprocess

        m = self.machine_of_host(host)
        r = self.agents[m.name].call("run", timeout_s=timeout_s + 30, host=host, argv=list(argv), limit_s=timeout_s)
        return subprocess.CompletedProcess(list(argv), r["returncode"], r["stdout"], r["stderr"])

    def log_path(self, host: str) -> Path:
        return self.out_dir / "logs" / f"{host}.log"

    # ----------------------------------------------------------------- links
    def wan_counters(self) -> dict[tuple[str, str], dict[int, dict]]:
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
                from .errors import CheckError

                raise CheckError(f"{queued} packets still queued after {timeout_s:g} s: the network is not idle")
            time.sleep(0.05)

    def _not_here(self, *args, **kwargs):
        raise SpecError("--backend", "(option)", "remote", "cannot change shaping live (Atlas)",
                        "use --backend netns or mininet for atlas, or a pp-fair or dp-wan policy")

    add_wan_class = set_wan_class_rate = compile_wan_class_rates = set_link_rate = _not_here


def _clean_machine(conn: Connection, m: Machine, root: str, prefix: str) -> str:
    """Remove what run ``prefix`` left on machine ``m`` after its agent died: its registry's record
    there (``testbed clean --run PREFIX`` with the deployed code), then its run folder. Returns a
    note; raises RemoteError if that machine still holds the run."""
    if conn.run(["test", "-d", f"{root}/code/testbed"])[0] != 0:
        conn.run(["rm", "-rf", "--", root])
        return "nothing of the run was left but its folder (removed)"
    code, out, err = conn.run([m.python, "-m", "testbed.cli", "clean", "--run", prefix],
                              env={"PYTHONPATH": f"{root}/code"}, timeout_s=120)
    text = out.strip().replace("\n", "; ")
    if code != 0 or "still running" in text:
        raise RemoteError(f"{conn.where}: testbed clean there failed: {(text or err.strip())[-300:]}")
    conn.run(["rm", "-rf", "--", root])
    return text or "cleaned"


def clean_remote_run(rec: RunRecord) -> list[str]:
    """Finish a dead remote run on its machines (``testbed clean``): fetch the traces left in each
    machine's run folder into ``<run folder>/leftover-<machine>/``, let the machine's own registry
    remove what a killed agent left (``testbed clean --run PREFIX`` there, with the deployed code),
    and delete the run folder there. Returns one note per machine; a note starting with "could not"
    means that machine still needs cleaning."""
    inv = rec.remote.get("inventory", {})
    roots = rec.remote.get("roots", {})
    notes = []
    for raw in inv.get("machines", []):
        m = Machine(raw["name"], raw["address"], raw["user"], tuple(raw["dcs"]), raw["port"],
                    Path(raw["key"]) if raw.get("key") else None, raw["python"], raw["tunnel_address"], raw["workdir"])
        root = roots.get(m.name)
        if not root or not root.startswith(m.workdir + "/") or not root.endswith("/" + rec.prefix):
            notes.append(f"could not clean {m.name}: its recorded run folder {root!r} is not <workdir>/{rec.prefix}")
            continue
        try:
            conn = Connection(m, Path(inv["known_hosts"]), inv.get("accept_unknown_host_keys", False)).open()
        except RemoteError as e:
            notes.append(f"could not clean {m.name}: {e}")
            continue
        try:
            code, out, _ = conn.run(["test", "-d", root])
            if code != 0:
                notes.append(f"{m.name}: nothing left")
                continue
            fetched = _fetch_dir(conn, f"{root}/run", Path(rec.out_dir or ".") / f"leftover-{m.name}")
            note = f"{m.name}: {fetched} trace files fetched into {Path(rec.out_dir or '.') / f'leftover-{m.name}'}"
            # the agent removes the deployed code only after its teardown: code left means it was killed
            notes.append(note + "; " + _clean_machine(conn, m, root, rec.prefix))
        except RemoteError as e:
            notes.append(f"could not clean {m.name}: {e}")
        finally:
            conn.close()
    return notes


def _fetch_dir(conn: Connection, remote: str, local: Path) -> int:
    """Copy a remote folder's files (recursively) into ``local``; returns how many."""
    import stat

    sftp = conn.sftp()
    n = 0
    try:
        todo = [(remote, local)]
        while todo:
            src, dst = todo.pop()
            try:
                entries = sftp.listdir_attr(src)
            except OSError:
                continue
            dst.mkdir(parents=True, exist_ok=True)
            for e in entries:
                if stat.S_ISDIR(e.st_mode):
                    todo.append((f"{src}/{e.filename}", dst / e.filename))
                else:
                    sftp.get(f"{src}/{e.filename}", str(dst / e.filename))
                    n += 1
    finally:
        sftp.close()
    return n
