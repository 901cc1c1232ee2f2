"""The ``testbed`` command line. Scripts and this module stay thin: they parse and call the package."""
from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
from pathlib import Path

from .errors import SpecError, TestbedError
from .experiment import POLICIES, known_policies
from .features import DELAY_MECHANISMS, cached_features, describe_mechanism, missing_tools, require_root
from .topology import DEFAULT_TOPOLOGY, load_topology


def _err(msg: str) -> None:
    print(f"testbed: {msg}", file=sys.stderr, flush=True)


def _on_sigterm(signum, frame) -> None:
    _err(f"{signal.Signals(signum).name}: tearing down")
    raise SystemExit(128 + signum)


def _root_preamble(what: str) -> None:
    require_root(what)
    from .emulation import warn_stale_runs

    warning = warn_stale_runs()
    if warning:
        _err(f"warning: {warning}")


def _emulation(args, spec):
    from .backends import make_emulation

    return make_emulation(spec, delay_mechanism=args.delay_mechanism, out_dir=args.out, **_backend(args))


def _backend(args) -> dict:
    """``--backend`` and ``--inventory`` as keyword arguments of make_emulation/run_experiment."""
    from .backends import check_backend_options

    check_backend_options(args.backend, args.inventory)
    return {"backend": args.backend, "inventory": args.inventory}


def _backend_options(sp) -> None:
    from .backends import BACKENDS

    sp.add_argument("--backend", choices=BACKENDS, default="netns",
                    help="what builds the network: netns (pyroute2, default), mininet (Mininet's Python API), "
                         "remote (machines over SSH, with --inventory)")
    sp.add_argument("--inventory", type=Path, metavar="FILE", help="machines of --backend remote (YAML)")


def cmd_topo_show(args) -> int:
    from .addressing import AddressPlan
    from .routing import RoutingTable
    from .shaping import plan_shaping, tc_argv
    from .units import format_duration_us, format_rate

    spec = load_topology(args.file)
    mech = args.delay_mechanism
    if mech == "auto":
        netem = cached_features().get("netem")
        mech = "nfqueue" if netem is False else "netem"
        note = "detected" if netem is not None else "assumed: run a root command once to detect"
        print(f"delay mechanism: {describe_mechanism(mech)} ({note})")
    plan, routes = AddressPlan(spec, "tbXXXX"), RoutingTable(spec)
    print(f"topology {spec.name} ({spec.source}): {len(spec.dcs)} DCs, {spec.host_count} hosts, {len(spec.links)} links")
    for dc in spec.dcs:
        r = plan.routers[dc.name]
        extra = f", access links {format_rate(dc.intra_rate_bps) if dc.intra_rate_bps else 'unshaped'} " \
                f"{format_duration_us(dc.intra_delay_us)}"
        print(f"  DC {dc.name}: subnet {r.subnet}, gateway {r.ip}{extra}")
        for h in plan.hosts_of(dc.name):
            print(f"    {h.name:<16} {h.ip}")
    for link in spec.links:
        print(f"  link {link.a} <-> {link.b}: {format_rate(link.rate_bps)}, one-way {format_duration_us(link.delay_us)}"
              f", jitter {format_duration_us(link.jitter_us)}, loss {link.loss_pct:g}%, queue {link.queue_packets} pkts")
    print("routes (least total one-way delay):")
    for a in spec.dcs:
        for b in spec.dcs:
            if a.name != b.name:
                print(f"  {a.name} -> {b.name}: {' -> '.join(routes.route(a.name, b.name).dcs)}, one-way "
                      f"{format_duration_us(routes.one_way_delay_us(a.name, b.name))} host to host")
    if args.tc:
        shaping = plan_shaping(spec, plan, mech)
        for e in shaping.egress:
            print(f"# {e.netns} {e.ifname}")
            for argv in tc_argv(e):
                print("  " + " ".join(argv))
    return 0


