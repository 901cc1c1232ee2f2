"""Atlas's grant logic as pure code (DESIGN.md section 1, item 4): per link direction (``Hop``), which
data-parallel pipeline's transfer holds the link. Each pipeline has its own HTB class
(``1:(CLASS_BASE + replica)``) on every crossed egress; the holder's class gets the link, the others
a floor (``floor_bps``).

``GrantLoop`` is the controller's state machine over the workers' control messages
(``channel.py``) and its own timers (``tick``); it tells a switch (``switch.GrantSwitch`` in the
controller process, or any object with ``apply``, ``keep`` and ``release``) what to apply. Two ways
to share a link (the policy's ``sharing``):

- ``fifo``: a transfer is granted when both its sides have reported (``ready`` and ``recv``), earliest
  first (``GrantQueue``), and holds the link until its receiver says ``done`` (the rendezvous);
- ``planned``: the grant plan (``plan/grant_plan.py``) sets the order among waiting transfers (its
  order over an iteration; a transfer it does not list goes by readiness) and the timing: a
  transfer is granted on its path's first hop when its bytes can arrive there (the receiver's
  ready notice crosses back first, behind the receiver's own bytes to the sender where they were
  leaving, arriving with their last byte: ``notices.py``), on each further hop one link delay
  after it was granted on the hop before, and released as soon as the class's byte counter shows
  its bytes have passed since it became ready (``counters``; gloo moves none before; the class
  also carries the ACKs of its pipeline's reverse flow, a few percent, within
  ``BYTES_PASSED_SHARE``), or at ``done``.
  Between grants the classes stay as the last grant left them, as under ``fifo``: a transfer whose
  bytes come before its turn moves at the floor (or, with borrowing, on what the link has idle).

Liveness: a grant past its deadline (the plan's: 3 x its transfer time plus one RTT) is released,
logged and counted, so a lost ``done`` costs at most one deadline; a transfer whose ``ready`` or
``recv`` was lost (its other side has waited a whole planned iteration: a receiver may well post
long before its sender is ready, or the other way round) is then taken as ready, so such a loss
costs at most one iteration plus one deadline; messages about a transfer already done are
ignored. Nothing here touches the kernel; times are CLOCK_MONOTONIC ns.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Collection
from dataclasses import dataclass

from testbed.atlas.channel import DONE, READY, RECV, TransferKey, transfer_key
from testbed.atlas.classes import CLASS_BASE, Switch, floor_bps
from testbed.atlas.fifo import GrantQueue
from testbed.atlas.notices import NEVER, ReadyNotices
from testbed.atlas.rendezvous import Rendezvous
from testbed.atlas.timing import HopTiming
from testbed.plan.grant_plan import FLOOR_SHARE, Hop, Transfer, boundary_paths

__all__ = ["CLASS_BASE", "FLOOR_SHARE", "GrantLoop", "GrantQueue", "Hop", "HopTiming", "boundary_paths", "floor_bps"]
#: how often, at most, a granted class's byte counter is looked at while its bytes pass (ns)
MIN_CHECK_NS = 500_000
#: a grant's bytes have passed once the class sent this share of the transfer's expected wire bytes
BYTES_PASSED_SHARE = 0.97
#: why grants were released and classes opened when the routes moved (``GrantLoop.reroute``)
REROUTE = "reroute"


@dataclass
class _Held:
    replica: int
    key: TransferKey
    since_ns: int
    deadline_ns: int
    base_bytes: int | None = None
    check_ns: int | None = None


@dataclass
class _Waiting:
    replica: int
    key: TransferKey
    eligible_ns: int  # NEVER until the previous hop of its path granted it
    rank: tuple
    base_bytes: int  # the class's counter when the transfer became ready: no byte of it had gone


class GrantLoop:
    """The controller's state machine (see the module doc). ``replica_of``/``stage_of``: rank ->
    data-parallel replica / pipeline stage; ``hops``: the WAN egresses of each (sender, receiver)
    pair; ``timing``: each hop's plan (``planned``; under ``fifo`` only its deadline is used);
    ``notice_ns``: the one-way delay from each pair's receiver back to its sender; ``counters``:
    ``(hop, replica) -> bytes`` its class has sent (``planned``); ``iteration_ns``: the planned
    iteration, after which a half-reported transfer counts as lost-and-ready; ``homes``: the
    worker's stage holding each virtual stage (``schedule.stage_homes``; default one each);
    ``links``: every link direction with the pipelines' classes, where more than ``hops`` crosses
    (the paths a failover may move traffic to: ``reroute``). Raises ValueError for a sharing it
    does not know, or ``planned`` without what it needs."""

    def __init__(
        self,
        switch: Switch,
        replica_of: dict[int, int],
        hops: dict[tuple[int, int], list[Hop]],
        sharing: str = "fifo",
        timing: dict[Hop, HopTiming] | None = None,
        stage_of: dict[int, int] | None = None,
        notice_ns: dict[tuple[int, int], int] | None = None,
        counters: Callable[[Hop, int], int] | None = None,
        iteration_ns: int = NEVER,
        homes: list[int] | None = None,
        links: Collection[Hop] = (),
    ) -> None:
        if sharing not in ("fifo", "planned"):
            raise ValueError(f"unknown sharing {sharing!r}: fifo or planned")
        if sharing == "planned" and (timing is None or stage_of is None or counters is None):
            raise ValueError("planned sharing needs the plan's timing, the stages and the class counters")
        self.switch, self.replica_of, self.hops, self.sharing = switch, replica_of, hops, sharing
        self.timing, self.stage_of = timing or {}, stage_of or {}
        self.notice_ns, self.counters, self.iteration_ns = notice_ns or {}, counters, iteration_ns
        self.homes = homes
        all_hops = {h for hs in hops.values() for h in hs} | set(links)
        self.queues = {h: GrantQueue() for h in all_hops}  # fifo: who holds and waits, in order
        self.held: dict[Hop, _Held | None] = dict.fromkeys(all_hops)
        self.waiting: dict[Hop, list[_Waiting]] = {h: [] for h in all_hops}
        self.granted: dict[Hop, int | str | None] = dict.fromkeys(all_hops)
        self.rendezvous = Rendezvous()
        self._seq = itertools.count()
        self.deadline_releases = 0
        self._free_since: dict[Hop, int] = dict.fromkeys(all_hops, 0)
        self.notices = ReadyNotices(self.notice_ns)  # planned: when each transfer's bytes can go

    def replan(self, timing: dict[Hop, HopTiming], iteration_ns: int, sharing: str | None = None) -> None:
        """Follow a new plan from now on (the first iteration's profile, under real compute):
        transfers that become ready from now on take the new order; grants held keep their deadline.
        ``sharing`` ``planned`` switches a loop that ran ``fifo`` to the plan (a launched job's,
        whose workload is known only once measured): a FIFO grant held then is released at its
        ``done``, transfers FIFO queued then get no grant and move at the floor (or borrowing).
        Raises ValueError for ``planned`` without the stages or the class counters."""
        if sharing is not None and sharing != self.sharing:
            if sharing != "planned" or not self.stage_of or self.counters is None:
                raise ValueError(f"cannot switch from {self.sharing} to {sharing} sharing")
            self.sharing = sharing
        self.timing, self.iteration_ns = timing, iteration_ns

    def relink(self, batches: dict[Hop, dict], t_ns: int) -> None:
        """Take every grant compiled again at the links' new rates (``batches``, the switch's form)
        and apply each hop's current grant (the holder's, or every class open) at once, so that
        the classes follow the link's new rate now rather than at the next grant."""
        self.switch.relink(batches)
        for hop, granted in self.granted.items():
            self.switch.apply(hop, granted if granted is not None else "open", event="relink")

    def reroute(self, hops: dict[tuple[int, int], list[Hop]], notice_ns: dict[tuple[int, int], int], t_ns: int) -> None:
        """The routes moved (a link failed over, or came back): each (sender, receiver) pair's
        transfers cross ``hops`` from now on, and its receiver's notices take ``notice_ns``. The
        grants held are released (reason ``reroute``) and every class is opened; the transfers
        waiting for a grant are let go: what was in flight at the move finishes under fair sharing,
        on whichever path its packets now take, and transfers ready from now on are granted on
        their new paths. Raises ValueError for a hop that has no classes (``Controller.install``
        puts them on every egress a failover can move a pipeline's traffic to)."""
        unknown = sorted({h for hs in hops.values() for h in hs} - set(self.held), key=str)
        if unknown:
            raise ValueError(f"no classes on {', '.join(f'{h.src}->{h.dst}' for h in unknown)}: cannot grant there")
        for hop, held in self.held.items():
            if held is not None:
                self._release(hop, t_ns, REROUTE, handover=False)
        self.hops, self.notice_ns = hops, notice_ns
        self.notices = ReadyNotices(notice_ns)
        self.queues = {h: GrantQueue() for h in self.held}
        self.waiting = {h: [] for h in self.held}
        for hop in self.granted:
            self.switch.apply(hop, "open", event=REROUTE)
            self.granted[hop] = None
            self._free_since[hop] = t_ns

    # ------------------------------------------------------------------ messages
    def handle(self, msg: dict, t_ns: int) -> None:
        """One control message (``channel.parse_message``'s form) received at ``t_ns`` (or sent at
        its own ``t``). Raises ValueError for an unknown event."""
        ev = msg["ev"]
        if ev not in (READY, RECV, DONE):
            raise ValueError(f"unknown control message {msg!r}")
        key = transfer_key(msg)
        t = msg.get("t", t_ns)
        if self.rendezvous.is_done(key):
            return  # a late or repeated message about a finished transfer
        if ev == DONE:
            self.rendezvous.finish(key)
            self._done(key, t)
            return
        both = self.rendezvous.report(key, ev, t)
        if both is not None:
            self._ready(key, *both, t)

    def _path(self, key: TransferKey) -> list[Hop]:
        return self.hops.get((key[0], key[1]), [])

    def _half_expiry(self, key: TransferKey) -> int:
        """How long one side of ``key`` waits for the other before the other counts as lost (ns)."""
        longest = max((self._deadline_after(h) for h in self._path(key)), default=NEVER)
        return NEVER if self.iteration_ns >= NEVER or longest >= NEVER else self.iteration_ns + longest

    def _deadline_after(self, hop: Hop) -> int:
        timing = self.timing.get(hop)
        return timing.deadline_ns if timing else NEVER

    def _ready(self, key: TransferKey, t_sender: int, t_receiver: int, t_ns: int) -> None:
        replica = self.replica_of[key[0]]
        path = self._path(key)
        if self.sharing == "fifo":
            for hop in path:
                nxt = self.queues[hop].ready(replica, key)
                if nxt is not None:
                    self._grant(hop, _Held(nxt, key, t_ns, t_ns + self._deadline_after(hop)), t_ns)
            return
        if not path:
            return
        start = self.notices.ready(key, t_sender, t_receiver)
        assert self.counters is not None
        for i, hop in enumerate(path):
            timing = self.timing[hop]
            rank = (key[2], timing.position.get(self._transfer(key), len(timing.position)), next(self._seq))
            eligible = start if i == 0 else NEVER
            self.waiting[hop].append(_Waiting(replica, key, eligible, rank, self.counters(hop, replica)))
        self._dispatch(path[0], t_ns)

    def _transfer(self, key: TransferKey) -> Transfer:
        """The plan's name of ``key``: its boundary's virtual stage as the worker sent it, or (-1) the
        lower of the two workers' stages; forward where the sender holds that virtual stage."""
        src, dst, _, mb, boundary = key
        if boundary < 0:
            boundary = min(self.stage_of[src], self.stage_of[dst])
        home = self.homes[boundary] if self.homes is not None else boundary
        return Transfer("F" if home == self.stage_of[src] else "B", boundary, mb, self.replica_of[src])

    def _passed(self, key: TransferKey, t_ns: int) -> None:
        """Planned: ``key``'s bytes have reached its receiver at ``t_ns`` (its last hop's grant
        ended, plus that hop's delay, or it is done): the transfers whose notices waited behind
        them become due."""
        for other, start in self.notices.passed(key, t_ns):
            for w in self.waiting[self._path(other)[0]]:
                if w.key == other:
                    w.eligible_ns = start

    def _done(self, key: TransferKey, t_ns: int) -> None:
        if self.sharing == "planned":
            self._passed(key, t_ns)
        for hop in self._path(key):
            held = self.held[hop]
            if self.sharing == "fifo":
                nxt = self.queues[hop].done(key)
                if held is not None and held.key == key:
                    self._release(hop, t_ns, DONE, handover=nxt is not None)
                    self._grant_next_fifo(hop, nxt, t_ns)
                continue
            self.waiting[hop] = [w for w in self.waiting[hop] if w.key != key]  # done before its grant
            if held is not None and held.key == key:
                self._release(hop, t_ns, DONE, handover=self._any_due(hop, t_ns))
            self._dispatch(hop, t_ns)

    # ------------------------------------------------------------------ timers
    def tick(self, t_ns: int) -> None:
        """Act on what is due at ``t_ns``: byte counters of planned grants, deadlines, transfers
        whose other side's message was lost, planned grants whose bytes are about to arrive."""
        for key, t_sender, t_receiver in self.rendezvous.expire(t_ns, self._half_expiry):
            self._ready(key, t_sender, t_receiver, t_ns)
        for hop, held in self.held.items():
            if held is None:
                if self.sharing == "planned":
                    self._dispatch(hop, t_ns)
                continue
            if self.sharing == "planned" and held.check_ns is not None and t_ns >= held.check_ns:
                assert self.counters is not None and held.base_bytes is not None
                timing = self.timing[hop]
                sent = self.counters(hop, held.replica) - held.base_bytes
                if sent >= BYTES_PASSED_SHARE * timing.wire_bytes:
                    self._release(hop, t_ns, "bytes", handover=self._any_due(hop, t_ns))
                    self._dispatch(hop, t_ns)
                    continue
                left_ns = int(max(timing.wire_bytes - sent, 0) * 8 / timing.rate_bps * 1e9)
                held.check_ns = t_ns + max(MIN_CHECK_NS, left_ns)
            if t_ns >= held.deadline_ns:
                self.deadline_releases += 1
                if self.sharing == "fifo":
                    nxt = self.queues[hop].done(held.key)
                    self._release(hop, t_ns, "deadline", handover=nxt is not None)
                    self._grant_next_fifo(hop, nxt, t_ns)
                else:
                    self._release(hop, t_ns, "deadline", handover=self._any_due(hop, t_ns))
                    self._dispatch(hop, t_ns)

    def next_wakeup_ns(self) -> int | None:
        """When ``tick`` has something to do next (None: nothing until a message comes)."""
        times = self.rendezvous.expiries_ns(self._half_expiry)
        for hop, held in self.held.items():
            if held is not None:
                times.append(held.deadline_ns)
                if held.check_ns is not None:
                    times.append(held.check_ns)
            elif self.waiting[hop]:
                times.append(min(w.eligible_ns for w in self.waiting[hop]))
        due = [t for t in times if t < NEVER]
        return min(due) if due else None

    # ------------------------------------------------------------------ applying
    def _any_due(self, hop: Hop, t_ns: int) -> bool:
        return any(w.eligible_ns <= t_ns for w in self.waiting[hop])

    def _dispatch(self, hop: Hop, t_ns: int) -> None:
        """Planned: grant the free hop to the waiting transfer first in the plan's order among those
        whose bytes are due; the transfer's next hop becomes due one link delay later."""
        if self.held[hop] is not None:
            return
        due = [w for w in self.waiting[hop] if w.eligible_ns <= t_ns]
        if not due:
            return  # the last holder keeps the classes as they are (held ones at their floor)
        w = min(due, key=lambda x: x.rank)
        self.waiting[hop].remove(w)
        timing = self.timing[hop]
        held = _Held(w.replica, w.key, t_ns, t_ns + timing.deadline_ns, w.base_bytes)
        held.check_ns = t_ns + max(MIN_CHECK_NS, timing.transfer_ns)
        # the grant could go out once its bytes were due and the link was free: its latency counts from there
        self._grant(hop, held, max(w.eligible_ns, self._free_since[hop]))
        path = self._path(w.key)
        i = path.index(hop)
        if i + 1 < len(path):
            nxt = next((x for x in self.waiting[path[i + 1]] if x.key == w.key), None)
            if nxt is not None:
                nxt.eligible_ns = t_ns + timing.delay_ns

    def _grant_next_fifo(self, hop: Hop, nxt: int | None, t_ns: int) -> None:
        current = self.queues[hop].current
        if nxt is not None and current is not None:
            self._grant(hop, _Held(nxt, current[1], t_ns, t_ns + self._deadline_after(hop)), t_ns)

    def _grant(self, hop: Hop, held: _Held, t_ready_ns: int) -> None:
        self.held[hop] = held
        if self.granted[hop] != held.replica:
            self.switch.apply(hop, held.replica, t_ready_ns)
            self.granted[hop] = held.replica
        else:  # the classes are already this pipeline's: logged, nothing to send
            self.switch.keep(hop, held.replica, t_ready_ns)

    def _release(self, hop: Hop, t_ns: int, reason: str, handover: bool) -> None:
        held = self.held[hop]
        assert held is not None
        self.held[hop] = None
        self._free_since[hop] = t_ns
        if self.sharing == "planned" and self._path(held.key)[-1] == hop:
            self._passed(held.key, t_ns + self.timing[hop].delay_ns)
        sent = None
        if self.counters is not None and held.base_bytes is not None:
            sent = self.counters(hop, held.replica) - held.base_bytes
        timing = self.timing.get(hop)
        self.switch.release(
            hop,
            held.replica,
            t_ns,
            handover=handover,
            reason=reason,
            held_ns=t_ns - held.since_ns,
            sent_bytes=sent,
            rate_bps=timing.rate_bps if timing else None,
        )
