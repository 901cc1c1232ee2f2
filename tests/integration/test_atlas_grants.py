"""Atlas's planned grants on real runs: one pipeline's transfer on a link at a time (byte counters
read back from the kernel every millisecond), a lost ``done`` released at its deadline, and the
same math at every step of the ablation."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from testbed.results.analysis import losses
from testbed.spec.experiment_file import load_experiment
from testbed.spec.policy import ABLATION
from testbed.trace.events import read_events


def _quiet(line: str) -> None:
    pass


def _sample_classes(out_dir: Path, link: str, stop: threading.Event, samples: list) -> None:
    """Every millisecond, the byte counter of each pipeline's class on ``link`` (as the controller
    compiled them: controller_plan.json), read with one netlink dump per class."""
    from testbed.net import rtnl_raw

    plan_path = out_dir / "controller_plan.json"
    while not plan_path.exists() and not stop.is_set():
        time.sleep(0.01)
    if stop.is_set():
        return
    plan = json.loads(plan_path.read_text())
    hop = next(h for h in plan["switch"] if f"{h['src']}->{h['dst']}" == link)
    replicas = sorted(int(k) for k in hop["batches"] if k != "open")
    any_batch = hop["batches"][str(replicas[0])]
    sock = rtnl_raw.rtnl_socket(any_batch["netns"])
    try:
        while not stop.is_set():
            t = time.monotonic_ns()
            try:
                row = [rtnl_raw.class_tx_bytes(sock, any_batch["ifindex"], 0x10000 | (0x20 + r)) for r in replicas]
            except (KeyError, OSError):  # the network is going down
                return
            samples.append((t, row))
            time.sleep(0.001)
    finally:
        sock.close()


def _grant_intervals(log: list[dict], link: str) -> list[tuple[int, int, int]]:
    """(applied ns, released ns, replica) of every grant on ``link`` in the controller's log."""
    out, open_ = [], {}
    for r in log:
        if r.get("link") != link:
            continue
        if r["event"] == "grant":
            open_[r["replica"]] = r["t_applied_ns"]
        elif r["event"] == "release" and r["replica"] in open_:
            out.append((open_.pop(r["replica"]), r["t_ns"], r["replica"]))
    return out


@pytest.mark.parametrize(
    "backend, borrow",
    [("netns", False), ("netns", True), ("mininet", False)],
    ids=["netns-no-borrowing", "netns-borrowing", "mininet-no-borrowing"],
)
def test_planned_grants_send_one_pipelines_transfer_at_a_time(backend, borrow, tmp_path, clean_machine, launcher):
    """On the sharing experiment (four pipelines on one 25 Mbit/s link), sampled in 2 ms windows.
    Without borrowing, at most one pipeline's class sends more than its floor (plus one HTB burst):
    the bytes sent in windows where two or more do are a small share of all bytes. With borrowing,
    held classes send beyond their floors only while the granted class has no backlog: in windows
    inside a grant where the holder sends at its granted rate, the others stay at their floors.
    Mininet's interfaces run the first case; borrowing is the same HTB ceilings on either backend
    (Mininet's borrowing case cost 10-12 s of the suite until 99b4ea5)."""
    from testbed.run.runner import run_experiment

    exp = load_experiment("sharing").with_overrides(
        iterations=4, warmup_iterations=1, policy="atlas", atlas_borrow=borrow
    )
    stop, samples = threading.Event(), []
    sampler = threading.Thread(target=_sample_classes, args=(tmp_path, "east->west", stop, samples))
    sampler.start()
    try:
        summary = run_experiment(exp, tmp_path, progress=_quiet, backend=backend, launcher=launcher)
    finally:
        stop.set()
        sampler.join()
    assert summary["completed_iterations"] == 4 and summary["grants"] > 0
    log = [json.loads(x) for x in (tmp_path / "controller.jsonl").read_text().splitlines()]
    floor_bytes_per_ms = 0.05 * 25e6 / 8 / 1000
    burst = 2 * 1514  # HTB lets a held class send one burst beyond its rate
    windows = []
    for (t0, a), (t1, b) in zip(samples[::2], samples[2::2]):
        windows.append((t0, t1, [y - x for x, y in zip(a, b)]))
    total = sum(sum(sent) for _, _, sent in windows)
    assert total > 4 * 4 * 65536  # every transfer of the iterations went through the classes
    overlap = 0
    if not borrow:
        for t0, t1, sent in windows:
            ms = (t1 - t0) / 1e6
            above = sorted((x for x in sent if x > 2 * floor_bytes_per_ms * ms + burst), reverse=True)
            overlap += sum(above[1:])  # all but the holder's
    else:
        grants = _grant_intervals(log, "east->west")
        granted_bytes_per_ms = 25e6 * (1 - 3 * 0.05) / 8 / 1000
        inside = 0
        for t0, t1, sent in windows:
            holder = next((g for a, z, g in grants if a <= t0 and t1 <= z), None)
            if holder is None:
                continue
            ms = (t1 - t0) / 1e6
            inside += 1
            if sent[holder] >= 0.9 * granted_bytes_per_ms * ms:  # the holder is backlogged
                overlap += sum(max(0, x - (floor_bytes_per_ms * ms + burst)) for r, x in enumerate(sent) if r != holder)
        assert inside > 100, inside  # the check saw the grants
    assert overlap <= 0.10 * total, (overlap, total)
    reasons = [r["reason"] for r in log if r["event"] == "release"]
    assert reasons.count("bytes") >= 0.8 * len(reasons), reasons  # grants end when their bytes have passed
    assert (tmp_path / "grant_plan.txt").read_text().startswith("one transfer: 65536 bytes")


