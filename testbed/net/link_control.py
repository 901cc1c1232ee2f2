"""WAN link changes on command (``testbed link list|down|up|rate``), for a topology or a run that
is up on this machine, from any shell: outages, and the link's rate changed in place.

A link is down when it carries nothing in either direction: in the router namespace at each of
its ends, iptables drops every packet forwarded out of or in from the link's interface (filter
table, FORWARD, first rule), so what was already on the wire (in the far end's delay queue or
netem leaf) is dropped on arrival too. Interfaces, addresses, routes and the shaping tree are not
touched; bringing the link up deletes the two rules and nothing else. Each change is logged in the
run's ``shaping.jsonl`` (``link_down``/``link_up``, with the time it was issued and how long the
rules took). A link is named by its two DCs, ``a:b`` as the topology lists it (``b:a`` is the same
link); DC names cannot hold ``:``. The tc ``drop`` action is not used: it needs ``act_gact``,
which kernels without ``CONFIG_NET_ACT_GACT`` (this VM's) lack, where iptables is there for the
delay element anyway.

A rate change sets the link's HTB classes (``1:1``, the link, and ``1:10``, the default leaf) at
both ends to the new rate, in place (one netlink message each, as the network's own live changes:
``wan_shaper.set_link_rate``), logged as their ``change`` lines. Classes added at run time (Atlas's
pipelines' ``1:20``...) keep their rates: the link's class caps them, and Atlas's controller does
not yet see the change.
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from pyroute2 import IPRoute

from testbed.errors import TestbedError
from testbed.net import netlink, netlink_tc, rtnl_raw
from testbed.net.hostproc import netns_argv
from testbed.net.registry import RunRecord, list_runs
from testbed.net.shaping import DEFAULT_CLASS_MINOR, LINK_CLASS_MINOR, HtbClass
from testbed.spec.addressing import AddressPlan
from testbed.spec.topology import TopologySpec
from testbed.trace.jsonl import open_jsonl, write_row
from testbed.trace.shaping_log import LINK_DOWN, LINK_RATE, LINK_UP, SHAPING_LOG, shaping_record

#: the backends whose routers live in this machine's namespaces
LOCAL_BACKENDS = ("netns", "mininet")


class LinkError(TestbedError):
    """No such run or link, or iptables refused a rule."""


@dataclass(frozen=True)
class LinkEnd:
    """One end of a WAN link: the router namespace and its interface toward the other DC."""

    netns: str
    ifname: str


def link_name(a: str, b: str) -> str:
    return f"{a}:{b}"


def link_ends(spec: TopologySpec, prefix: str) -> dict[str, tuple[LinkEnd, LinkEnd]]:
    """Each WAN link of ``spec`` in run ``prefix``, by name (``a:b`` in the file's order), with its
    two ends."""
    plan = AddressPlan(spec, prefix)
    out = {}
    for link in spec.links:
        ea, eb = plan.wan_ends[(link.a, link.b)], plan.wan_ends[(link.b, link.a)]
        out[link_name(link.a, link.b)] = (
            LinkEnd(plan.routers[link.a].netns, ea.ifname),
            LinkEnd(plan.routers[link.b].netns, eb.ifname),
        )
    return out


def resolve_link(spec: TopologySpec, name: str) -> str:
    """The link's name as ``link_ends`` keys it (``b:a`` -> ``a:b``). Raises LinkError naming the
    links there are."""
    a, sep, b = name.partition(":")
    names = [link_name(x.a, x.b) for x in spec.links]
    for candidate in (name, link_name(b, a)):
        if sep and candidate in names:
            return candidate
    raise LinkError(f"{spec.name} has no link {name!r}: its links are {', '.join(names)} (write DC:DC)")


def drop_rules(end: LinkEnd) -> list[list[str]]:
    """The FORWARD rules that drop everything out of and in from ``end``'s interface (iptables
    arguments after the verb and chain)."""
    return [["-o", end.ifname, "-j", "DROP"], ["-i", end.ifname, "-j", "DROP"]]


def _iptables(end: LinkEnd, args: list[str], check: bool = True) -> int:
    """``iptables -w ARGS`` in ``end``'s router namespace; its status. Raises LinkError where it
    fails and ``check``."""
    proc = subprocess.run(netns_argv(end.netns, ["iptables", "-w", *args]), capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise LinkError(f"iptables in {end.netns} refused {' '.join(args)}: {proc.stderr.strip()}")
    return proc.returncode


def is_down(ends: tuple[LinkEnd, LinkEnd]) -> bool:
    """Whether the link's drop rules are in place (all of them)."""
    return all(_iptables(e, ["-C", "FORWARD", *r], check=False) == 0 for e in ends for r in drop_rules(e))


