"""How hard a placement loads its WAN links, before anything runs (``testbed plan`` prints it):
per stage boundary that crosses the WAN, how many data-parallel pipelines share its link, how long
one transfer takes alone and when they all go at once under TCP fair sharing, against the sending
stage's forward time; how busy the link is over an iteration; and what share of the link one TCP
connection fills on that path under the experiment's socket-buffer cap (DESIGN.md 2a).

The regime where sending one transfer at a time helps (the Atlas issue, item 6): D x S / B above a
stage's forward time (the pipelines would wait on each other), while the link still idles a good
part of the iteration (not saturated: then only total bytes / rate counts).
"""

from __future__ import annotations

from dataclasses import dataclass

from testbed.plan.connections import one_connection_bps, path_connection_share, transfer_time_s
from testbed.plan.virtual_stages import experiment_homes
from testbed.plan.workers import WorkerSpec
from testbed.spec.experiment import Experiment
from testbed.spec.model import stage_layers
from testbed.spec.routing import RoutingTable
from testbed.spec.topology import TopologySpec
from testbed.spec.wire import TCP_GOODPUT_FRACTION


@dataclass(frozen=True)
class BoundaryLoad:
    """Virtual stage ``stage`` -> ``stage + 1`` (the workers' stages where each holds one) between DCs
    ``src`` and ``dst`` (seconds; shares 0..1)."""

    stage: int
    src: str
    dst: str
    pipelines: int
    transfer_s: float  # one microbatch's activations alone on the path's bottleneck
    fair_transfer_s: float  # all pipelines' at once, each at a fair share (D x S / B without a cap)
    forward_s: float  # the sending stage's forward of one microbatch
    busy_s: float  # the link's own time per iteration and direction: all pipelines' bytes / its rate
    connection_share: float | None  # of the path's rate, one TCP connection under the buffer cap

    def idle_share(self, iteration_s: float) -> float:
        """The share of an iteration of ``iteration_s`` the link has nothing of this boundary to send."""
        return max(0.0, 1 - self.busy_s / iteration_s) if iteration_s > 0 else 0.0


def boundary_loads(
    exp: Experiment, topo: TopologySpec, workers: list[WorkerSpec], connections: int = 1
) -> list[BoundaryLoad]:
    """Every WAN stage boundary of a pipeline placement (``workers``), in stage order, with each
    transfer striped over ``connections`` TCP connections (each held to its path's share)."""
    routes = RoutingTable(topo)
    dc_of = {(w.stage, w.replica): w.dc for w in workers}
    per_f, _ = exp.block_s
    homes = experiment_homes(exp)
    out = []
    for s in range(len(homes) - 1):
        a, b = dc_of[(homes[s], 0)], dc_of[(homes[s + 1], 0)]
        if a == b:
            continue
        rate = routes.wan_rate_bps(a, b)
        share = path_connection_share(exp, topo, workers, a, b)
        bits = exp.activation_bytes * 8 / TCP_GOODPUT_FRACTION
        one = one_connection_bps(exp, topo, workers, a, b, exp.activation_bytes / connections)
        alone = transfer_time_s(exp.activation_bytes, rate * TCP_GOODPUT_FRACTION, one, connections)
        # all at once: the link's rate shared R ways, or each still alone where its windows limit it
        together = max(alone, exp.replicas * bits / rate)
        out.append(
            BoundaryLoad(
                s,
                a,
                b,
                exp.replicas,
                alone,
                together,
                len(stage_layers(exp.model.n_layers, len(homes), s)) * per_f,
                exp.replicas * exp.microbatches * bits / rate,
                share,
            )
        )
    return out


def format_loads(loads: list[BoundaryLoad], iteration_s: float) -> str:
    """The loads as text, one line per boundary, against an iteration of ``iteration_s``."""
    if not loads:
        return "  no stage boundary crosses the WAN"
    lines = []
    for x in loads:
        share = (
            "one TCP connection can fill the path (no share modelled)"
            if x.connection_share is None
            else f"one TCP connection fills {x.connection_share:.0%} of the path"
        )
        lines.append(
            f"  stage {x.stage}->{x.stage + 1} ({x.src}->{x.dst}): {x.pipelines} pipelines; a transfer alone "
            f"{x.transfer_s * 1e3:.1f} ms, all at once (D x S / B) {x.fair_transfer_s * 1e3:.1f} ms vs a "
            f"{x.forward_s * 1e3:.0f} ms forward; link idle {x.idle_share(iteration_s):.0%} of the iteration; "
            f"{share}"
        )
    return "\n".join(lines)
