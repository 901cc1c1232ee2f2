"""What a process of this machine may do with hosts whose namespaces live here (the netns and
Mininet backends; the ``network.LocalHosts`` contract): enter one, start a helper of the run
beside them, adopt a process started otherwise, and record this machine's scheduler for the
run. ``LocalNetwork`` takes these from ``LocalHostProcesses``; the remote backend has none."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from testbed.errors import BuildError
from testbed.net.hostproc import HostProcesses
from testbed.net.registry import RunRecord, remove_trace_instance
from testbed.net.tracefs import SchedTrace
from testbed.spec.addressing import AddressPlan


class LocalHostProcesses:
    """The ``LocalHosts`` side of a network on this machine: ``plan`` its addresses, ``prefix`` its
    run prefix, ``processes`` the processes in its hosts, ``record`` its registry entry (None until
    built)."""

    plan: AddressPlan
    prefix: str
    processes: HostProcesses
    record: RunRecord | None

    def log_path(self, host: str) -> Path:
        return self.processes.log_path(host)

    def netns_path(self, host: str) -> str:
        """Where a process of this machine enters ``host``'s network namespace (setns)."""
        return f"/run/netns/{self.plan.host(host).netns}"

    def start_local(self, argv: Sequence[str], what: str, **kwargs: Any) -> subprocess.Popen:
        """Start a helper of the run in the root namespace (the worker launcher)."""
        self._require_built()
        return self.processes.popen_root(argv, what, **kwargs)

    def adopt(self, proc: Any, what: str) -> None:
        """Register a process started otherwise (a forked worker) and stop it at teardown."""
        self.processes.adopt(proc, what)

    def sched_trace(self) -> SchedTrace:
        """A recorder of this machine's scheduler for this run (not started; ``net/tracefs.py``).
        Raises FeatureError where tracefs is missing."""
        assert self.record is not None, "not built"
        return SchedTrace(self.record)

    def _remove_trace_instance(self, path: str) -> None:
        assert self.record is not None
        remove_trace_instance(path, self.prefix)
        self.record.forget_trace_instance(path)

    def _require_built(self) -> None:
        if self.record is None:
            raise BuildError("the network is not built: use it in a with statement (or call build() first)")
