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


def test_a_short_outage_stalls_training_which_resumes_with_the_same_losses(tmp_path, clean_machine):
    (tmp_path / "stepped.yaml").write_text(STEPPED)
    exp = _experiment(outage_timeout_s=30, iterations=4, topology=str(tmp_path / "stepped.yaml"), policy="atlas")
    tmp_path = tmp_path / "run"
    log: list = []
    cutter = _cut_after_first_iteration(tmp_path, 2.0, log)
    summary = run_experiment(exp, tmp_path, progress=lambda _: None)
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


def test_an_outage_past_the_timeout_aborts_the_run_naming_the_link(tmp_path, clean_machine):
    exp = _experiment(outage_timeout_s=3, iterations=50)
    log: list = []
    _cut_after_first_iteration(tmp_path, None, log)
    with pytest.raises(OutageError, match=r"WAN link east:west has been down for 3\.\d s, past the experiment's"):
        run_experiment(exp, tmp_path, progress=lambda _: None)
    ended = time.monotonic()
    assert log and log[0][2].returncode == 0
    assert ended - log[0][1] < 3 + 10
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["aborted"] is True and summary["completed_iterations"] >= 1
    assert summary["outages"] == [
        {"link": "east:west", "down_s": summary["outages"][0]["down_s"], "duration_s": None, "resume_ms": None}
    ]
    assert (tmp_path / "events.parquet").exists() and (tmp_path / "shaping.jsonl").exists()
