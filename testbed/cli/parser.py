"""The ``testbed`` command line's parser: every command, its options and its examples, each command
bound to its module's function, imported only when that command runs (``_command_in``: so that
``testbed clean`` does not load the simulator and pandas, seconds under an emulated CPU)."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from pathlib import Path

from testbed.cli.common import (
    backend_options,
    bubbletea_options,
    dilation_option,
    number,
    policy_name,
    sched_trace_option,
)
from testbed.cli.examples import add_examples
from testbed.net.features import DELAY_MECHANISMS
from testbed.net.network import BACKENDS
from testbed.spec.pipeline_schedules import DEFAULT_VIRTUAL_STAGES, MAX_VIRTUAL_STAGES, SCHEDULES
from testbed.spec.policy import ABLATION, POLICIES
from testbed.spec.regions import DEFAULT_HOSTS, DEFAULT_SCALE, MAX_RATE_BPS
from testbed.spec.topology_file import DEFAULT_TOPOLOGY
from testbed.spec.units import format_rate


def _command_in(module: str, name: str) -> Callable[[argparse.Namespace], int]:
    """The command ``name`` of ``testbed.cli.<module>``, imported when it is called."""

    def command(args: argparse.Namespace) -> int:
        return getattr(importlib.import_module(f"testbed.cli.{module}"), name)(args)

    command.__name__ = name
    return command


cmd_topo_show, cmd_topo_check, cmd_topo_up, cmd_topo_regions = (
    _command_in("topo", n) for n in ("cmd_topo_show", "cmd_topo_check", "cmd_topo_up", "cmd_topo_regions")
)
cmd_run, cmd_compare, cmd_plan, cmd_schedule, cmd_analyze = (
    _command_in("train", n) for n in ("cmd_run", "cmd_compare", "cmd_plan", "cmd_schedule", "cmd_analyze")
)
cmd_clean, cmd_doctor = (_command_in("machine", n) for n in ("cmd_clean", "cmd_doctor"))
cmd_sim = _command_in("sim", "cmd_sim")
cmd_launch = _command_in("launch", "cmd_launch")
cmd_link = _command_in("link", "cmd_link")


def add_schedule_args(sp: argparse.ArgumentParser) -> None:
    """``--schedule`` and ``--virtual-stages``, in place of the experiment file's."""
    sp.add_argument("--schedule", choices=SCHEDULES, help="the pipeline schedule (default: the experiment's)")
    sp.add_argument(
        "--virtual-stages",
        type=number(1, MAX_VIRTUAL_STAGES, int),
        help=f"model chunks per worker under interleaved-1f1b (default {DEFAULT_VIRTUAL_STAGES})",
    )


def add_run_options(sp: argparse.ArgumentParser) -> None:
    """What ``run`` and ``compare`` share: the delay mechanism, the layout (``--plan``), ``--force``."""
    sp.add_argument("--delay-mechanism", choices=DELAY_MECHANISMS, default="auto")
    sp.add_argument(
        "--plan",
        choices=("own", "best"),
        default="own",
        help="own: the experiment's stages x replicas; best: the planner's fastest of the same global batch",
    )
    sp.add_argument(
        "--force", action="store_true", help="run even an iteration the cost model predicts to take over 10 minutes"
    )


