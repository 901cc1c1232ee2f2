"""Atlas's temporal bandwidth sharing (DESIGN.md section 1, item 4), applied through HTB: the
runner's side of the controller.

On every WAN egress that a stage boundary's traffic crosses, each data-parallel pipeline gets its
own HTB class (``1:(0x20 + replica)``) selected by u32 filters on the pipeline's (sender, receiver)
host pairs. The controller grants a link direction to one pipeline's transfer at a time: the
granted class runs at the full link rate, the others are held at a small floor rate (starving a
TCP flow to zero sends it into retransmission back-off that wastes its next grant, so held
classes keep ``FLOOR_SHARE`` of the link). Order: earliest ready first, which follows the pipeline
schedule and staggers the pipelines (one computes while another transmits).

The grant loop runs in its own process (no GIL shared with the runner's threads, higher priority),
and each grant is compiled ahead into one netlink buffer sent in one system call. Workers report
over a control channel outside the emulated WAN (a Unix datagram socket in the testbed's state
folder): the sender says ``ready`` when it starts a send and the receiver ``recv``
when it posts the receive (gloo moves data only once both are there, so a transfer is ready when
both messages have come); the receiver says ``done`` when the data has arrived. Workers never wait
for the controller; if it dies, ``fall_back`` opens every class to the full rate (fair sharing by
TCP) and the run says so; the runner does the same if the process is killed.

Across machines (``net.shaping`` a ``RelayedControl``: the remote backend) the controller still
runs here and decides every grant; its socket is UDP on the management network, which a relay on
each machine feeds with its workers' datagrams (bound at the same path there), and a grant goes to
the relay of the machine holding its link (``net/remote/control_relay.py``).

Parts: ``grants.py`` (the pure grant logic), ``channel.py`` (the workers' messages),
``switch.py`` (applying a grant), ``controller_process.py`` (the loop in its own process).
"""

from __future__ import annotations

import itertools
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

from testbed.atlas.channel import REPLAN, REPLAN_FILE, STOP, encode_message
from testbed.atlas.classes import CLASS_BASE, floor_bps
from testbed.atlas.grants import FLOOR_SHARE, NEVER, Hop, boundary_paths
from testbed.atlas.switch import GrantSwitch
from testbed.atlas.timing import HopTiming, timing_to_json
from testbed.net.network import Network, RelayedControl, require_live_shaping
from testbed.plan.grant_plan import GrantPlan, granted_class_bps
from testbed.plan.virtual_stages import home_boundaries
from testbed.plan.workers import WorkerSpec
from testbed.spec.routing import RoutingTable, routes_without
from testbed.spec.wire import TCP_GOODPUT_FRACTION
from testbed.trace.jsonl import write_json_atomic


