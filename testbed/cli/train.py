"""``testbed run``, ``compare``, ``plan``, ``schedule`` and ``analyze``: training runs, their
comparison, their plan, and their traces."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from testbed.cli.common import backend, bubbletea_overrides, root_preamble
from testbed.errors import SpecError
from testbed.plan.cores import processes_allowed
from testbed.plan.grant_plan import format_grant_plan
from testbed.plan.profile_phases import profile_phases
from testbed.plan.run_plan import format_plan, make_plan
from testbed.plan.schedule import RankAction, bubble_fraction, experiment_tables, format_grid, rank_grid
from testbed.plan.virtual_stages import chunk_numbers, experiment_homes
from testbed.plan.wan_load import boundary_loads, format_loads
from testbed.plan.what_if import alternatives, best_plan, what_if
from testbed.run.records import check_fresh_out_dir, discard_unused_out
from testbed.spec.experiment_file import load_experiment
from testbed.spec.model import stage_layers
from testbed.spec.policy import ABLATION, POLICIES, UnknownPolicy, parse_policy
from testbed.trace.clock import command_start_ns

# run/ and results/ (pandas, matplotlib) are imported by the commands that use them: a training run
# starts its worker launcher first, so that the launcher's torch import overlaps the runner's.


def cmd_run(args) -> int:
    exp = load_experiment(args.experiment).with_overrides(
        iterations=args.iterations,
        microbatches=args.microbatches,
        topology=args.topology,
        schedule=args.schedule,
        virtual_stages=args.virtual_stages,
        stages=args.stages,
        replicas=args.replicas,
        data=str(args.data) if args.data else None,
        policy=args.policy,
        time_dilation=args.dilation,
    )
    exp = bubbletea_overrides(exp, args)
    plan_note = None
    if args.plan == "best":
        exp, plan_note = best_plan(exp, exp.topology_spec)
        print(plan_note)
    root_preamble("testbed run")
    out = args.out or Path("results") / f"{exp.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    check_fresh_out_dir(out)
    existed = out.exists()
    launcher = None
    if args.backend != "remote":
        from testbed.run.launch import Launcher

        launcher = Launcher(out / "logs" / "launcher.log")  # before the runner's own imports
    try:
        from testbed.results.report import format_summary
        from testbed.run.runner import run_experiment

        summary = run_experiment(
            exp,
            out,
            delay_mechanism=args.delay_mechanism,
            progress=lambda line: print(line, flush=True),
            launcher=launcher,
            plan_note=plan_note,
            t_command_ns=command_start_ns(),  # start-up is counted from the command
            force=args.force,
            profile_wan=args.profile_wan,
            sched_trace=args.sched_trace,
            **backend(args),
        )
    except SpecError:
        if launcher is not None:
            launcher.close()
            launcher = None
        discard_unused_out(out, created=not existed)  # refused before building: no run folder left
        raise
    finally:
        if launcher is not None:
            launcher.close()
    print(format_summary(summary))
    return 0


def cmd_compare(args) -> int:
    policies = list(ABLATION) if args.ablation else [p.strip() for p in args.policies.split(",") if p.strip()]
    if not policies:
        raise SpecError("--policies", "(option)", args.policies, "is empty", f"use e.g. {','.join(POLICIES)}")
    for p in policies:
        try:
            parse_policy(p)
        except UnknownPolicy as e:
            raise SpecError("--policies", "(option)", p, "is no policy", str(e)) from None
    exp = load_experiment(args.experiment).with_overrides(
        iterations=args.iterations,
        schedule=args.schedule,
        virtual_stages=args.virtual_stages,
        time_dilation=args.dilation,
    )
    exp = bubbletea_overrides(exp, args)
    root_preamble("testbed compare")
    from testbed.results.compare import format_comparison
    from testbed.run.compare import compare

    out = args.out or Path("results") / f"compare-{exp.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    result = compare(
        exp,
        policies,
        out,
        args.repeat,
        args.delay_mechanism,
        progress=lambda line: print(line, flush=True),
        force=args.force,
        ablation=args.ablation,
        best_plan=args.plan == "best",
        sched_trace=args.sched_trace,
        **backend(args),
    )
    print(format_comparison(result))
    print(f"comparison.json and run folders in {out}")
    return 0


def _blocks_per_stage(exp) -> str:
    """``2``, or ``2-3`` where the blocks do not split evenly over the stages."""
    sizes = [len(stage_layers(exp.model.n_layers, exp.stages, s)) for s in range(exp.stages)]
    return f"{min(sizes)}" if min(sizes) == max(sizes) else f"{min(sizes)}-{max(sizes)}"


def _print_phases(exp, grants: bool) -> None:
    """Each phase of the topology's link profiles (``plan/profile_phases.py``) with the predicted
    iteration under the experiment's policy, placed as at the start (a run keeps its placement);
    with ``grants``, Atlas's grant plan for each phase whose links are all up, and whether each
    link direction's order differs from the first phase's."""
    from testbed.plan.profile_phases import experiment_at
    from testbed.run.link_replan import hop_orders

    base = make_plan(exp)
    phases = profile_phases(exp.topology_spec)
    print("link profile phases (one cycle), placed as at the start:")
    first_orders = None
    for ph in phases:
        when = f"  {ph.when} ({ph.describe()})"
        if ph.stalled(exp.topology_spec):
            print(f"{when}: a link is down without failover, training over it stalls")
            continue
        if not ph.all_up:
            when += " (routed around the link that is down)"
        at = experiment_at(exp, ph.states, list(base.workers))
        plan = make_plan(at, list(base.workers))
        print(f"{when}: predicted {plan.predicted_iteration_s:.3f} s under {exp.policy.name}")
        if grants:
            pol = exp.policy if exp.policy.grants else parse_policy("atlas")
            gp = make_plan(replace(at, policy=pol), list(base.workers)).grant_plan
            assert gp is not None  # a policy with grants has one
            orders = hop_orders(gp)
            first_orders = first_orders or orders
            differs = [h for h in orders if orders[h] != first_orders.get(h)]
            differs_text = ", ".join(differs) or "none"
            print(f"    grant plan under {pol.name}; order differs from the first phase's on: {differs_text}")
            print("    " + format_grant_plan(gp).replace("\n", "\n    "))


@processes_allowed()  # atlas's grant plans on every core (plan/cores.py)
def cmd_plan(args) -> int:
    exp = load_experiment(args.experiment).with_overrides(schedule=args.schedule, virtual_stages=args.virtual_stages)
    topo = exp.topology_spec
    print(
        f"{exp.name} on {topo.name}: global batch {exp.global_batch} sequences of {exp.model.seq_len} tokens, "
        f"microbatch {exp.microbatch_size}; compute {exp.compute.forward_ms:g}/{exp.compute.backward_ms:g} ms per "
        f"stage of {_blocks_per_stage(exp)} blocks, optimizer step {exp.compute.optimizer_target_ms:g} ms; "
        f"{exp.schedule}" + (f" ({exp.chunks} virtual stages per worker)" if exp.chunks > 1 else "")
    )
    for policy in POLICIES:
        try:
            plan = make_plan(exp.with_overrides(policy=policy))
        except SpecError as e:
            print(f"  {policy}: infeasible: {e.field} {e.value} {e.problem}")
            continue
        p = plan.prediction
        where = ", ".join(f"s{w.stage}r{w.replica}@{w.host}" for w in plan.workers)
        pipeline = (
            f"pipeline {p.fill_s:.3f} simulated" if p.steady_s == 0 else f"fill {p.fill_s:.3f}, steady {p.steady_s:.3f}"
        )
        print(f"  {policy}: predicted {p.iteration_s:.3f} s ({pipeline}, all-reduce {p.allreduce_s:.3f}); {where}")
    own = exp.policy if exp.policy.pipeline_across_dcs else parse_policy("pp-fair")
    for pol in dict.fromkeys([own, parse_policy("atlas")]):  # the experiment's, then Atlas's striping
        try:
            plan = make_plan(replace(exp, policy=pol))
        except SpecError:
            continue
        t, n = plan.predicted_iteration_s, plan.connections
        print(f"WAN load under {pol.name} ({n} connection(s) per transfer; predicted iteration {t:.3f} s):")
        print(format_loads(boundary_loads(exp, topo, list(plan.workers), n), t))
    plans = alternatives(exp, topo)
    print("plans weighed (same global batch and microbatch size; Atlas's DC selection):")
    print(f"  {'stages':>6} {'replicas':>8} {'microbatches':>12} {'DCs':>4} {'predicted s':>12}")
    for p in plans[: args.top]:
        if p.prediction:
            print(
                f"  {p.stages:>6} {p.replicas:>8} {p.microbatches:>12} {p.prediction.dcs_used:>4} "
                f"{p.prediction.iteration_s:>12.3f}"
            )
        else:
            print(f"  {p.stages:>6} {p.replicas:>8} {p.microbatches:>12} {'-':>4} {'infeasible':>12}  ({p.why_not})")
    best, more = what_if(plans)
    if best:
        if more:
            verdict = "helps" if more.prediction.iteration_s < best.prediction.iteration_s else "does not help"
            print(
                f"what-if: the best plan uses {best.prediction.dcs_used} DC(s); adding a DC {verdict} (best "
                f"{best.prediction.dcs_used + 1}-DC plan: {more.stages} stages x {more.replicas} replicas, "
                f"{more.prediction.iteration_s:.3f} s vs {best.prediction.iteration_s:.3f} s)"
            )
        else:
            print(f"what-if: the best plan uses {best.prediction.dcs_used} DC(s); no feasible plan uses one more")
    if args.grants:
        pol = exp.policy if exp.policy.grants else parse_policy("atlas")
        plan = make_plan(replace(exp, policy=pol))
        assert plan.grant_plan is not None  # a policy with grants has one
        print(f"grant plan under {pol.name} ({plan.connections} connection(s) per cross-DC transfer):")
        print(format_grant_plan(plan.grant_plan))
    if profile_phases(exp.topology_spec):
        _print_phases(exp, args.grants)
    try:  # the one value a run of this experiment is made from (plan/run_plan.py)
        run_plan = make_plan(exp)
    except SpecError as e:
        print(f"the run's plan under {exp.policy.name}: infeasible: {e.field} {e.value} {e.problem}")
        return 0
    print(format_plan(run_plan))
    _print_dilation(exp, run_plan)
    return 0


def _print_dilation(exp, run_plan) -> None:
    """The smallest time dilation this machine runs ``exp`` representatively at (``fit.suggest_dilation``)."""
    from testbed.net.capacity import cached_capacity_bps
    from testbed.net.features import cached_features
    from testbed.run.fit import suggest_dilation

    mechanism = "nfqueue" if cached_features().get("netem") is False else "netem"
    need = suggest_dilation(run_plan, capacity_bps=cached_capacity_bps(mechanism))
    k = exp.time_dilation
    verdict = (
        ""
        if k == 1 and need.k == 1
        else f"; the experiment's time_dilation {k:g} is "
        + ("enough" if k >= need.k else f"too small (--dilation {need.k:g})")
    )
    print(need.describe() + verdict)


def cmd_schedule(args) -> int:
    exp = load_experiment(args.experiment).with_overrides(
        microbatches=args.microbatches, schedule=args.schedule, virtual_stages=args.virtual_stages
    )
    plan = make_plan(exp)
    workers = plan.workers
    from testbed.run.fit import check_iteration_time

    check_iteration_time(plan)  # a schedule of 10^12 microbatches is no table to print
    tables, chunk = experiment_tables(exp), chunk_numbers(experiment_homes(exp))

    def label(a: RankAction) -> str:
        return f"{a.kind}{a.microbatch}" + (f"c{chunk[a.stage]}" if chunk[a.stage] else "")

    held = f", {exp.chunks} virtual stages per worker" if exp.chunks > 1 else ""
    print(f"{exp.schedule}: {exp.stages} stages x {exp.replicas} replicas, {exp.microbatches} microbatches{held}")
    print(
        "actions per worker (F/B = forward/backward of microbatch m, I/W = the backward's input/weight part, "
        "c1 = on the worker's second virtual stage; receives and sends implied):"
    )
    for w in workers:
        print(
            f"  worker {w.rank} ({w.host}, stage {w.stage}, replica {w.replica}): "
            + " ".join(label(a) for a in tables[w.stage])
        )
    rows = rank_grid(tables, label=label)
    print(
        f"simulated grid (a forward of a virtual stage = 1 slot, its backward 2, input and weight parts 1 each; "
        f"communication free; '.' = bubble, {bubble_fraction(rows):.0%} of slots):"
    )
    print(format_grid(rows, width=max(3, *(len(c) for row in rows for c in row))))
    return 0


def cmd_analyze(args) -> int:
    from testbed.results.report import finalize, format_summary

    if not (args.run_dir / "config.json").exists():
        raise SpecError(
            str(args.run_dir),
            "(run folder)",
            str(args.run_dir),
            "has no config.json",
            "give a folder written by testbed run",
        )
    summary = finalize(args.run_dir)
    print(format_summary(summary))
    print(f"summary, events.parquet, trace.json and plots rewritten in {args.run_dir}")
    return 0