def cmd_topo_check(args) -> int:
    from .fidelity import HEADER, check_fidelity, format_row
    from .features import require_tools

    spec = load_topology(args.file)
    _root_preamble("testbed topo check")
    require_tools(["iperf3", "ping"], "the fidelity check")
    out = sys.stderr if args.json else sys.stdout
    with _emulation(args, spec) as emu:
        print(f"{spec.name}: built {len(emu.plan.namespaces)} namespaces in {emu.build_s:.2f} s; delay mechanism: "
              f"{describe_mechanism(emu.mechanism)}; traces in {emu.out_dir}", file=out, flush=True)
        print(HEADER, file=out, flush=True)
        report = check_fidelity(emu, args.duration, args.omit, args.rtt_samples,
                                progress=lambda r: print(format_row(r), file=out, flush=True))
        (emu.out_dir / "fidelity.json").write_text(json.dumps(report, indent=1))
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(f"fidelity {'ok' if report['ok'] else 'FAILED'}: rate within 5% of expected goodput, RTT within "
              f"max(1 ms, 5%); report in {emu.out_dir / 'fidelity.json'}")
    return 0 if report["ok"] else 1


def cmd_topo_up(args) -> int:
    spec = load_topology(args.file)
    _root_preamble("testbed topo up")
    with _emulation(args, spec) as emu:
        print(f"{spec.name} is up ({emu.build_s:.2f} s, run prefix {emu.prefix}, delay mechanism: "
              f"{describe_mechanism(emu.mechanism)}); logs in {emu.out_dir}")
        for h in emu.hosts.values():
            where = f"on machine {emu.machine_of_host(h.name).name}: " if emu.backend == "remote" else ""
            print(f"  {h.name:<16} {str(h.ip):<15} {where}ip netns exec {h.netns} ...")
        print("Ctrl-C to tear down.", flush=True)
        try:
            while True:
                time.sleep(0.5)
                emu.check_alive()
        except KeyboardInterrupt:
            print("tearing down")
    return 0


def cmd_clean(args) -> int:
    from .registry import clean_run, list_runs

    require_root("testbed clean")
    runs = [r for r in list_runs() if args.run is None or r.prefix == args.run]
    targets = [r for r in runs if args.all or not r.owner_alive()]
    for r in runs:
        if r not in targets:
            print(f"run {r.prefix} is still running (pid {r.owner_pid}): left alone (use --all to remove it too)")
    if not targets:
        print("nothing to clean")
    for r in targets:
        if args.dry_run:
            print(f"would remove run {r.prefix}: {len(r.namespaces)} namespaces, {len(r.processes)} processes")
            continue
        if r.kind == "remote":
            from .remote_backend import clean_remote_run

            notes = clean_remote_run(r)
            for note in notes:
                print(f"run {r.prefix}: {note}")
            if any(note.startswith("could not") for note in notes) and not args.forget:
                print(f"run {r.prefix}: kept in the registry; run 'testbed clean' again once the machines are "
                      f"reachable, or 'testbed clean --run {r.prefix} --forget' if they are gone for good")
                continue
        removed = clean_run(r)
        print(f"removed run {r.prefix}: {len(removed['namespaces'])} namespaces, "
              f"{len(removed['processes'])} processes")
    return 0


def cmd_doctor(args) -> int:
    from .capacity import CACHE, machine_capacity_bps
    from .delay_element import build_helper
    from .units import format_rate

    _root_preamble("testbed doctor")
    missing = missing_tools(["nsenter", "iperf3", "ping", "iptables-restore", "tc"])
    print("tools: " + ("all present" if not missing else "missing " + ", ".join(missing)))
    print(f"delay element: {build_helper()}")
    from .mininet_backend import mininet_status, openvswitch_status

    print(f"mininet (--backend mininet): {mininet_status()}")
    print(f"Open vSwitch: {openvswitch_status()} (the mininet backend uses none: hosts link straight to a "
          "bridge in their DC router)")
    from .capacity import PROBE
    from .emulation import Emulation
    from .topology import parse_topology

    with tempfile.TemporaryDirectory() as tmp:
        with Emulation(parse_topology(PROBE, "<probe>"), out_dir=Path(tmp), check_capacity=False,
                       delay_mechanism=args.delay_mechanism) as emu:
            mech = emu.mechanism
    print(f"sch_netem: {'present' if cached_features().get('netem') else 'absent'}")
    print(f"delay mechanism: {describe_mechanism(mech)}")
    cap, cached = machine_capacity_bps(mech)
    print(f"capacity through {mech}: {format_rate(round(cap, -6))} ({'cached in ' + str(CACHE) if cached else 'measured now'})")
    return 1 if missing else 0


def _number(lo: float, hi: float, kind=float):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{text} is outside {lo:g}..{hi:g}")
        return value
    return parse


