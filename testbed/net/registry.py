"""The registry of what each run created, so that cleanup never works by name pattern alone.

One JSON file per run under ``/run/testbed/runs/`` (tmpfs: a reboot clears it together with the
namespaces it lists). A run records its namespaces *before* creating them and every helper process
as soon as it starts (PID plus the kernel's start time, so a recycled PID is never killed), and
removes its file after teardown. ``testbed clean`` finishes the job for runs whose owner died
(``kill -9``, a crash, a power cut of the shell). All interfaces, addresses, routes, qdiscs and
iptables rules of a run live inside its namespaces, so removing them removes everything else.

A record is saved whole (written beside it, then renamed), one thread at a time, with the ending
signals held back (``net.signals``).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pyroute2 import netns as _netns

from testbed.invocation import sudo_testbed
from testbed.net.signals import deferred_signals
from testbed.spec.addressing import new_run_prefix

RUN_DIR = Path(os.environ.get("TESTBED_STATE_DIR", "/run/testbed"))


def registry_dir() -> Path:
    return RUN_DIR / "runs"


#: one save at a time in this process: threads start host processes concurrently (each registered),
#: and two writers of the same temporary file would lose one's rename
_SAVE_LOCK = threading.Lock()


def proc_start_time(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (proc(5), /proc/PID/stat field 22), or None
    if there is no such process or it has exited (a zombie waiting to be reaped counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def same_process(pid: int, start: int | None) -> bool:
    """True if ``pid`` is alive and is the process that was registered (same start time)."""
    return start is not None and proc_start_time(pid) == start


@dataclass
class ProcessEntry:
    pid: int
    start: int | None
    what: str


@dataclass
class RunRecord:
    """What one run created. ``prefix`` (such as ``tb3f9a``) names its kernel objects."""

    prefix: str
    owner_pid: int
    owner_start: int | None
    created_unix: float
    kind: str = "topology"
    out_dir: str = ""
    namespaces: list[str] = field(default_factory=list)
    processes: list[ProcessEntry] = field(default_factory=list)
    #: --backend remote: {"inventory": Inventory.to_dict(), "roots": {machine: run folder there}}
    remote: dict = field(default_factory=dict)
    #: tracefs instances the run made (``--sched-trace``, ``net/tracefs.py``), by path
    trace_instances: list[str] = field(default_factory=list)

    @classmethod
    def new(cls, prefix: str, kind: str = "topology", out_dir: str = "") -> RunRecord:
        pid = os.getpid()
        rec = cls(prefix, pid, proc_start_time(pid), time.time(), kind, out_dir)
        rec.save()
        return rec

    @property
    def path(self) -> Path:
        return registry_dir() / f"{self.prefix}.json"

    def save(self) -> None:
        registry_dir().mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        with deferred_signals(), _SAVE_LOCK:  # no half-written .tmp left beside the record
            tmp.write_text(json.dumps(asdict(self), indent=1))
            os.replace(tmp, self.path)

    def add_namespaces(self, names: list[str]) -> None:
        self.namespaces.extend(n for n in names if n not in self.namespaces)
        self.save()

    def add_process(self, pid: int, what: str) -> None:
        self.processes.append(ProcessEntry(pid, proc_start_time(pid), what))
        self.save()

    def forget_process(self, pid: int) -> None:
        self.processes = [p for p in self.processes if p.pid != pid]
        self.save()

    def add_trace_instance(self, path: str) -> None:
        self.trace_instances.append(path)
        self.save()

    def forget_trace_instance(self, path: str) -> None:
        self.trace_instances = [p for p in self.trace_instances if p != path]
        self.save()

    def owner_alive(self) -> bool:
        return same_process(self.owner_pid, self.owner_start)

    def delete(self) -> None:
        self.path.unlink(missing_ok=True)

    @classmethod
    def load(cls, path: Path) -> RunRecord:
        data = json.loads(path.read_text())
        data["processes"] = [ProcessEntry(**p) for p in data.get("processes", [])]
        return cls(**data)


def list_runs() -> list[RunRecord]:
    """Every registered run, oldest first (unreadable files are skipped)."""
    out = []
    for path in sorted(registry_dir().glob("*.json")):
        try:
            out.append(RunRecord.load(path))
        except (OSError, ValueError, TypeError):
            continue
    return sorted(out, key=lambda r: r.created_unix)


def stale_runs() -> list[RunRecord]:
    """Runs whose owning process is gone: their leftovers are for ``testbed clean``."""
    return [r for r in list_runs() if not r.owner_alive()]


def stop_process(pid: int, start: int | None, grace_s: float = 1.0) -> bool:
    """SIGTERM, then SIGKILL after ``grace_s``, the process registered as (pid, start). Returns
    True if it was ours and alive. Never signals a PID whose start time differs (recycled PID)."""
    if not same_process(pid, start):
        return False
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not same_process(pid, start):
            return True
        _reap(pid)
        time.sleep(0.01)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    _reap(pid)
    return True


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


#: where tracefs is mounted, in the order looked at (the second is the older debugfs path)
TRACEFS_MOUNTS = (Path("/sys/kernel/tracing"), Path("/sys/kernel/debug/tracing"))


def trace_instance_name(prefix: str) -> str:
    """The name of run ``prefix``'s tracefs instance (``--sched-trace``)."""
    return f"{prefix}-sched"


