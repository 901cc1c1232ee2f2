"""Training through a WAN that changes: a short outage (``testbed link down`` from another shell
while a run trains) stalls the run, which resumes when the link returns with the same losses as
one process, the outage and the resume delay in the summary, while the link's profile halves its
rate and Atlas's controller takes a plan made for it (``run/link_replan.py``); an outage longer
than the experiment's ``outage_timeout`` aborts the run within that timeout plus 10 s, naming the
link, its traces kept and nothing left behind."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from testbed.results.analysis import losses
from testbed.run.outage_watch import OutageError
from testbed.run.runner import run_experiment
from testbed.spec.experiment_file import load_experiment
from testbed.trace.events import read_events
from tests.support.reference import reference_losses

from .conftest import REPO

#: two_dc whose link halves its rate 1 s after the network is up (before the workers have
#: finished their first iteration: the re-plan waits for the plan made from its profile)
STEPPED = """name: two_dc_stepped
dcs:
  - {name: east, hosts: 2}
  - {name: west, hosts: 2}
links:
  - {between: [east, west], rate: 100mbit, delay: 20ms, profile: {generator: step, at: 1s, rate: 50mbit}}
"""


def _experiment(outage_timeout_s: float, iterations: int, topology: str = "two_dc", policy: str | None = None):
    exp = load_experiment().with_overrides(
        topology=topology,
        policy=policy,
        stages=2,
        replicas=2,
        iterations=iterations,
        warmup_iterations=1,
        schedule="gpipe",
        outage_timeout=int(outage_timeout_s * 1e6),
    )
    return exp.with_overrides(compute=type(exp.compute)(mode="real"))


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "testbed.cli", *args], cwd=REPO, capture_output=True, text=True)


def _cut_after_first_iteration(out: Path, hold_s: float | None, log: list) -> threading.Thread:
    """Take east:west down once the last stage has stepped its optimizer (iteration 0), and bring it
    back ``hold_s`` later (None: never)."""

    def cut() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            events = out / "events" / "w3.jsonl"
            if events.exists() and '"optimizer"' in events.read_text():
                break
            time.sleep(0.05)
        log.append(("down", time.monotonic(), _cli("link", "down", "east:west")))
        if hold_s is not None:
            time.sleep(hold_s)
            log.append(("up", time.monotonic(), _cli("link", "up", "east:west")))

    thread = threading.Thread(target=cut, daemon=True)
    thread.start()
    return thread


def test_a_short_outage_stalls_training_which_resumes_with_the_same_losses(tmp_path, clean_machine, launcher):
    (tmp_path / "stepped.yaml").write_text(STEPPED)
    exp = _experiment(outage_timeout_s=30, iterations=4, topology=str(tmp_path / "stepped.yaml"), policy="atlas")
    tmp_path = tmp_path / "run"
    log: list = []
    cutter = _cut_after_first_iteration(tmp_path, 2.0, log)
    summary = run_experiment(exp, tmp_path, progress=lambda _: None, launcher=launcher)
    cutter.join(timeout=10)
    assert [(what, r.stdout.strip()) for what, _, r in log] == [("down", "east:west down"), ("up", "east:west up")]
    got = losses(read_events(tmp_path)).tolist()
    want = reference_losses(exp, 4)
    assert len(got) == 4 and all(abs(g - w) / abs(w) < 1e-4 for g, w in zip(got, want)), (got, want)
    [outage] = summary["outages"]
    assert outage["link"] == "east:west" and 1.9 < outage["duration_s"] < 3.0, outage
    # training was under way (waiting on the link) and resumed after TCP's retransmission backoff
    assert outage["resume_ms"] is not None and 0 <= outage["resume_ms"] < 10_000, outage
    assert not summary["aborted"]
    # the profile's step, planned for: the controller's classes compiled again at 50 Mbit/s
    [replan] = [json.loads(x) for x in (tmp_path / "replans.jsonl").read_text().splitlines()]
    assert replan["links"] == {"east:west": {"rate_bps": 50_000_000, "delay_us": 20_000}}
    assert replan["planning_ms"] < 1000 and replan["order"]
    controller = [json.loads(x) for x in (tmp_path / "controller.jsonl").read_text().splitlines()]
    relinked = [r for r in controller if r.get("event") == "relink"]
    assert {r["link"] for r in relinked} == {"east->west", "west->east"}
    shaping = [json.loads(x) for x in (tmp_path / "shaping.jsonl").read_text().splitlines()]
    after = [r for r in shaping if r["event"] == "change" and r["t_ns"] >= min(r["t_ready_ns"] for r in relinked)]
    assert {r["ceil_bps"] for r in after if r["classid"] >= "1:20"} <= {50_000_000}, after


def test_an_outage_past_the_timeout_aborts_the_run_naming_the_link(tmp_path, clean_machine, launcher):
    exp = _experiment(outage_timeout_s=3, iterations=50)
    log: list = []
    _cut_after_first_iteration(tmp_path, None, log)
    with pytest.raises(OutageError, match=r"WAN link east:west has been down for 3\.\d s, past the experiment's"):
        run_experiment(exp, tmp_path, progress=lambda _: None, launcher=launcher)
    ended = time.monotonic()
    assert log and log[0][2].returncode == 0
    assert ended - log[0][1] < 3 + 10
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["aborted"] is True and summary["completed_iterations"] >= 1
    assert summary["outages"] == [
        {"link": "east:west", "down_s": summary["outages"][0]["down_s"], "duration_s": None, "resume_ms": None}
    ]
    assert (tmp_path / "events.parquet").exists() and (tmp_path / "shaping.jsonl").exists()


def test_atlas_follows_a_failed_over_link_and_a_rate_set_from_another_shell(tmp_path, clean_machine, launcher):
    """three_dc with central:west marked ``failover``, under Atlas: ``testbed link down
    central:west`` once training is under way; the routers move its routes through east (the
    run goes on: not an outage that stalls it), the runner plans the grants for the detour and the
    controller grants the moved transfers on each link of their new path; ``testbed link rate
    east:west`` during the detour is planned for too; the link comes back, the routes return and
    so does the first plan. The losses are one process's."""
    data = yaml.safe_load((REPO / "topologies" / "three_dc.yaml").read_text())
    data["links"][1]["failover"] = True
    (tmp_path / "failover.yaml").write_text(yaml.safe_dump(data))
    exp = load_experiment().with_overrides(topology=str(tmp_path / "failover.yaml"), policy="atlas", iterations=7)
    out = tmp_path / "run"
    log: list = []

    def commands() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not any(
            '"optimizer"' in p.read_text() for p in (out / "events").glob("*.jsonl")
        ):
            time.sleep(0.05)
        for what, args, after_s in (
            ("down", ("link", "down", "central:west"), 1.5),
            ("rate", ("link", "rate", "east:west", "30mbit"), 1.5),
            ("up", ("link", "up", "central:west"), 0),
        ):
            log.append((what, time.monotonic(), _cli(*args)))
            time.sleep(after_s)

    thread = threading.Thread(target=commands, daemon=True)
    thread.start()
    summary = run_experiment(exp, out, progress=lambda _: None, launcher=launcher)
    thread.join(timeout=10)
    assert [r.returncode for _, _, r in log] == [0, 0, 0], [r.stderr for _, _, r in log]
    assert not summary["aborted"] and summary["completed_iterations"] == 7
    got = losses(read_events(out)).tolist()
    want = reference_losses(exp, 7)
    assert all(abs(g - w) / abs(w) < 1e-4 for g, w in zip(got, want, strict=True)), (got, want)
    shaping = [json.loads(x) for x in (out / "shaping.jsonl").read_text().splitlines()]
    assert [r["down"] for r in shaping if r["event"] == "reroute"] == [["central:west"], []]
    replans = [json.loads(x) for x in (out / "replans.jsonl").read_text().splitlines()]
    print([(r["cause"], r["routed_off"], r["after_step_ms"], r["iteration_s"]) for r in replans])
    assert [(r["cause"], r["routed_off"]) for r in replans] == [
        ("reroute", ["central:west"]),
        ("link_rate", ["central:west"]),
        ("reroute", []),
    ]
    assert replans[1]["links"]["east:west"]["rate_bps"] == 30_000_000
    # the detour's plans have central:west's transfers on the two links through east; the last is the first plan's
    plan = json.loads((out / "controller_plan.json").read_text())
    first = {(h["src"], h["dst"]): [tuple(x) for x in h["hops"]] for h in plan["hops"]}
    moved = {pair: path for pair, path in first.items() if ("central", "west") in path or ("west", "central") in path}
    assert moved and set(replans[0]["order"]) - {f"{a}->{b}" for p in first.values() for a, b in p}
    # the controller granted the moved transfers on their new paths between the two moves
    t_away, t_back = (r["t_ns"] for r in shaping if r["event"] == "reroute")
    grants = [json.loads(x) for x in (out / "controller.jsonl").read_text().splitlines()]
    during = {g["link"] for g in grants if g.get("event") == "grant" and t_away < g["t_applied_ns"] < t_back}
    new_links = {f"{a}->{b}" for a, b in (("central", "east"), ("east", "west"), ("west", "east"), ("east", "central"))}
    assert during & new_links - {f"{a}->{b}" for p in first.values() for a, b in p}, during
    assert {"central->west", "west->central"}.isdisjoint(during), during
    assert any(g.get("event") == "reroute" for g in grants)
