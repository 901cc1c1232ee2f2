#!/usr/bin/env python3
"""Benchmark of the emulated network (figures printed, nothing asserted).

- build and teardown time of a 4-DC x 8-host full mesh on the testbed's netns backend (goals:
  build < 3 s, teardown < 2 s on a 2-core VM), beside plain Mininet building and tearing down the
  same topology in the same run, interleaved with it (anchor: the issue measured Mininet's build at
  1.1 s and its teardown at 1.1 s), and the ratio testbed/Mininet;
- CPU of one read of every WAN class's counters, the link sampler's read while training (goal:
  p50 < 1 ms, so 10 reads a second take under 1% of a core), on a plain rtnetlink socket, beside
  pyroute2 reading the same classes (the anchor: what the sampler used before);
- latency of one live HTB rate change on a WAN class through netlink (goal: p99 < 0.5 ms): between
  two rates (a controller's case: the encoded message is remembered) and to a new rate every time
  (the message is packed first, netlink_tc.class_change_message); a link's change in both directions
  (``set_link_rate``: one batch per router); next to the tc command-line tool's time for the same
  change in the same run.

**Teardown is measured until the kernel has freed the run's namespaces**, not until the call
returns: removing a namespace's name (or ending the last process inside it) only queues it, and
the kernel unregisters its links, bridges and qdiscs later, in its netns workqueue (one batch of
namespaces at a time). The clock starts when the teardown call starts and stops when

1. every namespace of the run has been unhashed by the kernel: before the teardown each one is
   given a namespace id (nsid) in the root namespace, which holds no reference to it; the kernel
   drops that id when the batch that cleans the namespace up begins, that is once no name,
   process, socket or file descriptor holds it any more (the ids are read with a dump: asking for
   one id answers "none" as soon as nothing holds it, before its cleanup is even queued). A
   namespace that something still holds is never unhashed, so a teardown that leaves anything
   behind never finishes (it is reported after ``--free-timeout-s``);
2. and that cleanup has finished: a sentinel namespace of the benchmark's own, released only once
   step 1 is done, is cleaned up by the same ordered workqueue in a later batch, so when its id is
   dropped the run's links, addresses and qdiscs are gone and its namespaces freed.

``lsns -t net`` is not used: it lists namespaces through processes only (util-linux 2.38 here),
so it never sees the netns backend's named namespaces, it stops listing one before the kernel has
freed it, and it counts other users' namespaces on a shared machine. Neither topology below puts a
link in the root namespace, and the netns backend's ``/run/netns`` files are gone when the call
returns (checked), so these add no condition.

**The Mininet anchor** is Mininet's own API (``Mininet(topo).build()``, ``stop()``; no controller,
no switches, plain links) building ``mininet_topo.SpecTopo`` of the same topology: the same 36
namespaces, 38 veth pairs, 4 Linux bridges, addresses and routes as the netns backend, each
node a Mininet shell configured with ``ip`` commands. Like for like, it builds what the testbed
builds, by Mininet's means; the testbed's build additionally installs its shaping (HTB classes
on every WAN interface and the delay mechanism), which plain Mininet links lack. The testbed's
``--backend mininet`` is not the anchor: it is this plus the testbed's shaping and naming, the
testbed's cost on top of Mininet, not Mininet's. Its teardown is measured the same way (Mininet's
hosts are namespaces held by their shells). The issue's figures are kept as the anchor's
reference; what it built is not recorded, so the ratio uses the Mininet figures of the same run.
Mininet runs hold the testbed's Mininet lock: the benchmark waits for another Mininet run to end
rather than run beside it.

Run as root: .venv/bin/python scripts/bench_network.py [--repeat N] [--changes N] [--no-mininet]
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import statistics
import struct
import subprocess
import tempfile
import time
from pathlib import Path

from testbed.errors import BuildError, CheckError, FeatureError
from testbed.net import netlink, netlink_tc
from testbed.net.capacity_probe import machine_capacity_bps
from testbed.net.hostproc import netns_argv
from testbed.net.mininet_backend import BackendBusyError, MininetLock, import_mininet
from testbed.net.registry import RunRecord
from testbed.net.shaping import DEFAULT_CLASS_MINOR, LINK_CLASS_MINOR, HtbClass
from testbed.net.shaping_text import tc_class_argv
from testbed.run.backends import make_network
from testbed.run.interrupts import tears_down_on_signals
from testbed.spec.addressing import new_run_prefix
from testbed.spec.topology_file import parse_topology

#: Goals of the testbed and the issue's figures for Mininet, in seconds.
GOAL_BUILD_S, GOAL_TEARDOWN_S = 3.0, 2.0
#: CPU of one read of every WAN class's counters: 10 reads a second then take under 1% of a core
GOAL_COUNTERS_CPU_MS = 1.0
ANCHOR_BUILD_S, ANCHOR_TEARDOWN_S = 1.1, 1.1
#: How often the kernel's namespace ids are polled, and how long a busy Mininet lock is waited for.
POLL_S = 0.002
MININET_LOCK_WAIT_S = 300.0


def mesh(n_dcs: int, hosts: int):
    dcs = [{"name": f"dc{i}", "hosts": hosts} for i in range(n_dcs)]
    links = [
        {"between": [f"dc{i}", f"dc{j}"], "rate": "100mbit", "delay": f"{10 + 5 * (i + j)}ms"}
        for i in range(n_dcs)
        for j in range(i + 1, n_dcs)
    ]
    return parse_topology({"name": f"mesh{n_dcs}x{hosts}", "dcs": dcs, "links": links}, "<bench>")


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] if len(values) > 1 else values[0]


class NsidTable:
    """The root namespace's ids for other namespaces (nsids; rtnetlink(7), RTM_NEWNSID and
    RTM_GETNSID), through a plain rtnetlink socket. The ids are read with a dump, which lists an id
    until the kernel unhashes it; asking for one id (pyroute2's ``get_netnsid(nsid=...)``) answers
    ENOENT as soon as nothing holds the namespace, before its cleanup has even begun."""

    RTM_NEWNSID, RTM_GETNSID = 88, 90
    NETNSA_NSID, NETNSA_PID, NETNSA_FD = 1, 2, 3
    NLMSG_ERROR, NLMSG_DONE = 2, 3
    NLM_F_REQUEST, NLM_F_ACK, NLM_F_DUMP = 0x1, 0x4, 0x300

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
        self.sock.bind((0, 0))
        self.seq = 0

    def _request(self, msg_type: int, flags: int, attrs: list[tuple[int, bytes]]) -> list[dict[int, bytes]]:
        """Send one request; return the attributes of each message of the answer. Raises OSError
        with the kernel's errno."""
        self.seq += 1
        body = struct.pack("Bxxx", socket.AF_UNSPEC)  # struct rtgenmsg, aligned to 4
        for kind, value in attrs:
            body += struct.pack("HH", 4 + len(value), kind) + value + b"\0" * (-len(value) % 4)
        self.sock.send(struct.pack("IHHII", 16 + len(body), msg_type, flags, self.seq, 0) + body)
        out: list[dict[int, bytes]] = []
        while True:
            data, off = self.sock.recv(1 << 16), 0
            while off + 16 <= len(data):
                length, kind, _, seq, _ = struct.unpack_from("IHHII", data, off)
                if seq == self.seq:
                    if kind == self.NLMSG_ERROR:
                        code = struct.unpack_from("i", data, off + 16)[0]
                        if code:
                            raise OSError(-code, os.strerror(-code))
                        return out
                    if kind == self.NLMSG_DONE:
                        return out
                    msg_attrs, a = {}, off + 20
                    while a + 4 <= off + length:
                        alen, akind = struct.unpack_from("HH", data, a)
                        msg_attrs[akind & 0x3FFF] = data[a + 4 : a + alen]
                        a += (alen + 3) & ~3
                    out.append(msg_attrs)
                    if not flags & self.NLM_F_DUMP and not flags & self.NLM_F_ACK:
                        return out
                off += (length + 3) & ~3

    def assign(self, nsid: int, target: tuple[int, int]) -> None:
        """Give the namespace ``target`` (``(NETNSA_FD, fd)`` or ``(NETNSA_PID, pid)``) the id
        ``nsid`` here. Raises OSError (EEXIST: it has an id, or ``nsid`` is taken)."""
        attrs = [(self.NETNSA_NSID, struct.pack("i", nsid)), (target[0], struct.pack("I", target[1]))]
        self._request(self.RTM_NEWNSID, self.NLM_F_REQUEST | self.NLM_F_ACK, attrs)

    def id_of(self, target: tuple[int, int]) -> int:
        """The id the namespace ``target`` has here (-1: none)."""
        answer = self._request(self.RTM_GETNSID, self.NLM_F_REQUEST, [(target[0], struct.pack("I", target[1]))])
        return struct.unpack("i", answer[0][self.NETNSA_NSID])[0]

    def ids(self) -> set[int]:
        """Every id given here to a namespace whose cleanup has not begun."""
        answer = self._request(self.RTM_GETNSID, self.NLM_F_REQUEST | self.NLM_F_DUMP, [])
        return {struct.unpack("i", m[self.NETNSA_NSID])[0] for m in answer if self.NETNSA_NSID in m}

    def close(self) -> None:
        self.sock.close()


class KernelRelease:
    """Waits until the kernel has freed some network namespaces (the module docstring's steps 1
    and 2). The sentinel namespace is listed in ``record``, so ``testbed clean`` removes it if the
    benchmark dies."""

    def __init__(self, record: RunRecord) -> None:
        self.table = NsidTable()
        self.sentinel = f"{record.prefix}-free"
        record.add_namespaces([self.sentinel])
        self.watched: dict[int, str] = {}  # nsid in the root namespace -> what it names
        self._sentinel_id = -1
        self._next = random.randrange(1 << 24, 1 << 30)  # far above the ids the kernel picks itself

    def watch(self, what: str, *, path: str | None = None, pid: int | None = None) -> int:
        """Watch the namespace at ``path`` (a /run/netns file) or of process ``pid``; returns its id."""
        fd = os.open(path, os.O_RDONLY) if path else None
        target = (NsidTable.NETNSA_FD, fd) if fd is not None else (NsidTable.NETNSA_PID, pid or 0)
        try:
            for _ in range(10):
                self._next += 1
                try:
                    self.table.assign(self._next, target)
                except FileExistsError:
                    pass  # it has an id already (kept), or this id is taken (try the next)
                nsid = self.table.id_of(target)
                if nsid >= 0:
                    break
        finally:
            if fd is not None:
                os.close(fd)
        if nsid < 0:
            raise CheckError(f"could not give {what}'s namespace an id in the root namespace")
        self.watched[nsid] = what
        return nsid

    def arm(self) -> None:
        """Create the sentinel namespace and watch it (before the teardown: not timed)."""
        netlink.remove_netns(self.sentinel)  # one a failed wait left
        netlink.create_netns(self.sentinel, {}).close()
        self._sentinel_id = self.watch("the sentinel", path=f"/run/netns/{self.sentinel}")

    def _wait_unhashed(self, nsids: set[int], deadline: float, timeout_s: float) -> None:
        while held := nsids & self.table.ids():
            if time.monotonic() > deadline:
                names = ", ".join(sorted(self.watched[n] for n in held))
                raise CheckError(
                    f"{len(held)} namespace(s) not freed {timeout_s:g} s after the teardown started (still "
                    f"held by a name, a process, a socket or a descriptor): {names}"
                )
            time.sleep(POLL_S)

    def wait(self, timeout_s: float) -> None:
        """Return once every watched namespace is freed (step 1, then step 2); CheckError after
        ``timeout_s``. Forgets them and consumes the sentinel (``arm`` again for the next run)."""
        deadline = time.monotonic() + timeout_s
        try:
            self._wait_unhashed(set(self.watched) - {self._sentinel_id}, deadline, timeout_s)
            netlink.remove_netns(self.sentinel)  # queued behind them on the ordered netns workqueue
            self._wait_unhashed({self._sentinel_id}, deadline, timeout_s)
        finally:
            self.watched.clear()

    def close(self) -> None:
        netlink.remove_netns(self.sentinel)
        self.table.close()


class Timings:
    """One network's builds and teardowns, in seconds."""

    def __init__(self) -> None:
        self.build: list[float] = []
        self.returned: list[float] = []  # until the teardown call returned
        self.freed: list[float] = []  # until the kernel had freed everything (the honest figure)


def time_testbed(spec, out_dir: Path, release: KernelRelease, timeout_s: float, into: Timings) -> None:
    net = make_network(spec, out_dir=out_dir)
    t0 = time.perf_counter()
    with net:
        t1 = time.perf_counter()
        for ns in net.namespaces:
            release.watch(ns, path=f"/run/netns/{ns}")
        release.arm()
        t2 = time.perf_counter()
    t3 = time.perf_counter()
    left = [ns for ns in net.namespaces if os.path.exists(f"/run/netns/{ns}")]
    if left:
        raise BuildError(f"the teardown returned with {len(left)} namespace name(s) left: {', '.join(left)}")
    release.wait(timeout_s)
    t4 = time.perf_counter()
    into.build.append(t1 - t0)
    into.returned.append(t3 - t2)
    into.freed.append(t4 - t2)


def time_mininet(mnet, spec, record: RunRecord, release: KernelRelease, timeout_s: float, into: Timings) -> None:
    # mininet_topo's classes subclass Mininet's: imported once Mininet is known to be here
    from testbed.net.mininet_topo import build_topo

    lock = MininetLock(record.prefix)
    deadline = time.monotonic() + MININET_LOCK_WAIT_S
    while True:
        try:
            lock.acquire()
            break
        except BackendBusyError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    try:
        # as the Mininet backend does: Mininet.init() would raise the root namespace's limits
        mnet.Mininet.inited = True
        mn = mnet.Mininet(
            topo=build_topo(spec, record.prefix),
            build=False,
            controller=None,
            autoSetMacs=False,
            autoStaticArp=False,
            inNamespace=False,
            waitConnected=False,
        )
        t0 = time.perf_counter()
        try:
            mn.build()
            t1 = time.perf_counter()
            for node in mn.hosts:  # so that testbed clean stops the shells if the benchmark dies
                record.add_process(node.pid, f"mininet shell of {node.name} (bench)")
            for node in mn.hosts:
                release.watch(node.name, pid=node.pid)
            release.arm()
        finally:
            t2 = time.perf_counter()
            mn.stop()
            t3 = time.perf_counter()
        release.wait(timeout_s)
        t4 = time.perf_counter()
        for node in mn.hosts:
            record.forget_process(node.pid)
    finally:
        lock.release()
    into.build.append(t1 - t0)
    into.returned.append(t3 - t2)
    into.freed.append(t4 - t2)


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b > 0 else "-"


def print_timings(label: str, t: Timings, build_note: str, teardown_note: str) -> None:
    med = statistics.median
    print(f"  {label}")
    print(f"    build                         median {med(t.build):.3f} s  max {max(t.build):.3f} s  ({build_note})")
    print(f"    teardown until kernel freed   median {med(t.freed):.3f} s  max {max(t.freed):.3f} s  ({teardown_note})")
    print(f"    teardown until call returned  median {med(t.returned):.3f} s  max {max(t.returned):.3f} s")


def bench_build_teardown(spec, args: argparse.Namespace, tmp: Path) -> None:
    mnet, why_not = None, "--no-mininet"
    if not args.no_mininet:
        try:
            mnet = import_mininet()
        except FeatureError as e:
            why_not = str(e)
    record = RunRecord.new(new_run_prefix(), kind="bench", out_dir=str(tmp))
    release = KernelRelease(record)
    testbed, mininet = Timings(), Timings()
    try:
        warm = make_network(spec, out_dir=tmp / "warm")
        with warm:  # first build may measure the machine's capacity; not counted
            mechanism = warm.mechanism
        machine_capacity_bps(mechanism)
        if mnet is not None:  # Mininet's first build too (imports, page cache); not counted
            time_mininet(mnet, spec, record, release, args.free_timeout_s, Timings())
        for i in range(args.repeat):  # interleaved, so that the machine's load weighs on both alike
            time_testbed(spec, tmp / f"b{i}", release, args.free_timeout_s, testbed)
            if mnet is not None:
                time_mininet(mnet, spec, record, release, args.free_timeout_s, mininet)
    finally:
        release.close()
        record.delete()

    print(
        f"topology {spec.name}: {len(spec.dcs)} DCs x 8 hosts, {len(spec.links)} WAN links, "
        f"{len(spec.dcs) + spec.host_count} namespaces; {args.repeat} builds and teardowns each, interleaved"
    )
    print_timings(
        f"testbed, netns backend (with its shaping, delay mechanism {mechanism})",
        testbed,
        f"goal < {GOAL_BUILD_S:g} s",
        f"goal < {GOAL_TEARDOWN_S:g} s",
    )
    if mnet is None:
        print(f"  Mininet: not measured ({why_not})")
        return
    print_timings(
        f"Mininet {mnet.VERSION}, same topology through its own API (no controller, no switches, plain links)",
        mininet,
        f"anchor: the issue measured {ANCHOR_BUILD_S:g} s",
        f"anchor: the issue measured {ANCHOR_TEARDOWN_S:g} s",
    )
    med = statistics.median
    print(
        f"  testbed/Mininet  build {ratio(med(testbed.build), med(mininet.build))} (median), "
        f"{ratio(max(testbed.build), max(mininet.build))} (max);  "
        f"teardown until kernel freed {ratio(med(testbed.freed), med(mininet.freed))} (median), "
        f"{ratio(max(testbed.freed), max(mininet.freed))} (max)"
    )


def timed_ms(call, n: int, clock=time.perf_counter_ns) -> list[float]:
    """Milliseconds each of ``n`` calls ``call(i)`` took on ``clock`` (wall time; with
    ``time.process_time_ns``, this process's CPU)."""
    out = []
    for i in range(n):
        t0 = clock()
        call(i)
        out.append((clock() - t0) / 1e6)
    return out


def bench_rate_changes(spec, args: argparse.Namespace, tmp: Path) -> None:
    with make_network(spec, out_dir=tmp / "live") as net:
        rates = [20_000_000, 80_000_000]
        shaping = net.shaping
        two = timed_ms(
            lambda i: shaping.set_wan_class_rate("dc0", "dc1", DEFAULT_CLASS_MINOR, rates[i % 2]), args.changes
        )
        new = timed_ms(
            lambda i: shaping.set_wan_class_rate("dc0", "dc1", DEFAULT_CLASS_MINOR, 30_000_000 + 1000 * i), args.changes
        )
        link = timed_ms(lambda i: shaping.set_link_rate("dc0", "dc1", 40_000_000 + 1000 * i), args.changes)
        router = net.plan.routers["dc0"].netns
        ifname = net.plan.wan_ends[("dc0", "dc1")].ifname

        def tc_change(i: int) -> None:
            cls = HtbClass(DEFAULT_CLASS_MINOR, LINK_CLASS_MINOR, rates[i % 2], rates[i % 2])
            subprocess.run(netns_argv(router, tc_class_argv(ifname, cls, "change")), check=True)

        tc = timed_ms(tc_change, args.tc_changes)
        counters = timed_ms(lambda i: net.wan_counters(), args.changes, time.process_time_ns)
        handles, ends = net.handles, list(net.plan.wan_ends.items())

        def pyroute2_counters(i: int) -> None:
            for (src, _), end in ends:
                ns = net.plan.routers[src].netns
                netlink_tc.read_classes(handles.ipr(ns), handles.ifindex(ns, end.ifname))

        anchor = timed_ms(pyroute2_counters, args.changes, time.process_time_ns)
    print("live rate change (dc0->dc1), each including its shaping-log write:")
    for label, values, goal in (
        ("one class, two rates", two, "goal p99 < 0.5 ms"),
        ("one class, new rate", new, "goal p99 < 0.5 ms; the message is packed first"),
        ("link, both directions", link, "four classes, new rate, one batch per router"),
        ("tc tool (nsenter)", tc, "anchor"),
    ):
        print(f"  {label:<22} n={len(values):5d}  p50 {pct(values, 50):.3f} ms  p99 {pct(values, 99):.3f} ms  ({goal})")
    print(f"WAN counters of all {len(ends)} WAN egresses (the link sampler's read, 10 a second while training), CPU:")
    for label, values, goal in (
        ("plain socket", counters, f"goal p50 < {GOAL_COUNTERS_CPU_MS:g} ms: under 1% of a core"),
        ("pyroute2", anchor, "anchor: netlink_tc.read_classes, what the sampler used before"),
    ):
        print(f"  {label:<22} n={len(values):5d}  p50 {pct(values, 50):.3f} ms  p99 {pct(values, 99):.3f} ms  ({goal})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5, help="builds and teardowns of each network (default 5)")
    ap.add_argument("--changes", type=int, default=1000)
    ap.add_argument("--tc-changes", type=int, default=100)
    ap.add_argument("--no-mininet", action="store_true", help="measure the testbed only")
    ap.add_argument(
        "--free-timeout-s",
        type=float,
        default=30.0,
        help="give up waiting for the kernel to free a teardown's namespaces after this long (default 30)",
    )
    args = ap.parse_args()
    spec = mesh(4, 8)
    with tempfile.TemporaryDirectory() as tmp:
        bench_build_teardown(spec, args, Path(tmp))
        bench_rate_changes(spec, args, Path(tmp))


if __name__ == "__main__":
    with tears_down_on_signals():  # SIGTERM, SIGHUP and Ctrl-C tear the network down
        main()
