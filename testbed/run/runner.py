"""Run an experiment: build the topology, start one worker per emulated GPU in its host, watch
them, sample the WAN classes, tear down, and turn the traces into a summary and plots.

Failure handling: a worker that exits non-zero, or a run whose workers write no event for
``hang_timeout_s``, aborts the whole run with an error naming the worker and its log tail; the
network is removed in every case and the traces written so far are kept and summarised.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from testbed.bubbletea.stream import request_stream
from testbed.errors import SpecError, TestbedError
from testbed.net.network import LocalHosts, Network
from testbed.net.tracefs import SchedTrace, TracefsMount, ensure_tracefs
from testbed.plan.placement import decode_hosts
from testbed.plan.run_plan import RunPlan, make_plan
from testbed.plan.worker_config import STAGGER_FILE, TrainingConfig, WorkerConfig, write_worker_config
from testbed.results.report import finalize
from testbed.run.atlas_setup import profiles_first, start_controller
from testbed.run.backends import make_network, offers_live_shaping, runs_here
from testbed.run.bubbletea_setup import prepare_bubbletea, send_priors, start_bubbletea, stop_bubbletea
from testbed.run.fit import (
    DILATION_STEP,
    MAX_CONTENDED_SHARE,
    check_connection_window,
    check_corpus,
    check_iteration_time,
    check_memory,
    contended_share,
)
from testbed.run.launch import Launcher, start_workers
from testbed.run.link_replan import LinkReplans
from testbed.run.profile import replan_from_profile
from testbed.run.records import check_fresh_out_dir, record_plan, write_config, write_env
from testbed.run.sched_tracing import start_sched_trace
from testbed.run.wan_profiling import profile_wan_paths
from testbed.run.watch import LinkSampler, RunError, watch
from testbed.spec.dilation import dilate_experiment
from testbed.spec.experiment import Experiment
from testbed.trace.clock import now_ns
from testbed.trace.startup import mark_startup
from testbed.train.corpus import corpus_bytes, corpus_sha256

GLOO_PORT = 29500

__all__ = ["RunError", "check_runnable", "run_experiment", "timeout_s"]


#: the predicted iterations a run's collective and hang timeouts last at least (``timeout_s``)
TIMEOUT_ITERATIONS = 3
#: how much longer than the outage timeout the collective timeout is (s): time for the watcher to
#: see the outage, abort and tear down before any worker's gloo gives up
OUTAGE_MARGIN_S = 30.0


def timeout_s(exp: Experiment, predicted_iteration_s: float = 0.0) -> float:
    """Collective timeout: ten times the slowest activation transfer (bytes / slowest WAN rate plus
    the longest one-way delay) plus the padded compute of a whole iteration, at least 60 s and at
    least ``TIMEOUT_ITERATIONS`` predicted iterations (dp-wan's all-reduce over a slow link can take
    minutes: a random draw's was cut at 60 s). A slow link never trips it; a dead peer is detected
    within it. It is also longer than the experiment's ``outage_timeout`` (plus
    ``OUTAGE_MARGIN_S``): a link that stays down is reported by the run's watcher, naming it, not by
    gloo."""
    topo = exp.topology_spec
    act_bytes = exp.activation_bytes
    slowest = min(link.rate_bps for link in topo.links) if topo.links else 10**9
    longest = max((link.delay_us for link in topo.links), default=0) / 1e6
    per_iter = exp.microbatches * (exp.compute.forward_ms + exp.compute.backward_ms) / 1000 * exp.stages
    transfers = 10 * (act_bytes * 8 / slowest + longest) * exp.microbatches * exp.stages
    outage = exp.outage_timeout / 1e6 + OUTAGE_MARGIN_S
    return max(60.0, transfers + 3 * per_iter, TIMEOUT_ITERATIONS * predicted_iteration_s, outage)


def _replans_stagger(exp: Experiment) -> bool:
    """Whether the pipelines' offsets may be planned again while the run trains (planned grants on
    a topology whose links have profiles: ``link_replan.py``); the first stages then read them from
    the stagger file each iteration."""
    return exp.policy.sharing == "planned" and any(link.profile for link in exp.topology_spec.links)


def check_runnable(exp: Experiment, backend: str = "netns", force: bool = False) -> RunPlan:
    """Everything about ``exp`` on its topology that can be refused before anything is built: what
    the backend cannot do, the placement, BubbleTea's decode hosts and request trace, the memory the workers need,
    the corpus, an iteration longer than ``fit.MAX_ITERATION_S`` (unless ``force``), a connection
    window too small to emulate (``fit.check_connection_window``). Returns the
    run's plan (``plan/run_plan.make_plan``), made here once; raises SpecError."""
    if (exp.policy.grants or exp.policy.bubbletea) and not offers_live_shaping(backend):
        raise SpecError(
            "--policy",
            "(option)",
            exp.policy.name,
            f"needs live shaping, which --backend {backend} does not offer",
            f"use --policy pp-fair or dp-wan with --backend {backend}, or another backend",
        )
    plan = make_plan(exp)
    if exp.policy.bubbletea:
        decode_hosts(exp.topology_spec, list(plan.workers))
        request_stream(exp)  # a trace file is read and checked before anything is built
    check_iteration_time(plan, force)
    short = plan.gpu_shortfall
    if short:
        raise SpecError(
            exp.source,
            "gpu_memory_mb",
            exp.gpu_memory_mb,
            f"is too small: {short}",
            "use more stages, a smaller microbatch_size or model, or a larger gpu_memory_mb",
        )
    if runs_here(backend):  # remote workers use the remote machines' memory, not checked from here
        check_memory(plan)
    check_corpus(exp)
    check_connection_window(plan)
    return plan