def _bubbletea_options(sp) -> None:
    g = sp.add_argument_group("BubbleTea (policies ending in +bubbletea)")
    g.add_argument("--requests", type=Path, metavar="FILE",
                   help="Azure LLM inference trace CSV (TIMESTAMP,ContextTokens,GeneratedTokens); default: a "
                        "synthetic stream fitted to that trace")
    g.add_argument("--request-rate", type=_number(0.001, 1000, float), metavar="R",
                   help="synthetic requests per second (default: the experiment's, 4)")
    g.add_argument("--time-scale", type=_number(0.0001, 10000, float), help="multiply the trace's arrival times")
    g.add_argument("--rate-factor", type=_number(0.0001, 10000, float), help="divide the trace's arrival times")
    g.add_argument("--no-decode", action="store_true", help="decode hosts record TTFT but run no decode steps")


def cmd_run(args) -> int:
    from .experiment import load_experiment
    from .report import format_summary
    from .runner import run_experiment

    exp = load_experiment(args.experiment).with_overrides(
        iterations=args.iterations, microbatches=args.microbatches, topology=args.topology, schedule=args.schedule,
        stages=args.stages, replicas=args.replicas, data=str(args.data) if args.data else None,
        policy=args.policy)
    exp = _bubbletea_overrides(exp, args)
    _root_preamble("testbed run")
    out = args.out or Path("results") / f"{exp.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    summary = run_experiment(exp, out, delay_mechanism=args.delay_mechanism,
                             progress=lambda line: print(line, flush=True), **_backend(args))
    print(format_summary(summary))
    return 0


def _bubbletea_overrides(exp, args):
    """--requests FILE, --request-rate R, --no-decode, --time-scale, --rate-factor."""
    from dataclasses import replace

    changes = {}
    if getattr(args, "requests", None):
        if not args.requests.is_file():
            raise SpecError("--requests", "(option)", str(args.requests), "is not a file",
                            "give a CSV of the Azure LLM inference trace format (TIMESTAMP,ContextTokens,GeneratedTokens)")
        changes["requests"] = str(args.requests)
    for key in ("request_rate", "time_scale", "rate_factor"):
        if getattr(args, key, None) is not None:
            changes[key] = getattr(args, key)
    if getattr(args, "no_decode", False):
        changes["decode"] = False
    return exp.with_overrides(bubbletea=replace(exp.bubbletea, **changes)) if changes else exp


def cmd_compare(args) -> int:
    from .compare import compare, format_comparison
    from .experiment import load_experiment

    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    bad = [p for p in policies if p not in known_policies()]
    if bad or not policies:
        raise SpecError("--policies", "(option)", args.policies, "names an unknown policy" if bad else "is empty",
                        f"use a comma-separated list of {', '.join(POLICIES)}, each optionally followed by +bubbletea")
    exp = _bubbletea_overrides(load_experiment(args.experiment).with_overrides(iterations=args.iterations), args)
    _root_preamble("testbed compare")
    out = args.out or Path("results") / f"compare-{exp.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    result = compare(exp, policies, out, args.repeat, args.delay_mechanism, progress=lambda line: print(line, flush=True),
                     **_backend(args))
    print(format_comparison(result))
    print(f"comparison.json and run folders in {out}")
    return 0


def cmd_plan(args) -> int:
    from .experiment import load_experiment
    from .placement import place
    from .planner import alternatives, predict, what_if

    exp = load_experiment(args.experiment)
    topo = load_topology(exp.topology)
    print(f"{exp.name} on {topo.name}: global batch {exp.global_batch} sequences of {exp.model.seq_len} tokens, "
          f"microbatch {exp.microbatch_size}; compute {exp.compute.forward_ms:g}/{exp.compute.backward_ms:g} ms per "
          f"stage of {exp.model.n_layers // exp.stages} blocks")
    for policy in POLICIES:
        try:
            workers = place(exp, topo, policy)
        except SpecError as e:
            print(f"  {policy}: infeasible: {e.problem}")
            continue
        p = predict(exp.with_overrides(policy=policy), topo, workers)
        where = ", ".join(f"s{w.stage}r{w.replica}@{w.host}" for w in workers)
        print(f"  {policy}: predicted {p.iteration_s:.3f} s (fill {p.fill_s:.3f}, steady {p.steady_s:.3f}, "
              f"all-reduce {p.allreduce_s:.3f}); {where}")
    plans = alternatives(exp, topo)
    print("plans weighed (same global batch and microbatch size; Atlas placement, largest DCs first):")
    print(f"  {'stages':>6} {'replicas':>8} {'microbatches':>12} {'DCs':>4} {'predicted s':>12}")
    for p in plans[: args.top]:
        if p.prediction:
            print(f"  {p.stages:>6} {p.replicas:>8} {p.microbatches:>12} {p.prediction.dcs_used:>4} "
                  f"{p.prediction.iteration_s:>12.3f}")
        else:
            print(f"  {p.stages:>6} {p.replicas:>8} {p.microbatches:>12} {'-':>4} {'infeasible':>12}  ({p.why_not})")
    best, more = what_if(plans)
    if best:
        if more:
            verdict = "helps" if more.prediction.iteration_s < best.prediction.iteration_s else "does not help"
            print(f"what-if: the best plan uses {best.prediction.dcs_used} DC(s); adding a DC {verdict} (best "
                  f"{best.prediction.dcs_used + 1}-DC plan: {more.stages} stages x {more.replicas} replicas, "
                  f"{more.prediction.iteration_s:.3f} s vs {best.prediction.iteration_s:.3f} s)")
        else:
            print(f"what-if: the best plan uses {best.prediction.dcs_used} DC(s); no feasible plan uses one more")
    return 0


