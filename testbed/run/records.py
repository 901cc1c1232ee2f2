"""What a run folder records about the run before it trains: ``config.json`` (the resolved
experiment, its placement and the predicted iteration time) and ``env.json`` (versions, the kernel,
the backend and what it found, the delay mechanism, the corpus's fingerprint, the CPU cgroup and
autogroup of the runner and, on this machine, its workers, and how its kernel schedules (tick
rate, preemption model, scheduler sysctls), when the run began); and the check
that a folder holds no run yet."""

from __future__ import annotations

import gzip
import json
import os
import platform
import re
import shutil
import subprocess
import zlib
from dataclasses import asdict
from importlib import metadata
from pathlib import Path
from typing import Any

from testbed.errors import SpecError
from testbed.net.network import LocalHosts, Network
from testbed.plan.placement import WorkerSpec
from testbed.plan.run_plan import PLANS_FILE, RunPlan, plan_record
from testbed.spec.experiment import Experiment
from testbed.trace import schema as T
from testbed.trace.frame import TIME_DILATION_KEY
from testbed.trace.jsonl import open_jsonl, write_row


def _versions() -> dict[str, Any]:
    def cmd(argv: list[str]) -> str | None:
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=5).stdout.strip()
        except OSError:
            return None

    repo = Path(__file__).resolve().parents[2]
    return {
        "python": platform.python_version(),
        "torch": metadata.version("torch"),
        "pyroute2": metadata.version("pyroute2"),
        "iproute2": cmd(["ip", "-V"]),
        "kernel": platform.release(),
        "git_commit": cmd(["git", "-C", str(repo), "rev-parse", "HEAD"]),
        "trace_schema": T.SCHEMA_VERSION,
    }


