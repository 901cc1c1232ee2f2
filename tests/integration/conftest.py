"""Integration tier: real namespaces, real tc, real iperf3. Needs root (CI runs as root)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

#: fidelity-check settings of the integration tests. A failing direction is measured a second time
#: and judged by it, both measurements in the report: on this 2-core machine one measurement in a
#: few falls just outside a tolerance while another process takes a core (a rate at 89-94% of its
#: goodput, an RTT 1.25 ms high on a 20 ms path in a CI run on 2026-12-03); a direction that is
#: wrong usually fails both
SHORT = {"duration_s": 3, "omit_s": 1, "rtt_samples": 20, "attempts": 2}
#: three_dc's 60 ms east-west path fell about 5.5% short now and then over SHORT's 2 s window, on
#: every backend; over 5 s after 2 s of warm-up (nearer the CLI's 10 s after 2 s) it has not so far
LONG_RTT = {"duration_s": 5, "omit_s": 2, "rtt_samples": 20, "attempts": 2}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "integration" in str(item.fspath):
            item.add_marker(pytest.mark.root)
            if os.geteuid() != 0:
                item.add_marker(pytest.mark.skip(reason="integration tier needs root: run scripts/test with sudo"))


@pytest.fixture(scope="session", autouse=True)
def leaves_tracefs_as_it_found_it():
    """A traced run mounts tracefs where none is and leaves it mounted, as it does for a user
    (``net/tracefs.ensure_tracefs``); the suite unmounts what its own runs mounted, so that it
    leaves the machine as it found it (a fresh machine has none: ``shared/fresh-machine``). Left
    alone where tracefs was there before, or holds an instance."""
    from testbed.net.tracefs import TRACEFS_MOUNT_POINT

    was = os.path.ismount(TRACEFS_MOUNT_POINT)
    yield
    if was or os.geteuid() != 0 or not os.path.ismount(TRACEFS_MOUNT_POINT):
        return
    if not any((TRACEFS_MOUNT_POINT / "instances").iterdir()):
        subprocess.run(["umount", str(TRACEFS_MOUNT_POINT)], capture_output=True)


def goodput_within(measure, expected_bps: float, attempts: int = 2) -> list[float]:
    """Goodputs (bit/s) of up to ``attempts`` calls of ``measure``, stopping at the first within 5%
    of ``expected_bps``: a failing rate measurement is taken again, as in the fidelity settings
    above, and every one is returned, to assert on and to print."""
    from testbed.net.fidelity import rate_within

    taken = [measure()]
    while not rate_within(taken[-1], expected_bps) and len(taken) < attempts:
        taken.append(measure())
    return taken


def _run(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True).stdout


def registered_prefixes() -> set[str]:
    """The name prefixes of every run in the registry now (running or stale)."""
    runs = Path("/run/testbed/runs")
    return {p.stem for p in runs.glob("*.json")} if runs.is_dir() else set()


def machine_state(ignore: set[str] = frozenset()) -> dict:
    """What the testbed could leave behind in the root namespace: namespaces, links, qdiscs,
    iptables rules, registered runs, tracefs instances (``--sched-trace``). Items naming a prefix
    in ``ignore`` (runs that were there before the test, e.g. a user's experiment or a run killed
    earlier) are left out, so that a test compares only what it made itself."""
    netns = sorted(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else []
    links = sorted(re.findall(r"^\d+: ([^:@]+)", _run(["ip", "-o", "link", "show"]), re.M))
    qdiscs = sorted(line.split(" refcnt")[0] for line in _run(["tc", "qdisc", "show"]).splitlines())
    rules = sorted(line for line in _run(["iptables-save"]).splitlines() if not line.startswith(("#", ":")))
    runs = sorted(os.listdir("/run/testbed/runs")) if os.path.isdir("/run/testbed/runs") else []
    instances = "/sys/kernel/tracing/instances"
    traces = sorted(os.listdir(instances)) if os.path.isdir(instances) else []
    state = {"netns": netns, "links": links, "qdiscs": qdiscs, "iptables": rules, "runs": runs, "tracefs": traces}
    return {key: [item for item in items if not any(p in item for p in ignore)] for key, items in state.items()}


def alive_with_argv(argv: list[str]) -> list[int]:
    """PIDs of live processes (not zombies) whose command line is ``argv``."""
    want = ("\0".join(argv) + "\0").encode()
    pids = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and Path(f"/proc/{entry}/cmdline").read_bytes() == want:
                if Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
                    pids.append(int(entry))
        except OSError:
            continue
    return pids


def run_cli(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "testbed.cli", *args], capture_output=True, text=True, cwd=REPO, **kwargs
    )


def start_topo_up(tmp_path: Path, *args: str, topology: str = "two_dc") -> subprocess.Popen:
    """``testbed topo up`` in the background, returned once the network is up."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "testbed.cli", "topo", "up", topology, "--out", str(tmp_path), *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        lines.append(line)
        if "Ctrl-C to tear down" in line:
            return proc
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise AssertionError("topo up did not come up:\n" + "".join(lines))


@pytest.fixture(scope="session")
def launchers(tmp_path_factory):
    """One worker launcher for the suite's runs made in this process on this machine
    (``run.launch.Launchers``, as ``compare`` and the validation scripts share one): each run is
    spared the launcher's start, about 1.7 s (its torch import); one that exited is replaced."""
    from testbed.run.launch import Launchers

    with Launchers(tmp_path_factory.mktemp("launcher") / "launcher.log") as shared:
        yield shared


@pytest.fixture
def launcher(launchers):
    """The running launcher of ``launchers``, for a test's ``run_experiment`` or ``compare``."""
    return launchers.get()


def two_dc_gpipe():
    """The experiment of the pipeline-and-data-parallel math checks: two_dc, 2 stages (one per DC)
    x 2 replicas, GPipe, real compute, 3 iterations."""
    from testbed.spec.compute import ComputeModel
    from testbed.spec.experiment_file import load_experiment

    exp = load_experiment().with_overrides(
        topology="two_dc", stages=2, replicas=2, iterations=3, warmup_iterations=1, schedule="gpipe"
    )
    return exp.with_overrides(compute=ComputeModel(mode="real"))


@pytest.fixture(scope="session")
def two_dc_gpipe_netns(tmp_path_factory, launchers):
    """``two_dc_gpipe()`` run once on the netns backend: (experiment, run folder, summary), for
    test_training's check against one process and test_mininet's against Mininet's run (each made
    a run of its own until 2026-12-07: 6-8 s of the suite)."""
    from testbed.run.runner import run_experiment

    exp = two_dc_gpipe()
    out = tmp_path_factory.mktemp("two_dc_gpipe") / "netns"
    return exp, out, run_experiment(exp, out, progress=lambda line: None, backend="netns", launcher=launchers.get())


@pytest.fixture
def clean_machine():
    """The machine state before the test; asserts the test left nothing behind."""
    others = registered_prefixes()
    before = machine_state(others)
    yield before
    assert machine_state(others) == before
