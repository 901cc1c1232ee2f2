"""Route failover: when a WAN link marked ``failover`` goes down (a profile's outage or ``testbed
link down``), every router moves the routes that crossed it to the other path ``failover_after``
later, as routers do once BFD has missed its hellos; when the link returns they move back as long
after. Routes are replaced in place (``netlink.replace_route``). Links without ``failover`` keep
their routes through an outage (traffic to them is lost until they return).

A thread follows the run's ``shaping.jsonl`` for ``link_down``/``link_up`` lines (whoever wrote
them) and logs each change of routes as a ``reroute`` line: the links seen down, each router's
moved routes (``router``, destination DC, new next hop) and how long the changes took."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from pyroute2 import IPRoute

from testbed.errors import TestbedError
from testbed.net import netlink
from testbed.spec.addressing import AddressPlan
from testbed.spec.routing import RoutingTable, routes_without
from testbed.spec.topology import TopologySpec
from testbed.trace.jsonl import JsonlFollower, open_jsonl, write_row
from testbed.trace.shaping_log import LINK_DOWN, LINK_UP, REROUTE, SHAPING_LOG

#: how often the log is read for outages (s): well below any detection time worth modelling
POLL_S = 0.005


class FailoverError(TestbedError):
    """The routers' routes could not be changed."""


def next_hops(spec: TopologySpec, routes: RoutingTable) -> dict[tuple[str, str], str]:
    """Each (router's DC, destination DC) pair's next-hop DC under ``routes``."""
    return {
        (a.name, b.name): routes.next_hop(a.name, b.name)[0] for a in spec.dcs for b in spec.dcs if a.name != b.name
    }


class FailoverAgent(threading.Thread):
    """Moves routes off failed ``failover`` links of a network built on this machine (module doc);
    ``on_failure`` is called once, from this thread, where a route change fails."""

    def __init__(
        self,
        spec: TopologySpec,
        plan: AddressPlan,
        out_dir: Path,
        now_ns: Callable[[], int],
        on_failure: Callable[[TestbedError], None],
    ) -> None:
        super().__init__(name="failover", daemon=True)
        self.spec, self.plan, self.out_dir, self.now_ns, self.on_failure = spec, plan, out_dir, now_ns, on_failure
        self.failover = {f"{x.a}:{x.b}": x.failover_after_us * 1000 for x in spec.links if x.failover}
        self.installed = next_hops(spec, RoutingTable(spec))
        self._halt = threading.Event()
        self.log = JsonlFollower(out_dir / SHAPING_LOG, (LINK_DOWN, LINK_UP))
        #: failover links down in the log: name -> when (ns); seen down by the routers: names
        self.down: dict[str, int] = {}
        self.up_at: dict[str, int] = {}
        self.seen_down: set[str] = set()

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        while not self._halt.wait(POLL_S):
            self._read()
            now = self.now_ns()
            wanted = {k for k, t in self.down.items() if now >= t + self.failover[k]}
            wanted |= {
                k for k in self.seen_down if k not in self.down and now < self.up_at.get(k, 0) + self.failover[k]
            }
            if wanted != self.seen_down:
                try:
                    self._reroute(wanted)
                except (OSError, TestbedError, KeyError) as e:
                    self.on_failure(
                        FailoverError(f"moving routes off {', '.join(sorted(wanted)) or 'nothing'} failed: {e}")
                    )
                    return

    def _read(self) -> None:
        for row in self.log.new_rows():
            link = row.get("link")
            if link not in self.failover:
                continue
            if row.get("event") == LINK_DOWN:
                self.down.setdefault(link, int(row["t_ns"]))
            elif row.get("event") == LINK_UP:
                self.down.pop(link, None)
                self.up_at[link] = int(row["t_ns"]) + int(row.get("duration_ns", 0))

    def _reroute(self, down: set[str]) -> None:
        t0 = self.now_ns()
        wanted = next_hops(self.spec, routes_without(self.spec, down))
        moved = []
        by_router: dict[str, list[tuple[str, str]]] = {}
        for (at, dst), via in wanted.items():
            if self.installed[(at, dst)] != via:
                by_router.setdefault(at, []).append((dst, via))
        for at, changes in by_router.items():
            with IPRoute(netns=self.plan.routers[at].netns) as ipr:
                for dst, via in changes:
                    gateway = self.plan.wan_ends[(at, via)].peer_ip
                    netlink.replace_route(ipr, str(self.plan.routers[dst].subnet), str(gateway))
                    self.installed[(at, dst)] = via
                    moved.append({"router": at, "to": dst, "via": via})
        self.seen_down = set(down)
        with open_jsonl(self.out_dir / SHAPING_LOG) as log:
            write_row(
                log,
                {
                    "t_ns": t0,
                    "event": REROUTE,
                    "down": sorted(down),
                    "moved": moved,
                    "duration_ns": self.now_ns() - t0,
                },
            )
