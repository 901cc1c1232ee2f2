"""The remote backend across stand-in machines: sshd instances in their own network, mount and time
namespaces (testbed/net/remote/lab.py; one machine's CLOCK_MONOTONIC runs 1000 s ahead). Fidelity, a
short training run under Atlas with clock-corrected traces and control messages lost on purpose,
refusals before anything is built, and nothing left behind on any machine, including after
kill -9."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest

from testbed.errors import RemoteError
from testbed.net.fidelity import check_fidelity, parse_ping_ms
from testbed.net.registry import list_runs
from testbed.net.remote.backend import RemoteNetwork
from testbed.net.remote.lab import SshLab
from testbed.net.remote.relay_client import FAULTS_ENV
from testbed.results.analysis import iteration_times, losses
from testbed.run.runner import run_experiment
from testbed.spec.experiment_file import load_experiment
from testbed.spec.topology_file import load_topology
from testbed.trace import metrics as M
from testbed.trace import schema as T
from testbed.trace.events import read_events
from testbed.trace.jsonl import read_jsonl
from tests.support.reference import reference_losses

from .conftest import LONG_RTT, run_cli, start_topo_up

SHIFT_S = 1000
GROUPS = {"two_dc": [["east"], ["west"]], "three_dc": [["east", "central"], ["west"]]}
EMPTY = {"netns": [], "runs": [], "workdir": []}


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    with SshLab([["east"], ["west"]], tmp_path_factory.mktemp("lab"), shifts=[0, SHIFT_S]) as lab:
        yield lab


def _empty(lab) -> dict:
    return {m.name: {k: v for k, v in lab.machine_state(m).items() if k != "links"} for m in lab.machines}


def _assert_machines_clean(lab) -> None:
    assert _empty(lab) == {m.name: EMPTY for m in lab.machines}
    for m in lab.machines:
        assert lab.machine_state(m)["links"] == ["eth0", "lo"]


def _assert_offsets(clock: dict) -> None:
    for name, want in (("m0", 0), ("m1", SHIFT_S * 10**9)):
        est = clock[name]["before"]
        assert abs(est["offset_ns"] - want) <= est["uncertainty_ns"] + 1_000_000, (name, est)


def _fragments(lab) -> dict[str, tuple[int, int]]:
    """Each stand-in machine's IPv4 fragments made and reassemblies asked for (/proc/net/snmp of
    its namespace: FragCreates, ReasmReqds)."""
    out = {}
    for m in lab.machines:
        text = subprocess.run(
            ["ip", "netns", "exec", m.netns, "cat", "/proc/net/snmp"], capture_output=True, text=True, check=True
        ).stdout
        names, values = (line.split()[1:] for line in text.splitlines() if line.startswith("Ip:"))
        ip = dict(zip(names, map(int, values)))
        out[m.name] = (ip["FragCreates"], ip["ReasmReqds"])
    return out


# three_dc only: its DCs on two machines give links across the two (to west), two_dc's one kind of
# link among them (two_dc's case cost 25 s of the suite). One of them, both ways: east:west, the
# longest path and the slowest link; central:west crosses between the same two machines (19 s
# more here), and the link inside one machine (east-central) is built by the netns backend's
# code inside the machine and measured by test_three_dc_fidelity (17 s more)
CROSSING = {"three_dc": ["east:west"]}


@pytest.mark.parametrize("name", ["three_dc"])
def test_fidelity_across_machines(name, lab, tmp_path, clean_machine):
    inv = lab.write_inventory(tmp_path / "inventory.yaml", GROUPS[name])
    spec = load_topology(name)
    with RemoteNetwork(spec, inventory=inv, out_dir=tmp_path / "run") as net:
        state = _empty(lab)
        # each machine holds its own copy of the package, which this namespace cannot see
        assert state["m0"]["workdir"] == state["m1"]["workdir"] == [net.prefix]
        assert not any(Path(lab.workdir).iterdir())
        assert state["m1"]["netns"] == sorted(
            net.plan.hosts[h].netns for h in net.plan.hosts if h.startswith("west")
        ) + [f"{net.prefix}-west-r"]
        _assert_offsets(net.clock)
        # the first packet over a link across machines waits no ARP round trip: each end of the
        # tunnel knows the other's link-layer address from the tunnel plan and pinned it (under
        # netem, whose delay covers ARP, an unpinned first ping takes two round trips; the NFQUEUE
        # element delays IP only, so here the neighbour tables show it)
        first = net.run("east-h0", ["ping", "-c", "1", "-W", "5", str(net.host("west-h0").ip)])
        rtt_ms = parse_ping_ms(first.stdout)[0]
        assert rtt_ms <= 2 * net.routes.one_way_delay_us("east", "west") / 1000 + 1.0, first.stdout
        machine = {m.name: m for m in lab.machines}
        for dc, peer in (("east", "west"), ("west", "east")):
            near, far = net.plan.wan_ends[(dc, peer)], net.plan.wan_ends[(peer, dc)]
            ns = {d: net.plan.routers[d].netns for d in (dc, peer)}
            m_near, m_far = (machine[net.inventory.machine_of(d).name] for d in (dc, peer))
            neigh = json.loads(lab.run_in(m_near, ["ip", "-n", ns[dc], "-j", "neigh", "show", "dev", near.ifname]))
            link = json.loads(lab.run_in(m_far, ["ip", "-n", ns[peer], "-j", "link", "show", far.ifname]))
            entry = next(n for n in neigh if n["dst"] == str(near.peer_ip))
            assert "PERMANENT" in entry["state"] and entry["lladdr"] == link[0]["address"], (entry, link)
        fragments_before = _fragments(lab)
        # a failing direction measured again, up to three measurements: the two stand-in machines
        # and their agents' trace copying share this machine's two cores, and the directions sent
        # from the machine holding west alone dip most (86-92% of their goodput twice in a row in
        # one full run on 2026-12-03, 81-90% in one of two runs right after the Mininet tests,
        # 99-100% in four runs alone); a direction that is wrong usually fails every time
        report = check_fidelity(net, **{**LONG_RTT, "attempts": 3}, links=CROSSING[name])
        bad = [link for link in report["links"] if not link["ok"]]
        for x in report["links"]:
            measured = [e["measured_rate_mbit"] for e in x["earlier"]] + [x["measured_rate_mbit"]]
            print(f"{x['src_dc']}->{x['dst_dc']}: {measured} of {x['expected_goodput_mbit']:.1f} Mbit/s")
    assert not bad, json.dumps(bad, indent=1)
    # the bulk transfers crossed the tunnels in whole packets: no machine fragmented or reassembled
    # one (MaxiNet#19: TCP over GRE failed at a 1500-byte MTU), the emulated MTU leaving room
    assert _fragments(lab) == fragments_before
    assert {(x["src_dc"], x["dst_dc"]) for x in report["links"]} == {
        (a, b) for link in CROSSING[name] for a, b in [link.split(":"), link.split(":")[::-1]]
    }
    topo = json.loads((tmp_path / "run" / "topology.json").read_text())
    assert topo["backend"] == "remote" and topo["tunnels"]["m0"] and topo["hosts"]["west-h0"]["machine"] == "m1"
    shaping = [json.loads(line) for line in (tmp_path / "run" / "shaping.jsonl").read_text().splitlines()]
    assert {s["netns"].split("-", 1)[1] for s in shaping} >= {"east-r", "west-r"}  # both ends shaped
    _assert_machines_clean(lab)


#: the BubbleTea run's iterations (about 1 s each): the request stream starts once every worker and
#: decode host is ready, 3.0 s after training began in a run alone and 4.9 s in a fresh clone's
#: suite, where 4 iterations completed none of the 22 requests assigned; 7 leave 3 s or more
BUBBLETEA_ITERATIONS = 7


def test_atlas_and_bubbletea_across_machines_with_control_messages_lost_and_repeated(
    lab, tmp_path, clean_machine, monkeypatch
):
    """Atlas and BubbleTea on two machines (the controller and the dispatcher here, a relay on each
    machine), a tenth of the relays' forwards and answers dropped and another tenth sent twice on
    purpose: training finishes with the netns backend's losses, in one clock; each machine applied
    the grants of its own links, as its kernel's counters show; every lost message cost at most one
    deadline; requests were prefilled on both machines and their times line up in one clock."""
    monkeypatch.setenv(FAULTS_ENV, "drop=0.1,duplicate=0.1,seed=1")
    inv = lab.write_inventory(tmp_path / "inventory.yaml", GROUPS["two_dc"])
    topo = tmp_path / "two_dc_decode.yaml"  # two_dc with a decode host in each DC
    topo.write_text(Path(load_topology("two_dc").source).read_text().replace("hosts: 2}", "hosts: 3, decode_hosts: 1}"))
    exp = load_experiment().with_overrides(
        topology=str(topo),
        stages=2,
        replicas=2,
        iterations=BUBBLETEA_ITERATIONS,
        warmup_iterations=1,
        schedule="gpipe",
        policy="atlas+bubbletea",
    )
    # prompts clipped short, as in test_bubbletea: the default's prompts take seconds of bubbles each,
    # and 4 iterations completed one request or none (CI at 7a7b80b: none)
    short = replace(exp.bubbletea, request_rate=8.0, max_prompt_tokens=256, max_output_tokens=8, model=None)
    exp = exp.with_overrides(bubbletea=short)
    t0 = time.monotonic_ns()
    summary = run_experiment(exp, tmp_path / "run", progress=lambda line: None, backend="remote", inventory=inv)
    t1 = time.monotonic_ns()
    assert summary["backend"] == "remote" and summary["completed_iterations"] == BUBBLETEA_ITERATIONS
    assert summary[M.MACHINES] == {"m0": ["east"], "m1": ["west"]}
    run = tmp_path / "run"
    assert losses(read_events(run)).tolist() == pytest.approx(reference_losses(exp, BUBBLETEA_ITERATIONS), rel=1e-4)
    clock = json.loads((run / "clock_offsets.json").read_text())["machines"]
    _assert_offsets(clock)
    assert all("after" in c for c in clock.values())
    assert (
        summary[M.CLOCK_OFFSET_UNCERTAINTY_MS]
        == max(e["uncertainty_ns"] for c in clock.values() for e in c.values()) / 1e6
    )
    ev = read_events(run)
    assert set(ev[T.HOST].map(lambda h: h.split("-")[0])) == {"east", "west"}
    # every event in this machine's clock (m1's raw clock is 1000 s ahead)
    assert ev[T.START_NS].min() >= t0 and ev[T.END_NS].max() <= t1
    # causality across machines: a tensor arrives no earlier than one one-way delay after its send began
    sends = ev[ev[T.KIND] == T.SEND].set_index([T.WORKER, T.PEER, T.ITERATION, T.MICROBATCH])[T.START_NS]
    recvs = ev[ev[T.KIND] == T.RECV_WAIT]
    one_way = load_topology("two_dc").links[0].delay_us * 1000
    gaps = [r[T.END_NS] - sends[(r[T.PEER], r[T.WORKER], r[T.ITERATION], r[T.MICROBATCH])] for _, r in recvs.iterrows()]
    assert gaps and min(gaps) >= one_way - 2_000_000, min(gaps)

    # each machine applied the grants of the links leaving its DCs, and its kernel's classes moved
    applied = [r for r in read_jsonl(run / "relay.jsonl") if r["event"] == "applied"]
    assert {(r["machine"], r["netns"].split("-", 1)[1]) for r in applied} == {("m0", "east-r"), ("m1", "west-r")}
    grants = [r for r in read_jsonl(run / "controller.jsonl") if r.get("event") == "grant" and not r.get("kept")]
    assert {r["machine"] for r in grants} == {"m0", "m1"}
    assert all(r["t_decided_ns"] <= r["t_acked_ns"] for r in grants)
    # a relay's applied time lies between the decision and its answer's arrival, within the offsets' uncertainty
    slack = summary[M.CLOCK_OFFSET_UNCERTAINTY_MS] * 1e6
    assert all(r["t_decided_ns"] - slack <= r["t_applied_ns"] <= r["t_acked_ns"] + slack for r in grants)
    # planned grants end when their class's byte counter, read by the relay of the link's machine,
    # shows the transfer's bytes passed: the granted class carried them there
    releases = [r for r in read_jsonl(run / "controller.jsonl") if r.get("event") == "release"]
    by_bytes = {r["link"] for r in releases if r["reason"] == "bytes" and r["sent_bytes"] > 0}
    assert by_bytes == {"east->west", "west->east"}
    ages = [r["counter_age_ns"] for r in releases if "counter_age_ns" in r]
    assert ages and all(-slack <= a < 20_000_000 + slack for a in ages), sorted(ages)[-3:]  # a read's round trip

    # BubbleTea: requests dispatched from here to workers on both machines were prefilled, and each
    # request's times (the dispatcher's arrival, the worker's prefill, the decode host's first token) line up
    firsts = [
        r for f in (run / "requests").glob("decode-*.jsonl") for r in read_jsonl(f) if r["event"] == "first_token"
    ]
    assert summary[M.REQUESTS_COMPLETED] == len(firsts) > 0
    assigned = [r for r in read_jsonl(run / "requests" / "dispatch.jsonl") if r["event"] == "assign"]
    assert {"east" if r["worker"] < 2 else "west" for r in assigned} == {"east", "west"}  # ranks 0-1: stage 0, east
    assert {"east" if r["worker"] < 2 else "west" for r in firsts} == {"east", "west"}  # completed on both machines
    for r in firsts:
        assert r["arrival_ns"] - slack <= r["prefill_start_ns"] <= r["prefill_end_ns"] <= r["first_token_ns"] + slack, r

    # the faults happened, and each lost message cost at most one deadline
    relays = summary[M.CONTROL_RELAYS]
    assert set(relays) == {"m0", "m1", "runner"} and all(r["stale"] == 0 for r in relays.values())
    # the hub here delivered the workers' profiles to the dispatcher, the relays its requests to the workers
    assert all(relays[m]["delivered"] > 0 for m in ("runner", "m0", "m1"))
    dropped = sum(r["forwards_dropped"] for r in relays.values())
    assert dropped > 0 and sum(r["forwards_duplicated"] for r in relays.values()) > 0
    assert sum(r["replies_dropped"] for r in relays.values()) > 0
    end = next(r for r in read_jsonl(run / "controller.jsonl") if r.get("event") == "loop_end")
    assert end["relay_requests_resent"] >= sum(r["replies_dropped"] for r in relays.values())
    assert end["deadline_releases"] + end["expired"] <= dropped
    plan = json.loads((run / "controller_plan.json").read_text())
    deadline_s = max(h["deadline_ns"] for h in plan["timing"]) / 1e9
    it = iteration_times(ev, exp.warmup_iterations)["duration_s"]
    budget = len(it) * summary[M.PREDICTED_ITERATION_TIME_S] * 1.1 + dropped * deadline_s
    assert it.sum() <= budget, (list(it), dropped, deadline_s)
    _assert_machines_clean(lab)


def test_twelve_machines_every_host_pair_reachable(tmp_path, clean_machine):
    """More than ten machines (Mininet Cluster Edition lost reachability past ten, mininet#1078):
    12 stand-in machines, one DC of two hosts each, the DCs in a chain, so that paths cross up to
    twelve machines (each DC's router forwarding between two tunnels); every pair of the 24 hosts
    answers a ping, and every machine is left clean."""
    names = [f"dc{i:02d}" for i in range(12)]
    topo = tmp_path / "chain12.yaml"
    topo.write_text(
        "name: chain12\ndescription: twelve DCs in a chain\ndcs:\n"
        + "".join(f"  - {{name: {d}, hosts: 2}}\n" for d in names)
        + "links:\n"
        + "".join(f"  - {{between: [{a}, {b}], rate: 10mbit, delay: 1ms}}\n" for a, b in zip(names, names[1:]))
    )
    with SshLab([[d] for d in names], tmp_path / "lab") as lab:
        inv = lab.write_inventory(tmp_path / "inventory.yaml", [[d] for d in names])
        with RemoteNetwork(load_topology(str(topo)), inventory=inv, out_dir=tmp_path / "run") as net:
            hosts = sorted(net.hosts)
            assert len(hosts) == 24 and len({net.host_machine(h) for h in hosts}) == 12
            unreachable = []
            for h in hosts:  # each host pings all the others at once
                ips = " ".join(str(net.host(o).ip) for o in hosts if o != h)
                script = f"for ip in {ips}; do (ping -c 1 -W 3 $ip >/dev/null || echo $ip) & done; wait"
                out = net.run(h, ["sh", "-c", script], timeout_s=30).stdout.split()
                unreachable += [(h, ip) for ip in out]
        assert unreachable == []
        assert _empty(lab) == {m.name: EMPTY for m in lab.machines}


def test_kill_9_then_clean(lab, tmp_path, clean_machine):
    inv = lab.write_inventory(tmp_path / "inventory.yaml", GROUPS["two_dc"])
    proc = start_topo_up(tmp_path / "run", "--backend", "remote", "--inventory", str(inv))
    rec = next(r for r in list_runs() if r.owner_pid == proc.pid)
    assert rec.kind == "remote" and set(rec.remote["roots"]) == {"m0", "m1"}
    assert all(_empty(lab)[m.name]["netns"] for m in lab.machines)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    # the agents see their SSH channel close and tear their part down
    deadline = time.monotonic() + 30
    while any(_empty(lab)[m.name]["netns"] for m in lab.machines) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert all(not s["netns"] and not s["runs"] for s in _empty(lab).values())
    cleaned = run_cli("clean")
    assert cleaned.returncode == 0, cleaned.stderr
    assert f"removed run {rec.prefix}" in cleaned.stdout and "trace files fetched" in cleaned.stdout
    assert (tmp_path / "run" / "leftover-m0").is_dir()
    _assert_machines_clean(lab)


def test_a_killed_agent_is_reported_and_its_machine_cleaned(lab, tmp_path, clean_machine):
    import os

    inv = lab.write_inventory(tmp_path / "inventory.yaml", GROUPS["two_dc"])
    with RemoteNetwork(load_topology("two_dc"), inventory=inv, out_dir=tmp_path / "run") as net:
        os.kill(net.agent_pids["m1"], signal.SIGKILL)  # the lab's machines share this PID namespace
        with pytest.raises(RemoteError, match="m1.*exited or was killed") as first:
            for _ in range(50):
                net.check_alive()
                time.sleep(0.1)
        # one event, one message: whichever thread met it first (the heartbeat's or this one),
        # every later call says the same
        with pytest.raises(RemoteError) as again:
            net.check_alive()
        assert str(again.value) == str(first.value)
        assert _empty(lab)["m1"]["netns"]  # a killed agent cannot tear down
    _assert_machines_clean(lab)  # the runner cleaned m1 from its own registry
    assert not [r for r in list_runs() if r.kind == "remote"]


def test_a_dead_controller_then_a_killed_agent_mid_run(lab, tmp_path, clean_machine):
    """Atlas training across two machines. The controller (here) killed with SIGKILL after the first
    iteration: the runner opens every pipeline's class through the machines' relays, as on one
    machine, and training goes on. Then m1's agent killed with SIGKILL after the third (its relay
    and workers die with it): the run aborts within seconds, naming the machine, its summary and
    the traces copied so far kept, and both machines clean."""
    inv = lab.write_inventory(tmp_path / "inventory.yaml", GROUPS["two_dc"])
    exp = load_experiment().with_overrides(topology="two_dc", stages=2, iterations=20, policy="atlas")
    lines: list[str] = []
    killed: list[float] = []

    def progress(line: str) -> None:
        lines.append(line)
        if "iteration 1/" in line:
            rec = next(r for r in list_runs() if r.owner_pid == os.getpid() and r.kind == "remote")  # not the lab
            os.kill(next(p.pid for p in rec.processes if p.what == "atlas controller"), signal.SIGKILL)
        if "iteration 3/" in line and not killed:  # the lab's machines share this PID namespace
            os.kill(json.loads((tmp_path / "run" / "topology.json").read_text())["agent_pids"]["m1"], signal.SIGKILL)
            killed.append(time.monotonic())

    with pytest.raises(RemoteError, match="m1") as e:
        run_experiment(exp, tmp_path / "run", progress=progress, backend="remote", inventory=inv)
    assert killed and time.monotonic() - killed[0] < 20, e.value  # bounded: the agent's end is seen at once
    assert any("fell back to fair sharing" in line for line in lines)
    rows = sorted(read_jsonl(tmp_path / "run" / "shaping.jsonl"), key=lambda r: r["t_ns"])
    last = {(r["netns"], r["classid"]): r["rate_bps"] for r in rows if r.get("classid") in ("1:20", "1:21")}
    assert {ns.split("-", 1)[1] for ns, _ in last} == {"east-r", "west-r"}
    assert all(v == 100_000_000 for v in last.values()), last  # all open again, on both machines
    falls = [r for r in read_jsonl(tmp_path / "run" / "controller.jsonl") if r.get("event") == "fall_back"]
    assert {r["machine"] for r in falls} == {"m0", "m1"}
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["aborted"] and summary["completed_iterations"] >= 3 and summary[M.CONTROLLER_FAILED]
    # the iterations it completed, under grants and then fair sharing, learned as one process does
    done = losses(read_events(tmp_path / "run")).tolist()
    assert len(done) >= 3 and done == pytest.approx(reference_losses(exp, len(done)), rel=1e-4)
    assert list((tmp_path / "run" / "events").glob("*.jsonl"))
    _assert_machines_clean(lab)
    assert not [r for r in list_runs() if r.kind == "remote"]


def test_a_cut_management_connection_ends_in_bounded_time_and_clean_restores_the_machine(lab, tmp_path, clean_machine):
    """m1's management interface taken down while a process runs in one of its hosts (a run under
    way): the runner hears nothing from m1's agent for ``agent_answer_s`` and says so, naming the
    machine; m1's agent, hearing no request for ``agent_idle_s`` (the runner, or the network, gone
    without a TCP close), tears its part down on its own; the teardown cannot reach m1 and keeps the
    run in the registry, and ``testbed clean``, once the interface is back, finishes it."""
    inv = lab.write_inventory(tmp_path / "inventory.yaml", GROUPS["two_dc"])
    net = RemoteNetwork(load_topology("two_dc"), inventory=inv, out_dir=tmp_path / "run")
    net.agent_idle_s = net.agent_answer_s = 3
    m1 = next(m for m in lab.machines if m.name == "m1")
    with pytest.raises(RemoteError, match=r"m1.*did not answer") as e:
        with net:
            proc = net.popen("west-h0", ["sleep", "120"])
            subprocess.run(["ip", "-n", m1.netns, "link", "set", "eth0", "down"], check=True)
            t_cut = time.monotonic()
            while time.monotonic() - t_cut < 30:  # what the runner's watch does
                proc.poll()
                net.check_alive()
                time.sleep(0.2)
    t_end = time.monotonic()
    assert t_end - t_cut < 3 + 15, (t_end - t_cut, e.value)  # the answer's wait, then the failed cleaning
    while lab.machine_state(m1)["netns"] and time.monotonic() - t_end < 10:
        time.sleep(0.2)
    assert lab.machine_state(m1)["netns"] == []  # its agent tore down on its own, unreachable
    assert [r.kind for r in list_runs() if r.kind == "remote"] == ["remote"]  # kept for testbed clean
    subprocess.run(["ip", "-n", m1.netns, "link", "set", "eth0", "up"], check=True)
    # this test's process owns the run, as a runner that exited would not: named, and --all
    cleaned = run_cli("clean", "--run", net.prefix, "--all")
    assert cleaned.returncode == 0, cleaned.stdout + cleaned.stderr
    assert f"run {net.prefix}: m1: " in cleaned.stdout and f"removed run {net.prefix}" in cleaned.stdout
    _assert_machines_clean(lab)
    assert not [r for r in list_runs() if r.kind == "remote"]


def _refused(inv: Path, tmp_path: Path, lab, needle: str, topology: str = "two_dc") -> str:
    with pytest.raises(RemoteError) as e:
        with RemoteNetwork(load_topology(topology), inventory=inv, out_dir=tmp_path / "run"):
            pass
    assert needle in str(e.value), str(e.value)
    assert "nothing was built" in str(e.value)
    _assert_machines_clean(lab)
    assert not [r for r in list_runs() if r.kind == "remote"]
    return str(e.value)


def test_unknown_and_changed_host_keys_are_refused(lab, tmp_path, clean_machine):
    known = (lab.out / "known_hosts").read_text().splitlines()
    (tmp_path / "kh_m0_only").write_text(known[0] + "\n")
    inv = lab.write_inventory(tmp_path / "a.yaml", GROUPS["two_dc"], known_hosts=str(tmp_path / "kh_m0_only"))
    msg = _refused(inv, tmp_path, lab, "is not in")
    assert "m1" in msg and "accept_unknown_host_keys" in msg
    # m1 presents a key other than the recorded one
    ip1 = lab.machines[1].ip
    (tmp_path / "kh_swapped").write_text(known[0] + "\n" + ip1 + " " + known[0].split(" ", 1)[1] + "\n")
    inv = lab.write_inventory(tmp_path / "b.yaml", GROUPS["two_dc"], known_hosts=str(tmp_path / "kh_swapped"))
    _refused(inv, tmp_path, lab, "differs from the one in")


def test_a_refused_login_is_named(lab, tmp_path, clean_machine):
    import subprocess

    import yaml

    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    data = yaml.safe_load(lab.write_inventory(tmp_path / "a.yaml", GROUPS["two_dc"]).read_text())
    data["machines"][1]["key"] = str(other)  # not in the machine's authorized_keys
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(data))
    msg = _refused(tmp_path / "a.yaml", tmp_path, lab, "refused the login")
    assert "m1" in msg and "PRIVATE KEY" not in msg and other.read_text() not in msg
    locked = tmp_path / "locked_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "a passphrase", "-f", str(locked)], check=True)
    data["machines"][1]["key"] = str(locked)
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(data))
    _refused(tmp_path / "a.yaml", tmp_path, lab, "encrypted with a passphrase")
    data["machines"][1]["key"] = str(locked) + ".pub"  # the public half by mistake
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(data))
    _refused(tmp_path / "a.yaml", tmp_path, lab, "cannot be")


def test_unreachable_machine_and_missing_modules_are_refused_before_building(lab, tmp_path, clean_machine):
    import yaml

    inv = lab.write_inventory(tmp_path / "a.yaml", GROUPS["two_dc"])
    data = yaml.safe_load(inv.read_text())
    data["machines"][1]["address"] = str(lab.machines[1].ip).rsplit(".", 1)[0] + ".250"  # nobody there
    data["accept_unknown_host_keys"] = True
    inv.write_text(yaml.safe_dump(data))
    _refused(inv, tmp_path, lab, "is unreachable")
    data = yaml.safe_load(lab.write_inventory(tmp_path / "b.yaml", GROUPS["two_dc"]).read_text())
    data["machines"][1]["python"] = "/usr/bin/python3"  # Debian's Python: no torch, no pyroute2
    (tmp_path / "b.yaml").write_text(yaml.safe_dump(data))
    _refused(tmp_path / "b.yaml", tmp_path, lab, "m1: Python modules missing: torch")


def test_cli_refuses_what_the_remote_backend_cannot_do(lab, tmp_path):
    inv = lab.write_inventory(tmp_path / "a.yaml", GROUPS["three_dc"])
    proc = run_cli(
        "run", "--backend", "remote", "--inventory", str(inv), "--sched-trace", "--out", str(tmp_path / "run")
    )
    assert proc.returncode == 2 and "traces this machine's scheduler" in proc.stderr
    proc = run_cli("topo", "up", "two_dc", "--backend", "remote")
    assert proc.returncode == 2 and "--inventory" in proc.stderr
    proc = run_cli("topo", "up", "two_dc", "--backend", "remote", "--inventory", str(inv))
    assert proc.returncode == 2 and "central" in proc.stderr  # three_dc's inventory does not fit two_dc
