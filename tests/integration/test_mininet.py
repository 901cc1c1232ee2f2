"""The Mininet backend: Mininet builds the nodes and links, the testbed shapes them. Same fidelity
tolerances and the same training losses as the netns backend; nothing left behind, even after
kill -9; one Mininet run at a time; the topologies/ module works with Mininet's own ``mn``."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

from testbed.net.fidelity import check_fidelity
from testbed.net.registry import proc_start_time, same_process
from testbed.results.analysis import losses
from testbed.run.backends import make_network
from testbed.run.runner import run_experiment
from testbed.spec.topology_file import load_topology
from testbed.trace.events import read_events
from tests.support.reference import reference_losses

from .conftest import REPO, SHORT, machine_state, registered_prefixes, run_cli, start_topo_up


def test_fidelity_under_mininet(tmp_path, clean_machine):
    """two_dc: Mininet realises the nodes and links, the testbed routes and shapes them with the
    code the netns backend uses, whose three-DC fidelity (multi-hop routes, long RTTs) is checked in
    ``test_fidelity.py`` (three_dc here too cost the suite 50 s for no path of its own)."""
    spec = load_topology("two_dc")
    with make_network(spec, "mininet", out_dir=tmp_path) as net:
        # Mininet's node shells hold the namespaces the testbed shapes
        shells = {node.name: node.pid for node in net.realiser.mn.hosts}
        assert set(shells) == set(net.plan.hosts) | {f"{dc.name}-r" for dc in spec.dcs}
        assert all(proc_start_time(pid) is not None for pid in shells.values())
        for h in net.plan.hosts.values():
            assert Path(f"/proc/{shells[h.name]}/ns/net").stat().st_ino == Path(f"/run/netns/{h.netns}").stat().st_ino
        report = check_fidelity(net, **SHORT)
    bad = [link for link in report["links"] if not link["ok"]]
    assert not bad and report["ok"], json.dumps(bad, indent=1)
    assert len(report["links"]) == 2 * len(spec.links)
    assert json.loads((tmp_path / "topology.json").read_text())["backend"] == "mininet"
    assert all(proc_start_time(pid) is None for pid in shells.values())


def test_training_under_mininet_gives_the_netns_losses(two_dc_gpipe_netns, tmp_path, clean_machine, launcher):
    """The netns backend's run of the same experiment is shared with test_training
    (``conftest.two_dc_gpipe``)."""
    exp, netns_run, netns_summary = two_dc_gpipe_netns
    got = {"netns": losses(read_events(netns_run)).tolist()}
    assert netns_summary["backend"] == "netns"
    summary = run_experiment(
        exp, tmp_path / "mininet", progress=lambda line: None, backend="mininet", launcher=launcher
    )
    assert summary["backend"] == "mininet" and summary["completed_iterations"] == 3
    got["mininet"] = losses(read_events(tmp_path / "mininet")).tolist()
    assert len(got["mininet"]) == 3
    assert got["mininet"] == pytest.approx(got["netns"], rel=1e-6)
    assert got["mininet"] == pytest.approx(reference_losses(exp, 3), rel=1e-4)
    assert json.loads((tmp_path / "mininet" / "env.json").read_text())["backend"] == "mininet"


def test_one_mininet_run_at_a_time_and_kill_9_then_clean(tmp_path):
    others = registered_prefixes()  # clean may remove those too (if stale): not this test's business
    before = machine_state(others)
    proc = start_topo_up(tmp_path / "first", "--backend", "mininet")
    second = run_cli("topo", "check", "two_dc", "--backend", "mininet", "--out", str(tmp_path / "second"))
    assert second.returncode == 1
    assert "another Mininet run is active" in second.stderr and f"pid {proc.pid}" in second.stderr
    run = next(
        r
        for r in (json.loads(p.read_text()) for p in Path("/run/testbed/runs").glob("*.json"))
        if r["owner_pid"] == proc.pid
    )
    assert run["kind"] == "mininet"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert set(run["namespaces"]) <= set(machine_state()["netns"])  # the names outlive the owner
    cleaned = run_cli("clean")
    assert cleaned.returncode == 0, cleaned.stderr
    assert f"removed run {run['prefix']}" in cleaned.stdout
    assert machine_state(others) == before
    for p in run["processes"]:  # Mininet's shells and the delay elements are gone
        assert not same_process(p["pid"], p["start"])
    # the dead run's lock went with it: the next Mininet run builds
    with make_network(load_topology("two_dc"), "mininet", out_dir=tmp_path / "again", check_capacity=False) as net:
        assert net.run("east-h0", ["ping", "-c1", "-W2", str(net.host("west-h1").ip)]).returncode == 0
    assert machine_state(others) == before


#: the machine-wide settings ``mn`` raises at start (mininet/util.py, fixLimits) and leaves raised,
#: put back by the test that runs it
MN_SYSCTLS = (
    "fs/file-max",
    "net/core/wmem_max",
    "net/core/rmem_max",
    "net/ipv4/tcp_rmem",
    "net/ipv4/tcp_wmem",
    "net/core/netdev_max_backlog",
    "net/ipv4/neigh/default/gc_thresh1",
    "net/ipv4/neigh/default/gc_thresh2",
    "net/ipv4/neigh/default/gc_thresh3",
    "net/ipv4/route/max_size",
    "kernel/pty/max",
)


@pytest.fixture
def mn_sysctls_restored():
    """The MN_SYSCTLS as they were before the test, written back after it (the testbed's own
    Mininet backend never raises them: ``mininet_backend.py``)."""
    saved = {name: (Path("/proc/sys") / name).read_text() for name in MN_SYSCTLS}
    yield saved
    for name, value in saved.items():
        (Path("/proc/sys") / name).write_text(value)


def test_mn_custom_builds_the_same_network(clean_machine, mn_sysctls_restored):
    """Mininet's own tool opens the shipped topology (no switch, no controller) and every node
    reaches every other."""
    proc = subprocess.run(
        [
            "mn",
            "--custom",
            str(REPO / "topologies" / "mininet_topos.py"),
            "--topo",
            "two_dc",
            "--controller",
            "none",
            "--test",
            "pingall",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Results: 0% dropped (30/30 received)" in proc.stderr + proc.stdout