def run_experiment(
    exp: Experiment,
    out_dir: Path,
    delay_mechanism: str = "auto",
    progress: Callable[[str], Any] = print,
    hang_timeout_s: float | None = None,
    backend: str = "netns",
    inventory: Path | None = None,
    launcher: Launcher | None = None,
    t_command_ns: int | None = None,
    force: bool = False,
    plan_note: str | None = None,
    profile_wan: bool = False,
    sched_trace: bool = False,
) -> dict[str, Any]:
    """Run ``exp`` on ``backend`` (``backends.py``) and return its summary (also in
    ``out_dir/summary.json``). ``launcher``: a worker launcher to reuse (``compare``); without one,
    a run whose hosts are on this machine starts its own at once. ``t_command_ns``: when the
    command began (start-up is counted from there; default: now). ``force``: run even an iteration
    the cost model predicts to take longer than ``fit.MAX_ITERATION_S``; ``plan_note``: which plan the
    planner chose and why (``what_if.best_plan``), recorded in config.json. ``profile_wan``: before training,
    measure one TCP connection on each WAN path training uses (``net/wan_probe.py``) into
    ``wan_profile.json``, for ``testbed sim --validate``. ``sched_trace``: record the kernel
    scheduler's events while training (``net/tracefs.py``, ``results/sched_trace.py``; hosts on
    this machine only; tracefs mounted first where none is, recorded in ``env.json``). Raises
    SpecError for a run refused before building (``check_runnable``), RunError when a worker fails;
    PrivilegeError, FeatureError, BuildError from the network (and FeatureError, before building,
    where tracefs cannot record the scheduler)."""
    t_begin_ns = t_command_ns or now_ns()
    dilation = exp.time_dilation
    exp = dilate_experiment(exp)  # what runs in real time (spec/dilation.py); the summary gives the emulated frame
    plan = check_runnable(exp, backend, force)
    if dilation != 1 and runs_here(backend):
        warn_dilation(plan, dilation, progress)
    if sched_trace:
        if not runs_here(backend):
            raise SpecError(
                "--sched-trace",
                "(option)",
                backend,
                "traces this machine's scheduler",
                "use --backend netns or mininet",
            )
    # FeatureError, before anything is built, where the kernel cannot trace
    tracefs = ensure_tracefs() if sched_trace else None
    check_fresh_out_dir(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    mark_startup(out_dir, "run_start", t_ns=t_begin_ns)
    own = Launcher(out_dir / "logs" / "launcher.log") if launcher is None and runs_here(backend) else None
    try:
        return _run(
            exp,
            out_dir,
            plan,
            delay_mechanism,
            progress,
            hang_timeout_s,
            backend,
            inventory,
            launcher or own,
            own,
            t_begin_ns,
            plan_note,
            profile_wan,
            tracefs,
            dilation,
        )
    finally:
        if own is not None:
            own.close()


def warn_dilation(plan: RunPlan, dilation: float, progress: Callable[[str], Any]) -> None:
    """Say so where ``plan`` (dilated ``dilation`` times) still asks more of this machine's cores than
    a representative run may (``fit.contended_share`` above ``fit.MAX_CONTENDED_SHARE``), and where
    the pipelines' flows share links under CUBIC, whose window grows with real time, not the
    dilated world's (docs/time-dilation.md: 3% slower at k = 2-4 on the sharing experiment; Reno,
    clocked by ACKs alone, within 0.8%)."""
    exp = plan.experiment
    if exp.policy.sharing == "tcp" and exp.topology_spec.tcp_congestion in (None, "cubic"):
        progress(
            f"note: dilated x{dilation:g} with the links shared by TCP under "
            f"{exp.topology_spec.tcp_congestion or 'the machine default (cubic on most)'}: CUBIC's window grows "
            "with real time, not the dilated world's, so sharing may run a few percent slower than undilated "
            "(docs/time-dilation.md); a topology's tcp_congestion: reno keeps it"
        )
    share, _, _ = contended_share(plan)
    if share > MAX_CONTENDED_SHARE:
        need = math.ceil(dilation * share / MAX_CONTENDED_SHARE / DILATION_STEP) * DILATION_STEP
        progress(
            f"WARNING: at time dilation {dilation:g} this machine's compute still takes {share:.0%} of the padded "
            f"targets with every worker at once (at most {MAX_CONTENDED_SHARE:.0%}): operations may overrun and the "
            f"run not be representative; use --dilation {need:g} or more (testbed plan suggests the smallest)"
        )


def _run(
    exp: Experiment,
    out_dir: Path,
    plan: RunPlan,
    delay_mechanism: str,
    progress: Callable[[str], Any],
    hang_timeout_s: float | None,
    backend: str,
    inventory: Path | None,
    launcher: Launcher | None,
    own_launcher: Launcher | None,
    t_begin_ns: int,
    plan_note: str | None = None,
    profile_wan: bool = False,
    tracefs: TracefsMount | None = None,
    dilation: float = 1.0,
) -> dict[str, Any]:
    """``run_experiment``'s body; ``tracefs``: where the scheduler is traced from (None: it is not);
    ``dilation``: the time dilation ``exp`` (the real frame) was made with."""
    topo = exp.topology_spec
    workers = list(plan.workers)
    corpus_sha = corpus_sha256(corpus_bytes(Path(exp.data) if exp.data else None))
    write_config(out_dir, exp, workers, plan.predicted_iteration_s, plan_note, dilation)
    record_plan(out_dir, plan, t_begin_ns, "made before the run")
    hang = hang_timeout_s or timeout_s(exp, plan.predicted_iteration_s)
    error: BaseException | None = None
    t_start = time.monotonic()
    try:
        with make_network(
            topo,
            backend,
            inventory,
            delay_mechanism=delay_mechanism,
            out_dir=out_dir,
            tcp_buffer_bytes=plan.socket_buffer_bytes,
        ) as net:
            write_env(out_dir, net, corpus_sha, t_begin_ns, tracefs.env() if tracefs else {})
            mark_startup(out_dir, "network_built")
            if profile_wan:
                profile_wan_paths(net, exp, workers, out_dir, progress)
                mark_startup(out_dir, "wan_profiled")
            if own_launcher is not None and isinstance(net, LocalHosts):
                net.adopt(own_launcher.proc, "worker launcher")  # registered for testbed clean
            tracer = net.sched_trace() if tracefs and isinstance(net, LocalHosts) else None
            _train(net, exp, plan, out_dir, hang, progress, t_start, launcher if runs_here(backend) else None, tracer)
    # RunError, a dead delay element or agent, Ctrl-C, SIGTERM or SIGHUP (SystemExit, run/interrupts.py):
    # the traces are kept and summarised, then the error raised again
    except (TestbedError, KeyboardInterrupt, SystemExit) as e:
        error = e
        if not isinstance(e, (RunError, KeyboardInterrupt, SystemExit)) and not (out_dir / "events").exists():
            raise  # it failed before any worker ran: nothing to summarize
    summary = finalize(out_dir, aborted=error is not None)
    if error is not None:
        raise error
    progress(f"done in {time.monotonic() - t_start:.1f} s; traces in {out_dir}")
    return summary


def _corpus_for_hosts(net: Network, exp: Experiment) -> str | None:
    """The corpus as the hosts' processes name it: the path itself where they see this machine's
    files, else the corpus as read here, copied to them (every replica trains on the same bytes
    whatever the machines' own files hold)."""
    path = Path(exp.data) if exp.data else None
    if net.local_files:
        return str(path) if path is not None else None
    return net.share_bytes("corpus.txt", corpus_bytes(path))


def _train(
    net: Network,
    exp: Experiment,
    plan: RunPlan,
    out_dir: Path,
    hang_s: float,
    progress: Callable[[str], Any],
    t_start: float,
    launcher: Launcher | None,
    tracer: SchedTrace | None = None,
) -> None:
    """Start the controller, BubbleTea's processes and the workers on the built ``net`` as ``plan``
    places and plans them; watch them (with ``tracer``, the kernel's scheduler recorded meanwhile
    into ``sched.parquet``: started before anything of the run's, so that a refusal costs no
    training, and saved and removed whatever happens)."""
    with ExitStack() as stack:
        if tracer is not None:
            start_sched_trace(stack, tracer, launcher, out_dir, progress)
        # gloo connects each pair when it first talks instead of the whole mesh up front: seconds of
        # start-up, more so with many striped connections (torch's TORCH_GLOO_LAZY_INIT)
        worker_env = {"OMP_NUM_THREADS": "1", "TORCH_GLOO_LAZY_INIT": "1"}
        workers, n_conn = list(plan.workers), plan.connections
        controller, grant_plan = start_controller(net, plan, out_dir)
        if controller is not None:  # stopped even if what follows fails to start
            stack.callback(controller.stop)
        profiling = profiles_first(exp)
        bt, dispatcher, decode_at = prepare_bubbletea(net, plan, out_dir) if exp.policy.bubbletea else (None, None, {})
        cfg = WorkerConfig(
            TrainingConfig.of(exp, _corpus_for_hosts(net, exp), n_conn),
            tuple(workers),
            net.host_out_dir,
            f"tcp://{net.host(workers[0].host).ip}:{GLOO_PORT}",
            timeout_s(exp, plan.predicted_iteration_s),
            str(controller.sock_path) if controller else None,
            bt,
            grant_plan.stagger_s if grant_plan is not None and exp.policy.sharing == "planned" else (),
            f"{net.host_out_dir}/{STAGGER_FILE}" if profiling or _replans_stagger(exp) else None,
        )
        write_worker_config(out_dir / "worker_config.json", cfg)
        cfg_arg = net.share_file(out_dir / "worker_config.json")
        if dispatcher is not None:
            start_bubbletea(net, dispatcher, decode_at, cfg_arg)
        # one gloo connection per pair per entry; concurrent operations use different ones
        env = {**worker_env, "GLOO_SOCKET_IFNAME": ",".join(["eth0"] * n_conn)}
        procs = start_workers(
            net, launcher, out_dir / "worker_config.json", cfg_arg, {w.rank: w.host for w in workers}, env
        )
        progress(
            f"{len(workers)} workers started on {exp.topology_spec.name} ({net.mechanism} delay); "
            f"{exp.stages} stages x {exp.replicas} replicas, {exp.schedule}, {exp.microbatches} microbatches"
        )
        sampler = LinkSampler(net, out_dir / "link_counters.jsonl")
        sampler.start()
        with ExitStack() as stops:  # run in the reverse order, each even when one before it raised
            if dispatcher is not None and bt is not None:
                stops.callback(stop_bubbletea, dispatcher, bt, workers, out_dir, progress)
            stops.callback(sampler.stop)
            if tracer is not None:
                stops.callback(tracer.stop)  # the teardown is not training: not recorded
            profile = (
                replan_from_profile(plan, controller, out_dir, out_dir / STAGGER_FILE, progress)
                if profiling and controller is not None
                else None
            )
            replans = None
            if controller is not None or bt is not None:  # a profile, testbed link or a failover may change the WAN
                replans = LinkReplans(
                    plan,
                    controller,
                    out_dir,
                    progress,
                    stage_s=lambda: profile.times if profile is not None else None,
                    stagger_path=out_dir / STAGGER_FILE if _replans_stagger(exp) else None,
                    ready=lambda: profile is None or profile.done,
                    priors=(lambda priors: send_priors(bt, priors)) if bt is not None else None,
                )
            watch(net, exp, workers, procs, out_dir, hang_s, progress, t_start, controller, profile, replans)
        if sampler.error is not None:
            progress(f"the link sampler stopped early ({sampler.error}): link_counters.jsonl ends there")