def build_parser(command: str = "testbed") -> argparse.ArgumentParser:
    """The command line's parser; ``command``: how its examples write the testbed's command."""
    p = argparse.ArgumentParser(prog="testbed", description="Emulated multi-datacenter LLM training testbed.")
    sub = p.add_subparsers(dest="command", required=True)

    def topo_args(sp, out=True):
        sp.add_argument(
            "file",
            nargs="?",
            default=DEFAULT_TOPOLOGY,
            help=f"topology file or shipped name (default: {DEFAULT_TOPOLOGY})",
        )
        sp.add_argument(
            "--delay-mechanism",
            choices=DELAY_MECHANISMS,
            default="auto",
            help="netem where the kernel has it (auto), or force one",
        )
        if out:
            sp.add_argument(
                "--out",
                type=Path,
                default=None,
                help="folder for logs and results (default: results/topo-<time>-<prefix>)",
            )
            backend_options(sp)
            dilation_option(sp, "the links")

    topo = sub.add_parser("topo", help="topologies: show, check, up, regions").add_subparsers(
        dest="topo_command", required=True
    )
    sp = topo.add_parser("show", help="print DCs, hosts, addresses, routes (no root needed)")
    topo_args(sp, out=False)
    sp.add_argument("--tc", action="store_true", help="also print the shaping as tc commands")
    sp.set_defaults(func=cmd_topo_show)
    sp = topo.add_parser("check", help="build the topology and measure every WAN link against the file")
    topo_args(sp)
    sp.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    sp.add_argument("--duration", type=number(1, 3600), default=10.0, help="iperf3 seconds per direction (default 10)")
    sp.add_argument("--omit", type=number(0, 600), default=2.0, help="warm-up seconds omitted (default 2)")
    sp.add_argument(
        "--rtt-samples", type=number(3, 10000, int), default=20, help="ping samples per direction (default 20)"
    )
    sp.add_argument(
        "--attempts",
        type=number(1, 10, int),
        default=1,
        help="measurements of a failing direction, judged by the last; every one is reported (default 1)",
    )
    sp.add_argument(
        "--link",
        action="append",
        default=[],
        metavar="DC:DC",
        help="measure this WAN link only, both ways (as `testbed link list` names it; repeat for more; default: all)",
    )
    sp.add_argument(
        "--profile",
        action="store_true",
        help="check the profiled links under change instead: delivered rate every 100 ms against the profile "
        "(shifted by the one-way delay), the lag of each rate drop and each phase's RTT, for --duration seconds "
        "from the build",
    )
    sp.set_defaults(func=cmd_topo_check)
    sp = topo.add_parser("up", help="build the topology and keep it up until Ctrl-C")
    topo_args(sp)
    sp.set_defaults(func=cmd_topo_up)
    add_regions_parser(topo)

    link = sub.add_parser(
        "link", help="WAN link changes while a topology or a run is up: list, down LINK, up LINK, rate LINK RATE"
    ).add_subparsers(dest="link_command", required=True)
    sp = link.add_parser("list", help="one line per WAN link: its name (DC:DC), up or down, rate and delay")
    sp.add_argument("--run", metavar="PREFIX", help="the topology's run prefix, where several are up")
    sp.set_defaults(func=cmd_link)
    for verb, what in (("down", "drop everything the link carries, both ways"), ("up", "bring it back")):
        sp = link.add_parser(verb, help=f"{what} (interfaces, addresses and routes untouched)")
        sp.add_argument("link", help="the link, by its DCs: east:west")
        sp.add_argument("--run", metavar="PREFIX", help="the topology's run prefix, where several are up")
        sp.set_defaults(func=cmd_link)
    sp = link.add_parser("rate", help="set the link's rate both ways, in place (its HTB classes at both ends)")
    sp.add_argument("link", help="the link, by its DCs: east:west")
    sp.add_argument("rate", help="the new rate, such as 30mbit")
    sp.add_argument("--run", metavar="PREFIX", help="the topology's run prefix, where several are up")
    sp.set_defaults(func=cmd_link)

    sp = sub.add_parser("run", help="train across the emulated DCs (default: the embedded default experiment)")
    sp.add_argument("experiment", nargs="?", default=None, help="experiment file or shipped name (default: default)")
    sp.add_argument("--iterations", type=number(1, 100000, int))
    sp.add_argument("--microbatches", type=number(1, 1024, int))
    add_schedule_args(sp)
    sp.add_argument("--topology", help="topology file or shipped name")
    sp.add_argument("--stages", type=number(1, 1024, int), help="pipeline stages")
    sp.add_argument("--replicas", type=number(1, 1024, int), help="data-parallel replicas per stage")
    sp.add_argument("--data", type=Path, help="text file or folder to train on (default: Python's stdlib sources)")
    sp.add_argument("--out", type=Path, help="run folder (default: results/<experiment>-<time>)")
    sp.add_argument(
        "--policy",
        type=policy_name,
        metavar="POLICY",
        help=f"{', '.join(POLICIES)}, optionally with parts replaced (/placement=.., /striping=on|off, "
        "/sharing=tcp|fifo|planned) and followed by +bubbletea, or by +prefill-alone (the same GPUs "
        "serving prefill alone, no training) (default: the experiment's)",
    )
    add_run_options(sp)
    sp.add_argument(
        "--profile-wan",
        action="store_true",
        help="before training, measure one TCP connection on each WAN path training uses (about 5 s per path "
        "direction) into wan_profile.json; testbed sim --validate then uses it in place of the modelled window",
    )
    sched_trace_option(sp)
    backend_options(sp)
    bubbletea_options(sp)
    dilation_option(sp, "the run")
    sp.set_defaults(func=cmd_run)
    sp = sub.add_parser("compare", help="run several policies on the same experiment and compare them")
    sp.add_argument("experiment", nargs="?", default=None)
    sp.add_argument("--policies", default=",".join(POLICIES), help=f"comma-separated (default: {','.join(POLICIES)})")
    sp.add_argument(
        "--ablation",
        action="store_true",
        help="instead of --policies, the chain from pp-fair to atlas adding one part at a time: "
        + " -> ".join(ABLATION),
    )
    sp.add_argument("--iterations", type=number(2, 100000, int))
    sp.add_argument("--repeat", type=number(1, 100, int), default=1, help="runs per policy, interleaved")
    add_schedule_args(sp)
    sp.add_argument("--out", type=Path, help="folder for comparison.json and one run folder per policy")
    add_run_options(sp)
    sched_trace_option(sp)
    backend_options(sp)
    bubbletea_options(sp)
    dilation_option(sp, "every run")
    sp.set_defaults(func=cmd_compare)
    sp = sub.add_parser("plan", help="placements and predicted iteration times, alternatives, what-if (no root)")
    sp.add_argument("experiment", nargs="?", default=None)
    sp.add_argument("--top", type=number(1, 1000, int), default=12, help="plans to print (default 12)")
    add_schedule_args(sp)
    sp.add_argument(
        "--grants",
        action="store_true",
        help="also print Atlas's grant plan: per WAN link direction the order of an iteration's transfers, "
        "their times and deadlines, and the pipelines' offsets",
    )
    sp.set_defaults(func=cmd_plan)
    add_sim_parser(sub)
    sp = sub.add_parser("schedule", help="print an experiment's pipeline schedule as a table (no root needed)")
    sp.add_argument("experiment", nargs="?", default=None)
    sp.add_argument("--microbatches", type=number(1, 1024, int))
    add_schedule_args(sp)
    sp.set_defaults(func=cmd_schedule)
    sp = sub.add_parser("analyze", help="recompute summary, parquet, Chrome trace and plots of a run folder")
    sp.add_argument("run_dir", type=Path)
    sp.set_defaults(func=cmd_analyze)

    sp = sub.add_parser(
        "launch",
        help="your own torchrun job in the emulated hosts: testbed launch [TOPOLOGY|EXPERIMENT] --mesh pp=P,dp=D "
        "-- SCRIPT [ARGS]",
    )
    sp.add_argument(
        "target",
        nargs="?",
        default=None,
        help=f"a topology or an experiment (its topology and stages x replicas), by name or path (default: "
        f"{DEFAULT_TOPOLOGY})",
    )
    sp.add_argument(
        "--mesh", metavar="pp=P,dp=D", help="the job's ranks as P stages x D replicas (rank = stage x D + replica)"
    )
    sp.add_argument(
        "--placement",
        metavar="FILE",
        help="YAML list of {stage, replica, host}: where each rank runs (a job's job.json is one); it gives the mesh",
    )
    sp.add_argument(
        "--policy",
        type=policy_name,
        metavar="POLICY",
        help="pp-fair (default: TCP shares the links), pp-fair/sharing=fifo (Atlas's grants for the job's "
        "cross-DC point-to-point transfers, through a hook in every rank), /striping=on (each such transfer "
        "over several connections), /placement=largest-first",
    )
    sp.add_argument(
        "--connections",
        type=int,
        default=4,
        help="connections a striped transfer uses, 2..16 (default 4; with /striping=on)",
    )
    sp.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="iterations left out of the job's figures, where it marks them (default 1)",
    )
    sp.add_argument("--out", type=Path, help="the job's folder (default: results/job-<script>-<time>)")
    sp.add_argument(
        "--backend",
        choices=BACKENDS,
        default="netns",
        help="what builds the network: netns only so far (each node in its own mount and UTS namespaces on this "
        "machine); mininet and remote are refused, saying why",
    )
    sp.add_argument("--stream", action="store_true", help="also print every rank's output, prefixed [rank R]")
    sp.add_argument(
        "--timeout",
        type=number(1, 7 * 86400),
        default=3600.0,
        help="stop the job after this many seconds (default 3600)",
    )
    sp.add_argument(
        "--rendezvous",
        choices=("wan", "management"),
        default="wan",
        help="where the rendezvous goes: wan (rank 0's host over the emulated network, counted on the WAN; "
        "default) or management (a management network beside it, neither shaped nor counted)",
    )
    sp.add_argument(
        "--join-timeout",
        type=number(0, 7 * 86400),
        default=300.0,
        help="stop the job when a rank has not called init_process_group after this many seconds, naming it "
        "(default 300; 0: no limit)",
    )
    sp.add_argument(
        "--outage-timeout",
        type=number(0.1, 7 * 86400),
        default=None,
        help="stop the job when a WAN link stays down this many seconds, naming it (default: the experiment's "
        "outage_timeout where the target is an experiment, else 60; a link that fails over does not count)",
    )
    sp.add_argument("--delay-mechanism", choices=DELAY_MECHANISMS, default="auto")
    sp.set_defaults(func=cmd_launch, job=[])
    sp = sub.add_parser("clean", help="remove what crashed or killed runs left behind")
    sp.add_argument("--all", action="store_true", help="also remove runs whose owner is still alive")
    sp.add_argument("--dry-run", action="store_true", help="only say what would be removed")
    sp.add_argument("--run", metavar="PREFIX", help="only this run (such as tb3f9a)")
    sp.add_argument(
        "--forget",
        action="store_true",
        help="drop remote runs from the registry even when their "
        "machines cannot be reached (what they left there stays)",
    )
    sp.set_defaults(func=cmd_clean)
    sp = sub.add_parser("doctor", help="detect kernel features, build the delay element, measure capacity")
    sp.add_argument("--delay-mechanism", choices=DELAY_MECHANISMS, default="auto")
    sp.set_defaults(func=cmd_doctor)
    return add_examples(p, command)


