"""The gradient all-reduce after the pipeline, as the workers run it: each stage's replicas form
one ring in replica order (gloo's ring all-reduce over the stage's process group: 2 (R - 1) steps,
a reduce-scatter then an all-gather, each member sending 1 / R of the gradients to the next member
per step; Patarasuk and Yuan 2009, "Bandwidth optimal all-reduce algorithms for clusters of
workstations"), every stage's ring at once. A ring edge between two DCs crosses the routed WAN
path on one TCP connection; an edge inside a DC crosses the access links. With the pipeline
policies a stage's replicas share a DC and no byte crosses the WAN; under dp-wan the placement
keeps consecutive replicas together (``placement.place_dp_wan``), so the ring crosses each DC
boundary once.

Pure functions of an experiment, its topology and its placement.
"""

from __future__ import annotations

from dataclasses import dataclass

from testbed.plan.connections import connection_rate_bps, connection_window_bytes, one_connection_bps
from testbed.plan.virtual_stages import experiment_homes
from testbed.plan.workers import WorkerSpec
from testbed.spec.experiment import Experiment
from testbed.spec.model import stage_param_bytes
from testbed.spec.routing import RoutingTable
from testbed.spec.topology import TopologySpec
from testbed.spec.wire import TCP_GOODPUT_FRACTION

#: inside an emulated DC (unshaped access links) an all-reduce is paced by this machine: per
#: process of the rings that run side by side (the critical ring and the one before it: at an
#: iteration's end the stages' rings overlap), one round of a window (s; a connection there keeps
#: the window the hosts' socket-buffer cap gives it, as across the WAN, ``connection_window_bytes``,
#: round trip after round trip on the veths and bridge), and the cost per byte each member sends
#: where the window does not limit it (s/byte: the copies and the sum). Measured on this project's
#: two-core VM by ``scripts/bench_allreduce.py`` (2 MB, two rings of 4 side by side, 8 processes:
#: 166 us a window round under a 12,000-byte cap, 5.33 ms per MB uncapped); a machine with more
#: cores runs it faster, which the model does not know
INTRA_DC_ROUND_S = 166e-6 / 8
INTRA_DC_S_PER_BYTE = 5.33e-9 / 8
#: how many rings the model takes side by side, as the benchmark runs them
INTRA_DC_RINGS = 2


@dataclass(frozen=True)
class StageRing:
    """One stage's all-reduce: its gradients' bits and the DC of each replica, in ring order."""

    stage: int
    bits: float
    members: tuple[str, ...]

    def edges(self) -> list[tuple[str, str]]:
        """(from DC, to DC) of each member's sends to the next member."""
        n = len(self.members)
        return [(self.members[i], self.members[(i + 1) % n]) for i in range(n)]

    def sent_bits(self) -> float:
        """What each member sends to the next over the all-reduce: 2 (R - 1) / R of the gradients."""
        n = len(self.members)
        return 2 * (n - 1) / n * self.bits


def stage_rings(exp: Experiment, workers: list[WorkerSpec]) -> list[StageRing]:
    """Every stage's all-reduce ring (none with one replica)."""
    if exp.replicas == 1:
        return []
    dc = {(w.stage, w.replica): w.dc for w in workers}
    return [
        StageRing(s, stage_param_bytes(exp.model, exp.stages, s) * 8, tuple(dc[(s, r)] for r in range(exp.replicas)))
        for s in range(exp.stages)
    ]


def wan_allreduce_bits(exp: Experiment, topo: TopologySpec, workers: list[WorkerSpec]) -> dict[tuple[str, str], float]:
    """Payload bits per iteration the all-reduce puts on each WAN link direction (from DC, to DC):
    every ring edge between two DCs along its routed path."""
    routes = RoutingTable(topo)
    out: dict[tuple[str, str], float] = {}
    for ring in stage_rings(exp, workers):
        for a, b in ring.edges():
            if a == b:
                continue
            dcs = routes.route(a, b).dcs
            for x, y in zip(dcs, dcs[1:]):
                out[(x, y)] = out.get((x, y), 0.0) + ring.sent_bits()
    return out


def intra_dc_machine_s(sent_bytes: float, window_bytes: float | None, processes: int) -> float:
    """Seconds for each member of a ring to send ``sent_bytes`` to the next inside an emulated DC
    whose access links are unshaped, on this machine, with ``processes`` all-reducing side by side:
    a window (``window_bytes``; None: not capped) a round, or the bytes' own cost, whichever is
    slower (``INTRA_DC_ROUND_S``, ``INTRA_DC_S_PER_BYTE``)."""
    per_byte = (
        INTRA_DC_S_PER_BYTE if window_bytes is None else max(INTRA_DC_S_PER_BYTE, INTRA_DC_ROUND_S / window_bytes)
    )
    return sent_bytes * per_byte * processes


def allreduce_s(exp: Experiment, topo: TopologySpec, workers: list[WorkerSpec]) -> float:
    """The all-reduce's time (s; the workers start it once their last backward is done and do not
    overlap it): the slowest stage's ring (``stage_allreduce_s``); 0 with one replica."""
    return max(stage_allreduce_s(exp, topo, workers).values(), default=0.0)