def sched_group(proc: Path = Path("/proc"), cgroup2: Path = Path("/sys/fs/cgroup")) -> dict[str, Any]:
    """The groups the fair scheduler shares the CPUs by, for this process and the processes it
    starts (sched(7), "The autogroup feature"; ``proc``: where procfs is mounted, ``cgroup2``:
    the unified hierarchy where it is the only one):

    - ``cpu_cgroup``: its cgroup of the ``cpu`` controller (v1); on the unified hierarchy (v2),
      the deepest of its cgroup's ancestors (itself included) down to which every parent enables
      ``cpu`` in ``cgroup.subtree_control`` ("/" where none does); None where unreadable. The
      path is as this process's cgroup namespace shows it.
    - ``autogroup`` ("/autogroup-25") and ``autogroup_nice`` (int): its session's autogroup and
      that group's nice value, both None where the kernel has no autogroups or they are off
      (``kernel.sched_autogroup_enabled``). A process of init's session (a service started with
      no ``setsid``) is in the kernel's default autogroup, the root task group itself, where
      ``/proc/self/autogroup`` is empty: ``autogroup`` is then "/" and ``autogroup_nice`` None
      (its tasks compete one by one; the root group has no nice value to set). An autogroup counts
      only in the root cpu cgroup ("/"):
      the kernel then shares a CPU between the run's session and each other session (and each
      task of the daemons in no session of their own) by the groups' nice values."""
    cgroup = unified = None
    try:
        for line in (proc / "self" / "cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if "cpu" in controllers.split(","):
                cgroup = path
            elif controllers == "":
                unified = path
    except (OSError, ValueError):
        pass
    if cgroup is None and unified is not None:  # cgroup v2 alone: cpu where it is enabled down to it
        cgroup = "/"
        for part in [p for p in unified.split("/") if p]:
            try:
                enabled = (cgroup2 / cgroup.lstrip("/") / "cgroup.subtree_control").read_text().split()
            except OSError:
                break
            if "cpu" not in enabled:
                break
            cgroup = cgroup.rstrip("/") + "/" + part
    autogroup = nice = None
    try:
        if (proc / "sys" / "kernel" / "sched_autogroup_enabled").read_text().strip() == "1":
            shown = (proc / "self" / "autogroup").read_text().split()  # "/autogroup-25 nice 0"
            if not shown:  # the default autogroup: init's session (kernel/sched/autogroup.c)
                autogroup = "/"
            else:
                name, _, value = shown
                autogroup, nice = name, int(value)
    except (OSError, ValueError):  # a kernel without CONFIG_SCHED_AUTOGROUP
        pass
    return {"cpu_cgroup": cgroup, "autogroup": autogroup, "autogroup_nice": nice}


#: the fair scheduler's tunables that live in debugfs since Linux 5.13 (``sched/``), read where the
#: kernel lets root read them
SCHED_DEBUGFS_TUNABLES = ("base_slice_ns", "migration_cost_ns", "nr_migrate", "tunable_scaling")


def _readable(paths: list[Path]) -> dict[str, int | str]:
    """Each of ``paths`` that can be read, by its name: its value, a number where it is one."""
    values: dict[str, int | str] = {}
    for path in paths:
        try:
            text = path.read_text().strip()
        except OSError:  # write-only, absent, or not root's to read (a locked-down debugfs)
            continue
        values[path.name] = int(text) if text.lstrip("-").isdigit() else text
    return values


def sched_kernel(
    proc: Path = Path("/proc"), boot: Path = Path("/boot"), debugfs: Path = Path("/sys/kernel/debug")
) -> dict[str, Any]:
    """How this machine's kernel schedules, as far as it tells (read, never changed), so that two
    machines' late operations are compared knowing it: ``kernel_hz``, its tick rate
    (``CONFIG_HZ`` of ``/proc/config.gz`` or ``/boot/config-RELEASE``); ``kernel_preempt``, its
    preemption model (``none``, ``voluntary``, ``full``, ``lazy`` or ``rt``: debugfs's
    ``sched/preempt`` where readable, else, on a kernel built with ``CONFIG_PREEMPT_DYNAMIC``,
    ``preempt=`` of its command line, else the configured ``CONFIG_PREEMPT_*``); ``sched_sysctls``:
    every readable ``/proc/sys/kernel/sched_*`` (a machine's own, such as a VM platform's,
    included); ``sched_tunables``: the readable ``SCHED_DEBUGFS_TUNABLES``. Each None, or {},
    where not told."""
    config: list[str] = []
    for path in (proc / "config.gz", boot / f"config-{platform.release()}"):
        try:
            raw = path.read_bytes()
            config = (gzip.decompress(raw) if path.suffix == ".gz" else raw).decode().splitlines()
            break
        except (OSError, EOFError, zlib.error, gzip.BadGzipFile, UnicodeDecodeError):
            continue
    options = dict(line.split("=", 1) for line in config if line.startswith("CONFIG_") and "=" in line)
    hz = int(options["CONFIG_HZ"]) if options.get("CONFIG_HZ", "").isdigit() else None
    preempt = None
    try:  # "none (voluntary) full lazy": the chosen one in brackets
        chosen = re.search(r"\((\w+)\)", (debugfs / "sched" / "preempt").read_text())
        preempt = chosen.group(1) if chosen else None
    except OSError:
        pass
    if preempt is None and options.get("CONFIG_PREEMPT_DYNAMIC") == "y":
        try:
            given = re.search(r"(?:^|\s)preempt=(\w+)", (proc / "cmdline").read_text())
            preempt = given.group(1) if given else None
        except OSError:
            pass
    if preempt is None:
        models = {"CONFIG_PREEMPT_RT": "rt", "CONFIG_PREEMPT_LAZY": "lazy", "CONFIG_PREEMPT": "full"}
        models |= {"CONFIG_PREEMPT_VOLUNTARY": "voluntary", "CONFIG_PREEMPT_NONE": "none"}
        preempt = next((m for option, m in models.items() if options.get(option) == "y"), None)
    return {
        "kernel_hz": hz,
        "kernel_preempt": preempt,
        "sched_sysctls": _readable(sorted((proc / "sys" / "kernel").glob("sched_*"))),
        "sched_tunables": _readable([debugfs / "sched" / name for name in SCHED_DEBUGFS_TUNABLES]),
    }


def write_config(
    out_dir: Path,
    exp: Experiment,
    workers: list[WorkerSpec],
    predicted_s: float,
    plan_note: str | None = None,
    dilation: float = 1.0,
) -> None:
    """``config.json``: the experiment as resolved and run (in real time: dilated, where
    ``dilation`` is not 1, ``spec/dilation.py``), the workers' placement, the cost model's
    predicted iteration time (s, real time), when the planner chose the layout (``--plan best``),
    which plan and why (``plan``), and the dilation it ran with (``TIME_DILATION_KEY``)."""
    (out_dir / "config.json").write_text(
        json.dumps(
            {
                **exp.to_dict(),
                "workers": [asdict(w) for w in workers],
                "predicted_iteration_time_s": predicted_s,
                "plan": plan_note or "the experiment's own layout",
                TIME_DILATION_KEY: dilation,
            },
            indent=1,
        )
    )


def record_plan(out_dir: Path, plan: RunPlan, t_ns: int, why: str) -> None:
    """Append ``plan`` to the run folder's record of every plan the run used (``PLANS_FILE``), with
    the time it took effect (``t_ns``, the run's clock) and ``why``."""
    with open_jsonl(out_dir / PLANS_FILE) as f:
        write_row(f, plan_record(plan, t_ns, why))


def write_env(out_dir: Path, net: Network, corpus_sha: str, t_begin_ns: int, extra: dict[str, Any]) -> None:
    """``env.json``: where and with what the run ran; ``run_start_ns`` is when it began (the run's
    clock), from which the summary counts start-up; ``extra``: what the run itself set up on the
    machine (``tracefs``, ``tracefs_mounted_by_run`` under ``--sched-trace``)."""
    (out_dir / "env.json").write_text(
        json.dumps(
            {
                **_versions(),
                "backend": net.backend,
                **net.backend_info,
                "delay_mechanism": net.mechanism,
                "netem": net.mechanism == "netem",
                "corpus_sha256": corpus_sha,
                "cpus": os.cpu_count(),
                # the runner's and this machine's: the workers' here
                **({**sched_group(), **sched_kernel()} if isinstance(net, LocalHosts) else {}),
                "run_prefix": net.prefix,
                "run_start_ns": t_begin_ns,
                **extra,
            },
            indent=1,
        )
    )


#: what a run writes into its folder: a folder holding any of them holds an earlier run
RUN_MARKERS = ("events", "config.json", "summary.json", "comparison.json")


def discard_unused_out(out_dir: Path, created: bool) -> None:
    """Remove ``out_dir`` after a run refused before building, if this command ``created`` it and
    it holds nothing but the launcher's log (``logs/launcher.log``): a refusal leaves no run folder."""
    if not created or not out_dir.is_dir():
        return
    held = {p.relative_to(out_dir).as_posix() for p in out_dir.rglob("*")}
    if held <= {"logs", "logs/launcher.log"}:
        shutil.rmtree(out_dir)


def check_fresh_out_dir(out_dir: Path) -> None:
    """Refuse a folder that already holds a run: traces are appended as they are written, so a
    second run there would mix its events with the first's. Raises SpecError."""
    found = [m for m in RUN_MARKERS if (out_dir / m).exists()]
    if found:
        raise SpecError(
            "--out",
            "(option)",
            str(out_dir),
            f"already holds a run ({found[0]})",
            "give a new folder, or remove the old run first",
        )