def add_regions_parser(topo) -> None:
    """The ``topo regions`` subcommand's arguments."""
    sp = topo.add_parser(
        "regions",
        help="write a topology of real cloud regions: WAN RTTs and rates from Skyplane's 2022 measurements, "
        "the rates scaled down (no root needed)",
    )
    sp.add_argument(
        "regions",
        nargs="*",
        metavar="REGION",
        help="two or more regions, cloud:region as Skyplane names them (aws:us-east-1, azure:eastus, "
        "gcp:europe-west4-a); one DC each",
    )
    sp.add_argument(
        "--scale",
        type=number(1e-6, 1),
        default=DEFAULT_SCALE,
        help=f"measured rates are multiplied by this (default {DEFAULT_SCALE:g}: the emulator cannot run links at "
        f"tens of Gbit/s, and refuses a rate above {format_rate(MAX_RATE_BPS)})",
    )
    sp.add_argument(
        "--hosts", type=number(1, 1024, int), default=DEFAULT_HOSTS, help=f"hosts per DC (default {DEFAULT_HOSTS})"
    )
    sp.add_argument("--name", help="the topology's name (default: regions_ and the DCs' names)")
    sp.add_argument(
        "--unmeasured-rate",
        metavar="RATE",
        help="the rate (as emulated, such as 30mbit) of a link between regions whose throughput was not measured "
        "(default: such a pair is an error naming regions nearby that were)",
    )
    sp.add_argument("-o", "--out", type=Path, metavar="FILE", help="write the topology here (default: print it)")
    sp.add_argument("--list", action="store_true", help="print every known region, its DC name and what was measured")
    sp.set_defaults(func=cmd_topo_regions)


