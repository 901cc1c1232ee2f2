"""Pure parts of --backend remote: command quoting, tunnel plans, clock offsets, preflight verdicts,
topologies shipped to machines."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.net.remote.clock import estimate_offset
from testbed.net.remote.deploy import package_files
from testbed.net.remote.inventory import parse_inventory
from testbed.net.remote.preflight import check_congestion_defaults, check_machine, check_not_here, state_dir_id
from testbed.net.remote.ssh import remote_command
from testbed.net.remote.tunnels import tunnel_plan
from testbed.spec.topology_file import TOPOLOGY_DIR, load_topology, parse_topology

HOSTILE = [
    "a b",
    "it's",
    '"quoted"',
    "$(touch /tmp/pwned)",
    "`id`",
    "semi;colon",
    "a|b",
    "new\nline",
    "*",
    "",
    "--option",
    "~root",
    "back\\slash",
    "é",
]


def test_remote_command_delivers_every_word_intact(tmp_path):
    """The line is run by a real POSIX shell (as sshd does) and the program sees exactly its argv."""
    argv = [
        sys.executable,
        "-c",
        "import json, os, sys; print(json.dumps([sys.argv[1:], os.environ['TB_X'], os.getcwd()]))",
        *HOSTILE,
    ]
    cwd = tmp_path / "dir with 'quote' and $x"
    cwd.mkdir()
    line = remote_command(argv, env={"TB_X": "v; $(id) 'q'"}, cwd=str(cwd))
    out = subprocess.run(["sh", "-c", line], capture_output=True, text=True, check=True).stdout
    args, env, got_cwd = json.loads(out)
    assert args == HOSTILE and env == "v; $(id) 'q'" and got_cwd == str(cwd)
    assert not (tmp_path / "pwned").exists()


def test_remote_command_refuses_bad_input():
    with pytest.raises(ValueError):
        remote_command([])
    with pytest.raises(ValueError, match="variable name"):
        remote_command(["true"], env={"A B": "1"})
    with pytest.raises(ValueError, match="variable name"):
        remote_command(["true"], env={"X=$(id)": "1"})


def _inventory(groups):
    return parse_inventory(
        {
            "machines": [
                {"name": f"m{i}", "address": f"192.0.2.{10 + i}", "user": "root", "dcs": dcs}
                for i, dcs in enumerate(groups)
            ]
        },
        "inv.yaml",
    )


def test_tunnels_only_between_machines_with_matching_ends():
    spec = load_topology("three_dc")
    inv = _inventory([["east", "central"], ["west"]])
    plan = tunnel_plan(spec, inv, "tb3f9a")
    cross = [link for link in spec.links if {inv.machine_of(link.a).name, inv.machine_of(link.b).name} == {"m0", "m1"}]
    assert len(plan["m0"]) == len(plan["m1"]) == len(cross) >= 1
    for t in plan["m0"]:
        peer = next(p for p in plan["m1"] if p["vni"] == t["vni"])
        assert (peer["here"], peer["there"]) == (t["there"], t["here"])
        assert (t["local"], t["remote"]) == (peer["remote"], peer["local"]) == ("192.0.2.10", "192.0.2.11")
        assert 0 < t["vni"] < 2**24 and t["port"] == 4789
        # each end knows the other's link-layer address (pinned: no ARP across the link)
        assert (t["mac"], t["peer_mac"]) == (peer["peer_mac"], peer["mac"]) and t["mac"] != t["peer_mac"]
        assert int(t["mac"].split(":")[0], 16) & 0b11 == 0b10  # locally administered, unicast
    macs = [t["mac"] for m in plan.values() for t in m]
    assert len(set(macs)) == len(macs)
    assert tunnel_plan(spec, _inventory([["east", "central", "west"]]), "tb3f9a") == {"m0": []}
    other = tunnel_plan(spec, inv, "tb0001")  # another run on the same machines: other VNIs
    assert {t["vni"] for t in other["m0"]}.isdisjoint({t["vni"] for t in plan["m0"]})


def test_offset_from_the_exchange_with_the_smallest_round_trip():
    true_offset = 1_000_000_000_000
    samples = [
        (0, 600_000 + true_offset, 1_000_000),  # slow return: biased
        (2_000_000, 2_050_000 + true_offset, 2_100_000),  # 100 us round trip, symmetric
        (3_000_000, 3_100_000 + true_offset, 3_900_000),
    ]
    got = estimate_offset(samples)
    assert got["offset_ns"] == true_offset and got["rtt_ns"] == 100_000 and got["uncertainty_ns"] == 50_000
    with pytest.raises(ValueError):
        estimate_offset([])


def _report(**changes):
    r = {
        "uid": 0,
        "modules": {"torch": "2.13.0+cpu", "pyroute2": "0.9.7", "numpy": "2", "pandas": "3", "yaml": "6"},
        "tools": {
            t: f"/usr/bin/{t}" for t in ("nsenter", "ip", "tc", "iptables-restore", "iperf3", "ping", "unshare", "gcc")
        },
        "nfq_header": True,
        "vxlan": True,
        "vxlan_error": "",
        "congestion": {"available": ["reno", "cubic"], "allowed": ["reno", "cubic"], "default": "cubic"},
    }
    r.update(changes)
    return r


def test_congestion_control_is_checked_on_every_machine():
    """The topology's tcp_congestion available and allowed on each machine; without one, each end
    runs its machine's default, so the defaults must agree."""
    assert check_machine("m0", _report(), "2.13.0+cpu", "0.9.7", "reno") == []
    missing = check_machine("m0", _report(), "2.13.0+cpu", "0.9.7", "bbr")
    assert missing == [
        "m0: the kernel has no TCP congestion control 'bbr' (available: reno, cubic; modprobe tcp_bbr loaded none): "
        "set the topology's tcp_congestion to one every machine has"
    ]
    cc = {"available": ["reno", "cubic", "bbr"], "allowed": ["reno", "cubic"], "default": "cubic"}
    (not_allowed,) = check_machine("m1", _report(congestion=cc), "2.13.0+cpu", "0.9.7", "bbr")
    assert "tcp_allowed_congestion_control='reno cubic bbr'" in not_allowed
    same = {"m0": _report(), "m1": _report()}
    assert check_congestion_defaults(same) == []
    other = {"m0": _report(), "m1": _report(congestion={**cc, "default": "bbr"})}
    (differ,) = check_congestion_defaults(other)
    assert "differ (m0 cubic, m1 bbr)" in differ and "set the topology's tcp_congestion" in differ