class Controller:
    """The runner's side of Atlas's controller: installs one HTB class per pipeline on every crossed
    egress (all open, fair, until the first grant), compiles every grant, and runs the grant loop
    in its own process (``serve``: its own interpreter, no GIL shared with the runner's threads, a
    higher scheduling priority), fed by workers over a Unix datagram socket bound here before any
    worker starts. ``grant`` applies a grant from this process (tests, tools)."""

    def __init__(
        self,
        net: Network,
        workers: list[WorkerSpec],
        replicas: int,
        sock_path: Path,
        log_path: Path,
        floor_share: float = FLOOR_SHARE,
        sharing: str = "fifo",
        plan: GrantPlan | None = None,
        borrow: bool = False,
        homes: list[int] | None = None,
    ) -> None:
        """``sharing``: ``fifo`` or ``planned`` (``grants.py``); ``plan``: the run's grant plan (its
        deadlines serve both; ``planned`` needs it); ``borrow``: held classes may use idle capacity;
        ``homes``: the worker's stage holding each virtual stage (``schedule.stage_homes``; default
        one virtual stage per worker)."""
        self.net, self.workers, self.replicas = net, {w.rank: w for w in workers}, replicas
        self.shaping = require_live_shaping(net, "Atlas's controller")
        self.floor_share, self.sharing, self.grant_plan, self.borrow = floor_share, sharing, plan, borrow
        if sharing == "planned" and plan is None:
            raise ValueError("planned sharing needs a grant plan")
        self.sock_path, self.log_path = Path(sock_path), Path(log_path)
        self.error_file = self.log_path.with_name("controller_error.txt")
        self.homes = homes if homes is not None else list(range(max(w.stage for w in workers) + 1))
        self.hops = boundary_paths(workers, net.routes, home_boundaries(self.homes))
        self.switch: GrantSwitch | None = None
        self.proc = None
        self._sock: socket.socket | None = None
        #: the machines' relays (``RelayedControl.open_control``), where the links are on other machines
        self.relays: dict | None = None
        self._stopping = False
        self._failure: str | None = None
        #: link rates changed since the topology's (a link profile's step), by hop
        self.link_rates: dict[Hop, int] = {}
        self._pairs: dict[tuple[Hop, int], list[tuple[str, str]]] = {}

    def link_rate_bps(self, hop: Hop) -> int:
        """The hop's link rate: the topology's, or the last one ``replan`` was given."""
        return self.link_rates.get(hop, self.net.plan.wan_ends[(hop.src, hop.dst)].link.rate_bps)

    def install(self) -> None:
        """One class per pipeline on every egress its traffic crosses, or may cross once a
        ``failover`` link has failed (``_route_sets``), all open (fair) until the first grant;
        compile each grant: the granted class gets the link minus the others' floors, the others
        their floor (held, never starved), the old holders first so the link is never
        oversubscribed; with ``borrow`` every class may also use what the link has idle (HTB ceil
        at the link rate; the granted class, within its rate, is served first)."""
        if isinstance(self.shaping, RelayedControl):  # the relays first: the switch sends grants through them
            self._sock, self.relays = self.shaping.open_control(str(self.sock_path))
        pairs: dict[tuple[Hop, int], list[tuple[str, str]]] = {}
        for routes in self._route_sets():
            for (s, d), hops in self._paths(routes).items():
                for hop in hops:
                    pair = (self.workers[s].host, self.workers[d].host)
                    if pair not in pairs.setdefault((hop, self.workers[s].replica), []):
                        pairs[(hop, self.workers[s].replica)].append(pair)
        for (hop, replica), host_pairs in sorted(pairs.items(), key=lambda x: (x[0][0].src, x[0][0].dst, x[0][1])):
            rate_bps = self.link_rate_bps(hop)
            self.shaping.add_wan_class(hop.src, hop.dst, CLASS_BASE + replica, rate_bps, rate_bps, host_pairs)
        self._pairs = pairs
        self.switch = GrantSwitch(self._compile(), self.log_path, self.shaping.shaping_log_path, self.relays)

    def _paths(self, routes: RoutingTable) -> dict[tuple[int, int], list[Hop]]:
        """Each (sender, receiver) pair's WAN egresses under ``routes``."""
        return boundary_paths(list(self.workers.values()), routes, home_boundaries(self.homes))

    def _route_sets(self) -> list[RoutingTable]:
        """The routes as built, and those after each set of the topology's ``failover`` links has
        failed (every set that leaves every DC reachable): the pipelines' classes go on every
        egress their traffic may take, so that a grant can follow it there (``GrantLoop.reroute``)."""
        spec = self.net.spec
        names = [f"{x.a}:{x.b}" for x in spec.links if x.failover]
        out = [self.net.routes]
        for k in range(1, len(names) + 1):
            for down in itertools.combinations(names, k):
                try:
                    out.append(routes_without(spec, set(down)))
                except KeyError:  # a DC cut off: nothing to route
                    continue
        return out

    def hops_json(self, routes: RoutingTable) -> dict[str, list[dict]]:
        """The grant loop's paths (``hops``: each pair's egresses) and notice delays (``notice``:
        from each pair's receiver back to its sender, ns) under ``routes``."""
        paths = self._paths(routes)
        return {
            "hops": [{"src": s, "dst": d, "hops": [[h.src, h.dst] for h in hs]} for (s, d), hs in paths.items()],
            "notice": [
                {"src": s, "dst": d, "ns": routes.one_way_delay_us(self.workers[d].dc, self.workers[s].dc) * 1000}
                for s, d in paths
            ],
        }

    def _compile(self) -> dict[Hop, dict]:
        """Every grant of every hop compiled at the hops' link rates (``install``'s doc)."""
        pairs = self._pairs
        hops = sorted({h for h, _ in pairs}, key=lambda h: (h.src, h.dst))
        batches: dict[Hop, dict] = {}
        for hop in hops:
            rate_bps = self.link_rate_bps(hop)
            floor = floor_bps(rate_bps, self.floor_share)
            full_bps = int(granted_class_bps(rate_bps, self.replicas, floor / rate_bps))
            minors = sorted(CLASS_BASE + r for (h, r) in pairs if h == hop)
            open_rates = [(m, rate_bps) for m in minors]
            batches[hop] = {"open": self.shaping.compile_wan_class_rates(hop.src, hop.dst, open_rates)}
            held_ceil = rate_bps if self.borrow else floor
            full_ceil = rate_bps if self.borrow else full_bps
            for m in minors:
                order = [(o, floor, held_ceil) for o in minors if o != m] + [(m, full_bps, full_ceil)]
                batches[hop][m - CLASS_BASE] = self.shaping.compile_wan_class_rates(hop.src, hop.dst, order)
        return batches

    def grant(self, hop: Hop, replica: int, t_ready_ns: int | None = None) -> int:
        """Give ``hop`` to ``replica`` now, from this process; returns when the kernel acknowledged."""
        return self.switch.apply(hop, replica, t_ready_ns)

    def start(self) -> None:
        """Bind the control socket (across machines: ``install`` opened it) and start the
        controller process."""
        if self._sock is None:
            self.sock_path.unlink(missing_ok=True)
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._sock.bind(str(self.sock_path))
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        timing = HopTiming.from_plan(self.grant_plan, TCP_GOODPUT_FRACTION) if self.grant_plan else {}
        plan = {
            "switch": self.switch.to_json(),
            "log": str(self.log_path),
            "shaping_log": str(self.shaping.shaping_log_path),
            "error_file": str(self.error_file),
            "sharing": self.sharing,
            "iteration_ns": _iteration_ns(self.grant_plan) if self.grant_plan else NEVER,
            "replica_of": {str(r): w.replica for r, w in self.workers.items()},
            "stage_of": {str(r): w.stage for r, w in self.workers.items()},
            "stage_homes": self.homes,
            **self.hops_json(self.net.routes),
            "timing": timing_to_json(timing),
            "fd": self._sock.fileno(),
            **({"relays": self.relays} if self.relays else {}),
        }
        plan_path = self.log_path.with_name("controller_plan.json")
        write_json_atomic(plan_path, plan)  # readers (tools, tests) may open it while it is written
        if self.relays:
            plan_path.chmod(0o600)  # the run's token: whoever has it may send the machines' relays grants
        with open(self.log_path.with_name("controller.log"), "a") as out:
            self.proc = self.shaping.start_helper(
                [sys.executable, "-m", "testbed.atlas.controller_process", str(plan_path)],
                "atlas controller",
                pass_fds=(self._sock.fileno(),),
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
            )

    def replan(
        self,
        plan: GrantPlan,
        sharing: str | None = None,
        link_rates: dict[tuple[str, str], int] | None = None,
        routes: RoutingTable | None = None,
    ) -> None:
        """Hand the running controller a new grant plan (the first iteration's profiled compute, a
        link profile's step): written to ``REPLAN_FILE`` beside its log, then announced; it follows
        it from the next transfer that becomes ready. ``sharing`` ``planned``: a controller started
        ``fifo`` (a launched job's, before its workload was measured) switches to the plan
        (``GrantLoop.replan``). ``link_rates``: the links' rates now, by (DC, DC) either way round,
        where they changed (bit/s): every grant is compiled again at them and the grants held are
        applied again at once. ``routes``: the routes now, where a failover may have moved them:
        where a pair's path differs from the one the loop follows, the loop takes the new paths
        (``GrantLoop.reroute``)."""
        timing = HopTiming.from_plan(plan, TCP_GOODPUT_FRACTION)
        data: dict = {"timing": timing_to_json(timing), "iteration_ns": _iteration_ns(plan)}
        if sharing is not None:
            data["sharing"] = sharing
            self.sharing = sharing
        if link_rates and self.switch is not None:
            for hop in self.switch.batches:
                rate = link_rates.get((hop.src, hop.dst), link_rates.get((hop.dst, hop.src)))
                if rate is not None:
                    self.link_rates[hop] = rate
            self.switch.batches = self._compile()
            data["switch"] = self.switch.to_json()
        if routes is not None and self._paths(routes) != self.hops:
            self.hops = self._paths(routes)
            data |= self.hops_json(routes)
        write_json_atomic(self.log_path.with_name(REPLAN_FILE), data)
        self.grant_plan = plan
        try:
            self._notify(encode_message(REPLAN))
        except OSError:  # a dead controller is reported by poll_failure
            pass

    def _notify(self, data: bytes) -> None:
        """Send the controller process a message of the runner's (``stop``, ``replan``) on its own socket."""
        assert self._sock is not None
        if self.relays:  # UDP across machines: framed with the run's token like the relays' forwards
            self._sock.sendto(bytes.fromhex(self.relays["token"]) + data, ("127.0.0.1", self._sock.getsockname()[1]))
        else:
            self._sock.sendto(data, str(self.sock_path))

    def poll_failure(self) -> str | None:
        """If the controller process has died during the run, open every class (fair sharing; the
        process may have been killed before it could) and return why; else None. Reported once."""
        if self._failure is not None or self.proc is None or self._stopping or self.proc.poll() is None:
            return None
        why = self.error_file.read_text() if self.error_file.exists() else f"exit status {self.proc.returncode}"
        self._failure = why
        self.fall_back()
        return why

    def fall_back(self) -> None:
        """Open every class to the full link rate: the pipelines share links as TCP does."""
        for hop in self.switch.batches:
            try:
                self.switch.apply(hop, "open", event="fall_back")
            except Exception:  # noqa: BLE001 - the network may be going down
                return

    def stop(self) -> None:
        self._stopping = True
        if self.proc is not None and self.proc.poll() is None:
            try:
                self._notify(encode_message(STOP))
                self.proc.wait(timeout=2)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.terminate()
        if self.switch is not None:
            self.switch.close()
        if self._sock is not None:
            self._sock.close()
        self.sock_path.unlink(missing_ok=True)


def _iteration_ns(plan: GrantPlan) -> int:
    """The plan's iteration in ns; NEVER when it is not known (before the profile, real compute)."""
    return int(plan.iteration_s * 1e9) if math.isfinite(plan.iteration_s) else NEVER
