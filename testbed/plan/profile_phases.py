"""The phases of a topology's link profiles (``spec/link_profile.py``): stretches of time in which
no link changes, each with the topology as it is then, for planning and predicting per phase
(``testbed plan``, Atlas's plan made again during a run: ``run/link_replan.py``). Pure."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace

from testbed.plan.connections import connection_window_bytes
from testbed.plan.workers import WorkerSpec
from testbed.spec.experiment import Experiment
from testbed.spec.link_profile import LinkState
from testbed.spec.topology import TopologySpec


def topology_at(
    spec: TopologySpec, states: dict[str, LinkState], routed_off: Collection[str] | None = None
) -> TopologySpec:
    """``spec`` with each link named in ``states`` (``a:b``) at those figures, without profiles,
    routed as built (``LinkSpec.route_us``: the routes do not follow a delay change); the links
    whose routes have moved to the other path are left out: those named in ``routed_off`` (as
    ``net/failover.py`` logged its last move), or where it is None, every link that is down and
    fails over (as ``net/failover.py`` moves them). A link that is down without failover stays,
    at rate 0."""
    links = []
    for link in spec.links:
        name = f"{link.a}:{link.b}"
        s = states.get(name, link.state)
        moved = (name in routed_off) if routed_off is not None else (not s.up and link.failover)
        if moved:
            continue
        links.append(
            replace(
                link,
                rate_bps=s.rate_bps,
                delay_us=s.delay_us,
                jitter_us=s.jitter_us,
                loss_pct=s.loss_pct,
                profile=None,
                route_us=link.route_metric_us,
            )
        )
    return replace(spec, links=tuple(links))


def experiment_at(
    exp: Experiment,
    states: dict[str, LinkState],
    workers: list[WorkerSpec],
    routed_off: Collection[str] | None = None,
) -> Experiment:
    """``exp`` on its topology as ``states`` and ``routed_off`` leave it (``topology_at``), placed
    as ``workers`` and with the TCP window the run set at its start: the hosts' socket buffers are
    capped once, at the build, from the topology's own figures (``connections.connection_window_bytes``), and do
    not follow a link's changes, so the window is fixed (``wan_window_bytes``) where it came from
    a share of the link."""
    window = connection_window_bytes(exp, exp.topology_spec, workers)
    at = replace(exp, topology_spec=topology_at(exp.topology_spec, states, routed_off))
    return replace(at, wan_window_bytes=int(window), wan_connection_share=None) if window is not None else at


@dataclass(frozen=True)
class Phase:
    """From ``start_us`` to ``end_us`` after the network came up (None: for ever, the profiles
    hold), every link as in ``states`` (``a:b`` -> its figures; every link of the topology,
    profiled or not)."""

    start_us: int
    end_us: int | None
    states: dict[str, LinkState]

    @property
    def when(self) -> str:
        """``8-20 s``, or ``from 20 s on``."""
        if self.end_us is None:
            return f"from {self.start_us / 1e6:g} s on"
        return f"{self.start_us / 1e6:g}-{self.end_us / 1e6:g} s"

    @property
    def all_up(self) -> bool:
        return all(s.up for s in self.states.values())

    def stalled(self, spec: TopologySpec) -> bool:
        """Whether a link is down without failing over (traffic over it stops)."""
        fails_over = {f"{x.a}:{x.b}" for x in spec.links if x.failover}
        return any(not s.up and k not in fails_over for k, s in self.states.items())

    def describe(self) -> str:
        """``a:b 20 Mbit/s 10 ms, ...`` for the links whose figures a profile sets."""
        return ", ".join(
            f"{k} {'down' if not s.up else f'{s.rate_bps / 1e6:.3g} Mbit/s'} {s.delay_us / 1000:g} ms"
            for k, s in self.states.items()
        )


def cycle_us(spec: TopologySpec) -> int:
    """How long one pass through every profile takes (µs): the longest looping period, or the last
    step of a profile that holds; 0 without profiles."""
    ends = [
        p.period_us if p.period_us is not None else p.steps[-1].t_us
        for p in (link.profile for link in spec.links)
        if p is not None
    ]
    return max(ends, default=0)


def profile_phases(spec: TopologySpec, until_us: int | None = None) -> list[Phase]:
    """The phases from the network's start to ``until_us`` (default: one cycle, ``cycle_us``, the
    last phase for ever where no profile loops); a topology without profiles has none."""
    profiles = [link.profile for link in spec.links if link.profile is not None]
    if not profiles:
        return []
    loops = any(p.period_us is not None for p in profiles)
    until = (cycle_us(spec) if loops else cycle_us(spec) + 1) if until_us is None else until_us
    changes: dict[int, dict[str, LinkState]] = {}
    for link in spec.links:
        if link.profile is not None:
            for step in link.profile.changes(until):
                changes.setdefault(step.t_us, {})[f"{link.a}:{link.b}"] = step.state
    states = {f"{x.a}:{x.b}": x.state for x in spec.links}
    times = sorted(changes)
    phases = []
    for i, t in enumerate(times):
        states = {**states, **changes[t]}
        last_end = until if (loops or until_us is not None) else None
        phases.append(Phase(t, times[i + 1] if i + 1 < len(times) else last_end, dict(states)))
    return phases
