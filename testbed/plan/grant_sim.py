"""One iteration of every data-parallel pipeline, simulated from the schedule tables for Atlas's grant
plan (``grant_plan.py``): the list-schedule simulation (``simulate``) of the boundary transfers
(``boundary_transfers.py``).

``simulate`` plays one iteration of every pipeline as a list schedule in continuous time, as a
discrete-event simulation on SimPy: each worker runs its schedule table as callbacks of SimPy
events (its compute's end, its input's arrival; lighter than a SimPy process, which the
simulation's speed asks for: ``scripts/bench_sim.py``), and each step of a transfer an event,
ordered by time, then by when it was made. An action starts
when its worker is free and its input has arrived; gloo moves a tensor only once the receive is
posted and the receiver's ready notice has crossed back, one one-way delay. The notice travels on
the pair's TCP connection (gloo's tcp transport writes it to the same socket as the data), so while
the receiver's own bytes to that sender are leaving it (a gradient going back the way the next
activation will come) the notice leaves only after them: measured on the default experiment
under pp-fair, the last stage's next forward waited 94 ms after its backward where a notice alone
would have taken 74 ms. Each link direction is shared as the policy shares it: one transfer at a
time, earliest ready first, under grants (``fifo`` holds it for the whole rendezvous, the notice,
the bytes and their flight, where held classes may not borrow (``atlas_borrow`` false); with
borrowing, the default, the others use what the notice and the flight leave idle, so a transfer
holds it only while its bytes pass; on a path of several links a hop's last byte cannot leave
before the previous hop's last byte has arrived), or, without grants (``tcp``), among the
transfers on it as TCP's flows share it: max-min fairly where each connection sends a window at a
time, and in the order their bytes went into the link's queue where each transfer leaves as one
burst (``fair_share``, ``fifo_queue``).

Pure: no kernel, no processes; a simulation holds Python's garbage collector off while it runs
(``collector.py``: process-wide).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import simpy

from testbed.plan.actions import action_seconds, input_of, output_of
from testbed.plan.boundary_transfers import Hop, LinkTiming, Transfer
from testbed.plan.collector import collector_paused
from testbed.plan.fair_share import FairShare
from testbed.plan.handoff import action_handoff_s
from testbed.plan.schedule import RankAction, experiment_tables
from testbed.plan.symmetric_pipelines import CopiedOrder, symmetric_copies
from testbed.plan.virtual_stages import stage_homes
from testbed.plan.workers import WorkerSpec
from testbed.spec.experiment import Experiment

#: how ``simulate`` shares a link direction among the transfers that cross it
SHARING = ("planned", "fifo", "tcp")


class _Call(simpy.events.Event):
    """An event that calls ``act(*args)`` when SimPy processes it, ``delay`` s from now: a timeout
    with its callback, made in one step (the simulation makes about a million of them an iteration
    at the paper's scale: ``scripts/bench_sim.py``)."""

    _ok = True  # what SimPy reads of a processed event, the same for every one
    _value = None

    def __init__(self, env: simpy.Environment, delay: float, act: Callable[..., None], *args: Any):
        self.env = env
        self.callbacks = [_call]
        self.act, self.args = act, args
        env.schedule(self, simpy.events.NORMAL, delay)


def _call(event: Any) -> None:  # SimPy calls it with the _Call it belongs to
    event.act(*event.args)


@collector_paused()
def simulate(
    exp: Experiment,
    workers: list[WorkerSpec],
    links: dict[Hop, LinkTiming],
    paths: dict[tuple[int, int], list[Hop]],
    one_way_s: dict[tuple[int, int], float],
    stagger_s: tuple[float, ...],
    block_s: tuple[float, float] | None = None,
    sharing: str = "planned",
    stage_s: tuple[tuple[float, float], ...] | None = None,
    timeline: list[tuple[int, int, RankAction, float, float]] | None = None,
    hop_order: dict[Hop, tuple[Transfer, ...]] | None = None,
    replica_links: dict[tuple[Hop, int], LinkTiming] | None = None,
    path_links: dict[tuple[int, int], tuple[LinkTiming, ...]] | None = None,
    loss_wait_s: tuple[float, ...] | None = None,
    stripes: int = 1,
) -> tuple[float, Mapping[Hop, list[Transfer]]]:
    """One iteration of every pipeline (see the module doc): ``links``, each crossed hop's transfer
    time and delay; ``paths``, the hops of each (sender, receiver) pair; ``one_way_s``, each pair's
    one-way delay; ``stagger_s``, each replica's first-stage offset; ``block_s``, per-block
    (forward, backward) seconds (default the experiment's); ``stage_s``, each stage's own (forward,
    backward) seconds on one microbatch, per virtual stage (a profile; overrides ``block_s``); ``sharing``, how a link
    direction is shared (``SHARING``): ``planned``, one transfer at a time from when its bytes can
    go to when they have passed; ``fifo``, one at a time in the order they become ready, for the
    whole rendezvous (the notice, the bytes and their flight) unless ``exp.atlas_borrow`` (then
    while the bytes pass, as ``planned``); ``tcp``, no grants: each transfer is one flow over its
    whole path, the flows sharing the links max-min fairly (``fair_share.FairShare``: a link
    carries ``concurrency`` transfers at their speed alone; a flow goes at most at its speed alone
    on the slowest link of its path), recomputed whenever a transfer starts or ends; a transfer
    that leaves as one burst on a link (``LinkTiming.bursts``) goes into its queue at its speed
    alone and leaves in arrival order (``fifo_queue.PacedFifo``). ``timeline``, when given,
    receives every compute action as (worker's stage, replica, action, start s, end s) in the
    order they start. ``hop_order``, under ``planned`` or ``fifo`` sharing: each listed link
    direction serves the transfers of its list strictly in that order (a grant plan's, as Atlas's
    controller grants them: ``atlas/grants.py``), a transfer ready before its turn waiting for it;
    by default each link takes whichever transfer is ready first. ``replica_links``, under
    ``planned`` or ``fifo`` sharing: a (link direction, replica)'s own timing, for ``links``' (a
    run's measured figures: ``sim/plan_gap.py``). ``path_links``: each (sender, receiver) pair's
    own timing on each hop of its path (``grant_plan.WanLinks.path_links``), where a pair's
    transfer takes its own time on a link another pair's path also crosses; by default each hop's
    ``links`` timing, which also gives each link's capacity under ``tcp``. ``loss_wait_s``: per
    replica, how long after the others the worker that computes the loss (the last virtual
    stage's) begins, averaging the loss over the replicas first (``allreduce.loss_allreduce_s``;
    before ``stagger_s`` where that worker is the first). ``stripes``: the connections each transfer
    across DCs is striped over, whose sends lengthen the hand-off of the action that makes it
    (``handoff.action_handoff_s``). A worker runs its schedule
    table (``schedule.worker_tables``) over its virtual stages; a split backward's parts take
    ``schedule.backward_parts`` of the backward. Returns (the iteration time: the last worker's
    last compute or byte on a link, in s; the order in which transfers took each link direction).
    Raises ValueError when the schedule cannot complete, ``sharing`` is unknown, or ``hop_order``
    is given under ``tcp``."""
    if sharing not in SHARING:
        raise ValueError(f"unknown sharing {sharing!r}: use one of {', '.join(SHARING)}")
    if hop_order is not None and sharing == "tcp":
        raise ValueError("a link order needs grants (planned or fifo sharing), not tcp")
    # with borrowing, held classes fill what a FIFO rendezvous leaves idle (its notice, its flight)
    rendezvous_hold, fair = sharing == "fifo" and not exp.atlas_borrow, sharing == "tcp"
    # the paths' hops as the very objects that key ``links``: a dict finds its own key by identity,
    # where an equal hop would be compared field by field (a Hop is a dataclass)
    own = {h: h for h in links}
    paths = {k: [own.get(h, h) for h in v] for k, v in paths.items()}
    timing = {k: (path_links or {}).get(k) or tuple(links[h] for h in v) for k, v in paths.items()}
    S, R = exp.stages, exp.replicas
    home = stage_homes(exp.schedule, S, exp.chunks)
    V = len(home)  # virtual stages
    took_s = action_seconds(exp, V, block_s, stage_s)
    rank = {(w.stage, w.replica): w.rank for w in workers}
    # each virtual stage's worker rank per replica
    rank_at = [[rank[(home[v], r)] for r in range(R)] for v in range(V)]
    # each boundary's (sender, receiver) per replica: activations forward, gradients back
    forward_pair = [[(rank_at[v][r], rank_at[v + 1][r]) for r in range(R)] for v in range(V - 1)]
    backward_pair = [[(b, a) for a, b in row] for row in forward_pair]
    # what an action whose output crosses the WAN takes beyond its hand-off over one connection, and
    # those outputs as (kind, virtual stage, replica)
    striped_s = action_handoff_s(exp, stripes) - action_handoff_s(exp)
    striped = (
        {
            (kind, v, r)
            for kind, pairs in (("F", forward_pair), ("B", backward_pair))
            for v, row in enumerate(pairs)
            for r, p in enumerate(row)
            if paths.get(p)
        }
        if striped_s > 0
        else set()
    )
    actions = experiment_tables(exp)
    # per stage and place in its table: (the action, its seconds, its input and output transfers
    # as (kind, virtual stage, microbatch) or None: ``input_of``, ``output_of`` with the replica)
    steps = [
        [(a, took_s[a.kind][a.stage], _spec(input_of(a, 0, V)), _spec(output_of(a, 0, V))) for a in table]
        for table in actions
    ]
    env = simpy.Environment()
    loss_stage = home[-1]
    waits = loss_wait_s or (0.0,) * R
    same = timeline is None and len(set(waits)) == 1
    copies = symmetric_copies(exp, rank_at, timing, paths, one_way_s, stagger_s, fair) if same else 1
    pos = {(s, r): 0 for s in range(S) for r in range(R // copies)}
    arrived: dict[Transfer, float] = {}
    waiting: dict[Transfer, tuple[int, int]] = {}  # the worker (stage, replica) each awaited input holds
    posted: dict[Transfer, float] = {}
    notice_sent: dict[Transfer, float] = {}  # when the receiver's ready notice left it
    sending: dict[tuple[int, int], set[Transfer]] = {}  # per (sender, receiver): bytes leaving now
    # per pair, the notices queued behind them, each with the transfers still ahead of it
    behind: dict[tuple[int, int], list[tuple[Transfer, set[Transfer]]]] = {}
    ready: dict[Transfer, float] = {}
    link_free = dict.fromkeys(links, 0.0)
    # hop_order: each link's transfers by their place in its order, the next place, and the
    # transfers that came before their turn
    turn_of = {h: {t: k for k, t in enumerate(ts)} for h, ts in (hop_order or {}).items()}
    turn = dict.fromkeys(turn_of, 0)
    parked: dict[Hop, dict[int, tuple[Transfer, int, float | None, float]]] = {h: {} for h in turn_of}
    order: dict[Hop, list[Transfer]] = {h: [] for h in links}
    end = 0.0
    # tcp: the transfers under way, shared max-min fairly (capacities in transfers per second), and a
    # version that outdates the completion scheduled before the last change
    fluid = FairShare({h: x.concurrency / x.transfer_s / copies for h, x in links.items()})
    version = 0

    def at(t: float, act: Callable[..., None], *args: Any) -> None:
        """``act(*args)`` at time ``t`` (SimPy orders events by time, then by when they were made)."""
        delay = t - env.now
        _Call(env, delay if delay > 0.0 else 0.0, act, *args)

    def pair(t: Transfer) -> tuple[int, int]:
        return (forward_pair if t[0] == "F" else backward_pair)[t[1]][t[3]]

    def post(t: Transfer) -> None:
        """The receiver posts the receive of ``t``: its ready notice leaves now, or behind the bytes
        it is sending to the same sender on their connection."""
        posted[t] = env.now
        back = pair(t)[::-1]
        if sending.get(back):  # behind the bytes in the socket now, not those written after it
            behind.setdefault(back, []).append((t, set(sending[back])))
        else:
            notice_sent[t] = env.now
            eligible(t)

    def sending_starts(t: Transfer) -> None:
        sending.setdefault(pair(t), set()).add(t)

    def sending_ends(t: Transfer, arrived: bool = False) -> None:
        """``t``'s last byte has left its sender (a flow under ``tcp``) or, ``arrived``, reached its
        receiver at the end of its path (hop by hop, it may wait at a later hop, and the notices
        behind it with it): the notices queued behind nothing else leave, or have come with it."""
        key = pair(t)
        sending[key].discard(t)
        still = []
        for u, ahead in behind.pop(key, []):
            ahead.discard(t)
            if ahead:
                still.append((u, ahead))
            else:  # eligible counts a notice's one-way delay from when it left
                notice_sent[u] = max(posted[u], env.now - one_way_s[pair(u)]) if arrived else env.now
                eligible(u)
        if still:
            behind[key] = still

    def eligible(t: Transfer, handed_now: bool = False) -> None:
        """``t`` moves once its bytes are ready and its receiver's notice has come; ``handed_now``:
        its sender has just handed it to gloo at the end of the action that made it, so where it
        may go at once it does, before the sender posts its next receive (whose notice then
        queues behind these bytes, as on gloo's socket)."""
        if t in ready and t in notice_sent:
            key = pair(t)
            if key not in paths:  # inside one DC: no WAN link, no rendezvous cost worth modelling
                at(max(ready[t], posted[t]), arrive, t)
                return
            act: Callable[..., None]
            args: tuple[Any, ...]
            if rendezvous_hold:  # FIFO: the link is held from both sides ready, notice included
                when, act, args = max(ready[t], notice_sent[t]), hop, (t, 0, None, one_way_s[key])
            elif fair:
                when, act, args = max(ready[t], notice_sent[t] + one_way_s[key]), flow_start, (t,)
            else:
                when, act, args = max(ready[t], notice_sent[t] + one_way_s[key]), hop, (t, 0, None, 0.0)
            if handed_now and when <= env.now:
                act(*args)
            else:
                at(when, act, *args)

    def reshare() -> None:
        """Schedule the next completion under the new shares, outdating the previous one."""
        nonlocal version
        version += 1
        nxt = fluid.next_done()
        if nxt is not None:
            at(nxt[0], flow_done, version, nxt[1])

    def flow_start(t: Transfer) -> None:
        """A flow starts on every link of its path at once."""
        key = pair(t)
        crossed, mine = tuple(paths[key]), timing[key]
        sending_starts(t)
        for h in crossed:
            order[h].append(t)
        cap = min(1 / x.transfer_s for x in mine)
        # a burst is paced at its own rate alone (what BBR paces at: its bandwidth estimate)
        fluid.add(env.now, t, crossed, cap, pacing=cap if all(x.bursts for x in mine) else None)
        reshare()

    def flow_done(v: int, t: Transfer) -> None:
        nonlocal end
        if v != version:
            return  # outdated by a later start or end
        fluid.remove(env.now, t)
        reshare()
        sending_ends(t)
        end = max(end, env.now)
        at(env.now + one_way_s[pair(t)], arrive, t)

    def hop(t: Transfer, i: int, last_before: float | None, notice: float) -> None:
        """``t`` may take hop ``i`` of its path; ``last_before``: when the previous hop's last byte
        arrives; ``notice``: FIFO's wait for the ready notice to cross back. Under ``hop_order``
        it waits for the transfers before it in its link's order to have taken the link."""
        nonlocal end
        key = pair(t)
        path = paths[key]
        h = path[i]
        if h in turn_of:
            mine = turn_of[h].get(t)
            if mine is not None:
                if mine != turn[h]:
                    parked[h][mine] = (t, i, last_before, notice)
                    return
                turn[h] += 1
                if turn[h] in parked[h]:  # the next in order came early: it goes once this one has
                    at(env.now, hop, *parked[h].pop(turn[h]))
        link = timing[key][i]
        if replica_links:
            link = replica_links.get((h, t.replica), link)
        start = max(env.now, link_free[path[i]])
        first = start + notice
        last = max(first + link.transfer_s, last_before if last_before is not None else 0.0)
        link_free[path[i]] = last + (link.delay_s if notice else 0.0)  # FIFO: until the data arrived
        order[path[i]].append(t)
        if i == 0:  # its bytes are in the sender's socket from the notice's arrival until they leave
            begins = max(env.now, notice_sent[t] + one_way_s[key])
            if begins > env.now:
                at(begins, sending_starts, t)
            else:  # now, before a receive posted at this instant sends its notice
                sending_starts(t)
            if len(path) == 1:  # else the notices behind its bytes wait with them at a later hop
                at(last, sending_ends, t)
        end = max(end, last)
        if i + 1 < len(path):
            at(first + link.delay_s, hop, t, i + 1, last + link.delay_s, 0.0)
        else:
            at(last + link.delay_s + link.delivery_s, arrive, t)

    def arrive(t: Transfer) -> None:
        arrived[t] = env.now
        if t in sending.get(pair(t), ()):  # over several hops: the notices behind its bytes came with them
            sending_ends(t, arrived=True)
        if t in waiting:  # its worker resumes after what is already due now, as a SimPy process would
            _Call(env, 0.0, run, *waiting.pop(t))

    def run(s: int, r: int) -> None:
        """Worker (s, r) goes on with its schedule table: it starts its next action, or waits for
        that action's input (``arrive`` resumes it); its compute's end resumes it."""
        nonlocal end
        i = pos[(s, r)]
        if i >= len(steps[s]):
            return
        a, took, need_spec, out_spec = steps[s][i]
        if need_spec is not None:
            need = _transfer(Transfer, (*need_spec, r))
            if need not in posted:
                post(need)
            if need not in arrived:
                waiting[need] = (s, r)
                return
        start = env.now
        done = start + took
        if striped and out_spec is not None and (out_spec[0], out_spec[1], r) in striped:
            done += striped_s
        if timeline is not None:
            timeline.append((s, r, a, start, done))
        end = max(end, done)
        out = None if out_spec is None else _transfer(Transfer, (*out_spec, r))
        _Call(env, done - start, computed, s, r, out, done)

    def computed(s: int, r: int, out: Transfer | None, done: float) -> None:
        """Worker (s, r)'s action has ended at ``done``: it hands its output ``out`` to gloo, then
        goes on."""
        if out is not None:
            ready[out] = done
            eligible(out, handed_now=True)
        pos[(s, r)] += 1
        run(s, r)

    def begin(s: int, r: int) -> None:
        delay = (stagger_s[r] if s == 0 else 0.0) + (waits[r] if s == loss_stage else 0.0)
        if delay > 0:
            _Call(env, delay, run, s, r)
        else:
            run(s, r)

    # every worker begins before anything else happens at time 0, in order (as SimPy starts processes)
    for s, r in pos:
        begin(s, r)
    env.run()
    # the closures above refer to each other, so what they hold waits for a collection: let the
    # transfers' records go now
    for record in (arrived, posted, notice_sent, ready, waiting, sending, behind):
        record.clear()
    stuck = [(s, r) for (s, r), p in pos.items() if p < len(actions[s])]
    if stuck:
        s, r = stuck[0]
        raise ValueError(f"the schedule does not complete: stage {s} replica {r} waits at {actions[s][pos[(s, r)]]}")
    if copies > 1:  # every pipeline took each link when the first did, in replica order
        return end, CopiedOrder(order, copies)
    return end, order


#: a Transfer made from its fields' tuple in C (the named tuple's own constructor is Python: the
#: simulation makes one for every action's input and output)
_transfer = tuple.__new__


def _spec(t: Transfer | None) -> tuple[str, int, int] | None:
    """A transfer without its replica: (kind, virtual stage, microbatch)."""
    return None if t is None else (t.kind, t.stage, t.microbatch)