def stage_allreduce_s(exp: Experiment, topo: TopologySpec, workers: list[WorkerSpec]) -> dict[int, float]:
    """Each stage's all-reduce time (s), every stage's ring at once: 2 (R - 1) steps of its slowest
    edge's one-way delay plus the time its edges need to move 2 (R - 1) / R of the gradients: on a
    WAN edge, at most what its one connection carries on the path for one step's chunk
    (``one_connection_bps``), and no faster than every link it crosses carries all the rings' bits
    on it (``wan_allreduce_bits``); on an edge inside a DC, at the access link's payload rate, two
    access-link delays a step, or, where the access links are unshaped (the emulator's), at this
    machine's pace (``intra_dc_machine_s``). Empty with one replica."""
    rings = stage_rings(exp, workers)
    if not rings:
        return {}
    window = connection_window_bytes(exp, topo, workers)
    routes = RoutingTable(topo)
    load = wan_allreduce_bits(exp, topo, workers)
    out = {}
    for ring in rings:
        steps = 2 * (len(ring.members) - 1)
        delay_s, move_s = 0.0, 0.0
        for a, b in ring.edges():
            if a == b:
                dc = topo.dc(a)
                if dc.intra_rate_bps:
                    delay_s = max(delay_s, 2 * dc.intra_delay_us / 1e6)
                    move_s = max(move_s, ring.sent_bits() / (dc.intra_rate_bps * TCP_GOODPUT_FRACTION))
                else:
                    processes = min(len(rings), INTRA_DC_RINGS) * len(ring.members)
                    move_s = max(move_s, intra_dc_machine_s(ring.sent_bits() / 8, window, processes))
                continue
            dcs = routes.route(a, b).dcs
            # each step sends one chunk (1 / R of the gradients) to the next member
            chunk_bytes = ring.bits / 8 / len(ring.members)
            one_bps = one_connection_bps(exp, topo, workers, a, b, chunk_bytes)
            rate = routes.wan_rate_bps(a, b)
            if exp.wan_profile is not None and exp.wan_profile.path(a, b) is not None:
                one = min(rate * TCP_GOODPUT_FRACTION, one_bps or rate)  # measured: a payload rate
            else:
                # the modelled window's rate taken on the wire, as the paper-scale figures have it
                # (grant_plan takes it as payload: the two differ by TCP's goodput share)
                one = connection_rate_bps(rate, one_bps, 1) * TCP_GOODPUT_FRACTION
            links = [topo.link_between(x, y) for x, y in zip(dcs, dcs[1:])]
            shared = max(
                load[(x, y)] / (k.rate_bps * TCP_GOODPUT_FRACTION) for (x, y), k in zip(zip(dcs, dcs[1:]), links) if k
            )
            delay_s = max(delay_s, routes.one_way_delay_us(a, b) / 1e6)
            move_s = max(move_s, ring.sent_bits() / one, shared)
        out[ring.stage] = steps * delay_s + move_s
    return out


def loss_allreduce_s(exp: Experiment, topo: TopologySpec, workers: list[WorkerSpec]) -> tuple[float, ...]:
    """Per replica, the seconds from the optimizer step's end (every replica's at once, as the
    model's pipelines leave the gradient all-reduce together) to when the worker that computes the
    loss (the last virtual stage's) has the replicas' mean loss and starts its next iteration: the
    workers average the loss over their stage's replicas after each step (``train/worker.py``, as
    Megatron does for its log), a blocking all-reduce of one number, whose ring crosses the WAN
    under dp-wan. Its time is latency alone, as gloo's ring runs it (gloo ``allreduce.cc``,
    ``ring``): a member sends to the one before it once that one's ready notice has come; the one
    segment that holds the number is reduced from the last member down to the first, then sent
    from the first to the last and down to the second. Each hop takes the one-way delay between
    the members' DCs, or two access-link delays inside one (none where unshaped, the emulator's).
    In a run the members join one by one as the gradient ring lets them (not modelled); the same
    chain started at the members' measured joins gives what five dp-wan runs measured within 1-5
    ms (after the last to join: random-7-004 98-295 ms against 101-300, random-7-031 124-216
    against 125-218, random-7-044 84-126 against 86-128, random-7-066 4-9 against 5-12, sharing
    40-80 against 41-82). Joining together, the early joiners' notices come later, and the chain
    is longer than a run's: random-7-031 184-276 ms.
    Returns () with one replica."""
    R = exp.replicas
    if R == 1:
        return ()
    routes = RoutingTable(topo)
    loss_stage = _loss_stage(exp)
    dc = {w.replica: w.dc for w in workers if w.stage == loss_stage}

    def hop_s(a: int, b: int) -> float:
        if dc[a] == dc[b]:
            return 2 * topo.dc(dc[a]).intra_delay_us / 1e6
        return routes.one_way_delay_us(dc[a], dc[b]) / 1e6

    # reduce-scatter: from the last member down to the first, each send once its receiver's ready
    # notice (posted as the all-reduce began) has come; a member's part is done once it has sent
    done = [0.0] * R
    t = 0.0
    for r in range(R - 1, 0, -1):
        t = max(t, hop_s(r - 1, r))
        done[r] = t
        t += hop_s(r, r - 1)
    done[0] = t
    # all-gather: the first sends to the last, then down to the second, each send once its
    # receiver's notice (posted as that member left the reduce-scatter) has come; a member ends
    # once it has sent on, the second once it has received
    end = [0.0] * R
    sender = 0
    for receiver in (R - 1, *range(R - 2, 0, -1)):
        t = max(t, done[receiver] + hop_s(receiver, sender))
        end[sender] = t
        t += hop_s(sender, receiver)
        sender = receiver
    end[sender] = t
    return tuple(end)


def _loss_stage(exp: Experiment) -> int:
    """The worker (pipeline position) that computes the loss: the last virtual stage's."""
    return experiment_homes(exp)[-1]