def test_preflight_verdicts_name_the_machine_and_the_fix():
    assert check_machine("m0", _report(), "2.13.0+cpu", "0.9.7") == []
    problems = check_machine(
        "m1",
        _report(
            uid=1000,
            vxlan=False,
            vxlan_error="Unknown device type",
            modules={"torch": "2.1.0", "pyroute2": None, "numpy": "2", "pandas": "3", "yaml": "6"},
            tools={"nsenter": "/usr/bin/nsenter"},
        ),
        "2.13.0+cpu",
        "0.9.7",
    )
    text = "\n".join(problems)
    assert all(p.startswith("m1: ") for p in problems)
    for needle in (
        "not root",
        "pyroute2",
        "torch 2.1.0 differs",
        "iperf3 (apt-get install iperf3)",
        "VXLAN",
        "Unknown device type",
    ):
        assert needle in text, needle


def test_topologies_survive_the_trip_to_a_machine():
    for path in TOPOLOGY_DIR.glob("*.yaml"):
        spec = load_topology(path)
        assert parse_topology(json.loads(json.dumps(spec.to_file_dict())), spec.source) == spec
    spec = parse_topology(
        {
            "dcs": [
                {"name": "a", "hosts": 2, "intra_rate": "200mbit", "intra_delay": "1ms", "decode_hosts": 1},
                {"name": "b", "hosts": 1},
            ],
            "links": [
                {"between": ["a", "b"], "rate": "50mbit", "delay": "15ms", "jitter": "1ms", "loss": "0.3%", "queue": 77}
            ],
        },
        "impaired",
    )
    assert parse_topology(spec.to_file_dict(), "impaired") == spec


def test_deployment_carries_the_whole_package_tree_and_the_delay_element_source():
    """Every subpackage travels (the agent and the workers import across layers), with its
    ``__init__.py``; nothing compiled does."""
    import testbed

    names = {str(p) for p in package_files()}
    root = Path(testbed.__file__).parent
    every = {str(f.relative_to(root)) for f in root.rglob("*.py") if "__pycache__" not in f.parts}
    assert every <= names and "net/nfq_delay.c" in names
    assert {"net/remote/agent.py", "train/worker.py", "net/__init__.py", "net/remote/__init__.py"} <= names
    assert not any(n.endswith(".pyc") for n in names)


def _known_hosts(tmp_path, text: str | bytes):
    path = tmp_path / "known_hosts"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def test_known_hosts_lines_are_checked_and_named(tmp_path):
    import paramiko

    from testbed.errors import RemoteError
    from testbed.net.remote.ssh import load_known_hosts

    line = "192.0.2.10 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDwQ0vhUZm3kNk7uzAtOQq4iI6R3lu3nR0VbC+Qm0h0r\n"
    client = paramiko.SSHClient()
    load_known_hosts(client, _known_hosts(tmp_path, "# comment\n\n@cert-authority *.example.org " + line[11:] + line))
    assert client.get_host_keys().lookup("192.0.2.10") is not None
    for text, needle in [
        ("garbage ]]] AAAA\n", "line 1 is not a host key line"),
        (line + "@revoked * " + line[11:], "line 2 marks a revoked key"),
        (b"\xff\xfe\x00", "cannot be read"),
    ]:
        with pytest.raises(RemoteError, match=needle):
            load_known_hosts(paramiko.SSHClient(), _known_hosts(tmp_path, text))
    with pytest.raises(RemoteError, match="is not a file"):
        load_known_hosts(paramiko.SSHClient(), tmp_path)


def test_preflight_output_after_a_login_banner():
    from testbed.net.remote.preflight import last_json_line

    assert last_json_line('Welcome to m0!\n{"uid": 0}\n') == {"uid": 0}
    assert last_json_line("") is None and last_json_line("[1, 2]") is None
    assert "preflight report" in check_machine("m0", {"uid": 0}, "2.13.0", "0.9.7")[0]


def test_the_runners_own_machine_in_the_inventory_is_refused(tmp_path):
    """The same kernel and state folder as the runner's: the agent there would share the run's
    registry entry and control sockets; stand-in machines (their own /run/testbed) are not this one."""
    here = state_dir_id(tmp_path)
    assert here is not None and state_dir_id(tmp_path / "nope") is None
    (problem,) = check_not_here("m0", _report(state_dir=here), here)
    assert problem.startswith("m0: is this machine") and "outside the inventory" in problem
    assert check_not_here("m1", _report(state_dir=[here[0], here[1], here[2] + 1]), here) == []
    assert check_not_here("m1", _report(state_dir=None), here) == []
