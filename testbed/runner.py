"""Run an experiment: build the topology, start one worker per emulated GPU in its host, watch
them, sample the WAN classes, tear down, and turn the traces into a summary and plots.

Failure handling: a worker that exits non-zero, or a run whose workers write no event for
``hang_timeout_s``, aborts the whole run with an error naming the worker and its log tail; the
network is removed in every case and the traces written so far are kept and summarised.
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from . import trace as T
from .data import load_corpus
from .backends import make_emulation
from .emulation import Emulation
from .errors import SpecError, TestbedError
from .experiment import Experiment
from .placement import place
from .planner import socket_buffer_cap, wan_connections
from .topology import load_topology

GLOO_PORT = 29500
#: Extra time before a run's first event: workers import torch and join the process group.
STARTUP_S = 120.0


class RunError(TestbedError):
    """A worker crashed or hung; the run was aborted (its traces are kept)."""


def _versions() -> dict:
    import pyroute2
    import torch

    def cmd(argv):
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=5).stdout.strip()
        except OSError:
            return None

    repo = Path(__file__).resolve().parent.parent
    return {"python": platform.python_version(), "torch": torch.__version__, "pyroute2": pyroute2.__version__,
            "iproute2": cmd(["ip", "-V"]), "kernel": platform.release(),
            "git_commit": cmd(["git", "-C", str(repo), "rev-parse", "HEAD"]),
            "trace_schema": T.SCHEMA_VERSION}


def timeout_s(exp: Experiment, topo) -> float:
    """Collective timeout: ten times the slowest activation transfer (bytes / slowest WAN rate plus
    the longest one-way delay) plus the padded compute of a whole iteration, at least 60 s. A slow
    link never trips it; a dead peer is detected within it."""
    act_bytes = exp.microbatch_size * exp.model.seq_len * exp.model.d_model * 4
    slowest = min(link.rate_bps for link in topo.links) if topo.links else 10**9
    longest = max((link.delay_us for link in topo.links), default=0) / 1e6
    per_iter = exp.microbatches * (exp.compute.forward_ms + exp.compute.backward_ms) / 1000 * exp.stages
    return max(60.0, 10 * (act_bytes * 8 / slowest + longest) * exp.microbatches * exp.stages + 3 * per_iter)


class LinkSampler(threading.Thread):
    """Samples the transmitted bytes of every WAN class every ``interval_s`` into link_counters.jsonl."""

    def __init__(self, emu: Emulation, path: Path, interval_s: float = 0.1) -> None:
        super().__init__(name="link-sampler", daemon=True)
        self.emu, self.path, self.interval_s = emu, path, interval_s
        self._halt = threading.Event()

    def run(self) -> None:
        from pyroute2.netlink.exceptions import NetlinkError

        with open(self.path, "a", buffering=1) as f:
            while not self._halt.wait(self.interval_s):
                try:
                    links = self.emu.wan_counters()
                except (OSError, NetlinkError, TestbedError, KeyError):  # the network is being torn down
                    return
                t = T.now_ns()
                for (src, dst), counters in links.items():
                    for minor, c in counters.items():
                        f.write(json.dumps({T.T_NS: t, T.LINK: f"{src}->{dst}", T.CLASSID: f"1:{minor:x}",
                                            T.TX_BYTES: c["tx_bytes"], T.RATE_BPS: c["ceil_bps"]}) + "\n")

    def stop(self) -> None:
        self._halt.set()


#: what a run writes into its folder: a folder holding any of them holds an earlier run
RUN_MARKERS = ("events", "config.json", "summary.json", "comparison.json")


def check_fresh_out_dir(out_dir: Path) -> None:
    """Refuse a folder that already holds a run: traces are appended as they are written, so a
    second run there would mix its events with the first's. Raises SpecError."""
    found = [m for m in RUN_MARKERS if (out_dir / m).exists()]
    if found:
        raise SpecError("--out", "(option)", str(out_dir), f"already holds a run ({found[0]})",
                        "give a new folder, or remove the old run first")


def check_runnable(exp: Experiment, topo, backend: str = "netns") -> list:
    """Everything about ``exp`` on ``topo`` that can be refused before anything is built: the
    placement, BubbleTea's decode hosts, what the backend cannot do. Returns the placement; raises
    SpecError."""
    if backend == "remote" and (exp.base_policy == "atlas" or exp.uses_bubbletea):
        raise SpecError("--policy", "(option)", exp.policy, "needs the controller's local control sockets and live "
                        "shaping, which --backend remote does not carry across machines yet",
                        "use --policy pp-fair or dp-wan with --backend remote, or run atlas and BubbleTea on the "
                        "netns or mininet backend")
    workers = place(exp, topo)
    if exp.uses_bubbletea:
        from .placement import decode_hosts

        decode_hosts(topo, workers)
    return workers


