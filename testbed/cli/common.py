"""What every command shares: messages, the root preamble, the backend and BubbleTea options."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import Any

from testbed.errors import SpecError
from testbed.net.features import require_root
from testbed.net.network import BACKENDS, Network
from testbed.net.registry import warn_stale_runs
from testbed.run.interrupts import err
from testbed.spec.experiment import Experiment
from testbed.spec.policy import UnknownPolicy, parse_policy
from testbed.spec.topology import TopologySpec


def root_preamble(what: str) -> None:
    """Refuse without root; warn about what dead runs left behind."""
    require_root(what)
    warning = warn_stale_runs()
    if warning:
        err(f"warning: {warning}")


def network(args: argparse.Namespace, spec: TopologySpec) -> Network:
    """The (unbuilt) network of ``spec`` that ``--backend``, ``--delay-mechanism`` and ``--out`` ask for."""
    from testbed.run.backends import make_network  # the backends' modules, when a network is built

    return make_network(spec, delay_mechanism=args.delay_mechanism, out_dir=args.out, **backend(args))


def backend(args: argparse.Namespace) -> dict[str, Any]:
    """``--backend`` and ``--inventory`` as keyword arguments of make_network/run_experiment."""
    from testbed.run.backends import check_backend_options

    check_backend_options(args.backend, args.inventory)
    return {"backend": args.backend, "inventory": args.inventory}


def dilation_option(sp: argparse.ArgumentParser, what: str) -> None:
    """``--dilation K``: the emulated world ``K`` times slower than described (``spec/dilation.py``)."""
    sp.add_argument(
        "--dilation",
        type=number(1, 100),
        default=None,
        metavar="K",
        help=f"time dilation: {what} K times slower than described (delays and compute targets x K, rates / K), "
        "the figures reported in the emulated frame (default: the experiment's time_dilation, 1)",
    )


def backend_options(sp: argparse.ArgumentParser) -> None:
    sp.add_argument(
        "--backend",
        choices=BACKENDS,
        default="netns",
        help="what builds the network: netns (pyroute2, default), mininet (Mininet's Python API), "
        "remote (machines over SSH, with --inventory)",
    )
    sp.add_argument("--inventory", type=Path, metavar="FILE", help="machines of --backend remote (YAML)")


def sched_trace_option(sp: argparse.ArgumentParser) -> None:
    sp.add_argument(
        "--sched-trace",
        action="store_true",
        help="record the kernel scheduler's switches, wake-ups and moves between CPUs while training (a "
        "tracefs instance of the run's own) into sched.parquet, and say, for each operation that started "
        "late (counted from the kernel's wake-up of its worker's thread with the input), what that thread "
        "did, what the CPUs ran meanwhile and what the CPU whose run queue it waited on ran "
        "(late_starts.csv; netns and mininet backends)",
    )


def policy_name(text: str) -> str:
    """An argparse type: a policy name (``spec/policy.py``), checked here so that a typo is named
    with the known parts before anything runs."""
    try:
        parse_policy(text)
    except UnknownPolicy as e:
        raise argparse.ArgumentTypeError(f"{text!r}: {e}") from None
    return text


def number(lo: float, hi: float, kind: type = float) -> Any:
    """An argparse type: a number of ``kind`` from ``lo`` to ``hi``."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{text} is outside {lo:g}..{hi:g}")
        return value

    return parse


def bubbletea_options(sp: argparse.ArgumentParser) -> None:
    g = sp.add_argument_group("BubbleTea (policies ending in +bubbletea or +prefill-alone)")
    g.add_argument(
        "--requests",
        type=Path,
        metavar="FILE",
        help="Azure LLM inference trace CSV (TIMESTAMP,ContextTokens,GeneratedTokens); default: a "
        "synthetic stream fitted to that trace",
    )
    g.add_argument(
        "--request-rate",
        type=number(0.001, 1000, float),
        metavar="R",
        help="synthetic requests per second (default: the experiment's, 4)",
    )
    g.add_argument("--time-scale", type=number(0.0001, 10000, float), help="multiply the trace's arrival times")
    g.add_argument("--rate-factor", type=number(0.0001, 10000, float), help="divide the trace's arrival times")
    g.add_argument("--no-decode", action="store_true", help="decode hosts record TTFT but run no decode steps")


def bubbletea_overrides(exp: Experiment, args: argparse.Namespace) -> Experiment:
    """--requests FILE, --request-rate R, --no-decode, --time-scale, --rate-factor."""
    changes = {}
    if getattr(args, "requests", None):
        if not args.requests.is_file():
            raise SpecError(
                "--requests",
                "(option)",
                str(args.requests),
                "is not a file",
                "give a CSV of the Azure LLM inference trace format (TIMESTAMP,ContextTokens,GeneratedTokens)",
            )
        changes["requests"] = str(args.requests)
    for key in ("request_rate", "time_scale", "rate_factor"):
        if getattr(args, key, None) is not None:
            changes[key] = getattr(args, key)
    if getattr(args, "no_decode", False):
        changes["decode"] = False
    return exp.with_overrides(bubbletea=replace(exp.bubbletea, **changes)) if changes else exp
