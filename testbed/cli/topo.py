"""``testbed topo show|check|up``: a topology described, measured, or kept up."""

from __future__ import annotations

import json
import sys
import time

from testbed.cli.common import network, root_preamble
from testbed.net.features import cached_features, describe_mechanism, require_tools
from testbed.net.fidelity import HEADER, check_fidelity, format_row
from testbed.net.shaping import plan_shaping
from testbed.net.shaping_text import tc_argv
from testbed.spec.addressing import AddressPlan
from testbed.spec.routing import RoutingTable
from testbed.spec.topology_file import load_topology
from testbed.spec.units import format_duration_us, format_rate


def cmd_topo_show(args) -> int:
    spec = load_topology(args.file)
    mech = args.delay_mechanism
    if mech == "auto":
        netem = cached_features().get("netem")
        mech = "nfqueue" if netem is False else "netem"
        note = "detected" if netem is not None else "assumed: run a root command once to detect"
        print(f"delay mechanism: {describe_mechanism(mech)} ({note})")
    plan, routes = AddressPlan(spec, "tbXXXX"), RoutingTable(spec)
    print(
        f"topology {spec.name} ({spec.source}): {len(spec.dcs)} DCs, {spec.host_count} hosts, {len(spec.links)} links"
    )
    for dc in spec.dcs:
        r = plan.routers[dc.name]
        extra = (
            f", access links {format_rate(dc.intra_rate_bps) if dc.intra_rate_bps else 'unshaped'} "
            f"{format_duration_us(dc.intra_delay_us)}"
        )
        print(f"  DC {dc.name}: subnet {r.subnet}, gateway {r.ip}{extra}")
        for h in plan.hosts_of(dc.name):
            print(f"    {h.name:<16} {h.ip}")
    for link in spec.links:
        print(
            f"  link {link.a} <-> {link.b}: {format_rate(link.rate_bps)}, one-way {format_duration_us(link.delay_us)}"
            f", jitter {format_duration_us(link.jitter_us)}, loss {link.loss_pct:g}%, queue {link.queue_packets} pkts"
        )
    print("routes (least total one-way delay):")
    for a in spec.dcs:
        for b in spec.dcs:
            if a.name != b.name:
                print(
                    f"  {a.name} -> {b.name}: {' -> '.join(routes.route(a.name, b.name).dcs)}, one-way "
                    f"{format_duration_us(routes.one_way_delay_us(a.name, b.name))} host to host"
                )
    if args.tc:
        shaping = plan_shaping(spec, plan, mech)
        for e in shaping.egress:
            print(f"# {e.netns} {e.ifname}")
            for argv in tc_argv(e):
                print("  " + " ".join(argv))
    return 0


def cmd_topo_check(args) -> int:
    spec = load_topology(args.file)
    root_preamble("testbed topo check")
    require_tools(["iperf3", "ping"], "the fidelity check")
    out = sys.stderr if args.json else sys.stdout
    with network(args, spec) as net:
        print(
            f"{spec.name}: built {len(net.plan.namespaces)} namespaces in {net.build_s:.2f} s; delay mechanism: "
            f"{describe_mechanism(net.mechanism)}; traces in {net.out_dir}",
            file=out,
            flush=True,
        )
        print(HEADER, file=out, flush=True)
        report = check_fidelity(
            net,
            args.duration,
            args.omit,
            args.rtt_samples,
            progress=lambda r: print(format_row(r), file=out, flush=True),
            attempts=args.attempts,
        )
        (net.out_dir / "fidelity.json").write_text(json.dumps(report, indent=1))
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        dropped = [f"{r['src_dc']}->{r['dst_dc']}" for r in report["links"] if r["queue_drops"]]
        print(
            f"fidelity {'ok' if report['ok'] else 'FAILED'}: rate within 5% of expected goodput, RTT within "
            f"max(1 ms, 5%)"
            + (
                f"; WAN queues dropped packets on {', '.join(dropped)} while measured (a queue below the "
                "path's bandwidth-delay product drops in slow start)"
                if dropped
                else ""
            )
            + f"; report in {net.out_dir / 'fidelity.json'}"
        )
    return 0 if report["ok"] else 1


def cmd_topo_up(args) -> int:
    spec = load_topology(args.file)
    root_preamble("testbed topo up")
    with network(args, spec) as net:
        print(
            f"{spec.name} is up ({net.build_s:.2f} s, run prefix {net.prefix}, delay mechanism: "
            f"{describe_mechanism(net.mechanism)}); logs in {net.out_dir}"
        )
        for h in net.hosts.values():
            machine = net.host_machine(h.name)
            where = f"on machine {machine}: " if machine else ""
            print(f"  {h.name:<16} {str(h.ip):<15} {where}ip netns exec {h.netns} ...")
        print("Ctrl-C to tear down.", flush=True)
        try:
            while True:
                time.sleep(0.5)
                net.check_alive()
        except KeyboardInterrupt:
            print("tearing down")
    return 0
