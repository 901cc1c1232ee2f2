"""``testbed sim``: the simulator's figures of an experiment under each policy, or a measured run
set beside them (``--validate``); no root, no network (``testbed/sim/``)."""

from __future__ import annotations

import json
from pathlib import Path

from testbed.cli.common import err
from testbed.errors import SpecError
from testbed.plan.cores import processes_allowed
from testbed.sim.figures import simulate_policy
from testbed.sim.plan_gap import format_plan_gap, plan_gap
from testbed.sim.scenario import simulate_scenario
from testbed.sim.sweep import parse_sweep, sweep
from testbed.sim.timeline import PLOTTED_REPLICAS, simulated_events
from testbed.sim.validate import ABSOLUTE, validate_run
from testbed.spec.experiment_file import load_experiment
from testbed.spec.policy import UnknownPolicy, parse_policy
from testbed.spec.scenario_file import load_scenario, names_scenario
from testbed.trace import metrics as M
from testbed.trace import schema as T


@processes_allowed()  # atlas's grant plans on every core (plan/cores.py)
def cmd_sim(args) -> int:
    if args.validate is not None:
        result = validate_run(args.validate, measured_links=not args.modelled_window, measured_starts=not args.in_step)
        gap = plan_gap(args.validate)
        if args.json:
            print(json.dumps({**result, "plan_gap": None if gap is None else gap.to_dict()}, indent=1))
            return 0
        starts = result["starts"]
        if result["start_offsets_s"] is not None:
            starts += " (" + ", ".join(f"{x * 1e3:.1f}" for x in result["start_offsets_s"]) + " ms)"
        print(
            f"{result['run']} ({result['policy']}; WAN connections: {result['links']}; pipelines started "
            f"{starts}): predicted, measured, error"
        )
        for name, f in result["figures"].items():
            unit = "" if name in ABSOLUTE else " (relative)"
            x, y, e = (f[k] for k in ("predicted", "measured", "error"))
            shown = "-" if e is None else (f"{e:+.1%}" if name not in ABSOLUTE else f"{e:+.3f}")
            print(f"  {name:<22} {_num(x):>10} {_num(y):>10}  {shown}{unit}")
        if gap is not None:
            print(format_plan_gap(gap))
        return 0
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    for policy in policies:
        try:
            parse_policy(policy)
        except UnknownPolicy as e:
            err(f"--policies: {policy!r}: {e}")
            return 2
    if args.sweep is not None:
        return _sweep(args)
    if args.experiment is not None and names_scenario(args.experiment):
        sc = load_scenario(args.experiment)
        run = lambda policy: simulate_scenario(sc, policy)
        experiment_of = sc.experiment
        header = (
            f"{sc.name}: {sc.model_name} on {sc.gpus} {sc.device.model.name} GPUs in {len(sc.dcs)} DCs, tensor "
            f"parallel {sc.tensor_parallel}, {sc.stages} stages x {sc.replicas} replicas, {sc.microbatches} "
            f"microbatches of {sc.microbatch_size}, {sc.schedule} (simulated)"
        )
    else:
        exp = load_experiment(args.experiment)
        run = lambda policy: simulate_policy(exp, policy)
        experiment_of = lambda policy: exp.with_overrides(policy=policy)
        header = f"{exp.name} on {exp.topology_spec.name} (simulated, {exp.schedule}, {exp.microbatches} microbatches)"
    out, lines = {}, [header]
    for policy in policies:
        try:
            f = run(policy).to_dict()
        except SpecError as e:
            out[policy] = {"infeasible": f"{e.field} {e.value} {e.problem}"}
            lines.append(f"  {policy}: infeasible: {e.field} {e.value} {e.problem}")
            continue
        out[policy] = f
        if args.timeline is not None:
            folder = write_timeline(experiment_of(policy), args.timeline / policy)
            lines.append(f"  {policy}: timeline in {folder} (trace.json, timeline.png)")
        per_stage = ", ".join(f"{b:.2f}" for b in f[M.BUBBLE_FRACTION_PER_STAGE])
        if len(f[M.BUBBLE_FRACTION_PER_STAGE]) > 8:
            per_stage = f"{min(f[M.BUBBLE_FRACTION_PER_STAGE]):.2f}-{max(f[M.BUBBLE_FRACTION_PER_STAGE]):.2f}"
        links = ", ".join(f"{k} {u:.1%}" for k, u in f["wan_utilization"].items()) or "no WAN traffic"
        memory = f", {f['device_memory_gb']:.1f} GB per GPU" if "device_memory_gb" in f else ""
        lines.append(
            f"  {policy}: iteration {f[M.ITERATION_TIME_S]:.3f} s, {f[M.TOKENS_PER_S]:.0f} tokens/s, GPU utilization "
            f"{f[M.GPU_UTILIZATION]:.3f}, bubble fraction per stage {per_stage}{memory}; WAN {links}"
        )
        if M.PREFILL_TOKENS_PER_S in f:
            lines.append(
                f"    BubbleTea: training alone {f[M.TRAINING_GPU_UTILIZATION]:.3f}, with prefill "
                f"{f[M.GPU_UTILIZATION]:.3f}; {f[M.PREFILL_TOKENS_PER_S]:.0f} prompt tokens/s "
                f"({f['prefill_share_of_prefill_alone']:.1%} of the same GPUs serving prefill alone), "
                f"{f[M.REQUESTS_COMPLETED]} of {f['requests']} requests prefilled, TTFT p50 {_num(f[M.TTFT_P50_S])} s "
                f"p99 {_num(f[M.TTFT_P99_S])} s (arrival to the end of the prompt's prefill)"
            )
    print(json.dumps(out, indent=1) if args.json else "\n".join(lines))
    return 0


