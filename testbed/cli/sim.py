"""``testbed sim``: the simulator's figures of an experiment under each policy, or a measured run
set beside them (``--validate``); no root, no network (``testbed/sim/``)."""

from __future__ import annotations

import json
from pathlib import Path

from testbed.cli.common import err
from testbed.errors import SpecError
from testbed.sim.figures import simulate_policy
from testbed.sim.validate import ABSOLUTE, validate_run
from testbed.spec.experiment_file import load_experiment
from testbed.spec.policy import UnknownPolicy, parse_policy
from testbed.trace import metrics as M


def cmd_sim(args) -> int:
    if args.validate is not None:
        result = validate_run(args.validate)
        if args.json:
            print(json.dumps(result, indent=1))
            return 0
        print(f"{result['run']} ({result['policy']}): predicted, measured, error")
        for name, f in result["figures"].items():
            unit = "" if name in ABSOLUTE else " (relative)"
            x, y, e = (f[k] for k in ("predicted", "measured", "error"))
            shown = "-" if e is None else (f"{e:+.1%}" if name not in ABSOLUTE else f"{e:+.3f}")
            print(f"  {name:<22} {_num(x):>10} {_num(y):>10}  {shown}{unit}")
        return 0
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    for policy in policies:
        try:
            parse_policy(policy)
        except UnknownPolicy as e:
            err(f"--policies: {policy!r}: {e}")
            return 2
    exp = load_experiment(args.experiment)
    out, lines = {}, [f"{exp.name} on {exp.topology_spec.name} (simulated, {exp.microbatches} microbatches)"]
    for policy in policies:
        try:
            f = simulate_policy(exp, policy).to_dict()
        except SpecError as e:
            out[policy] = {"infeasible": f"{e.field} {e.value} {e.problem}"}
            lines.append(f"  {policy}: infeasible: {e.field} {e.value} {e.problem}")
            continue
        out[policy] = f
        per_stage = ", ".join(f"{b:.2f}" for b in f[M.BUBBLE_FRACTION_PER_STAGE])
        links = ", ".join(f"{k} {u:.1%}" for k, u in f["wan_utilization"].items()) or "no WAN traffic"
        lines.append(
            f"  {policy}: iteration {f[M.ITERATION_TIME_S]:.3f} s, {f[M.TOKENS_PER_S]:.0f} tokens/s, GPU utilization "
            f"{f[M.GPU_UTILIZATION]:.3f}, bubble fraction per stage {per_stage}; WAN {links}"
        )
    print(json.dumps(out, indent=1) if args.json else "\n".join(lines))
    return 0


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"


def add_sim_parser(sub) -> None:
    """The ``sim`` subcommand's arguments."""
    from testbed.spec.policy import POLICIES

    sp = sub.add_parser("sim", help="simulated iteration time, utilization, bubbles, WAN load per policy (no root)")
    sp.add_argument("experiment", nargs="?", default=None)
    sp.add_argument("--policies", default=",".join(POLICIES), help=f"comma-separated (default: {','.join(POLICIES)})")
    sp.add_argument("--validate", type=Path, metavar="RUN_DIR", help="a measured run beside its simulation")
    sp.add_argument("--json", action="store_true", help="print one JSON object")
    sp.set_defaults(func=cmd_sim)
