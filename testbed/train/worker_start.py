"""A training worker's start, before its first iteration: its threads named, how its main thread
waits for inputs (``thread_slice.WaitSwitch``), its event trace, BubbleTea's prefill server where
the run has one, the process group joined, and its start-up line recording what the kernel
granted (``trace/startup.py``)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from testbed.bubbletea.prefill import PrefillServer
from testbed.plan.worker_config import WorkerConfig
from testbed.thread_slice import WaitSwitch
from testbed.trace import schema as T
from testbed.trace import task_names
from testbed.trace.events import EventWriter
from testbed.trace.startup import FILL_NICE, SLICE_NS, SWITCH_INTERVAL_US, WAIT_NICE, WAIT_RT_PRIORITY, mark_startup
from testbed.trace.task_names import name_this_thread
from testbed.train.checkout import join
from testbed.train.preload import Preloaded


def startup_mark(cfg: WorkerConfig, rank: int, phase: str, **fields: int | None) -> None:
    """One line of the run folder's ``startup.jsonl``: when this worker reached ``phase``, and ``fields``."""
    mark_startup(Path(cfg.out_dir), phase, rank, **fields)


@dataclass
class Started:
    """What ``start`` leaves the worker: its wait switch, event writer, prefill server (None
    without BubbleTea) and data-parallel group (``checkout.join``)."""

    switch: WaitSwitch
    ev: EventWriter
    server: PrefillServer | None
    dp_group: dist.ProcessGroup


def start(cfg: WorkerConfig, rank: int, pre: Preloaded) -> Started:
    """Start worker ``rank`` of the run configured by ``cfg``, from ``pre``, up to the process
    group joined and recorded; the calling thread then computes in the fair class."""
    name_this_thread(task_names.WORKER.format(rank=rank))  # before gloo's threads: they inherit it
    # the short CPU slice, inherited by gloo's threads and the prefill stream (which sets the
    # kernel's back); this thread waits for an input in the real-time class (``thread_slice.py``)
    switch = WaitSwitch()
    exp, me = cfg.training, cfg.worker(rank)
    torch.set_num_threads(1)
    torch.manual_seed(exp.seed)
    ev = EventWriter(
        Path(cfg.out_dir) / "events" / f"w{rank}.jsonl",
        **{T.WORKER: rank, T.HOST: me.host, T.DC: me.dc, T.STAGE: me.stage, T.REPLICA: me.replica},
    )
    bt = cfg.bubbletea
    # BubbleTea's prefill stream is a process forked from this one (bubbletea/prefill_stream.py):
    # made before the process group, it inherits none of gloo's threads or sockets
    corpus = pre.train_tokens  # prompts are real text of it
    server = None if bt is None else PrefillServer.for_worker(bt, exp.seed, rank, me.dc, ev, exp.padded, corpus)
    dp_group = join(cfg, rank)
    if server is not None and bt is not None:
        server.announce(bt.prior_iteration_s)  # the stream starts once every worker can fill its bubbles
    waits = {WAIT_RT_PRIORITY: switch.granted_rt_priority, WAIT_NICE: switch.granted_nice}
    nices = {} if server is None else {FILL_NICE: server.filler.nice}
    switch_interval_us = round(sys.getswitchinterval() * 1e6)
    startup_mark(
        cfg,
        rank,
        "process_group",
        **{SLICE_NS: switch.granted_ns, SWITCH_INTERVAL_US: switch_interval_us},
        **waits,
        **nices,
    )
    switch.default()  # gloo's threads keep the short slice; this one waits for its inputs in the real-time class
    return Started(switch, ev, server, dp_group)
