"""Processes of a run on this machine: inside its hosts (started with nsenter(1), output to a
per-host log) and beside them in the root namespace (helpers such as Atlas's controller). Every one
is registered with the run (``testbed clean`` stops it after a crash) and stopped at teardown.

A process is started and registered with the ending signals held back (no Ctrl-C between the two
leaves it unknown), in a process group of its own: a terminal's Ctrl-C (or ``kill`` of the
command's group) reaches the command alone, which stops its processes in order."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from testbed.net.registry import RunRecord
from testbed.net.signals import deferred_signals
from testbed.spec.addressing import HOST_IFNAME

#: the package's parent folder: processes started in hosts find ``testbed`` there
PACKAGE_PARENT = Path(__file__).resolve().parents[2]
#: the interface gloo and NCCL bind to, for every process started in a host: inside a namespace a
#: host's name resolves to 127.0.0.1, so a torch.distributed job would otherwise listen on loopback
#: and its peers in other hosts could not reach it (gloo: GLOO_SOCKET_IFNAME; NCCL: NCCL_SOCKET_IFNAME)
HOST_SOCKET_ENV = {"GLOO_SOCKET_IFNAME": HOST_IFNAME, "NCCL_SOCKET_IFNAME": HOST_IFNAME}


def host_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a process started in a host: ``env`` (given by the caller, whose values
    win: the runner's striped GLOO_SOCKET_IFNAME) over ``HOST_SOCKET_ENV``; without one, this
    process's environment with ``HOST_SOCKET_ENV`` over it (the root namespace's interface names
    mean nothing in a host)."""
    if env is None:
        return {**os.environ, **HOST_SOCKET_ENV}
    return {**HOST_SOCKET_ENV, **env}


def netns_argv(netns: str, argv: Sequence[str]) -> list[str]:
    """``argv`` run inside namespace ``netns`` (nsenter execs it: the PID is the command's)."""
    return ["nsenter", f"--net=/run/netns/{netns}", "--", *argv]


def open_log(path: Path, argv: Sequence[str]):
    path.parent.mkdir(parents=True, exist_ok=True)
    f = open(path, "ab", buffering=0)
    f.write(f"\n# t_ns={time.monotonic_ns()} $ {' '.join(argv)}\n".encode())
    return f


#: how long the output of a command killed at its timeout is waited for (s): its process group is
#: gone by then, unless something of it left the group and holds its pipes
KILLED_OUTPUT_S = 5.0


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc`` (alive, started with ``process_group=0``: the group is its own) and what it
    started in its group, whose children would otherwise keep its pipes open, and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # it ended meanwhile
        pass
    proc.wait()


def run_logged(netns: str, argv: Sequence[str], log_path: Path, timeout_s: float) -> subprocess.CompletedProcess:
    """Run ``argv`` in ``netns`` to completion, in a process group of its own; its output is
    returned and appended to ``log_path``. Raises subprocess.TimeoutExpired after ``timeout_s``
    seconds, the group killed, with what the command had written (text, as ``output`` and
    ``stderr``; what came within ``KILLED_OUTPUT_S`` after the kill). The process is started with
    the ending signals held back, and on any exception, a signal's included, its group is killed
    and it is reaped with the signals held back again: ``subprocess.run`` could lose a process to a
    signal that came while it started (2026-12-07: a SIGTERM during ``--profile-wan`` left its
    probe running). It is not registered with the run: after a ``kill -9`` of the command,
    ``testbed clean`` finds it among the processes inside the run's namespaces."""
    proc = None
    try:
        with deferred_signals():
            proc = subprocess.Popen(
                netns_argv(netns, argv),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                stdin=subprocess.DEVNULL,
                env=host_env(),
                process_group=0,
            )
        try:
            stdout, stderr = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired as e:
            with deferred_signals():
                _kill_group(proc)
            try:
                e.output, e.stderr = proc.communicate(timeout=KILLED_OUTPUT_S)
            except subprocess.TimeoutExpired:
                pass  # something that left the group holds the pipes: closed below
            raise
    except BaseException:
        if proc is not None:
            with deferred_signals():
                if proc.poll() is None:
                    _kill_group(proc)
                for pipe in (proc.stdout, proc.stderr):
                    if pipe is not None:
                        pipe.close()
        raise
    done = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    with open_log(log_path, argv) as f:
        f.write(stdout.encode() + stderr.encode())
        f.write(f"# exit {done.returncode}\n".encode())
    return done


def stop_popen(proc: subprocess.Popen, grace_s: float = 2.0) -> None:
    """SIGTERM ``proc`` (a child of ours), SIGKILL it after ``grace_s`` seconds, and reap it."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class HostProcesses:
    """``netns_of(host)``: a host's namespace; ``log_dir``: where ``<host>.log`` files go;
    ``record``: the run's registry record (set once the run is registered)."""

    def __init__(self, netns_of: Callable[[str], str], log_dir: Path) -> None:
        self.netns_of, self.log_dir = netns_of, log_dir
        self.record: RunRecord | None = None
        self._procs: list[Any] = []

    def log_path(self, host: str) -> Path:
        return self.log_dir / f"{host}.log"

    def popen(self, host: str, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen:
        """Start ``argv`` inside ``host``; stdout and stderr go to the host's log unless given; its
        environment is ``host_env(env)``."""
        log = open_log(self.log_path(host), argv)
        kwargs["env"] = host_env(kwargs.get("env"))
        kwargs.setdefault("stdout", log)
        kwargs.setdefault("stderr", subprocess.STDOUT)
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        kwargs.setdefault("process_group", 0)
        try:
            with deferred_signals():
                proc = subprocess.Popen(netns_argv(self.netns_of(host), argv), **kwargs)
                self._keep(proc, f"{argv[0]} in {host}")
        finally:
            log.close()
        return proc

    def popen_root(self, argv: Sequence[str], what: str, **kwargs: Any) -> subprocess.Popen:
        """Start a helper of the run in the root namespace (``what`` names it in the registry)."""
        kwargs.setdefault("process_group", 0)
        with deferred_signals():
            proc = subprocess.Popen(list(argv), **kwargs)
            self._keep(proc, what)
        return proc

    def adopt(self, proc: Any, what: str) -> None:
        """Track a process started some other way (``subprocess.Popen``-like: ``pid``, ``poll``,
        ``terminate``, ``wait``, ``kill``): registered and stopped at teardown like the others."""
        with deferred_signals():
            self._keep(proc, what)

    def run(self, host: str, argv: Sequence[str], timeout_s: float = 60) -> subprocess.CompletedProcess:
        """Run ``argv`` inside ``host`` to completion; output returned and appended to the host's log."""
        return run_logged(self.netns_of(host), argv, self.log_path(host), timeout_s)

    def _keep(self, proc: Any, what: str) -> None:
        self._procs.append(proc)
        if self.record is not None:
            self.record.add_process(proc.pid, what)

    def stop_all(self) -> None:
        """SIGTERM every process still running, SIGKILL after 2 s, reap them all."""
        for p in self._procs:
            if p.poll() is None:
                try:
                    p.terminate()
                except ProcessLookupError:  # it ended meanwhile
                    pass
        for p in self._procs:
            stop_popen(p)
        self._procs.clear()


def local_process_env(extra: dict[str, str]) -> dict[str, str]:
    """The environment of a testbed process started on this machine: this one's, with the package
    on PYTHONPATH, plus ``extra``."""
    return {**os.environ, "PYTHONPATH": str(PACKAGE_PARENT), **extra}
