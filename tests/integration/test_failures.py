"""Failure paths: a dead delay element, kill -9 then clean, Ctrl-C, limits, missing privileges."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed.errors import BuildError, DelayElementError, FeatureError
from testbed.net.features import cached_features
from testbed.net.netlink_tc import read_qdiscs
from testbed.net.registry import same_process
from testbed.run.backends import make_network
from testbed.spec.topology_file import load_topology, parse_topology

from .conftest import REPO, machine_state, registered_prefixes, run_cli, start_topo_up


def test_kill_9_then_clean_restores_machine(tmp_path):
    others = registered_prefixes()  # clean may remove those too (if stale): not this test's business
    before = machine_state(others)
    proc = start_topo_up(tmp_path)
    runs = [
        json.loads(p.read_text())
        for p in Path("/run/testbed/runs").glob("*.json")
        if json.loads(p.read_text())["owner_pid"] == proc.pid
    ]
    assert len(runs) == 1
    run = runs[0]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    leftover = machine_state()
    assert set(run["namespaces"]) <= set(leftover["netns"])  # kill -9 leaves them: clean must act
    warn = run_cli("topo", "show", "two_dc")  # any command works; root commands warn about leftovers
    assert warn.returncode == 0
    cleaned = run_cli("clean")
    assert cleaned.returncode == 0, cleaned.stderr
    assert f"removed run {run['prefix']}" in cleaned.stdout
    assert machine_state(others) == before
    for p in run["processes"]:
        assert not same_process(p["pid"], p["start"])


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_tears_down(tmp_path, sig):
    others = registered_prefixes()
    before = machine_state(others)
    proc = start_topo_up(tmp_path)
    proc.send_signal(sig)
    assert proc.wait(timeout=30) in (0, 128 + sig, 130)
    assert machine_state(others) == before


def test_dead_delay_element_fails_loudly(tmp_path, clean_machine):
    spec = load_topology("two_dc")
    with pytest.raises(DelayElementError, match="dropped, not delayed"):
        with make_network(spec, out_dir=tmp_path, delay_mechanism="nfqueue") as net:
            net.delay.elements[0].proc.kill()
            time.sleep(3)  # the supervisor interrupts this sleep
            raise AssertionError("a dead delay element went unnoticed")


def test_rate_above_machine_capacity_is_refused(tmp_path, clean_machine):
    spec = parse_topology(
        {
            "dcs": [{"name": "a", "hosts": 1}, {"name": "b", "hosts": 1}],
            "links": [{"between": ["a", "b"], "rate": "900gbit", "delay": "5ms"}],
        },
        "huge.yaml",
    )
    with pytest.raises(BuildError, match=r"huge.yaml: links\[0\].rate: '900gbit' is above what this machine carries"):
        with make_network(spec, out_dir=tmp_path):
            pass


def test_a_run_too_long_or_too_large_is_refused_before_building(tmp_path, clean_machine):
    """The command refuses, names the field and the fix, builds nothing and leaves no run folder."""
    out = tmp_path / "never"
    long = run_cli("run", "default", "--microbatches", "10000000", "--out", str(out), timeout=120)
    assert long.returncode != 0
    assert "microbatches: 10000000" in long.stderr and "--force" in long.stderr, long.stderr
    assert not out.exists()
    exp = tmp_path / "big.yaml"
    exp.write_text("topology: two_dc\nstages: 2\nmodel: {n_layers: 64, d_model: 4096, n_heads: 32, seq_len: 128}\n")
    big = run_cli("run", str(exp), "--out", str(out), timeout=120)
    assert big.returncode != 0
    assert "model.d_model: 4096" in big.stderr and "GiB" in big.stderr, big.stderr
    assert not out.exists()


def _kernel_has_netem() -> bool:
    """Asked of the kernel directly, not of the testbed's probe: a netem qdisc on loopback of a
    throw-away network namespace."""
    proc = subprocess.run(
        ["unshare", "--net", "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"],
        capture_output=True,
        text=True,
    )
    return proc.returncode == 0


def test_forced_netem_follows_the_kernel(tmp_path, clean_machine):
    """--delay-mechanism netem builds netem leaves where the kernel has sch_netem, and is refused
    with the fix where it has not; which one is decided by the kernel, asked independently."""
    spec = load_topology("two_dc")
    if _kernel_has_netem():
        with make_network(spec, out_dir=tmp_path, delay_mechanism="netem") as net:
            assert net.mechanism == "netem"
            assert "netem" in str(net.shaping.wan_tc_argv("east", "west"))
            assert read_qdiscs(net.handles.ipr(net.plan.routers["east"].netns), "w-west") == ["htb", "netem"]
    else:
        with pytest.raises(FeatureError, match="--delay-mechanism nfqueue"):
            with make_network(spec, out_dir=tmp_path, delay_mechanism="netem"):
                pass
        assert cached_features()["netem"] is False


def test_not_root_says_sudo():
    proc = subprocess.run(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            sys.executable,
            "-m",
            "testbed.cli",
            "topo",
            "check",
            "two_dc",
        ],
        capture_output=True,
        text=True,
        cwd="/",
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 1, proc.stderr
    assert "sudo" in proc.stderr and "Traceback" not in proc.stderr