def _sweep(args) -> int:
    """``--sweep``: the table (``sweep.csv``) and plots in ``--out`` (default ``sim-sweep-<name>``)."""
    import pandas as pd

    from testbed.results.sweep_plots import plot_sweep

    if args.experiment is None or not names_scenario(args.experiment):
        err("--sweep: give a scenario (workloads/scenarios), e.g. testbed sim gpt3_175b_2dc --sweep delay=5ms,50ms")
        return 2
    sc = load_scenario(args.experiment)
    rows = pd.DataFrame(sweep(sc, parse_sweep(args.sweep), scheduler=args.scheduler))
    folder = args.out or Path(f"sim-sweep-{sc.name}")
    folder.mkdir(parents=True, exist_ok=True)
    rows.to_csv(folder / "sweep.csv", index=False)
    plots = plot_sweep(rows, folder, sc.name)
    if args.json:
        print(rows.to_json(orient="records", indent=1))
        return 0
    shown = rows[rows["policy"] == "atlas"].copy()
    print(f"{sc.name}: atlas's speed-up per WAN rate and one-way delay (table: {folder / 'sweep.csv'})")
    for _, r in shown.iterrows():
        ups = ", ".join(
            f"{c.removeprefix('speedup_over_')} {r[c]:.2f}x"
            for c in shown.columns
            if c.startswith("speedup_over_") and r[c] == r[c]
        )
        print(
            f"  {r['wan_rate_bps'] / 1e9:g} Gbit/s, {r['delay_us'] / 1e3:g} ms: over {ups or '(baselines infeasible)'}"
        )
    print("plots: " + ", ".join(str(p) for p in plots))
    return 0


def write_timeline(exp, folder: Path) -> Path:
    """One simulated iteration of ``exp`` as a run folder's ``trace.json`` and ``timeline.png``
    (the plot shows at most ``PLOTTED_REPLICAS`` replicas of each stage) in ``folder``."""
    import pandas as pd

    from testbed.plan.placement import place
    from testbed.results.chrome_trace import chrome_trace
    from testbed.results.plots import plot_timeline

    ev = pd.DataFrame(simulated_events(exp, place(exp)), columns=T.COLUMNS)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "trace.json").write_text(json.dumps(chrome_trace(ev)))
    plot_timeline(ev[ev[T.REPLICA] < PLOTTED_REPLICAS], folder / "timeline.png", 0)
    return folder


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"
