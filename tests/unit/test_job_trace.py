"""A launched job's event lines and figures: the helper a job calls (``trace/job.py``) outside and
inside ``testbed launch``, with a real module's passes timed through its hooks; the figures made
of them (``results/job_summary.py``); the hook's receive saying ``done`` once. The hook's wrappers
around torch.distributed run in ``tests/integration/test_launch.py``."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from testbed.results.job_summary import bytes_check, hook_figures, training_figures
from testbed.spec.wire import ACK_WIRE_BYTES, FRAME_BYTES, TCP_MSS_WITH_TIMESTAMPS
from testbed.trace import job as job_trace
from testbed.trace import schema as T
from testbed.trace.events import read_events
from testbed.trace.job import JOB_DIR_ENV, JobTrace
from testbed.train.job_hook import _Received


@pytest.fixture
def fresh_writer(monkeypatch):
    """Each test its own rank writer (the helper keeps one per process)."""
    monkeypatch.setattr(job_trace, "_writer", None)
    monkeypatch.setattr(job_trace, "_current", None)


def test_outside_launch_the_helper_does_nothing(monkeypatch, tmp_path, fresh_writer):
    monkeypatch.delenv(JOB_DIR_ENV, raising=False)
    trace = JobTrace()
    trace.watch(torch.nn.Linear(2, 2))
    trace.iteration(0)
    with trace.op(T.OPTIMIZER):
        pass
    trace.close()
    assert not trace.enabled and not list(tmp_path.iterdir())


def test_a_jobs_passes_and_steps_become_a_built_in_runs_events(monkeypatch, tmp_path, fresh_writer):
    workers = [{"rank": 0, "host": "east-h0", "dc": "east", "stage": 0, "replica": 0}]
    (tmp_path / "job.json").write_text(json.dumps({"workers": workers}))
    monkeypatch.setenv(JOB_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("RANK", "0")
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 1))
    trace = JobTrace()
    trace.watch(model)
    for step in range(3):
        trace.iteration(step)
        outs = [model(torch.randn(2, 4)) for _ in range(2)]  # two microbatches forward, then back
        for y in outs:
            y.sum().backward()
        with trace.op(T.OPTIMIZER, step):
            pass
    trace.close()
    ev = read_events(tmp_path)
    assert set(ev[T.WORKER]) == {0} and set(ev[T.DC]) == {"east"}
    for kind in (T.FORWARD, T.BACKWARD):
        mine = ev[ev[T.KIND] == kind]
        assert list(zip(mine[T.ITERATION], mine[T.MICROBATCH])) == [(k, m) for k in range(3) for m in range(2)]
        assert (mine[T.END_NS] >= mine[T.START_NS]).all()
    fwd, bwd = ev[ev[T.KIND] == T.FORWARD], ev[ev[T.KIND] == T.BACKWARD]
    assert (bwd[T.START_NS].to_numpy() >= fwd[T.END_NS].to_numpy()).all()  # each backward after its forward
    figures = training_figures(ev, warmup=1)
    assert figures["iterations_measured"] == 2 and figures["iteration_time_s"]["mean"] > 0
    assert 0 <= figures["bubble_fraction"]["0"] < 1
    assert job_trace.current_iteration() == 2


def test_no_optimizer_events_give_no_training_figures():
    ev = pd.DataFrame({T.KIND: [T.FORWARD], T.ITERATION: [0], T.START_NS: [0], T.END_NS: [1]})
    assert training_figures(ev, 0) is None


def test_the_classes_bytes_are_set_beside_the_payload_its_headers_and_the_reverse_flows_acks():
    segments = 1000
    payload = segments * TCP_MSS_WITH_TIMESTAMPS
    rows = bytes_check(
        {("east->west", 0): payload, ("west->east", 0): 2 * payload},
        {("east->west", 0): 1_600_000, ("west->east", 0): 0},
    )
    east = next(r for r in rows if r["link"] == "east->west")
    expected = segments * FRAME_BYTES + 2 * segments / 2 * ACK_WIRE_BYTES  # one ACK per two segments back
    assert east["wire_bytes"] == int(expected)
    assert east["class_over_wire"] == pytest.approx(1_600_000 / expected)


def test_the_hooks_cost_is_a_share_of_its_busiest_ranks_iterations_or_of_the_wall_time():
    totals = [{"transfers": 100, "hook_ns": 2_000_000}, {"transfers": 50, "hook_ns": 6_000_000}]
    marked = hook_figures(totals, iterations=4, iteration_s=0.5, wall_s=10)
    assert marked["per_transfer_us"] == pytest.approx(8000 / 150)
    assert marked["share_of_job"] == pytest.approx(0.006 / 2.0) and marked["share_over"] == "marked iterations"
    unmarked = hook_figures(totals, iterations=None, iteration_s=None, wall_s=10)
    assert unmarked["share_of_job"] == pytest.approx(0.006 / 10) and "wall time" in unmarked["share_over"]


class _Work:
    def __init__(self) -> None:
        self.waited = 0

    def wait(self) -> bool:
        self.waited += 1
        return True

    def is_completed(self) -> bool:
        return True


def test_a_received_transfer_says_done_once_after_every_stripe_is_in():
    said: list[int] = []
    works = [_Work(), _Work()]
    received = _Received(works, lambda: said.append(1))
    assert received.wait() and said == [1] and all(w.waited == 1 for w in works)
    assert received.is_completed() and received.wait() and said == [1]
