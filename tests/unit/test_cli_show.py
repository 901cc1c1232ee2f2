"""`testbed topo show` (no root) and how the command line reports bad input."""

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.cli import main
from testbed.net import registry
from testbed.spec.addressing import AddressPlan
from testbed.spec.topology_file import load_topology

REPO = Path(__file__).resolve().parents[2]


def run_cli(*args, state_dir):
    """``python -m testbed.cli ARGS`` with its feature cache in ``state_dir`` (so no detected netem)."""
    env = {"PATH": "/usr/bin:/bin", "TESTBED_STATE_DIR": str(state_dir)}
    return subprocess.run(
        [sys.executable, "-m", "testbed.cli", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def in_process(tmp_path, monkeypatch):
    """Call main() here: keep the feature cache in tmp_path and restore the signal handlers it sets."""
    monkeypatch.setattr(registry, "RUN_DIR", tmp_path)
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    yield main
    for s, handler in saved.items():
        signal.signal(s, handler)


def test_show_two_dc_with_tc(tmp_path):
    res = run_cli("topo", "show", "two_dc", "--tc", state_dir=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stderr == ""
    out = res.stdout
    plan = AddressPlan(load_topology("two_dc"), "tbXXXX")
    for h in plan.hosts.values():
        assert f"{h.name:<16} {h.ip}" in out
    assert "subnet 10.100.0.0/24, gateway 10.100.0.1" in out
    assert "link east <-> west: 100mbit, one-way 20ms" in out
    assert "east -> west: east -> west, one-way 20ms host to host" in out
    assert "(assumed: run a root command once to detect)" in out  # empty cache: netem assumed
    assert "  tc qdisc add dev w-west root handle 1: htb default 10" in out
    assert "  tc qdisc add dev w-east parent 1:10 handle 10: netem" in out
    assert "# tbXXXX-east-r w-west" in out and "# tbXXXX-west-r w-east" in out


def test_show_with_nfqueue_uses_pfifo_leaves(in_process, capsys):
    assert in_process(["topo", "show", "three_dc", "--tc", "--delay-mechanism", "nfqueue"]) == 0
    out = capsys.readouterr().out
    assert "delay mechanism" not in out  # forced: nothing to detect or assume
    assert "netem" not in out
    assert out.count("pfifo limit 1000") == 2 * 3  # one leaf per end of each of 3 links
    assert "east -> west: east -> west, one-way 30ms" in out
    assert "central -> west: central -> west, one-way 25ms" in out


def test_auto_follows_the_detected_kernel(in_process, capsys, tmp_path):
    boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    (tmp_path / "features.json").write_text(json.dumps({"boot_id": boot_id, "netem": False}))
    assert in_process(["topo", "show", "two_dc", "--tc"]) == 0
    out = capsys.readouterr().out
    assert "delay mechanism: nfqueue" in out and "(detected)" in out
    assert "pfifo limit 1000" in out and "netem limit" not in out


def test_bad_topology_file_exits_2_with_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "dcs: [{name: east, hosts: 2}, {name: west, hosts: 2}]\n"
        "links: [{between: [east, west], rate: 100mbps, delay: 20ms}]\n"
    )
    res = run_cli("topo", "show", str(bad), state_dir=tmp_path)
    assert res.returncode == 2
    assert res.stdout == ""
    assert "Traceback" not in res.stderr
    lines = res.stderr.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"testbed: error: {bad}: links[0].rate: '100mbps'")
    assert "'mbit'" in lines[0]


def test_missing_file_exits_2(in_process, capsys):
    assert in_process(["topo", "show", "no_such_file.yaml"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("testbed: error: no_such_file.yaml:") and "does not exist" in err
    assert err.count("\n") == 1


def test_unknown_mechanism_is_a_usage_error(in_process, capsys):
    with pytest.raises(SystemExit) as e:
        in_process(["topo", "show", "two_dc", "--delay-mechanism", "tbf"])
    assert e.value.code == 2
    assert "invalid choice: 'tbf'" in capsys.readouterr().err


def test_schedule_command_prints_actions_per_worker(in_process, capsys):
    assert in_process(["schedule", "--schedule", "1f1b", "--microbatches", "4"]) == 0
    out = capsys.readouterr().out
    assert "worker 0 (east-h0, stage 0, replica 0): F0 F1 F2 B0 F3 B1 B2 B3" in out
    assert "worker 5 (west-h1, stage 2, replica 1): F0 B0 F1 B1 F2 B2 F3 B3" in out
    assert "stage 2:" in out and " . " in out


def test_topo_check_names_a_link_it_has_not_before_building(in_process, capsys):
    """``topo check --link`` resolves each name against the file first (no root, nothing built):
    an unknown one lists the links there are; with ``--profile`` it is refused, saying why."""
    assert in_process(["topo", "check", "three_dc", "--link", "east:nowhere"]) == 2
    err = capsys.readouterr().err
    assert "--link: three_dc has no link 'east:nowhere'" in err
    assert "east:central, central:west, east:west (write DC:DC)" in err
    assert in_process(["topo", "check", "three_dc", "--link", "west:central", "--profile"]) == 2
    assert "--profile checks every profiled link" in capsys.readouterr().err
