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


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "integration" in str(item.fspath):
            item.add_marker(pytest.mark.root)
            if os.geteuid() != 0:
                item.add_marker(pytest.mark.skip(reason="integration tier needs root: run scripts/test with sudo"))


def _run(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True).stdout


def machine_state() -> dict:
    """What the testbed could leave behind in the root namespace: namespaces, links, qdiscs,
    iptables rules, registered runs."""
    netns = sorted(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else []
    links = sorted(re.findall(r"^\d+: ([^:@]+)", _run(["ip", "-o", "link", "show"]), re.M))
    qdiscs = sorted(line.split(" refcnt")[0] for line in _run(["tc", "qdisc", "show"]).splitlines())
    rules = sorted(line for line in _run(["iptables-save"]).splitlines() if not line.startswith(("#", ":")))
    runs = sorted(os.listdir("/run/testbed/runs")) if os.path.isdir("/run/testbed/runs") else []
    return {"netns": netns, "links": links, "qdiscs": qdiscs, "iptables": rules, "runs": runs}


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


@pytest.fixture
def clean_machine():
    """The machine state before the test; asserts the test left nothing behind."""
    before = machine_state()
    yield before
    assert machine_state() == before
