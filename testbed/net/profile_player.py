"""Replaying the topology's link profiles live (``spec/link_profile.py``): a thread that applies
each link's steps at their times from the moment the network is up, in place, and logs each.

- A rate change sets the link's HTB classes at both ends in one netlink batch each
  (``WanShaper.set_link_rate``: ``change`` lines in ``shaping.jsonl``).
- A rate of 0 takes the link down (``link_control.set_link``: iptables drops everything forwarded
  out of or in from it at both ends; ``link_down``/``link_up`` lines); the next step that is up
  brings it back. The iptables-restore each of these steps writes to is started once the step
  before it has been applied (``link_control.prepare_restores``), so that the step itself costs
  the rules' commit rather than the program's start.
- A delay, jitter or loss change goes to the delay mechanism: on the NFQUEUE element, one control
  datagram per receiving end (``delay_element.set_queue``; it never reorders: a shorter delay
  makes packets wait behind those already held); on netem, ``tc qdisc change`` of each leaf of the
  link's egress at both ends (netlink, in place), where a decrease is ramped down by
  ``NETEM_RAMP_US`` of delay every ``NETEM_RAMP_US`` (netem orders its queue by time to send, so a
  decrease of d at once puts packets sent within d of it before older ones; ramped at one
  microsecond per microsecond, a packet's release time never comes before an older one's, within
  the time one change takes).

Each step is logged as a ``profile_step`` line (the link, the step's time in the profile, its
figures, when it was due and when it was applied, on the run's clock), so that the analysis can
draw the configured rate over time and check the steps' timing. A step that fails stops the
replay and fails the run (``on_failure``): a profile the run did not follow must not pass for one
it did.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

from pyroute2 import IPRoute

from testbed.errors import TestbedError
from testbed.net import delay_element, link_control, netlink, netlink_tc
from testbed.net.shaping import Netem, ShapingPlan
from testbed.spec.addressing import AddressPlan
from testbed.spec.link_profile import LinkState, ProfileStep
from testbed.spec.topology import LinkSpec, TopologySpec
from testbed.trace.jsonl import open_jsonl, write_row
from testbed.trace.shaping_log import PROFILE_STEP, SHAPING_LOG

#: the largest delay decrease netem takes at once (µs); see the module doc
NETEM_RAMP_US = 1_000
#: how far ahead the replay unrolls a looping profile at a time (µs)
_WINDOW_US = 3_600_000_000


class ProfileError(TestbedError):
    """A profile step could not be applied."""


def link_steps(link: LinkSpec) -> Iterator[ProfileStep]:
    """Every change of ``link``'s profile from the start, loops unrolled without end."""
    assert link.profile is not None
    k = 0
    while True:
        window = [s for s in link.profile.changes((k + 1) * _WINDOW_US) if s.t_us >= k * _WINDOW_US]
        yield from window
        if link.profile.period_us is None and k * _WINDOW_US > link.profile.steps[-1].t_us:
            return
        k += 1


class ProfilePlayer(threading.Thread):
    """Plays the profiles of ``spec``'s links (those that have one) on a network built on this
    machine: ``set_link_rate(a, b, bps)`` changes a link's rate (``WanShaper.set_link_rate``);
    ``plan``/``shaping`` locate its ends and delay queues; ``now_ns`` is the run's clock and
    ``t0_ns`` the profiles' time 0 on it; ``on_failure`` is called once, from this thread, with the
    ProfileError of a step that failed."""

    def __init__(
        self,
        spec: TopologySpec,
        plan: AddressPlan,
        shaping: ShapingPlan,
        set_link_rate: Callable[[str, str, int], None],
        netem_leaves: Callable[[str, str], list[tuple[int, Netem]]],
        out_dir: Path,
        now_ns: Callable[[], int],
        t0_ns: int,
        on_failure: Callable[[TestbedError], None],
    ) -> None:
        super().__init__(name="profile-player", daemon=True)
        self.spec, self.plan, self.shaping = spec, plan, shaping
        self.set_link_rate, self.netem_leaves = set_link_rate, netem_leaves
        self.out_dir, self.now_ns, self.t0_ns, self.on_failure = out_dir, now_ns, t0_ns, on_failure
        self.ends = link_control.link_ends(spec, plan.prefix)
        self._halt = threading.Event()
        self.applied = 0
        self._iprs: dict[str, IPRoute] = {}  # netns -> its socket, opened by run (netem only)
        self._ifindex: dict[tuple[str, str], int] = {}  # (netns, WAN interface) -> index
        # per link: iptables-restore processes started ahead of its next outage's start or end
        self._prepared: dict[str, dict[link_control.LinkEnd, subprocess.Popen]] = {}

    @property
    def links(self) -> list[LinkSpec]:
        return [link for link in self.spec.links if link.profile is not None]

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        with ExitStack() as stack:
            stack.callback(self._close_prepared)
            if self.shaping.mechanism != "nfqueue":
                # netem's leaves are changed through these, opened once here (in this thread) rather
                # than at a step: opening a namespace's socket costs milliseconds (tens under TCG),
                # which a step would pay late
                try:
                    for link in self.links:
                        for at, peer in ((link.a, link.b), (link.b, link.a)):
                            netns, ifname = self.plan.routers[at].netns, self.plan.wan_ends[(at, peer)].ifname
                            if netns not in self._iprs:
                                self._iprs[netns] = stack.enter_context(IPRoute(netns=netns))
                            self._ifindex[(netns, ifname)] = netlink.ifindex(self._iprs[netns], ifname)
                except (TestbedError, OSError, KeyError) as e:
                    self.on_failure(ProfileError(f"cannot reach the profiled links' netem leaves: {e}"))
                    return
            self._play()

    def _play(self) -> None:
        streams = {link_control.link_name(x.a, x.b): (x, link_steps(x)) for x in self.links}
        state = {name: x.state for name, (x, _) in streams.items()}
        pending = {name: next(it, None) for name, (_, it) in streams.items()}
        for name, step in pending.items():
            self._prepare(name, state[name], step)
        while not self._halt.is_set():
            due = [(s.t_us, name) for name, s in pending.items() if s is not None]
            if not due:
                return
            t_us, name = min(due)
            step = pending[name]
            assert step is not None
            wait_s = (self.t0_ns + t_us * 1000 - self.now_ns()) / 1e9
            if wait_s > 0 and self._halt.wait(wait_s):
                return
            link = streams[name][0]
            try:
                self.apply(link, state[name], step)
            except (TestbedError, OSError, KeyError) as e:
                self.on_failure(ProfileError(f"link {name}: the profile step at {t_us / 1e6:g} s failed: {e}"))
                return
            state[name] = step.state
            pending[name] = next(streams[name][1], None)
            self._prepare(name, state[name], pending[name])

    def _prepare(self, name: str, now: LinkState, step: ProfileStep | None) -> None:
        """Where link ``name``'s next step takes it down or up, start the iptables-restore that
        step will write to now (``link_control.prepare_restores``: the step then costs the rules'
        commit, not the program's start). A start that fails is left to the step, which starts its
        own and reports what fails."""
        if step is None or step.state.up == now.up or self._prepared.get(name):
            return
        try:
            self._prepared[name] = link_control.prepare_restores(self.ends[name])
        except OSError:
            pass

    def _close_prepared(self) -> None:
        for prepared in self._prepared.values():
            link_control.close_restores(prepared)
        self._prepared.clear()

    def apply(self, link: LinkSpec, before: LinkState, step: ProfileStep) -> None:
        """Take ``link`` from ``before`` to ``step``'s state (module doc) and log the step."""
        name = link_control.link_name(link.a, link.b)
        after = step.state
        applied_ns = self.now_ns()
        changed = after.differs(before)
        going_down, coming_up = before.up and not after.up, after.up and not before.up
        if going_down:
            link_control.set_link(
                self.ends[name], name, True, self.out_dir, known_up=True, prepared=self._prepared.get(name)
            )
        if "rate" in changed and after.up:
            self.set_link_rate(link.a, link.b, after.rate_bps)
        if "delay" in changed or "loss" in changed:
            if self.shaping.mechanism == "nfqueue":
                self._set_element(link, after)
            else:
                self._set_netem(link, before, after)
        done_ns = self.now_ns()
        if coming_up:  # last: what crosses from now on sees the step's figures
            row = link_control.set_link(
                self.ends[name], name, False, self.out_dir, known_up=False, prepared=self._prepared.get(name)
            )
            done_ns = row["t_ns"] + row["duration_ns"] if row else self.now_ns()
        self.applied += 1
        with open_jsonl(self.out_dir / SHAPING_LOG) as log:
            write_row(
                log,
                {
                    "t_ns": applied_ns,
                    "event": PROFILE_STEP,
                    "link": name,
                    "profile_t_us": step.t_us,
                    "due_ns": self.t0_ns + step.t_us * 1000,
                    "rate_bps": after.rate_bps,
                    "delay_us": after.delay_us,
                    "jitter_us": after.jitter_us,
                    "loss_pct": after.loss_pct,
                    "changed": list(changed),
                    "duration_ns": done_ns - applied_ns,
                },
            )

    def _set_element(self, link: LinkSpec, s: LinkState) -> None:
        for at, peer in ((link.a, link.b), (link.b, link.a)):
            netns, ifname = self.plan.routers[at].netns, self.plan.wan_ends[(at, peer)].ifname
            queue = next(
                (q for q in self.shaping.delay_queues if (q.netns, q.in_ifname) == (netns, ifname) and q.live), None
            )
            if queue is None:
                raise ProfileError(f"no live delay queue on {netns}/{ifname}")
            delay_element.set_queue(netns, queue.queue_num, s.delay_us, s.jitter_us, s.loss_pct)

    def _set_netem(self, link: LinkSpec, before: LinkState, after: LinkState) -> None:
        """Change every netem leaf of ``link``'s egress at both ends to ``after``'s figures, through
        the sockets ``run`` opened; a delay decrease is ramped (module doc)."""
        delays = [after.delay_us]
        if after.delay_us < before.delay_us:  # ramp down (module doc)
            delays = list(range(before.delay_us - NETEM_RAMP_US, after.delay_us, -NETEM_RAMP_US)) + [after.delay_us]
        ends = [
            (self.plan.routers[s].netns, self.plan.wan_ends[(s, d)].ifname, s, d)
            for s, d in ((link.a, link.b), (link.b, link.a))
        ]
        for k, delay in enumerate(delays):
            if k:  # one step of delay per as long: release times (send + delay) never go back
                time.sleep(NETEM_RAMP_US / 1e6)
            for netns, ifname, src, dst in ends:
                index = self._ifindex[(netns, ifname)]
                for minor, leaf in self.netem_leaves(src, dst):
                    new = replace(leaf, delay_us=delay, jitter_us=min(after.jitter_us, delay), loss_pct=after.loss_pct)
                    netlink_tc.change_netem(self._iprs[netns], index, minor, new, f"{netns}/{ifname}")