def remove_trace_instance(path: str, prefix: str) -> bool:
    """Remove run ``prefix``'s tracefs instance at ``path`` (``<tracefs>/instances/<prefix>-sched``;
    removing its directory removes its buffers, settings and events). Returns True if it was
    there. Raises ValueError for a path that is not that run's instance under a tracefs mount,
    OSError if the kernel refuses (EBUSY: a reader holds one of its files open)."""
    p = Path(path)
    if p.name != trace_instance_name(prefix) or p.parent not in [m / "instances" for m in TRACEFS_MOUNTS]:
        raise ValueError(f"{path} is not run {prefix}'s tracefs instance")
    try:
        p.rmdir()
    except FileNotFoundError:
        return False
    return True


def unused_run_prefix() -> str:
    """A new run prefix (``spec.addressing.new_run_prefix``) that no registered run, namespace or
    tracefs instance of this machine uses (a prefix is 4 random hex digits: two runs may draw the
    same). Raises RuntimeError if 100 draws all collide."""
    taken = {r.prefix for r in list_runs()}
    names = existing_namespaces()
    for _ in range(100):
        prefix = new_run_prefix()
        if prefix in taken or any(n.startswith(prefix + "-") for n in names):
            continue
        if any((m / "instances" / trace_instance_name(prefix)).exists() for m in TRACEFS_MOUNTS):
            continue
        return prefix
    raise RuntimeError(f"100 run prefixes drawn were all in use: run '{sudo_testbed('clean')}'")


def existing_namespaces() -> set[str]:
    return set(_netns.listnetns())


def clean_run(rec: RunRecord) -> dict[str, list]:
    """Remove what ``rec`` lists: stop its processes, delete its namespaces, drop its file.

    Returns what was removed: ``{"processes": [pid, ...], "namespaces": [name, ...],
    "trace_instances": [path, ...], "left": [why, ...]}``; ``left`` names what could not be
    removed (a tracefs instance a reader holds open), and the record then stays for a later
    ``testbed clean``.
    """
    removed: dict[str, list] = {"processes": [], "namespaces": [], "trace_instances": [], "left": []}
    for path in rec.trace_instances:
        try:
            if remove_trace_instance(path, rec.prefix):
                removed["trace_instances"].append(path)
        except (OSError, ValueError) as e:
            removed["left"].append(f"tracefs instance {path}: {e}")
    for p in rec.processes:
        if stop_process(p.pid, p.start):
            removed["processes"].append(p.pid)
    present = existing_namespaces()
    # anything still running inside the run's namespaces was started there by the run (a worker
    # whose parent was killed, an sshd session of a lab machine)
    inside = _netns.ns_pids() if present else {}
    for name in rec.namespaces:
        for pid in inside.get(name, []):
            if stop_process(pid, proc_start_time(pid)):
                removed["processes"].append(pid)
    present = existing_namespaces()
    for name in rec.namespaces:
        if name in present:
            _netns.remove(name)
            removed["namespaces"].append(name)
    for sock in control_sockets(rec.prefix):
        sock.unlink(missing_ok=True)
    if removed["left"]:
        rec.processes, rec.namespaces = [], []
        rec.trace_instances = [p for p in rec.trace_instances if p not in removed["trace_instances"]]
        rec.save()
    else:
        rec.delete()
    return removed


def control_dir() -> Path:
    """Where a run's Unix sockets live (Atlas's controller, BubbleTea's dispatcher and the workers'
    inboxes): beside the registry, since AF_UNIX paths are limited to 108 bytes. Made if needed."""
    folder = RUN_DIR / "control"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def control_sockets(prefix: str) -> list[Path]:
    """The run's Unix sockets (Atlas controller, BubbleTea dispatcher and worker inboxes), named
    after its prefix in ``RUN_DIR/control``."""
    folder = RUN_DIR / "control"
    return sorted(folder.glob(f"{prefix}.sock")) + sorted(folder.glob(f"{prefix}-*.sock"))


def warn_stale_runs() -> str | None:
    """A warning if earlier runs left namespaces, processes or tracefs instances behind (their
    owner is gone)."""
    stale = stale_runs()
    if not stale:
        return None
    n_ns = sum(len(r.namespaces) for r in stale)
    n_tr = sum(len(r.trace_instances) for r in stale)
    traces = f" and {n_tr} tracefs instance(s), perhaps still recording" if n_tr else ""
    return (
        f"{len(stale)} earlier run(s) ({', '.join(r.prefix for r in stale)}) died without tearing down "
        f"(up to {n_ns} namespaces{traces}): run '{sudo_testbed('clean')}' to remove their leftovers"
    )
