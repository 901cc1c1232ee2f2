"""``testbed clean`` and ``testbed doctor``: this machine's leftovers and capabilities."""

from __future__ import annotations

import tempfile
from pathlib import Path

from testbed.cli.common import root_preamble
from testbed.errors import FeatureError
from testbed.invocation import sudo_testbed
from testbed.net.capacity import CACHE
from testbed.net.capacity_probe import PROBE, machine_capacity_bps
from testbed.net.delay_element import build_helper
from testbed.net.features import (
    allowed_congestion,
    cached_features,
    default_congestion,
    describe_mechanism,
    missing_tools,
    require_root,
)
from testbed.net.local import LocalNetwork
from testbed.net.mininet_backend import mininet_status, openvswitch_status
from testbed.net.registry import clean_run, list_runs
from testbed.net.remote.clean import clean_remote_run
from testbed.net.tracefs import tracefs_status
from testbed.spec.topology_file import parse_topology
from testbed.spec.units import format_rate


def cmd_clean(args) -> int:
    require_root("testbed clean")
    runs = [r for r in list_runs() if args.run is None or r.prefix == args.run]
    targets = [r for r in runs if args.all or not r.owner_alive()]
    for r in runs:
        if r not in targets:
            print(f"run {r.prefix} is still running (pid {r.owner_pid}): left alone (use --all to remove it too)")
    if not targets:
        print("nothing to clean")
    left = False
    for r in targets:
        if args.dry_run:
            print(
                f"would remove run {r.prefix}: {len(r.namespaces)} namespaces, {len(r.processes)} processes"
                + (f", {len(r.trace_instances)} tracefs instance(s)" if r.trace_instances else "")
            )
            continue
        if r.kind == "remote":
            notes = clean_remote_run(r)
            for note in notes:
                print(f"run {r.prefix}: {note}")
            if any(note.startswith("could not") for note in notes) and not args.forget:
                print(
                    f"run {r.prefix}: kept in the registry; run '{sudo_testbed('clean')}' again once the machines are "
                    f"reachable, or '{sudo_testbed(f'clean --run {r.prefix} --forget')}' if they are gone for good"
                )
                continue
        removed = clean_run(r)
        traced = removed["trace_instances"]
        print(
            f"removed run {r.prefix}: {len(removed['namespaces'])} namespaces, {len(removed['processes'])} processes"
            + (f", {len(traced)} tracefs instance(s)" if traced else "")
        )
        for why in removed["left"]:
            print(f"run {r.prefix}: could not remove {why}; kept in the registry: run '{sudo_testbed('clean')}' again")
        left = left or bool(removed["left"])
    return 1 if left else 0


def cmd_doctor(args) -> int:
    root_preamble("testbed doctor")
    missing = missing_tools(["nsenter", "iperf3", "ping", "iptables-restore", "tc", "ss"])
    print("tools: " + ("all present" if not missing else "missing " + ", ".join(missing)))
    try:
        print(f"delay element: {build_helper()}")
    except FeatureError as e:  # needed only where the kernel lacks sch_netem (the build below says)
        print(f"delay element: not built ({e}; needed only without sch_netem)")
    print(f"mininet (--backend mininet): {mininet_status()}")
    print(f"scheduler trace (--sched-trace): {tracefs_status()}")
    print(
        f"Open vSwitch: {openvswitch_status()} (the mininet backend uses none: hosts link straight to a "
        "bridge in their DC router)"
    )
    try:
        with tempfile.TemporaryDirectory() as tmp:
            with LocalNetwork(
                parse_topology(PROBE, "<probe>"), out_dir=Path(tmp), delay_mechanism=args.delay_mechanism
            ) as net:
                mech = net.mechanism
    except FeatureError as e:  # e.g. the kernel lacks netem and the delay element cannot be built
        print(f"sch_netem: {'present' if cached_features().get('netem') else 'absent'}")
        print(f"cannot build a network here: {e}")
        return 1
    print(f"sch_netem: {'present' if cached_features().get('netem') else 'absent'}")
    print(f"delay mechanism: {describe_mechanism(mech)}")
    allowed = allowed_congestion()
    print(
        f"TCP congestion control of new namespaces: {default_congestion()} (the machine's default; "
        f"a topology's tcp_congestion may choose among the allowed: {' '.join(allowed)})"
    )
    cap, cached = machine_capacity_bps(mech)
    where = f"cached in {CACHE}" if cached else "measured now"
    print(f"capacity through {mech}: {format_rate(round(cap, -6))} ({where})")
    return 1 if missing else 0