def test_a_lost_done_is_released_at_its_deadline(tmp_path, clean_machine):
    """The controller process under FIFO grants: replica 0's ``done`` never comes; the link goes to
    replica 1 once replica 0's grant reaches its deadline (3 transfer times plus one RTT)."""
    from testbed.atlas.channel import ControlClient
    from testbed.atlas.controller import Controller
    from testbed.atlas.grants import CLASS_BASE, floor_bps
    from testbed.plan.grant_plan import Hop, plan_grants
    from testbed.plan.placement import place
    from testbed.run.backends import make_network

    exp = load_experiment("two_dc").with_overrides(policy="atlas")
    workers = place(exp)
    plan = plan_grants(exp, exp.topology_spec, workers, 1)
    by = {(w.stage, w.replica): w.rank for w in workers}
    with make_network(exp.topology_spec, out_dir=tmp_path) as net:
        ctl = Controller(net, workers, 2, tmp_path / "c.sock", tmp_path / "controller.jsonl", sharing="fifo", plan=plan)
        ctl.install()
        ctl.start()
        client = ControlClient(str(ctl.sock_path))
        rate = 100_000_000
        full, floor = rate - floor_bps(rate), floor_bps(rate)

        def classes():
            return {r: c["rate_bps"] for r, c in net.shaping.wan_classes("east", "west").items() if r >= CLASS_BASE}

        for r in (0, 1):
            client.send("ready", by[(0, r)], by[(1, r)], 0, 0)
            client.send("recv", by[(0, r)], by[(1, r)], 0, 0)
        t0 = time.monotonic()
        deadline_s = plan.hop(Hop("east", "west")).deadline_s
        while classes() != {CLASS_BASE: floor, CLASS_BASE + 1: full} and time.monotonic() - t0 < 5:
            time.sleep(0.002)
        waited = time.monotonic() - t0
        assert classes() == {CLASS_BASE: floor, CLASS_BASE + 1: full}
        assert deadline_s * 0.9 <= waited <= deadline_s + 0.5, (waited, deadline_s)
        ctl.stop()
    *log, end = [json.loads(x) for x in (tmp_path / "controller.jsonl").read_text().splitlines()]
    assert end["event"] == "loop_end" and end["deadline_releases"] >= 1  # the loop counted what it released
    assert [(r["event"], r["replica"], r.get("reason")) for r in log][:3] == [
        ("grant", 0, None),
        ("release", 0, "deadline"),
        ("grant", 1, None),  # (whose done never comes either: it too ends at its deadline)
    ]


