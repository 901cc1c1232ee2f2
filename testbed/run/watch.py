"""Watching a run while it trains: its workers (a crash or a hang aborts the run, naming the worker
and its log tail), the delay mechanism, Atlas's controller, its progress (one line per iteration),
and the WAN classes' counters (sampled into ``link_counters.jsonl``)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from testbed.atlas.controller import Controller
from testbed.errors import TestbedError
from testbed.net.network import Network, Process
from testbed.plan.placement import WorkerSpec
from testbed.plan.virtual_stages import experiment_homes
from testbed.run.link_replan import LinkReplans
from testbed.run.outage_watch import OutageWatch
from testbed.run.profile import FirstIterationProfile
from testbed.spec.experiment import Experiment
from testbed.trace import schema as T
from testbed.trace import task_names
from testbed.trace.clock import now_ns
from testbed.trace.jsonl import open_jsonl, write_row
from testbed.trace.shaping_log import class_id
from testbed.trace.task_names import name_this_thread

#: Extra time before a run's first event: workers import torch and join the process group.
STARTUP_S = 120.0


class RunError(TestbedError):
    """A worker crashed or hung; the run was aborted (its traces are kept)."""


class LinkSampler(threading.Thread):
    """Samples every WAN class's counters (bytes sent, queue drops, overlimits, backlog) every
    ``interval_s`` into link_counters.jsonl."""

    def __init__(self, net: Network, path: Path, interval_s: float = 0.1) -> None:
        super().__init__(name="link-sampler", daemon=True)
        self.net, self.path, self.interval_s = net, path, interval_s
        self._halt = threading.Event()
        #: why it stopped before ``stop`` was called (the network failed under it), if it did
        self.error: str | None = None

    def run(self) -> None:
        from pyroute2.netlink.exceptions import NetlinkError

        name_this_thread(task_names.SAMPLER)
        with open_jsonl(self.path) as f:
            while not self._halt.wait(self.interval_s):
                try:
                    links = self.net.wan_counters()
                except (OSError, NetlinkError, TestbedError, KeyError) as e:  # the network is being torn down
                    if not self._halt.is_set():
                        self.error = f"{type(e).__name__}: {e}"
                    return
                t = now_ns()
                for (src, dst), counters in links.items():
                    for minor, c in counters.items():
                        write_row(
                            f,
                            {
                                T.T_NS: t,
                                T.LINK: f"{src}->{dst}",
                                T.CLASSID: class_id(minor),
                                T.TX_BYTES: c["tx_bytes"],
                                T.RATE_BPS: c["ceil_bps"],
                                T.DROPS: c["drops"],
                                T.OVERLIMITS: c["overlimits"],
                                T.BACKLOG_BYTES: c["backlog_bytes"],
                            },
                        )

    def stop(self) -> None:
        """Stop sampling; returns once the last sample is written (the teardown that follows
        closes the netlink handles it reads through)."""
        self._halt.set()
        if self.is_alive() and self is not threading.current_thread():
            self.join(timeout=5)


def log_tail(net: Network, host: str, lines: int = 15) -> str:
    text = net.log_path(host).read_text(errors="replace").splitlines()
    return "\n".join(text[-lines:])


def watch(
    net: Network,
    exp: Experiment,
    workers: list[WorkerSpec],
    procs: dict[int, Process],
    out_dir: Path,
    hang_s: float,
    progress: Callable[[str], Any],
    t_start: float,
    controller: Controller | None = None,
    profile: FirstIterationProfile | None = None,
    replans: LinkReplans | None = None,
) -> None:
    """Return when every worker has exited 0. Raises RunError when one exits non-zero or none
    writes an event for ``hang_s`` seconds (plus STARTUP_S before the first), DelayElementError
    when the delay mechanism dies; reports a dead controller (links fall back to fair sharing);
    polls ``profile`` (planned grants under real compute) until it has made its plan, and
    ``replans`` (Atlas's plan made again when a link's profile changes it). While a WAN
    link is down the run is stalled, not hung: OutageError once one has been down past the
    experiment's ``outage_timeout`` (``outage_watch.py``); a link that fails over does not stall
    it."""
    events = out_dir / "events"
    fails_over = [f"{x.a}:{x.b}" for x in exp.topology_spec.links if x.failover]
    outages = OutageWatch(out_dir, exp.outage_timeout / 1e6, fails_over)
    last_size, last_change, shown, offset = -1, time.monotonic(), -1, 0
    loss_stage = experiment_homes(exp)[-1]  # the worker holding the last virtual stage traces the loss
    last_stage = [w for w in workers if w.stage == loss_stage and w.replica == 0][0]
    while True:
        net.check_alive()
        why = controller.poll_failure() if controller is not None else None
        if why is not None:
            progress(
                f"WARNING: the Atlas controller died ({why}); WAN links fell back to fair sharing and training goes on"
            )
            (out_dir / "controller_failed").write_text(why)
        codes = {r: p.poll() for r, p in procs.items()}
        failed = [r for r, code in codes.items() if code not in (None, 0)]
        if failed:
            # the others fail because it did (their peer closed the connection): a worker killed by
            # a signal is the cause, then the lowest rank
            r = min(failed, key=lambda rank: (codes[rank] >= 0, rank))  # type: ignore[operator]
            w = workers[r]
            raise RunError(
                f"worker {r} (stage {w.stage}, replica {w.replica}, host {w.host}) exited with "
                f"status {codes[r]}; the run was aborted. Log tail:\n{log_tail(net, w.host)}"
            )
        if all(code == 0 for code in codes.values()):
            return
        if profile is not None:
            profile.poll()
        if replans is not None:
            replans.poll()
        size = sum(p.stat().st_size for p in events.glob("*.jsonl")) if events.exists() else 0
        now = time.monotonic()
        outages.check()
        if outages.down:  # stalled on the link, not hung: the hang timeout counts from its return
            last_change = now
        last_change = max(last_change, outages.last_up_ns / 1e9)
        if size != last_size:
            last_size, last_change = size, now
        elif now - last_change > (hang_s if size else hang_s + STARTUP_S):
            stuck = [r for r, code in codes.items() if code is None]
            raise RunError(
                f"no worker progressed for {hang_s:.0f} s (still running: workers {stuck}); the run was "
                f"aborted. Log tail of worker {stuck[0]}:\n{log_tail(net, workers[stuck[0]].host)}"
            )
        path = events / f"w{last_stage.rank}.jsonl"
        if path.exists():
            with open(path) as f:  # read only what was appended since the last look
                f.seek(offset)
                chunk = f.read()
            complete = chunk[: chunk.rfind("\n") + 1]
            offset += len(complete.encode())
            for line in complete.splitlines():
                try:
                    e = json.loads(line)
                except ValueError:  # progress lines only: the analysis reads the events on its own
                    continue
                if isinstance(e, dict) and e.get(T.KIND) in (T.OPTIMIZER, T.SERVING_WINDOW) and e[T.ITERATION] > shown:
                    shown = e[T.ITERATION]
                    what = f"loss {e[T.LOSS]:.4f}" if e.get(T.LOSS) is not None else "serving prefill alone"
                    progress(f"iteration {shown + 1}/{exp.iterations}  {what}  elapsed {now - t_start:.1f} s")
        time.sleep(0.2)
