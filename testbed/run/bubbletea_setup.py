"""Preparing BubbleTea for a run: the request stream (a trace, or the synthetic stream fitted to
it), the decode host of each DC, the workers' part of the configuration, and the dispatcher."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from testbed.bubbletea.decisions import seconds_per_flop
from testbed.bubbletea.dispatcher import Dispatcher
from testbed.bubbletea.dispatcher_link import PRIOR
from testbed.bubbletea.request_table import requests_to_frame
from testbed.bubbletea.stream import request_stream
from testbed.net.network import Network, RelayedControl
from testbed.net.registry import control_dir
from testbed.plan.bubble_timeline import END
from testbed.plan.cost_model import optimizer_s
from testbed.plan.memory import device_bytes_besides_kv
from testbed.plan.placement import WorkerSpec, decode_hosts
from testbed.plan.run_plan import RunPlan
from testbed.plan.worker_config import BubbleTeaConfig
from testbed.trace import schema as T

#: a run serving prefill alone under real compute, whose iteration is not known before the run,
#: serves windows of this length (s); with padded compute, the predicted iteration's
ALONE_WINDOW_S = 1.0


def prepare_bubbletea(net: Network, plan: RunPlan, out_dir: Path) -> tuple[BubbleTeaConfig, Dispatcher, dict[str, str]]:
    """(the workers' BubbleTea configuration, the dispatcher (not started), the decode host of each
    DC). The stream is written to ``requests/stream.parquet``. Serving prefill alone
    (``+prefill-alone``), a worker's window is the predicted iteration (``ALONE_WINDOW_S`` under
    real compute), all of it one bubble, and its GPU holds no training state."""
    exp, workers = plan.experiment, list(plan.workers)
    bt = exp.bubbletea
    reqs = request_stream(exp)
    (out_dir / "requests").mkdir(parents=True, exist_ok=True)
    requests_to_frame(reqs).to_parquet(out_dir / "requests" / "stream.parquet", index=False)
    hosts = decode_hosts(exp.topology_spec, workers)
    s_per_flop = seconds_per_flop(exp)
    control = control_dir()
    prior, iteration_s = bubble_prior(plan)
    if not exp.policy.training:  # prefill alone: each worker's whole window is its one bubble
        iteration_s = iteration_s or ALONE_WINDOW_S
        prior = {str(w.rank): {T.ALONE_SLOT: iteration_s} for w in workers}
    cfg = BubbleTeaConfig(
        spec=bt,
        s_per_flop=s_per_flop,
        inbox=str(control / f"{net.prefix}-w{{rank}}.sock"),
        dispatcher=str(control / f"{net.prefix}-bt.sock"),
        decode_hosts={dc: str(net.host(h).ip) for dc, h in hosts.items()},
        prior_s=prior,
        prior_iteration_s=iteration_s,
        device_bytes={str(w.rank): device_bytes_besides_kv(exp, w.stage) for w in workers},
        gpu_memory_bytes=None if exp.gpu_memory_mb is None else int(exp.gpu_memory_mb * 2**20),
        alone=not exp.policy.training,
    )
    ranks = [w.rank for w in workers]
    if isinstance(net.shaping, RelayedControl):  # workers on other machines: their paths bridged
        inboxes: dict[str, list[str]] = {}
        for w in workers:
            inboxes.setdefault(net.host_machine(w.host) or "", []).append(cfg.inbox_of(w.rank))
        net.shaping.open_bridge([cfg.dispatcher], inboxes)
    d = Dispatcher(bt, reqs, ranks, s_per_flop, Path(cfg.dispatcher), cfg.inbox, out_dir, tuple(hosts))
    return cfg, d, hosts


def start_bubbletea(net: Network, dispatcher: Dispatcher, decode_at: dict[str, str], cfg_arg: str) -> None:
    """Start each DC's decode host (``bubbletea.decode``, on the worker configuration ``cfg_arg`` as
    the hosts name it) and then the dispatcher."""
    for dc, host in decode_at.items():
        net.popen(
            host,
            [net.python(host), "-m", "testbed.bubbletea.decode", cfg_arg, dc],
            env=net.process_env({"OMP_NUM_THREADS": "1"}),
        )
    dispatcher.start()


def stop_bubbletea(
    dispatcher: Dispatcher,
    cfg: BubbleTeaConfig,
    workers: list[WorkerSpec],
    out_dir: Path,
    progress: Callable[[str], Any],
) -> None:
    """Stop the dispatcher, warn (through ``progress``) of a dispatcher that failed, recorded in
    ``out_dir/dispatcher_failed``, or of decode hosts that never listened, and remove the workers'
    inboxes. Training is not affected by either failure."""
    dispatcher.stop()
    if dispatcher.failed is not None:
        progress(
            f"WARNING: the BubbleTea dispatcher failed ({dispatcher.failed!r}); requests stopped "
            "being dispatched, training was not affected"
        )
        (out_dir / "dispatcher_failed").write_text(repr(dispatcher.failed))
    if dispatcher.decode_waiting:
        progress(
            f"WARNING: the decode host of {', '.join(sorted(dispatcher.decode_waiting))} never listened, so "
            f"no request was dispatched; see its log in {out_dir / 'logs'}"
        )
    for w in workers:
        Path(cfg.inbox_of(w.rank)).unlink(missing_ok=True)


def send_priors(cfg: BubbleTeaConfig, priors: dict[str, dict[str, float]]) -> None:
    """Give each worker's bubble predictor a new prior (rank as a string -> slot -> s) through its
    inbox (``dispatcher_link.PRIOR``); a worker not there (it ended) is skipped."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        for rank, prior in priors.items():
            try:
                sock.sendto(json.dumps({PRIOR: prior}).encode(), cfg.inbox_of(int(rank)))
            except OSError:
                pass


def bubble_prior(plan: RunPlan) -> tuple[dict[str, dict[str, float]], float]:
    """Each worker's predicted bubbles before the run (rank as a string -> the action a bubble
    precedes -> s) and the predicted iteration (s), from the run plan's bubbles (the schedule, the
    compute targets and the WAN: ``plan/bubble_timeline.py``), so that prefill starts in the first
    iteration; none under real compute, whose times are not known before the run."""
    if plan.bubbles is None or not plan.experiment.compute.padded:
        return {}, 0.0
    t, bubbles = plan.bubbles
    rank = {(w.stage, w.replica): w.rank for w in plan.workers}
    prior: dict[str, dict[str, float]] = {}
    for b in bubbles:  # the drain: the wait after the last compute (until the all-reduce can start)
        slot = T.SEND_DRAIN_SLOT if b.before == END else b.before
        prior.setdefault(str(rank[(b.stage, b.replica)]), {})[slot] = b.duration_s
    return prior, t + optimizer_s(plan.experiment)
