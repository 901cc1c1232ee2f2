"""``testbed topo show|check|up|regions``: a topology described, measured, kept up, or written from
real cloud regions."""

from __future__ import annotations

import json
import sys
import time

from testbed.cli.common import err, network, root_preamble
from testbed.errors import TestbedError
from testbed.net.features import cached_features, describe_mechanism, require_tools
from testbed.net.fidelity import HEADER, check_fidelity, format_row
from testbed.net.link_control import LinkError, resolve_link
from testbed.net.shaping import plan_shaping
from testbed.net.shaping_text import tc_argv
from testbed.spec.addressing import AddressPlan
from testbed.spec.dilation import dilate_topology
from testbed.spec.regions import dc_name, regions_topology
from testbed.spec.regions_table import RegionError, load_regions_table
from testbed.spec.routing import RoutingTable
from testbed.spec.topology import TopologySpec
from testbed.spec.topology_file import load_topology
from testbed.spec.units import UnitError, format_duration_us, format_rate, parse_rate_bps


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


def _check_profiles(net, args, out) -> int:
    """``topo check --profile``: the profiled links under change (``net/profile_check.py``)."""
    from testbed.net.profile_check import RATE_TOLERANCE, check_profile

    results = check_profile(net, args.duration)
    report = {"links": [r.to_dict() for r in results], "ok": all(r.ok for r in results)}
    (net.out_dir / "profile_check.json").write_text(json.dumps(report, indent=1))
    if args.json:
        print(json.dumps(report, indent=1))
        return 0 if report["ok"] else 1
    for r in results:
        print(
            f"{r.link} ({r.src} -> {r.dst}, one way {r.one_way_s * 1e3:.1f} ms): {r.intervals} intervals of 100 ms, "
            f"worst {r.worst_excess:+.1%} over the profile's rate, {len(r.over)} over {RATE_TOLERANCE:.0%}: "
            f"{'ok' if r.rate_ok else 'FAILED'}",
            file=out,
        )
        for lag in r.lags:
            took = "not sampled"
            if lag["lag_s"] is not None:
                took = f"{lag['lag_s'] * 1e3:+.1f} ms (+-{lag['lag_uncertainty_s'] * 1e3:.1f} ms) from when it was due"
            if lag.get("applied_s") is not None:
                began, made = (x * 1e3 for x in lag["applied_s"])
                took += f"; the shaper made it {began:+.1f} to {made:+.1f} ms"
            print(f"  drop at {lag['t_s']:g} s to {lag['to_bps'] / 1e6:g} Mbit/s: delivered rate changed {took}")
        for p in r.rtts:
            print(
                f"  from {p['from_s']:g} s: least RTT {p['least_ms']:.1f} ms, expected {p['expected_ms']:.1f} ms "
                f"({p['pings']} pings): {'ok' if p['ok'] else 'FAILED'}"
            )
    print(f"fidelity under change {'ok' if report['ok'] else 'FAILED'}; report in {net.out_dir / 'profile_check.json'}")
    return 0 if report["ok"] else 1


def _loaded(args) -> TopologySpec:
    """The topology ``args.file`` names, dilated by ``--dilation`` where given (``spec/dilation.py``)."""
    return dilate_topology(load_topology(args.file), args.dilation or 1)


def cmd_topo_check(args) -> int:
    spec = _loaded(args)
    if args.dilation and args.profile:
        err("error: --dilation: topo check --profile measures in real time only; check the profile undilated")
        return 2
    if args.link and args.profile:
        err("error: --link: topo check --profile checks every profiled link; --link is for the plain check")
        return 2
    try:  # a link the topology has not is named before anything is built
        for name in args.link:
            resolve_link(spec, name)
    except LinkError as e:
        err(f"error: --link: {e}")
        return 2
    root_preamble("testbed topo check")
    require_tools(["iperf3", "ping"], "the fidelity check")
    out = sys.stderr if args.json else sys.stdout
    with network(args, spec) as net:
        print(
            f"{spec.name}: built {len(net.plan.namespaces)} namespaces in {net.build_s:.2f} s; delay mechanism: "
            f"{describe_mechanism(net.mechanism)}; traces in {net.out_dir}"
            + (f"; dilated x{args.dilation:g}: figures in the emulated frame" if args.dilation else ""),
            file=out,
            flush=True,
        )
        if args.profile:
            return _check_profiles(net, args, out)
        print(HEADER, file=out, flush=True)
        report = check_fidelity(
            net,
            args.duration,
            args.omit,
            args.rtt_samples,
            progress=lambda r: print(format_row(r), file=out, flush=True),
            attempts=args.attempts,
            links=args.link,
            dilation=args.dilation or 1,
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
    spec = _loaded(args)
    root_preamble("testbed topo up")
    with network(args, spec) as net:
        print(
            f"{spec.name} is up ({net.build_s:.2f} s, run prefix {net.prefix}, delay mechanism: "
            f"{describe_mechanism(net.mechanism)}); logs in {net.out_dir}"
        )
        if args.dilation:
            print(
                f"  dilated x{args.dilation:g}: every link's rate / {args.dilation:g}, its delays x {args.dilation:g}"
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


def cmd_topo_regions(args) -> int:
    """Print (or write to ``--out``) a topology of real cloud regions (``spec/regions.py``)."""
    if args.list:
        table = load_regions_table()
        print(f"{'region':<32} {'DC name':<8} measured (Skyplane 2022, {table.source})")
        for name in table.names:
            measured = [
                what
                for what, has in (
                    ("RTT", table.has_rtt(name)),
                    ("throughput", any(table.throughput_bps(name, n) for n in table.names if n != name)),
                )
                if has
            ]
            print(f"{name:<32} {dc_name(name):<8} {', '.join(measured)}")
        return 0
    if len(args.regions) < 2:
        raise RegionError(
            f"{len(args.regions)} region given: name at least two, such as aws:us-east-1 gcp:europe-west4-a "
            "(testbed topo regions --list prints them all)"
        )
    rate = None
    if args.unmeasured_rate is not None:
        try:
            rate = parse_rate_bps(args.unmeasured_rate)
        except UnitError as e:
            raise RegionError(f"--unmeasured-rate {args.unmeasured_rate!r} {e}") from None
    topo = regions_topology(args.regions, args.scale, args.hosts, args.name, rate)
    text = topo.to_yaml()
    if args.out is None:
        print(text, end="")
    else:
        try:
            args.out.write_text(text)
        except OSError as e:
            raise TestbedError(f"cannot write {args.out}: {e.strerror}; give -o a path in a writable folder") from None
        err(f"wrote {args.out}: {topo.name}, {len(topo.dcs)} DCs, {len(topo.links)} links")
    err(
        f"rates are the measured goodput x {topo.scale:g} ({', '.join(format_rate(k.rate_bps) for k in topo.links)}): "
        "this emulator cannot run links at tens of Gbit/s; delays are as measured"
    )
    return 0
