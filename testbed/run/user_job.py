"""A user's own training job in the emulated hosts (``testbed launch``): the field's launcher,
``torchrun`` (``torch.distributed.run``), started in each host as one node of the job (one process
per node: one emulated GPU), its rendezvous over the emulated network at rank 0's host.

The ranks form the mesh the user gives (``spec/mesh.py``) and are placed as the testbed's own
workers are (``plan/placement.place_stages``: stages across DCs, replicas inside one). Each node
runs in its host's network namespace and in a mount and UTS namespace of its own, where
``/etc/hosts`` names every emulated host and the hostname is its host's, so that the job resolves
its own name and its peers' as it would on machines (c10d looks both up); its environment is
torchrun's (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, ...) plus ``GLOO_SOCKET_IFNAME`` and
``NCCL_SOCKET_IFNAME`` on the host's interface, with nothing of this machine's torch.distributed
variables. Each rank's output goes to ``ranks/rank<R>.log`` in the job's folder (and to the
terminal with a rank prefix where asked); the WAN classes' counters are sampled every 100 ms as
for a run; the summary (``summary.json``) gives the wall time, every rank's exit status and each
WAN link direction's bytes and mean utilization.

The job ends when every rank has ended, when one exits non-zero (the others are stopped: the
job's status is that rank's), at ``timeout_s``, or on Ctrl-C or SIGTERM: the network and every
process in it are removed as ``testbed run`` removes them.

Mechanism (processes, the network) on top of the pure placement; one node's command, environment
and output in ``job_nodes.py``, Atlas's grants for the job in ``job_grants.py``.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd

from testbed.atlas.controller import Controller
from testbed.errors import SpecError, TestbedError
from testbed.net.management import add_management_network
from testbed.net.network import Network
from testbed.net.registry import control_dir
from testbed.net.shaping import LINK_CLASS_MINOR
from testbed.plan.connections import socket_buffer_cap
from testbed.plan.job_plan import JobWorkload, job_experiment
from testbed.plan.placement import atlas_dc_order, place_by_hand, place_stages
from testbed.plan.workers import WorkerSpec
from testbed.results.job_summary import (
    bytes_check,
    class_bytes,
    hook_figures,
    reported_bytes,
    sent_bytes,
    training_figures,
)
from testbed.results.link_counters import link_utilization
from testbed.results.plots import plot_links, plot_timeline
from testbed.results.wan_changes import configured_rates
from testbed.run.backends import make_network
from testbed.run.job_grants import JOB_BORROW, JobProfile, job_floor_share, managed_pairs
from testbed.run.job_nodes import (
    RANKS_DIR,
    RENDEZVOUS_PORT,
    RankStreamer,
    hosts_file,
    job_env,
    node_argv,
    script_status,
)
from testbed.run.outage_watch import OutageError, OutageWatch
from testbed.run.records import check_fresh_out_dir, write_env
from testbed.run.watch import LinkSampler
from testbed.spec.experiment import Experiment
from testbed.spec.mesh import Mesh
from testbed.spec.policy import Policy
from testbed.spec.routing import RoutingTable
from testbed.spec.topology import TopologySpec
from testbed.trace import schema as T
from testbed.trace.clock import now_ns
from testbed.trace.events import read_events
from testbed.trace.jsonl import read_jsonl
from testbed.trace.shaping_log import SHAPING_LOG
from testbed.train.job_hook import JOINED_DIR

#: where the job's rendezvous may go (``Job.rendezvous``)
RENDEZVOUS_PATHS = ("wan", "management")
#: how long a job may run unless told otherwise (s)
DEFAULT_TIMEOUT_S = 3600.0
#: how long every rank has to join the job (call ``init_process_group``) unless told otherwise (s)
DEFAULT_JOIN_TIMEOUT_S = 300.0
#: how long a WAN link may stay down before the job is stopped, unless told otherwise (s): the
#: experiments' default ``outage_timeout``
DEFAULT_OUTAGE_TIMEOUT_S = Experiment.outage_timeout / 1e6
#: the placements a job may take (Atlas's DC selection needs the job's workload, which the testbed
#: does not know)
JOB_PLACEMENTS = ("file-order", "largest-first")
#: how a job's pipelines may share the links: as TCP does, or Atlas's grants through the hook, FIFO
#: or planned (from the job's first iteration, measured: ``plan/job_plan.py``)
JOB_SHARINGS = ("tcp", "fifo", "planned")
#: connections a striped cross-DC transfer of a job uses unless told (``connections.wan_connections``'s
#: figure where no per-connection share is modelled)
DEFAULT_JOB_STRIPES = 4


class JobError(TestbedError):
    """A launched job failed: a rank exited non-zero, or it ran past its time."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Job:
    """What ``launch_job`` starts: ``script`` and its ``args`` on ``topology``, its ranks a ``mesh``
    placed under ``policy`` (its placement)."""

    topology: TopologySpec
    mesh: Mesh
    policy: Policy
    script: Path
    args: tuple[str, ...] = ()
    #: connections a striped transfer uses (``policy.striping``)
    stripes: int = DEFAULT_JOB_STRIPES
    #: iterations left out of the job's figures (where it marks iterations: ``trace/job.py``)
    warmup: int = 1
    #: each (stage, replica)'s host, from a placement file (``--placement``; None: placed as the
    #: testbed's own workers are)
    hosts: dict[tuple[int, int], str] | None = None
    #: where the rendezvous goes: ``wan`` (rank 0's host over the emulated network, counted on the
    #: WAN) or ``management`` (its address on the management network, ``net/management.py``)
    rendezvous: str = "wan"
    #: the experiment the job was launched on, if it was: its per-connection window caps the hosts'
    #: socket buffers as for the built-in worker's runs (``connections.socket_buffer_cap``)
    experiment: Experiment | None = None

    @property
    def hooked(self) -> bool:
        """Whether the hook (``train/job_hook.py``) manages the job's cross-DC transfers: Atlas's
        sharing or striping (otherwise it only marks each rank's joining)."""
        return self.policy.grants or self.policy.striping