def test_every_ablation_step_keeps_the_math(tmp_path, clean_machine, launcher):
    """From pp-fair to atlas one part at a time: the layout, the connections and the grants change,
    the losses do not. The steps between the ends run here, against one process's losses; the ends
    themselves (pp-fair and atlas, the same experiment) are test_training's
    test_compare_policies_same_losses_and_comparison_json (they ran here too until fe85386: 13 s).

    The striping step also shows that striping leaves each stage's gradient all-reduce between the
    replicas of its DC on one connection: it takes a few milliseconds, as without striping. With
    the data-parallel groups striped too, each collective took about three round trips to the first
    DC's (67 ms in central, 188 ms in west on the default experiment). That ran as a test of its
    own, on a padded run of the same policy, until this step's run was read for it (11 s)."""
    from testbed.plan.worker_config import read_worker_config
    from testbed.run.compare import compare
    from testbed.spec.compute import ComputeModel
    from testbed.trace import schema as T
    from tests.support.reference import reference_losses

    steps = list(ABLATION[1:-1])
    assert (ABLATION[0], ABLATION[-1]) == ("pp-fair", "atlas") and len(steps) == 4
    exp = load_experiment().with_overrides(iterations=3, warmup_iterations=1, compute=ComputeModel(mode="real"))
    result = compare(exp, steps, tmp_path, progress=_quiet, launcher=launcher)
    assert list(result["policies"]) == steps
    want = reference_losses(exp, 3)
    for name in steps:
        got = losses(read_events(tmp_path / name.replace("/", "_"))).tolist()
        assert got == pytest.approx(want, rel=1e-4), (name, got, want)

    striped = "pp-fair/placement=atlas/striping=on"
    run = tmp_path / striped.replace("/", "_")
    assert read_worker_config(run / "worker_config.json").training.wan_connections > 1
    ev = read_events(run)
    ar = ev[(ev[T.KIND] == T.ALLREDUCE) & (ev[T.ITERATION] >= exp.warmup_iterations)]
    # the ring's last member to arrive waits for no one: its time is the all-reduce's own
    own_ms = ((ar[T.END_NS] - ar[T.START_NS]) / 1e6).groupby([ar[T.ITERATION], ar[T.STAGE]]).min()
    rtt_ms = 2 * min(link.delay_us for link in exp.topology_spec.links) / 1000  # 20 ms: east-central
    # striped groups took three round trips or more (67 ms and more); inside a DC it is 4-10 ms
    assert len(own_ms) == exp.stages * (exp.iterations - exp.warmup_iterations), own_ms
    assert own_ms.median() < rtt_ms and own_ms.max() < 2 * rtt_ms, own_ms


def test_under_real_compute_the_plan_is_made_from_the_first_iteration(tmp_path, clean_machine, launcher):
    """compute.mode real: iteration 0 goes earliest ready first, then the runner plans from its
    traced stage times; the controller follows that plan and the first stages apply its stagger,
    counted from the end of their last optimizer step. The losses are those of pp-fair."""
    from testbed.plan.worker_config import read_stagger
    from testbed.run.runner import run_experiment
    from testbed.spec.compute import ComputeModel

    exp = load_experiment("sharing").with_overrides(
        iterations=4, warmup_iterations=1, compute=ComputeModel(mode="real"), policy="atlas"
    )
    lines = []
    run_experiment(exp, tmp_path / "atlas", progress=lines.append, launcher=launcher)
    out = tmp_path / "atlas"
    assert any("grant plan made from iteration 0's compute" in line for line in lines), lines
    text = (out / "grant_plan_profiled.txt").read_text()
    assert text.startswith("profiled in iteration 0") and "order:" in text
    # every plan the run used, with when it took effect: the first before the run, the profiled one
    # after iteration 0, made by the same function from its stage times
    first, profiled = [json.loads(line) for line in (out / "plans.jsonl").read_text().splitlines()]
    assert first["why"] == "made before the run" and first["stage_s"] is None
    assert profiled["why"] == "profiled from iteration 0" and len(profiled["stage_s"]) == exp.stages
    assert first["t_ns"] < profiled["t_ns"] and profiled["placement"] == first["placement"]
    replan = json.loads((out / "controller_replan.json").read_text())
    assert replan["iteration_ns"] > 0 and all(row["order"] for row in replan["timing"])
    stagger = read_stagger(str(out / "stagger.json"))
    assert stagger is not None and len(stagger) == exp.replicas
    assert profiled["grant_plan"]["stagger_s"] == pytest.approx(stagger)  # what the workers applied
    ev = read_events(out)
    first = ev[ev["stage"] == 0]
    for r, offset in enumerate(stagger):
        mine = first[first["replica"] == r]
        for it in (2, 3):  # the stagger file is there by the end of iteration 0: applied from 2 on at the latest
            opt_end = mine[(mine["kind"] == "optimizer") & (mine["iteration"] == it - 1)]["end_ns"].max()
            start = mine[(mine["kind"] == "forward") & (mine["iteration"] == it)]["start_ns"].min()
            assert start - opt_end >= offset * 1e9 - 1e6, (r, it, offset)
    run_experiment(exp.with_overrides(policy="pp-fair"), tmp_path / "fair", progress=_quiet, launcher=launcher)
    assert losses(ev).tolist() == pytest.approx(losses(read_events(tmp_path / "fair")).tolist(), rel=1e-5)