def cmd_schedule(args) -> int:
    from .experiment import load_experiment
    from .placement import place
    from .schedule import bubble_fraction, format_grid, grid, make_schedule

    exp = load_experiment(args.experiment).with_overrides(microbatches=args.microbatches, schedule=args.schedule)
    workers = place(exp, load_topology(exp.topology))
    sched = make_schedule(exp.schedule, exp.stages, exp.microbatches)
    print(f"{exp.schedule}: {exp.stages} stages x {exp.replicas} replicas, {exp.microbatches} microbatches")
    print("actions per worker (F/B = forward/backward of microbatch m; receives and sends implied):")
    for w in workers:
        print(f"  worker {w.rank} ({w.host}, stage {w.stage}, replica {w.replica}): "
              + " ".join(str(a) for a in sched[w.stage]))
    rows = grid(sched)
    print(f"simulated grid (backward = 2 forward slots, communication free; '.' = bubble, "
          f"{bubble_fraction(rows):.0%} of slots):")
    print(format_grid(rows))
    return 0


def cmd_analyze(args) -> int:
    from .report import finalize, format_summary

    if not (args.run_dir / "config.json").exists():
        raise SpecError(str(args.run_dir), "(run folder)", str(args.run_dir), "has no config.json",
                        "give a folder written by testbed run")
    summary = finalize(args.run_dir)
    print(format_summary(summary))
    print(f"summary, events.parquet, trace.json and plots rewritten in {args.run_dir}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="testbed", description="Emulated multi-datacenter LLM training testbed.")
    sub = p.add_subparsers(dest="command", required=True)

    def topo_args(sp, out=True):
        sp.add_argument("file", nargs="?", default=DEFAULT_TOPOLOGY,
                        help=f"topology file or shipped name (default: {DEFAULT_TOPOLOGY})")
        sp.add_argument("--delay-mechanism", choices=DELAY_MECHANISMS, default="auto",
                        help="netem where the kernel has it (auto), or force one")
        if out:
            sp.add_argument("--out", type=Path, default=None, help="folder for logs and results "
                            "(default: results/topo-<time>-<prefix>)")
            _backend_options(sp)

    topo = sub.add_parser("topo", help="topologies: show, check, up").add_subparsers(dest="topo_command", required=True)
    sp = topo.add_parser("show", help="print DCs, hosts, addresses, routes (no root needed)")
    topo_args(sp, out=False)
    sp.add_argument("--tc", action="store_true", help="also print the shaping as tc commands")
    sp.set_defaults(func=cmd_topo_show)
    sp = topo.add_parser("check", help="build the topology and measure every WAN link against the file")
    topo_args(sp)
    sp.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    sp.add_argument("--duration", type=_number(1, 3600), default=10.0, help="iperf3 seconds per direction (default 10)")
    sp.add_argument("--omit", type=_number(0, 600), default=2.0, help="warm-up seconds omitted (default 2)")
    sp.add_argument("--rtt-samples", type=_number(3, 10000, int), default=20, help="ping samples per direction (default 20)")
    sp.set_defaults(func=cmd_topo_check)
    sp = topo.add_parser("up", help="build the topology and keep it up until Ctrl-C")
    topo_args(sp)
    sp.set_defaults(func=cmd_topo_up)

    sp = sub.add_parser("run", help="train across the emulated DCs (default: the embedded default experiment)")
    sp.add_argument("experiment", nargs="?", default=None, help="experiment file or shipped name (default: default)")
    sp.add_argument("--iterations", type=_number(1, 100000, int))
    sp.add_argument("--microbatches", type=_number(1, 1024, int))
    sp.add_argument("--schedule", choices=("gpipe", "1f1b"))
    sp.add_argument("--topology", help="topology file or shipped name")
    sp.add_argument("--stages", type=_number(1, 1024, int), help="pipeline stages")
    sp.add_argument("--replicas", type=_number(1, 1024, int), help="data-parallel replicas per stage")
    sp.add_argument("--data", type=Path, help="text file or folder to train on (default: Python's stdlib sources)")
    sp.add_argument("--out", type=Path, help="run folder (default: results/<experiment>-<time>)")
    sp.add_argument("--policy", choices=known_policies(), metavar="POLICY",
                    help=f"{', '.join(POLICIES)}, optionally followed by +bubbletea (default: the experiment's)")
    sp.add_argument("--delay-mechanism", choices=DELAY_MECHANISMS, default="auto")
    _backend_options(sp)
    _bubbletea_options(sp)
    sp.set_defaults(func=cmd_run)
    sp = sub.add_parser("compare", help="run several policies on the same experiment and compare them")
    sp.add_argument("experiment", nargs="?", default=None)
    sp.add_argument("--policies", default=",".join(POLICIES), help=f"comma-separated (default: {','.join(POLICIES)})")
    sp.add_argument("--iterations", type=_number(2, 100000, int))
    sp.add_argument("--repeat", type=_number(1, 100, int), default=1, help="runs per policy, interleaved")
    sp.add_argument("--out", type=Path, help="folder for comparison.json and one run folder per policy")
    sp.add_argument("--delay-mechanism", choices=DELAY_MECHANISMS, default="auto")
    _backend_options(sp)
    _bubbletea_options(sp)
    sp.set_defaults(func=cmd_compare)
    sp = sub.add_parser("plan", help="placements and predicted iteration times, alternatives, what-if (no root)")
    sp.add_argument("experiment", nargs="?", default=None)
    sp.add_argument("--top", type=_number(1, 1000, int), default=12, help="plans to print (default 12)")
    sp.set_defaults(func=cmd_plan)
    sp = sub.add_parser("schedule", help="print an experiment's pipeline schedule as a table (no root needed)")
    sp.add_argument("experiment", nargs="?", default=None)
    sp.add_argument("--microbatches", type=_number(1, 1024, int))
    sp.add_argument("--schedule", choices=("gpipe", "1f1b"))
    sp.set_defaults(func=cmd_schedule)
    sp = sub.add_parser("analyze", help="recompute summary, parquet, Chrome trace and plots of a run folder")
    sp.add_argument("run_dir", type=Path)
    sp.set_defaults(func=cmd_analyze)

    sp = sub.add_parser("clean", help="remove what crashed or killed runs left behind")
    sp.add_argument("--all", action="store_true", help="also remove runs whose owner is still alive")
    sp.add_argument("--dry-run", action="store_true", help="only say what would be removed")
    sp.add_argument("--run", metavar="PREFIX", help="only this run (such as tb3f9a)")
    sp.add_argument("--forget", action="store_true", help="drop remote runs from the registry even when their "
                    "machines cannot be reached (what they left there stays)")
    sp.set_defaults(func=cmd_clean)
    sp = sub.add_parser("doctor", help="detect kernel features, build the delay element, measure capacity")
    sp.add_argument("--delay-mechanism", choices=DELAY_MECHANISMS, default="auto")
    sp.set_defaults(func=cmd_doctor)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _on_sigterm)
    signal.signal(signal.SIGHUP, _on_sigterm)
    # a shell starting a command with & ignores SIGINT in it, and Python keeps an ignored SIGINT;
    # Ctrl-C (or kill -INT) must always tear down
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return args.func(args)
    except SpecError as e:
        _err(f"error: {e}")
        return 2
    except TestbedError as e:
        _err(f"error: {e}")
        return 1
    except KeyboardInterrupt:
        _err("interrupted; everything the run created was removed")
        return 130
    except BrokenPipeError:
        sys.stderr.close()  # stdout went to a pager or head that quit early
        return 0


if __name__ == "__main__":
    sys.exit(main())