def check_job(job: Job) -> list[WorkerSpec]:
    """The job's placement (rank, stage, replica, host, DC), checked before anything is built.
    Raises SpecError naming a script that is not there, a policy a job cannot take, or a mesh the
    topology cannot hold."""
    if not job.script.is_file():
        raise SpecError(str(job.script), "SCRIPT", str(job.script), "is not a file", "give the job's script after --")
    p = job.policy
    if p.placement not in JOB_PLACEMENTS or p.sharing not in JOB_SHARINGS or p.bubbletea or not p.training:
        raise SpecError(
            "--policy",
            "--policy",
            p.name,
            "is not applied to a launched job: Atlas's DC selection needs the job's workload before it runs, "
            "which the testbed does not know, and BubbleTea needs its own worker",
            "launch under pp-fair (TCP sharing) or pp-fair/sharing=fifo|planned/striping=on (Atlas's grants "
            "and striping), placed in file order or with /placement=largest-first",
        )
    if job.rendezvous not in RENDEZVOUS_PATHS:
        raise SpecError("--rendezvous", "--rendezvous", job.rendezvous, "is not a path", "give wan or management")
    if p.striping and not 2 <= job.stripes <= 16:
        raise SpecError("--connections", "--connections", str(job.stripes), "is not 2..16", "give e.g. --connections 4")
    if job.hosts is not None:
        if p.placement != "file-order":
            raise SpecError(
                "--policy", "--policy", p.name, "places the ranks, and so does --placement",
                "leave /placement out of the policy: the file places them",
            )  # fmt: skip
        return place_by_hand(job.hosts, job.mesh.dp, job.topology)
    order = atlas_dc_order(job.topology) if p.placement == "largest-first" else None
    return place_stages(job.mesh.pp, job.mesh.dp, job.topology, order, "--mesh")