def _spawn_restore(end: LinkEnd) -> subprocess.Popen:
    """``iptables-restore --noflush`` started in ``end``'s router namespace, waiting for its rules
    on its standard input."""
    return subprocess.Popen(
        netns_argv(end.netns, ["iptables-restore", "-w", "--noflush"]),
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def prepare_restores(ends: tuple[LinkEnd, ...]) -> dict[LinkEnd, subprocess.Popen]:
    """One ``iptables-restore`` per end, started now for a change due later (``set_link``'s
    ``prepared``): the change then costs its rules' commit, about 1 ms, where starting the program
    in a namespace costs 3-20 ms on this project's two-core VM (more under load: a profile's
    link-up once took 10.3 ms, 8.9 of them the start). ``close_restores`` ends those not used,
    applying nothing; should this process die first, they read the end of their input and exit,
    likewise applying nothing. Raises OSError where one cannot start, after ending those that
    did."""
    prepared: dict[LinkEnd, subprocess.Popen] = {}
    try:
        for end in ends:
            prepared[end] = _spawn_restore(end)
    except OSError:
        close_restores(prepared)
        raise
    return prepared


def close_restores(prepared: dict[LinkEnd, subprocess.Popen]) -> None:
    """End the prepared ``iptables-restore`` processes not used: each reads an empty input, applies
    nothing and exits (killed if it has not within 5 s)."""
    for proc in prepared.values():
        assert proc.stdin is not None
        proc.stdin.close()
    for proc in prepared.values():
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    prepared.clear()


def _restore_all(edits: dict[LinkEnd, list[str]], prepared: dict[LinkEnd, subprocess.Popen] | None = None) -> None:
    """Apply each end's rule edits (iptables-restore lines of the filter table, ``-I``/``-D``) in
    one ``iptables-restore --noflush`` per end, the ends at once (a link's outage starts at both
    within one call's time): an end's process from ``prepared`` where it has one (taken out of it:
    ``prepare_restores``), else one started now. Raises LinkError naming the end whose rules were
    refused."""
    procs = {}
    for end, lines in edits.items():
        text = "*filter\n" + "".join(f"{line}\n" for line in lines) + "COMMIT\n"
        procs[end] = prepared.pop(end) if prepared and end in prepared else _spawn_restore(end)
        assert procs[end].stdin is not None
        procs[end].stdin.write(text)
        procs[end].stdin.close()
    failed = []
    for end, proc in procs.items():
        assert proc.stderr is not None
        err = proc.stderr.read()
        if proc.wait() != 0:
            failed.append(f"{end.netns}: {err.strip()}")
    if failed:
        raise LinkError(f"iptables-restore refused the link's rules: {'; '.join(failed)}")


def set_link(
    ends: tuple[LinkEnd, LinkEnd],
    name: str,
    down: bool,
    out_dir: Path | None,
    known_up: bool | None = None,
    prepared: dict[LinkEnd, subprocess.Popen] | None = None,
) -> dict | None:
    """Bring the link down (``down``) or up; returns its log line, or None where it already was. ``known_up``: the
    caller knows whether the link is up (a profile's replay), which spares reading its rules back.
    ``prepared``: iptables-restore processes started ahead for its ends (``prepare_restores``; those
    used are taken out of it). Logged in ``out_dir``'s ``shaping.jsonl`` where given. Raises
    LinkError where iptables refuses.

    Deleting a rule costs the nf_tables backend of iptables 10-15 ms where inserting one costs
    about 2 (measured on this project's VM), so bringing a link up first inserts rules that accept
    its traffic above the drops (the link carries traffic from then on: ``duration_ns``), and
    then deletes both (``cleanup_ns``)."""
    down_now = [
        (end, rule)
        for end in ends
        for rule in drop_rules(end)
        if (not known_up if known_up is not None else _iptables(end, ["-C", "FORWARD", *rule], check=False) == 0)
    ]
    edits: dict[LinkEnd, list[str]] = {}
    if down:
        for end in ends:
            for rule in drop_rules(end):
                if (end, rule) not in down_now:
                    edits.setdefault(end, []).append(" ".join(["-I", "FORWARD", "1", *rule]))
    else:
        for end, rule in down_now:
            accept = [x if x != "DROP" else "ACCEPT" for x in rule]
            edits.setdefault(end, []).append(" ".join(["-I", "FORWARD", "1", *accept]))
    if not edits:
        return None
    t0 = time.monotonic_ns()
    _restore_all(edits, prepared)
    duration = time.monotonic_ns() - t0
    row = {"t_ns": t0, "event": LINK_DOWN if down else LINK_UP, "link": name}
    row |= {"ends": [f"{e.netns}/{e.ifname}" for e in ends], "duration_ns": duration}
    if not down:  # the link carries traffic now; remove the accepts and the drops they override
        cleanup: dict[LinkEnd, list[str]] = {}
        for line_end, lines in edits.items():
            cleanup[line_end] = [line.replace("-I FORWARD 1", "-D FORWARD") for line in lines]
            cleanup[line_end] += [" ".join(["-D", "FORWARD", *r]) for e, r in down_now if e == line_end]
        _restore_all(cleanup)
        row["cleanup_ns"] = time.monotonic_ns() - t0 - duration
    if out_dir is not None:
        with open_jsonl(out_dir / SHAPING_LOG) as log:
            write_row(log, row)
    return row


def link_rate_bps(end: LinkEnd) -> int:
    """The rate the link's class (``1:1``) has now at ``end``, read back from the kernel (bit/s).
    Raises LinkError where the interface has no such class."""
    with IPRoute(netns=end.netns) as ipr:
        classes = netlink_tc.read_classes(ipr, netlink.ifindex(ipr, end.ifname))
    if LINK_CLASS_MINOR not in classes:
        raise LinkError(f"{end.netns}/{end.ifname} has no link class 1:{LINK_CLASS_MINOR:x}")
    return int(classes[LINK_CLASS_MINOR]["rate_bps"])


def set_rate(ends: tuple[LinkEnd, LinkEnd], name: str, rate_bps: int, out_dir: Path | None) -> None:
    """Set link ``name``'s rate both ways to ``rate_bps`` in place (see the module doc), logged in
    ``out_dir``'s ``shaping.jsonl`` where given: each class's change, then one ``link_rate`` line
    (what a run's controllers follow: ``run/link_replan.py``). Raises LinkError for a rate below
    8 kbit/s or where the kernel refuses."""
    if rate_bps < 8000:
        raise LinkError(f"a rate of {rate_bps} bit/s is below 8 kbit/s: give a larger one (or take the link down)")
    classes = (
        HtbClass(LINK_CLASS_MINOR, 0, rate_bps, rate_bps),
        HtbClass(DEFAULT_CLASS_MINOR, LINK_CLASS_MINOR, rate_bps, rate_bps),
    )
    rows = []
    for end in ends:
        with IPRoute(netns=end.netns) as ipr:
            index = netlink.ifindex(ipr, end.ifname)
        sock = rtnl_raw.rtnl_socket(end.netns)
        try:
            t0 = time.monotonic_ns()
            try:
                rtnl_raw.send_batch(sock, b"".join(netlink_tc.class_change_message(index, c) for c in classes), 2)
            except OSError as e:
                raise LinkError(f"the kernel refused the rate change on {end.netns}/{end.ifname}: {e}") from None
            dt = time.monotonic_ns() - t0
        finally:
            sock.close()
        rows += [shaping_record(t0, "change", end.netns, end.ifname, c.minor, rate_bps, rate_bps, dt) for c in classes]
    rows.append({"t_ns": rows[0]["t_ns"], "event": LINK_RATE, "link": name, "rate_bps": rate_bps})
    if out_dir is not None:
        with open_jsonl(out_dir / SHAPING_LOG) as log:
            for row in rows:
                write_row(log, row)


@dataclass(frozen=True)
class LiveTopology:
    """A topology up on this machine: its run record, its spec and its folder."""

    record: RunRecord
    spec: TopologySpec
    out_dir: Path


def live_topologies() -> list[LiveTopology]:
    """Every run up on this machine (its owner alive) whose folder holds its ``topology.json``."""
    out = []
    for rec in list_runs():
        path = Path(rec.out_dir) / "topology.json"
        if not rec.owner_alive() or not path.exists():
            continue
        data = json.loads(path.read_text())
        out.append(LiveTopology(rec, TopologySpec.from_dict(data), Path(rec.out_dir)))
    return out


def find_topology(prefix: str | None) -> LiveTopology:
    """The live topology ``prefix`` names, or the only one up. Raises LinkError when there is none,
    when several are up and none is named (listing them), or for a backend whose routers are not
    on this machine."""
    live = live_topologies()
    if prefix is not None:
        live = [t for t in live if t.record.prefix == prefix]
        if not live:
            raise LinkError(f"no topology {prefix!r} is up on this machine (testbed topo list shows those that are)")
    if not live:
        raise LinkError("no topology is up on this machine: start one (testbed topo up, run, compare, launch)")
    if len(live) > 1:
        names = ", ".join(f"{t.record.prefix} ({t.spec.name})" for t in live)
        raise LinkError(f"several topologies are up ({names}): name one with --run PREFIX")
    topo = live[0]
    if topo.record.kind not in LOCAL_BACKENDS:
        raise LinkError(
            f"run {topo.record.prefix} uses the {topo.record.kind} backend: its routers are not on this machine"
        )
    return topo
