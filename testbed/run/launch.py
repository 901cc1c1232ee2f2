"""Starting a run's processes in its hosts: through the worker launcher (``train/launcher.py``) where
the hosts' namespaces are on this machine (``net.network.LocalHosts``), else one interpreter per
worker started by the backend (``Network.popen``, the remote backend's agents).

The launcher is started first, as soon as the network is built, so that its torch import overlaps
the rest of the set-up; ``prepare`` then hands it the workers' configuration and ``fork`` starts
each worker in its host. Forked workers are adopted by the network: registered for ``testbed
clean`` and stopped at teardown like every other process of the run.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from testbed.errors import TestbedError
from testbed.net.hostproc import local_process_env, open_log
from testbed.net.network import LocalHosts, Network, Process
from testbed.net.registry import proc_start_time
from testbed.trace.startup import mark_startup

#: how long the launcher may take to import torch and preload a run
PREPARE_TIMEOUT_S = 120.0


class LaunchError(TestbedError):
    """The worker launcher failed or did not answer; its log says why."""


class ForkedWorker:
    """A worker forked by the launcher, with the part of ``subprocess.Popen`` the runner uses. Its
    exit status comes from the launcher (its parent); if the launcher is gone, from /proc."""

    def __init__(self, launcher: Launcher, pid: int) -> None:
        self.launcher, self.pid = launcher, pid
        self.start = proc_start_time(pid)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            code = self.launcher.exit_code(self.pid)
            if code is not None:
                self.returncode = code
            elif self.launcher.gone and proc_start_time(self.pid) != self.start:
                self.returncode = -signal.SIGKILL  # it died with the launcher (PR_SET_PDEATHSIG)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0)
            time.sleep(0.01)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None and proc_start_time(self.pid) == self.start:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:  # it ended, and the launcher reaped it, since the check
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Launcher:
    """The runner's end of the worker launcher, on this machine (the hosts' namespaces must be
    here). Started before the network is built, so that its torch import overlaps the set-up; one
    launcher may serve several runs in turn (``compare``): each ``prepare`` replaces the last."""

    def __init__(self, log_path: Path) -> None:
        """Start the launcher; its own output goes to ``log_path``. It dies with this process, even
        one that dies before the launcher has started (it exits when its parent is gone)."""
        log_path.parent.mkdir(parents=True, exist_ok=True)
        env = local_process_env({"OMP_NUM_THREADS": "1"})
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "testbed.train.launcher", str(os.getpid())],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env=env,
                process_group=0,  # a terminal's Ctrl-C is the runner's to act on: it stops the workers
            )
        self.log_path = log_path
        self.net: LocalHosts | None = None
        self._replies: queue.Queue[dict[str, Any]] = queue.Queue()
        self._exits: dict[int, int] = {}
        self.gone = False
        self._reader = threading.Thread(target=self._read, name="launcher-reader", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if "exited" in msg:
                self._exits[msg["exited"]] = msg["code"]
            else:
                self._replies.put(msg)
        self.gone = True
        self._replies.put({"error": f"the launcher exited (status {self.proc.wait()}); see {self.log_path}"})

    def _ask(self, req: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write((json.dumps(req) + "\n").encode())
            self.proc.stdin.flush()
        except OSError as e:
            raise LaunchError(f"cannot reach the worker launcher ({e}); see {self.log_path}") from None
        try:
            reply = self._replies.get(timeout=timeout_s)
        except queue.Empty:
            raise LaunchError(
                f"the worker launcher did not answer {req['op']!r} within {timeout_s:g} s; see {self.log_path}"
            ) from None
        if "error" in reply:
            raise LaunchError(f"the worker launcher failed to {req['op']}: {reply['error']}")
        return reply

    def prepare(self, net: LocalHosts, config_path: Path) -> None:
        """Hand the launcher a run's configuration, for workers in ``net``'s hosts; returns once it
        has preloaded the run."""
        self.net = net
        self._ask({"op": "prepare", "config": str(config_path)}, PREPARE_TIMEOUT_S)

    def fork(self, rank: int, host: str, env: dict[str, str], what: str) -> ForkedWorker:
        """Start worker ``rank`` in ``host``; its output goes to the host's log."""
        assert self.net is not None, "prepare first"
        log = self.net.log_path(host)
        open_log(log, ["(forked by the launcher)", "testbed.train.worker", str(rank)]).close()
        reply = self._ask(
            {"op": "fork", "rank": rank, "netns": self.net.netns_path(host), "log": str(log), "env": env}, 30.0
        )
        worker = ForkedWorker(self, reply["pid"])
        self.net.adopt(worker, what)
        return worker

    def exit_code(self, pid: int) -> int | None:
        return self._exits.get(pid)

    def close(self, timeout_s: float = 5.0) -> None:
        """Close the launcher's input: it exits (its workers have ended, or end with it)."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Launchers:
    """One worker launcher for a sequence of runs in this process (a script's sweep, the test
    suite): started on first use, started again where the last one has exited, closed at the end.
    Each run after the first is spared the launcher's start (its torch import: about 1.7 s of
    every run's start-up on the 2-core development VM, ``run_start`` to ``launcher_ready``)."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self._launcher: Launcher | None = None

    def get(self) -> Launcher:
        """The running launcher (a new one where there is none, or it exited)."""
        if self._launcher is None or self._launcher.gone or self._launcher.proc.poll() is not None:
            if self._launcher is not None:
                self._launcher.close()
            self._launcher = Launcher(self.log_path)
        return self._launcher

    def close(self) -> None:
        if self._launcher is not None:
            self._launcher.close()
            self._launcher = None

    def __enter__(self) -> Launchers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_workers(
    net: Network,
    launcher: Launcher | None,
    config_path: Path,
    config_arg: str,
    hosts: dict[int, str],
    env: dict[str, str],
) -> dict[int, Process]:
    """Start worker ``rank`` in ``hosts[rank]`` for every rank: forked by ``launcher`` when there is
    one (``env``: what the worker adds to its environment), else ``python -m testbed.train.worker``
    through the backend (``config_arg``: the configuration as the hosts see it)."""
    procs: dict[int, Process]
    if launcher is not None:
        assert isinstance(net, LocalHosts)
        launcher.prepare(net, config_path)
        mark_startup(config_path.parent, "launcher_ready")
        procs = {r: launcher.fork(r, h, env, f"worker {r} in {h}") for r, h in hosts.items()}
    else:
        argv = [net.python(h) for h in hosts.values()]
        procs = {
            r: net.popen(h, [py, "-m", "testbed.train.worker", config_arg, str(r)], env=net.process_env(env))
            for (r, h), py in zip(hosts.items(), argv)
        }
    mark_startup(config_path.parent, "workers_started")
    return procs