def launch_job(
    job: Job,
    out_dir: Path,
    progress: Callable[[str], Any] = print,
    stream: Callable[[str], Any] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    delay_mechanism: str = "auto",
    join_timeout_s: float = DEFAULT_JOIN_TIMEOUT_S,
    outage_timeout_s: float | None = None,
) -> dict[str, Any]:
    """Run ``job`` (see the module doc) with its folder ``out_dir``; ``stream``: where each rank's
    output lines go, prefixed (None: only to their files). Returns the summary (also in
    ``summary.json``) once every rank has exited 0. Raises SpecError before building
    (``check_job``, a folder that holds a run), JobError when a rank exits non-zero, when some
    rank has not joined the job (called ``init_process_group``) ``join_timeout_s`` after the
    start (0: no limit; the error names them), the job runs past ``timeout_s`` or a WAN link
    stays down past ``outage_timeout_s`` (None: the experiment's ``outage_timeout`` where the job
    names one, else ``DEFAULT_OUTAGE_TIMEOUT_S``; a link that fails over does not count: its
    traffic moves) (the summary and every rank's output kept), and the network's errors."""
    workers = check_job(job)
    pairs = managed_pairs(job.topology, job.mesh.pp, workers) if job.hooked else []
    buffers = socket_buffer_cap(job.experiment, job.topology, workers) if job.experiment is not None else None
    check_fresh_out_dir(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    t_begin = now_ns()
    ranks_dir = out_dir / RANKS_DIR
    ranks_dir.mkdir(exist_ok=True)
    (out_dir / "job.json").write_text(
        json.dumps(
            {
                "script": str(job.script),
                "args": list(job.args),
                "mesh": asdict(job.mesh),
                "policy": job.policy.name,
                "topology": job.topology.name,
                "workers": [asdict(w) for w in workers],
                "rendezvous_port": RENDEZVOUS_PORT,
                "rendezvous": job.rendezvous,
                "hooked": job.hooked,
                "stripes": job.stripes if job.policy.striping else 1,
                "managed_pairs": pairs,
                "socket_buffer_bytes": buffers,
            },
            indent=1,
        )
    )
    codes: dict[int, int | None] = {}
    error: JobError | None = None
    t0 = time.monotonic()
    with (
        make_network(
            job.topology, "netns", delay_mechanism=delay_mechanism, out_dir=out_dir, tcp_buffer_bytes=buffers
        ) as net,
        ExitStack() as stack,
    ):
        write_env(out_dir, net, "", t_begin, {"job": str(job.script)})
        by_rank = sorted(workers, key=lambda w: w.rank)
        management = None
        if job.rendezvous == "management":
            management = add_management_network(net, [w.host for w in by_rank])
        hosts_path = out_dir / "hosts"
        hosts_path.write_text(hosts_file(net, job.topology, management))
        master = management[by_rank[0].host] if management else str(net.host(by_rank[0].host).ip)
        controller = None
        if job.policy.grants:
            controller = Controller(
                net, workers, job.mesh.dp, control_dir() / f"{net.prefix}.sock", out_dir / "controller.jsonl",
                floor_share=job_floor_share(job.mesh.dp), sharing="fifo", borrow=JOB_BORROW,
            )  # fmt: skip
            controller.install()
            controller.start()
            stack.callback(controller.stop)
        env = job_env(
            out_dir,
            controller.sock_path if controller is not None else None,
            job.stripes if job.policy.striping else 1,
        )
        procs: dict[int, subprocess.Popen] = {}
        for w in by_rank:
            argv = node_argv(
                net.python(w.host), str(hosts_path.resolve()), w.host, w.rank, len(by_rank), master,
                str(job.script.resolve()), job.args,
            )  # fmt: skip
            with open(ranks_dir / f"rank{w.rank}.log", "wb") as log:
                procs[w.rank] = net.popen(w.host, argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        progress(
            f"{len(by_rank)} ranks of {job.script.name} started on {job.topology.name} ({net.mechanism} delay): "
            f"pp={job.mesh.pp} x dp={job.mesh.dp}, rendezvous at {by_rank[0].host} ({master}:{RENDEZVOUS_PORT})"
        )
        sampler = LinkSampler(net, out_dir / "link_counters.jsonl")
        sampler.start()
        streamer = RankStreamer({r: ranks_dir / f"rank{r}.log" for r in procs}, stream) if stream else None
        if streamer is not None:
            streamer.start()
        stopped: str | None = None  # why the job was stopped from outside, if it was
        joins = (out_dir / JOINED_DIR, t0 + join_timeout_s) if join_timeout_s > 0 else None
        if outage_timeout_s is None:
            outage_timeout_s = job.experiment.outage_timeout / 1e6 if job.experiment else DEFAULT_OUTAGE_TIMEOUT_S
        fails_over = [f"{x.a}:{x.b}" for x in job.topology.links if x.failover]
        outages = OutageWatch(out_dir, outage_timeout_s, fails_over, ("the job's", "--outage-timeout"))
        profile = None
        if controller is not None and job.policy.sharing == "planned":
            profile = JobProfile(partial(job_stand_in, job), workers, out_dir, controller, progress)
        try:
            error = _watch(
                procs, {w.rank: w.host for w in by_rank}, codes, t0 + timeout_s, net, ranks_dir, joins,
                profile.poll if profile is not None else None, outages,
            )  # fmt: skip
        except KeyboardInterrupt:
            stopped = "interrupted (Ctrl-C)"
            raise
        except SystemExit:
            stopped = "stopped by SIGTERM or SIGHUP"
            raise
        except TestbedError as e:
            stopped = f"the network failed: {e}"
            raise
        finally:
            if streamer is not None:
                streamer.stop()
            sampler.stop()
            for rank, p in procs.items():
                codes.setdefault(rank, p.poll())
            if controller is not None and (why := controller.poll_failure()):
                progress(f"Atlas's controller failed ({why}): the links were shared as TCP shares them from then on")
            planned = profile.outcome() if profile is not None else None
            summary = _summary(out_dir, time.monotonic() - t0, codes, error, stopped, job, workers, planned)
    if error is not None:
        raise error
    progress(f"done in {summary['wall_time_s']:.1f} s; every rank exited 0; output in {ranks_dir}")
    return summary


def job_stand_in(job: Job, workload: JobWorkload) -> Experiment:
    """The experiment that stands for ``job`` once its ``workload`` is measured (``job_plan.py``)."""
    return job_experiment(
        workload, job.topology, job.mesh.pp, job.mesh.dp, job.policy, job.stripes,
        job_floor_share(job.mesh.dp), JOB_BORROW, job.experiment,
    )  # fmt: skip


def _watch(
    procs: dict[int, subprocess.Popen],
    host_of: dict[int, str],
    codes: dict[int, int | None],
    deadline: float,
    net: Network,
    ranks_dir: Path,
    joins: tuple[Path, float] | None = None,
    tick: Callable[[], Any] | None = None,
    outages: OutageWatch | None = None,
) -> JobError | None:
    """Wait for the ranks: None once every one has exited 0; the JobError to raise once one exits
    non-zero (the lowest rank among those that did; the script's own status where torchrun
    reported it), at ``deadline``, or (``joins``: the folder of the ranks' join marks, and by
    when) when a rank still running has not joined by then. ``codes`` gets each node's
    (torchrun's) status as it ends; ``tick`` is called on every round (the planned grants'
    profile); ``outages``: a WAN link down past its timeout stops the job (status 124), naming
    the link."""
    while True:
        for rank, p in procs.items():
            if rank not in codes and (c := p.poll()) is not None:
                codes[rank] = c
        failed = sorted(r for r, c in codes.items() if c)
        if failed:
            r = failed[0]
            status = script_status(ranks_dir / f"rank{r}.log") or codes[r] or 1
            return JobError(
                f"rank {r} (host {host_of[r]}) exited with status {status}; the other ranks were stopped "
                f"(its output: {RANKS_DIR}/rank{r}.log)",
                status,
            )
        if len(codes) == len(procs):
            return None
        if joins is not None and time.monotonic() > joins[1]:
            missing = sorted(r for r in procs if r not in codes and not (joins[0] / f"r{r}").exists())
            if missing:
                named = ", ".join(f"{r} ({host_of[r]})" for r in missing)
                return JobError(
                    f"rank{'s' if len(missing) > 1 else ''} {named} did not join the job within the join timeout "
                    f"(no call of init_process_group; output: {RANKS_DIR}/rank<R>.log) while the others waited; "
                    f"every rank was stopped (--join-timeout sets the limit, 0 for none)",
                    124,
                )
            joins = None  # every rank still running has joined
        if time.monotonic() > deadline:
            running = sorted(r for r in procs if r not in codes)
            return JobError(
                f"the job ran past its time limit; ranks {running} were still running and were stopped", 124
            )
        if outages is not None:
            try:
                outages.check()
            except OutageError as e:
                return JobError(str(e).replace("the run was aborted", "every rank was stopped"), 124)
        net.check_alive()
        if tick is not None:
            tick()
        time.sleep(0.1)


def _summary(
    out_dir: Path,
    wall_s: float,
    codes: dict[int, int | None],
    error: JobError | None,
    stopped: str | None,
    job: Job,
    workers: list[WorkerSpec],
    planned: str | None = None,
) -> dict[str, Any]:
    """``summary.json``: wall time, each rank's exit status (None: stopped while running), per WAN
    link direction its bytes and mean utilization over the job (from the sampled counters), and
    why it failed (``error``) or was stopped from outside (``stopped``: status 130), if it was;
    where the ranks wrote event lines, the iteration time and bubbles (``training``, with the
    timeline plot) and, under the hook, its cost and its bytes beside the classes' (``hook``,
    ``bytes``); the WAN utilization plot beside it."""
    links: dict[str, dict[str, float]] = {}
    path = out_dir / "link_counters.jsonl"
    rows = read_jsonl(path) if path.exists() else []
    counters = pd.DataFrame(rows)
    shaping = read_jsonl(out_dir / SHAPING_LOG) if (out_dir / SHAPING_LOG).exists() else []
    rates = configured_rates(shaping, counters) if rows else None  # drawn where they changed
    if rows:
        lu = link_utilization(counters)
        for link, nbytes in sent_bytes(counters, LINK_CLASS_MINOR).items():
            mine = lu[lu[T.LINK] == link]
            links[link] = {
                "bytes": nbytes,
                "utilization_mean": float(mine["utilization"].mean()) if not mine.empty else 0.0,
            }
        if not lu.empty:
            plot_links(lu, out_dir / "wan_utilization.png", rates)
    summary: dict[str, Any] = {
        "wall_time_s": wall_s,
        "exit_status": error.status if error is not None else 130 if stopped else 0,
        "rank_exit_status": {str(r): c for r, c in sorted(codes.items())},
        "failed": str(error) if error is not None else stopped,
        "policy": job.policy.name,
        "wan": links,
    }
    ev = read_events(out_dir) if (out_dir / "events").is_dir() else pd.DataFrame()
    training = training_figures(ev, job.warmup) if not ev.empty else None
    summary["training"] = training
    if training is not None:
        plot_timeline(ev, out_dir / "timeline.png", job.warmup, rates)
    if job.hooked:
        totals = read_jsonl(out_dir / "hook", "r*.json")
        its = training["iteration_time_s"] if training else None
        ran = int(ev[T.ITERATION].max()) + 1 if training else None  # every marked iteration, warm-up too
        summary["hook"] = hook_figures(totals, ran, its["mean"] if its else None, wall_s)
        summary["sharing"] = (
            planned or "fifo: Atlas's grants, earliest ready first" if job.policy.grants else "tcp"
        ) + (f"; striped over {job.stripes} connections" if job.policy.striping else "")
        if rows and not ev.empty:
            routes = RoutingTable(job.topology)
            dc_of = {w.rank: w.dc for w in workers}
            paths = {
                (s, d): [f"{a}->{b}" for a, b in zip(route, route[1:])]
                for s, d in managed_pairs(job.topology, job.mesh.pp, workers)
                for route in [routes.route(dc_of[s], dc_of[d]).dcs]
            }
            replica_of = {w.rank: w.replica for w in workers}
            summary["bytes"] = bytes_check(reported_bytes(ev, paths, replica_of), class_bytes(counters, job.mesh.dp))
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary
