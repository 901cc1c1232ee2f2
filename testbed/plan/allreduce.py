"""The gradient all-reduce after the pipeline: which DCs each stage's replicas sit in, the bytes
its rings put on each WAN link direction, and how long it takes.

A hierarchical ring (each step a ring: Patarasuk and Yuan 2009, "Bandwidth optimal all-reduce
algorithms for clusters of workstations": n members send 2 (n - 1) / n of the data each): the k
replicas of a stage inside one DC reduce-scatter over their access links, k rings of 1 / k of the
gradients each then all-reduce across the n DCs that hold the stage (each DC sending 2 (n - 1) / n
of them to the next DC of the ring, over the routed WAN path), and the DC's replicas all-gather.
With one replica per DC (the emulator's dp-wan) this is the flat ring over the WAN that gloo runs;
with every replica in one DC (the pipeline policies) no byte crosses the WAN.

Pure functions of an experiment, its topology and its placement.
"""

from __future__ import annotations

from dataclasses import dataclass

from testbed.plan.connections import connection_rate_bps, connection_window_bytes
from testbed.plan.workers import WorkerSpec
from testbed.spec.experiment import Experiment
from testbed.spec.model import stage_param_bytes
from testbed.spec.routing import RoutingTable
from testbed.spec.topology import TopologySpec
from testbed.spec.wire import TCP_GOODPUT_FRACTION


@dataclass(frozen=True)
class StageRing:
    """One stage's all-reduce: its gradients' bits, its replicas per DC (DC -> how many), and the
    ring's DCs in order (sorted by name)."""

    stage: int
    bits: float
    per_dc: dict[str, int]

    @property
    def dcs(self) -> list[str]:
        return sorted(self.per_dc)

    @property
    def rings(self) -> int:
        """Parallel rings across the DCs: the most replicas of the stage in one DC."""
        return max(self.per_dc.values())

    def wan_sends(self) -> list[tuple[str, str, float]]:
        """(from DC, to DC, bits) of the ring across the DCs: each DC sends 2 (n - 1) / n of the
        gradients to the next; none with the stage in one DC."""
        dcs, n = self.dcs, len(self.per_dc)
        if n < 2:
            return []
        return [(dcs[i], dcs[(i + 1) % n], 2 * (n - 1) / n * self.bits) for i in range(n)]


def stage_rings(exp: Experiment, workers: list[WorkerSpec]) -> list[StageRing]:
    """Every stage's all-reduce ring (none with one replica)."""
    if exp.replicas == 1:
        return []
    out = []
    for s in range(exp.stages):
        per_dc: dict[str, int] = {}
        for w in workers:
            if w.stage == s:
                per_dc[w.dc] = per_dc.get(w.dc, 0) + 1
        out.append(StageRing(s, stage_param_bytes(exp.model, exp.stages, s) * 8, per_dc))
    return out


def wan_allreduce_bits(exp: Experiment, topo: TopologySpec, workers: list[WorkerSpec]) -> dict[tuple[str, str], float]:
    """Payload bits per iteration the all-reduce puts on each WAN link direction (from DC, to DC):
    every stage ring's sends along their routed paths."""
    routes = RoutingTable(topo)
    out: dict[tuple[str, str], float] = {}
    for ring in stage_rings(exp, workers):
        for a, b, bits in ring.wan_sends():
            dcs = routes.route(a, b).dcs
            for x, y in zip(dcs, dcs[1:]):
                out[(x, y)] = out.get((x, y), 0.0) + bits
    return out


def allreduce_s(exp: Experiment, topo: TopologySpec, workers: list[WorkerSpec]) -> float:
    """The all-reduce's time (s; the workers start it once their last backward is done and do not
    overlap it), every stage's at once: inside the DCs, 2 (k - 1) / k x a stage's bits over the
    access link's payload rate (0 where access links are unshaped, as the emulator's are) plus
    2 (k - 1) round trips inside the DC, for the reduce-scatter and all-gather together; across the
    DCs, on the busiest link direction, its bits (``wan_allreduce_bits``) over what the rings'
    connections carry on the path (``connection_rate_bps``, one connection per ring and stage) plus
    2 (n - 1) one-way delays of the longest ring step."""
    rings = stage_rings(exp, workers)
    if not rings:
        return 0.0
    inside = 0.0
    for ring in rings:
        for name, k in ring.per_dc.items():
            dc = topo.dc(name)
            if k > 1 and dc.intra_rate_bps:
                rtt_s = 4 * dc.intra_delay_us / 1e6
                t = 2 * (k - 1) / k * ring.bits / (dc.intra_rate_bps * TCP_GOODPUT_FRACTION) + 2 * (k - 1) * rtt_s
                inside = max(inside, t)
    routes = RoutingTable(topo)
    window = connection_window_bytes(exp, topo, workers)
    load = wan_allreduce_bits(exp, topo, workers)
    across = 0.0
    for ring in rings:
        n = len(ring.per_dc)
        for a, b, _ in ring.wan_sends():
            path = routes.route(a, b).dcs
            rtt_s = routes.rtt_us(a, b) / 1e6
            connections = sum(r.rings for r in rings if len(r.per_dc) > 1)
            rate = connection_rate_bps(routes.wan_rate_bps(a, b), rtt_s, window, connections) * TCP_GOODPUT_FRACTION
            bits = max(load[(x, y)] for x, y in zip(path, path[1:]))
            across = max(across, bits / rate + 2 * (n - 1) * routes.one_way_delay_us(a, b) / 1e6)
    return inside + across