def add_sim_parser(sub) -> None:
    """The ``sim`` subcommand's arguments."""
    sp = sub.add_parser("sim", help="simulated iteration time, utilization, bubbles, WAN load per policy (no root)")
    sp.add_argument(
        "experiment", nargs="?", default=None, help="an experiment or a scenario (workloads/scenarios), by name or path"
    )
    sp.add_argument("--policies", default=",".join(POLICIES), help=f"comma-separated (default: {','.join(POLICIES)})")
    sp.add_argument(
        "--validate",
        type=Path,
        metavar="RUN_DIR",
        help="a measured run beside its simulation (under planned grants, also its gap to the grant plan by cause)",
    )
    sp.add_argument(
        "--modelled-window",
        action="store_true",
        help="with --validate: model each WAN connection's window even where the run measured its paths",
    )
    sp.add_argument(
        "--in-step",
        action="store_true",
        help="with --validate: start every pipeline together, not as far apart as the run's started",
    )
    sp.add_argument("--json", action="store_true", help="print one JSON object")
    sp.add_argument(
        "--sweep",
        metavar="GRID",
        help="a scenario over WAN rates and one-way delays on all cores, e.g. wan_rate=100gbit,400gbit,delay=5ms,50ms",
    )
    sp.add_argument("--out", type=Path, metavar="DIR", help="--sweep's folder (default sim-sweep-<scenario>)")
    sp.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="--sweep's points on a Dask distributed cluster (tcp://HOST:8786) instead of this machine's cores",
    )
    sp.add_argument(
        "--timeline", type=Path, metavar="DIR", help="write DIR/POLICY/trace.json and timeline.png of one iteration"
    )
    sp.set_defaults(func=cmd_sim)
