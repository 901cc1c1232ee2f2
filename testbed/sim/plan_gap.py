"""Where a run under Atlas's planned grants loses time against its grant plan (``testbed sim
--validate`` on the run's folder): the measured iteration minus the planned one, split by cause.

The planned iteration is the plan's own simulation (``grant_sim.simulate`` at the plan's offsets,
the modelled window, as ``testbed plan`` and the controller have it) plus the predicted all-reduce
and optimizer step. Each cause of ``CAUSES`` is a measured quantity put into that simulation in
place of the planned one, one after another, and is charged the change in the simulated
iteration; what the run measured beyond the last simulation is the remainder: what no listed cause
explains (the controller's CPU, gloo's ready notices, anything else). The parts sum to measured
minus planned by construction. Where causes interact, a later one is weighed with the earlier ones
in place, so the order (``CAUSES``'s) matters; it runs from what the workers do to what the network
does. Means over the run's measured iterations (the summary's iteration time is their mean).

Measured from the run's files: each virtual stage's forward and backward (``events``; a split
backward's parts added up), the pipelines' start offsets (``validate.pipeline_start_offsets_s``),
each link's grants (``controller.jsonl``: ready to applied, where a transfer that waited for the
link was ready at the previous grant's release, so this is also the handover gap; applied to the
release of a grant whose bytes had passed; that release to the receiver having them, per link
and pipeline), and each iteration's all-reduce and optimizer step (from its last backward to its
last optimizer step). The plan's order costs nothing where every transfer reached its link in the
order planned. Grants that ended at their deadline with nothing sent (the link held for a
transfer not yet there) are counted beside the parts.
Pure (reads the run's files).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd

from testbed.plan.allreduce import allreduce_s, loss_allreduce_s
from testbed.plan.boundary_transfers import Hop, LinkTiming
from testbed.plan.connections import wan_connections
from testbed.plan.cost_model import optimizer_s
from testbed.plan.grant_plan import granted_class_bps, held_floor_share, plan_grants, wan_links
from testbed.plan.grant_sim import simulate
from testbed.plan.virtual_stages import experiment_homes
from testbed.sim.validate import load_run, pipeline_start_offsets_s
from testbed.trace import schema as T
from testbed.trace.events import read_events
from testbed.trace.jsonl import read_jsonl

#: the causes, in the order they are put into the simulation: (name, what is measured)
CAUSES = (
    ("compute", "each virtual stage's forward and backward as measured (padding overruns, CPU contention)"),
    ("pipeline starts", "the pipelines' start offsets as measured, for the plan's"),
    ("grant latency", "each link's mean time from a transfer ready to its grant applied, added to every grant"),
    (
        "transfer time",
        "each link's and pipeline's mean time from a grant ready to its bytes passed, for the planned time "
        "(the granted class's rate, the held floors, borrowing, TCP, when the controller saw the bytes pass)",
    ),
    (
        "delivery",
        "each link's and pipeline's mean time from a grant's bytes passed to its receiver having them, beyond "
        "the one-way delay (the delay element, TCP's last segments, the receiver's wake-up)",
    ),
    (
        "the plan's order",
        "each link serving its transfers strictly in the plan's order, as the controller grants them (a "
        "transfer late for its turn holds the ones after it)",
    ),
    ("all-reduce and optimizer", "each iteration's gradient all-reduce and optimizer step as measured"),
)
#: why a planned grant ends once its bytes have passed the link (``atlas/grants.py``: the class's
#: byte counter); the others are the receiver's message that the transfer is in (``done``: the
#: bytes had passed and arrived before, so the hold counts their flight) and the deadline
PASSED = ("bytes",)
#: the controller's log of grants (``atlas/switch.py``)
CONTROLLER_FILE = "controller.jsonl"


@dataclass(frozen=True)
class PlanGap:
    """A grant run against its plan (s, per iteration): ``parts`` (cause, seconds) in ``CAUSES``'s
    order, summing with ``remainder_s`` to ``measured_s - planned_s``; ``expired`` the grants per
    iteration released at their deadline with nothing sent (the link held for a transfer that was
    not there), and ``expired_s`` the link time they held."""

    planned_s: float
    measured_s: float
    parts: tuple[tuple[str, float], ...]
    remainder_s: float
    expired: float
    expired_s: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "planned_s": self.planned_s,
            "measured_s": self.measured_s,
            "parts": dict(self.parts),
            "remainder_s": self.remainder_s,
            "expired_grants_per_iteration": self.expired,
            "expired_grant_s_per_iteration": self.expired_s,
        }


def grant_times(log: list[dict], window_ns: tuple[int, int]) -> pd.DataFrame:
    """Each grant of ``controller.jsonl``'s rows whose transfer became ready inside ``window_ns``:
    link, replica, ready, applied and released (ns), why it was released (``done``, ``deadline``,
    ...) and the bytes its class sent."""
    rows, open_ = [], {}
    for r in log:
        link = r.get("link")
        if r.get("event") == "grant":
            open_[link] = r
        elif r.get("event") == "release" and link in open_:
            g = open_.pop(link)
            rows.append(
                {
                    "link": link,
                    "replica": g.get("replica"),
                    "ready_ns": g["t_ready_ns"],
                    "applied_ns": g["t_applied_ns"],
                    "released_ns": r["t_ns"],
                    "reason": r.get("reason"),
                    "sent_bytes": r.get("sent_bytes"),
                }
            )
    columns = ["link", "replica", "ready_ns", "applied_ns", "released_ns", "reason", "sent_bytes"]
    out = pd.DataFrame(rows, columns=columns)
    return out[(out["ready_ns"] >= window_ns[0]) & (out["ready_ns"] < window_ns[1])].reset_index(drop=True)


def delivery_s(
    ev: pd.DataFrame, grants: pd.DataFrame, paths: dict[tuple[int, int], list[Hop]], one_way_s: dict
) -> dict[tuple[str, int], float]:
    """Per (link direction's name, replica), the mean time from a transfer's grant released with
    its bytes passed (``PASSED``) on the last link of its path to its receiver having the bytes
    (the receive's ``ready_ns``), less the path's one-way delay (s): negative where the controller
    let the link go after the bytes had passed (it looks at the class's byte counter every 0.5 ms
    or more). A transfer's grant is the latest of its replica's class applied at or before its
    arrival: the receiver's ready notice keeps one transfer of a replica in each direction at a
    time. A transfer whose grant ended otherwise (at the receiver's message that it was in, or at
    its deadline) has no such release and is left out: matched to the release of an earlier
    transfer of its class instead, as until 2026-12-07, it counted that transfer's interval,
    136-586 ms, and one in 24 moved default's atlas mean by +20 ms."""
    recv = ev[(ev[T.KIND] == T.RECV_WAIT) & ev[T.READY_NS].notna() & ev[T.PEER].notna()]
    extra: dict[tuple[str, int], list[float]] = {}
    for r in recv.itertuples(index=False):
        key = (int(getattr(r, T.PEER)), int(getattr(r, T.WORKER)))
        if key not in paths:
            continue
        link, replica, arrived = str(paths[key][-1]), int(getattr(r, T.REPLICA)), getattr(r, T.READY_NS)
        mine = grants[(grants["link"] == link) & (grants["replica"] == replica) & (grants["applied_ns"] <= arrived)]
        if mine.empty:
            continue
        own = mine.loc[mine["applied_ns"].idxmax()]
        if own["reason"] in PASSED and own["released_ns"] <= arrived:
            extra.setdefault((link, replica), []).append((arrived - own["released_ns"]) / 1e9 - one_way_s[key])
    return {k: statistics.fmean(x) for k, x in extra.items()}


def measured_stage_s(ev: pd.DataFrame, warmup: int) -> dict[int, tuple[float, float]]:
    """Per virtual stage, the mean (forward, backward) seconds of one microbatch over the measured
    iterations (a split backward's parts added up per microbatch)."""
    ev = ev[(ev[T.ITERATION] >= warmup) & ev[T.KIND].isin((T.FORWARD, T.BACKWARD))].copy()
    ev["took_s"] = (ev[T.END_NS] - ev[T.START_NS]) / 1e9
    ev["v"] = ev[T.VIRTUAL_STAGE].fillna(ev[T.STAGE]).astype(int)
    per = ev.groupby([T.KIND, "v", T.ITERATION, T.REPLICA, T.MICROBATCH])["took_s"].sum()
    mean = per.groupby([T.KIND, "v"]).mean()
    return {
        int(v): (float(mean[(T.FORWARD, v)]), float(mean[(T.BACKWARD, v)]))
        for v in sorted({v for _, v in mean.index})
        if (T.FORWARD, v) in mean.index and (T.BACKWARD, v) in mean.index
    }


def measured_reduce_s(ev: pd.DataFrame, warmup: int) -> float | None:
    """The mean over measured iterations of the time from the pipeline's end (its last backward)
    to the iteration's (its last optimizer step): the all-reduce and optimizer step after the
    pipeline, as the prediction adds them (a replica's all-reduce that waits for the others is
    the pipeline's, not this); None where the run traced no optimizer step (s)."""
    ev = ev[ev[T.ITERATION] >= warmup]
    ends = ev[ev[T.KIND].isin((T.BACKWARD, T.OPTIMIZER))].groupby([T.ITERATION, T.KIND])[T.END_NS].max().unstack()
    if T.OPTIMIZER not in ends or T.BACKWARD not in ends:
        return None
    tail = (ends[T.OPTIMIZER] - ends[T.BACKWARD]).dropna() / 1e9
    return float(tail.mean()) if not tail.empty else None


def plan_gap(run_dir: Path) -> PlanGap | None:
    """``run_dir``'s measured iteration against its grant plan, by cause (see the module doc);
    None where the run was not under planned grants (FIFO grants follow no plan, and hold a link
    until the receiver's message, past the bytes' flight), or lacks its controller log, events or
    measured iterations. Raises SpecError as ``validate.load_run``."""
    run = load_run(run_dir, measured_links=False)  # the plan the controller had: the modelled window
    exp, workers, measured = run.exp, run.workers, run.summary.get("iteration_time_s")
    if exp.policy.sharing != "planned" or measured is None or not (run_dir / CONTROLLER_FILE).exists():
        return None
    ev = read_events(run_dir)
    measured_ev = ev[ev[T.ITERATION] >= exp.warmup_iterations]
    n = measured_ev.loc[measured_ev[T.KIND] == T.OPTIMIZER, T.ITERATION].nunique()
    stage_s = measured_stage_s(ev, exp.warmup_iterations)
    reduce_s = measured_reduce_s(ev, exp.warmup_iterations)
    topo = exp.topology_spec
    connections = wan_connections(exp, topo, workers)
    plan = plan_grants(exp, topo, workers, connections)
    if not n or reduce_s is None or len(stage_s) != len(experiment_homes(exp)) or not plan.hops:
        return None
    window = (int(measured_ev[T.START_NS].min()), int(measured_ev[T.END_NS].max()))
    grants = grant_times(read_jsonl(run_dir / CONTROLLER_FILE), window)
    floor = held_floor_share(exp)
    wan = wan_links(exp, topo, workers, connections, lambda bps: granted_class_bps(bps, exp.replicas, floor))
    sharing = exp.policy.sharing
    planned_stagger = plan.stagger_s

    loss_wait = loss_allreduce_s(exp, topo, workers)

    def simulated(
        latency: dict[Hop, float | None] | None,
        stagger: tuple[float, ...],
        measured_compute: bool,
        ordered: bool = False,
        per_replica: dict[tuple[Hop, int], LinkTiming] | None = None,
    ) -> float:
        """The planned iteration with the measured causes given: ``latency``, each link's grant
        latency added to its transfers' time (each pair's own on its path's hops)."""
        links, own = wan.links, wan.path_links
        if latency is not None:
            links = {h: replace(x, transfer_s=x.transfer_s + (latency[h] or 0.0)) for h, x in links.items()}
            own = {
                k: tuple(replace(x, transfer_s=x.transfer_s + (latency[h] or 0.0)) for h, x in zip(wan.paths[k], v))
                for k, v in own.items()
            }
        compute = tuple(stage_s[v] for v in sorted(stage_s)) if measured_compute else None
        order = {h.hop: h.order for h in plan.hops} if ordered else None
        return simulate(
            exp,
            workers,
            links,
            wan.paths,
            wan.one_way_s,
            stagger,
            sharing=sharing,
            stage_s=compute,
            hop_order=order,
            replica_links=per_replica,
            path_links=own,
            loss_wait_s=loss_wait,
            stripes=wan.stripes,
        )[0]

    done = grants[grants["reason"].isin(PASSED)]
    latency = {h: _mean_s(grants[grants["link"] == str(h)], "applied_ns", "ready_ns") for h in wan.links}
    # per (link, replica): pipelines differ (a held class borrows from the granted one's ramp)
    held, delivered = {}, delivery_s(measured_ev, grants, wan.paths, wan.one_way_s)
    for h, x in wan.links.items():
        for r in range(exp.replicas):
            mine = grants[(grants["link"] == str(h)) & (grants["replica"] == r)]
            wire = _mean_s(done[(done["link"] == str(h)) & (done["replica"] == r)], "released_ns", "applied_ns")
            if wire is not None:
                held[(h, r)] = replace(x, transfer_s=(_mean_s(mine, "applied_ns", "ready_ns") or 0.0) + wire)
    with_delivery = {k: replace(x, delivery_s=delivered.get((str(k[0]), k[1]), 0.0)) for k, x in held.items()}
    offsets = pipeline_start_offsets_s(ev, exp.warmup_iterations) or planned_stagger
    steps = [
        simulated(None, planned_stagger, False),
        simulated(None, planned_stagger, True),
        simulated(None, offsets, True),
        simulated(latency, offsets, True),
        simulated(latency, offsets, True, per_replica=held),
        simulated(latency, offsets, True, per_replica=with_delivery),
        simulated(latency, offsets, True, True, with_delivery),
    ]
    predicted_reduce_s = allreduce_s(exp, topo, workers) + optimizer_s(exp)
    planned = steps[0] + predicted_reduce_s
    parts = [(name, b - a) for (name, _), a, b in zip(CAUSES, steps, steps[1:])]
    parts.append((CAUSES[-1][0], reduce_s - predicted_reduce_s))
    expired = grants[(grants["reason"] == "deadline") & (grants["sent_bytes"].fillna(0) == 0)]
    return PlanGap(
        planned,
        float(measured),
        tuple(parts),
        float(measured) - (steps[-1] + reduce_s),
        len(expired) / n,
        float((expired["released_ns"] - expired["applied_ns"]).sum()) / 1e9 / n,
    )


def _mean_s(rows: pd.DataFrame, end: str, start: str) -> float | None:
    return statistics.fmean((rows[end] - rows[start]) / 1e9) if not rows.empty else None


def format_plan_gap(gap: PlanGap) -> str:
    """The decomposition as lines: planned, each cause, the remainder, measured (ms and the share
    of the gap), and the expired grants."""
    gapped = gap.measured_s - gap.planned_s
    share = lambda s: f" ({s / gapped:+.0%} of the gap)" if abs(gapped) > 1e-9 else ""
    lines = [
        f"against its grant plan: planned {gap.planned_s * 1e3:.1f} ms, measured {gap.measured_s * 1e3:.1f} ms "
        f"({gapped * 1e3:+.1f} ms an iteration), by cause (each put into the plan's simulation in turn):"
    ]
    lines += [f"  {name:<26} {s * 1e3:+8.1f} ms{share(s)}" for name, s in gap.parts]
    lines.append(f"  {'not explained':<26} {gap.remainder_s * 1e3:+8.1f} ms{share(gap.remainder_s)}")
    lines.append(
        f"  grants released at their deadline with nothing sent: {gap.expired:.1f} an iteration, "
        f"holding links {gap.expired_s * 1e3:.1f} ms"
    )
    return "\n".join(lines)