def run_experiment(exp: Experiment, out_dir: Path, delay_mechanism: str = "auto",
                   progress: Callable[[str], None] = print, hang_timeout_s: float | None = None,
                   backend: str = "netns", inventory: Path | None = None) -> dict:
    """Run ``exp`` on ``backend`` (backends.py) and return its summary (also in
    ``out_dir/summary.json``). Raises RunError when a worker fails; PrivilegeError, FeatureError,
    BuildError from the network."""
    from .report import finalize

    topo = load_topology(exp.topology)
    workers = check_runnable(exp, topo, backend)
    check_fresh_out_dir(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    _, corpus_sha = load_corpus(Path(exp.data) if exp.data else None)
    from .planner import predict

    predicted = predict(exp, topo, workers).iteration_s
    (out_dir / "config.json").write_text(json.dumps({**exp.to_dict(), "topology_spec": topo.to_dict(),
                                                     "workers": [asdict(w) for w in workers],
                                                     "predicted_iteration_time_s": predicted}, indent=1))
    t_timeout = timeout_s(exp, topo)
    hang = hang_timeout_s or t_timeout
    error: BaseException | None = None
    t_start = time.monotonic()
    try:
        with make_emulation(topo, backend, inventory, delay_mechanism=delay_mechanism, out_dir=out_dir,
                            tcp_buffer_bytes=socket_buffer_cap(exp, topo, workers)) as emu:
            (out_dir / "env.json").write_text(json.dumps({
                **_versions(), "backend": emu.backend, **emu.backend_info, "delay_mechanism": emu.mechanism, "netem": emu.mechanism == "netem",
                "corpus_sha256": corpus_sha, "cpus": os.cpu_count(), "run_prefix": emu.prefix}, indent=1))
            master = emu.host(workers[0].host).ip
            n_conn = wan_connections(exp, topo, workers)
            controller = None
            if exp.base_policy == "atlas":
                from .controller import Controller

                from .registry import RUN_DIR

                # AF_UNIX paths are limited to 108 bytes: keep the socket beside the run registry
                (RUN_DIR / "control").mkdir(parents=True, exist_ok=True)
                controller = Controller(emu, workers, exp.replicas, RUN_DIR / "control" / f"{emu.prefix}.sock",
                                        out_dir / "controller.jsonl", exp.atlas_floor_share)
                controller.install()
                controller.start()
            exp_cfg = {**exp.to_dict(), "wan_connections": n_conn}
            exp_cfg["data"] = emu.share_corpus(Path(exp.data) if exp.data else None)
            cfg = {"experiment": exp_cfg, "workers": [asdict(w) for w in workers],
                   "out_dir": emu.host_out_dir, "init_method": f"tcp://{master}:{GLOO_PORT}", "timeout_s": t_timeout,
                   "control_socket": str(controller.sock_path) if controller else None}
            dispatcher, decode_at = None, {}
            if exp.uses_bubbletea:
                dispatcher, decode_at = _start_bubbletea(emu, exp, topo, workers, cfg, out_dir)
            cfg_path = out_dir / "worker_config.json"
            cfg_path.write_text(json.dumps(cfg))
            cfg_arg = emu.share_file(cfg_path)
            if dispatcher is not None:
                for dc, host in decode_at.items():
                    emu.popen(host, [emu.python(host), "-m", "testbed.decode", cfg_arg, dc],
                              env=emu.process_env({"OMP_NUM_THREADS": "1"}))
                dispatcher.start()
            # one gloo connection per pair per entry; concurrent operations use different ones
            env = emu.process_env({"GLOO_SOCKET_IFNAME": ",".join(["eth0"] * n_conn), "OMP_NUM_THREADS": "1"})
            procs = {w.rank: emu.popen(w.host, [emu.python(w.host), "-m", "testbed.worker", cfg_arg, str(w.rank)],
                                       env=env) for w in workers}
            progress(f"{len(workers)} workers started on {topo.name} ({emu.mechanism} delay); "
                     f"{exp.stages} stages x {exp.replicas} replicas, {exp.schedule}, {exp.microbatches} microbatches")
            sampler = LinkSampler(emu, out_dir / "link_counters.jsonl")
            sampler.start()
            try:
                _watch(emu, exp, workers, procs, out_dir, hang, progress, t_start, controller)
            finally:
                sampler.stop()
                if controller is not None:
                    controller.stop()
                if dispatcher is not None:
                    dispatcher.stop()
                    if dispatcher.failed is not None:
                        progress(f"WARNING: the BubbleTea dispatcher failed ({dispatcher.failed!r}); requests "
                                 "stopped being dispatched, training was not affected")
                        (out_dir / "dispatcher_failed").write_text(repr(dispatcher.failed))
                    for w in workers:
                        Path(cfg["bubbletea"]["inbox"].format(rank=w.rank)).unlink(missing_ok=True)
    except (TestbedError, KeyboardInterrupt) as e:  # RunError, a dead delay element or agent: traces kept
        error = e
        if not isinstance(e, (RunError, KeyboardInterrupt)) and not (out_dir / "events").exists():
            raise  # it failed before any worker ran: nothing to summarize
    summary = finalize(out_dir, exp, aborted=error is not None)
    if error is not None:
        raise error
    progress(f"done in {time.monotonic() - t_start:.1f} s; traces in {out_dir}")
    return summary


def _start_bubbletea(emu: Emulation, exp: Experiment, topo, workers, cfg: dict, out_dir: Path):
    """Prepare BubbleTea: the request stream (the trace, or the synthetic stream fitted to it), the
    decode hosts, the workers' part of the configuration (added to ``cfg``). Returns the dispatcher
    (not started) and the decode host of each DC."""
    from .bubbletea import seconds_per_flop
    from .dispatcher import Dispatcher
    from .placement import decode_hosts
    from .registry import RUN_DIR
    from .requests import load_azure_trace, requests_to_frame, synthetic_requests

    bt = exp.bubbletea
    if bt.requests:
        reqs = load_azure_trace(bt.requests, time_scale=bt.time_scale, rate_factor=bt.rate_factor)
    else:
        reqs = synthetic_requests(bt.request_rate, 3600.0, exp.seed)
    (out_dir / "requests").mkdir(parents=True, exist_ok=True)
    requests_to_frame(reqs).to_parquet(out_dir / "requests" / "stream.parquet", index=False)
    hosts = decode_hosts(topo, workers)
    s_per_flop = seconds_per_flop(exp)
    control = RUN_DIR / "control"
    control.mkdir(parents=True, exist_ok=True)
    inbox = str(control / f"{emu.prefix}-w{{rank}}.sock")
    cfg["bubbletea"] = {"spec": asdict(bt), "s_per_flop": s_per_flop, "inbox": inbox,
                        "dispatcher": str(control / f"{emu.prefix}-bt.sock"),
                        "decode_hosts": {dc: str(emu.host(h).ip) for dc, h in hosts.items()},
                        "padded": exp.compute.mode == "padded"}
    d = Dispatcher(bt, reqs, [w.rank for w in workers], s_per_flop, control / f"{emu.prefix}-bt.sock", inbox, out_dir)
    return d, hosts


def _log_tail(emu: Emulation, host: str, lines: int = 15) -> str:
    text = emu.log_path(host).read_text(errors="replace").splitlines()
    return "\n".join(text[-lines:])


def _watch(emu, exp, workers, procs, out_dir: Path, hang_s: float, progress, t_start: float,
           controller=None) -> None:
    events = out_dir / "events"
    last_size, last_change, shown, offset = -1, time.monotonic(), -1, 0
    last_stage = [w for w in workers if w.stage == exp.stages - 1 and w.replica == 0][0]
    while True:
        emu.check_alive()
        why = controller.poll_failure() if controller is not None else None
        if why is not None:
            progress(f"WARNING: the Atlas controller died ({why}); WAN links fell back to fair "
                     "sharing and training goes on")
            (out_dir / "controller_failed").write_text(why)
        codes = {r: p.poll() for r, p in procs.items()}
        for r, code in codes.items():
            if code not in (None, 0):
                w = workers[r]
                raise RunError(f"worker {r} (stage {w.stage}, replica {w.replica}, host {w.host}) exited with "
                               f"status {code}; the run was aborted. Log tail:\n{_log_tail(emu, w.host)}")
        if all(code == 0 for code in codes.values()):
            return
        size = sum(p.stat().st_size for p in events.glob("*.jsonl")) if events.exists() else 0
        now = time.monotonic()
        if size != last_size:
            last_size, last_change = size, now
        elif now - last_change > (hang_s if size else hang_s + STARTUP_S):
            stuck = [r for r, code in codes.items() if code is None]
            raise RunError(f"no worker progressed for {hang_s:.0f} s (still running: workers {stuck}); the run was "
                           f"aborted. Log tail of worker {stuck[0]}:\n{_log_tail(emu, workers[stuck[0]].host)}")
        path = events / f"w{last_stage.rank}.jsonl"
        if path.exists():
            with open(path) as f:  # read only what was appended since the last look
                f.seek(offset)
                chunk = f.read()
            complete = chunk[: chunk.rfind("\n") + 1]
            offset += len(complete.encode())
            for line in complete.splitlines():
                e = json.loads(line)
                if e.get(T.KIND) == T.OPTIMIZER and e[T.ITERATION] > shown:
                    shown = e[T.ITERATION]
                    progress(f"iteration {shown + 1}/{exp.iterations}  loss {e[T.LOSS]:.4f}  "
                             f"elapsed {now - t_start:.1f} s")
        time.sleep(0.2)
