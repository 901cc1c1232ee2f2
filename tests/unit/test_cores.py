"""Independent simulations over the cores (``plan/cores.py``): the same results as in one process,
in order, in other processes only where the program allows it, it is worth it and a fork is safe;
errors raised here; no worker left, and no word from one, when the caller is killed or
interrupted; and a grant plan the same on every core as on one."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from testbed.plan import cores, grant_plan
from testbed.plan.cores import map_over_cores, processes_allowed
from testbed.plan.placement import place
from testbed.spec.policy import parse_policy
from tests.unit.experiments import exp, topo


def square_and_pid(x: int) -> tuple[int, int]:
    return x * x, os.getpid()


def in_fresh_python(body: str) -> Any:
    """What ``body`` (Python, with ``cores``, ``os``, ``sys`` and ``json`` at hand and two usable
    cores) prints as JSON, run in a new interpreter: a main process with one thread, as the
    command line is (this test process may hold threads that others started and keep: Dask's
    offload and IO-loop threads after ``test_sweep_cluster.py``, where ``map_over_cores`` rightly
    declines to fork)."""
    preamble = "import json, os, sys\nfrom testbed.plan import cores\ncores.usable_cores = lambda: 2\n"
    done = subprocess.run(
        [sys.executable, "-c", preamble + textwrap.dedent(body)],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_items_go_to_other_processes_in_order():
    got = in_fresh_python(
        """
        def square_and_pid(x):
            return x * x, os.getpid()
        with cores.processes_allowed():
            out = cores.map_over_cores(square_and_pid, list(range(7)))
        print(json.dumps({"safe": cores.fork_is_safe(), "out": out, "me": os.getpid()}))
        """
    )
    assert got["safe"]
    assert [y for y, _ in got["out"]] == [x * x for x in range(7)]
    pids = {pid for _, pid in got["out"]}
    assert got["me"] not in pids
    assert 1 <= len(pids) <= 2


def test_not_allowed_not_worth_it_one_item_or_one_core_stays_here(monkeypatch):
    monkeypatch.setattr(cores, "usable_cores", lambda: 2)
    monkeypatch.setattr(cores, "fork_is_safe", lambda: True)  # (nothing below may fork all the same)
    assert {pid for _, pid in map_over_cores(square_and_pid, [1, 2])} == {os.getpid()}  # not allowed
    with processes_allowed():
        assert {pid for _, pid in map_over_cores(square_and_pid, [1, 2], parallel=False)} == {os.getpid()}
        assert {pid for _, pid in map_over_cores(square_and_pid, [5])} == {os.getpid()}
        monkeypatch.setattr(cores, "usable_cores", lambda: 1)
        assert {pid for _, pid in map_over_cores(square_and_pid, [1, 2])} == {os.getpid()}
    assert not cores._allowed  # as before the block


def test_a_caller_running_other_threads_is_not_forked(monkeypatch):
    monkeypatch.setattr(cores, "usable_cores", lambda: 2)
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        assert not cores.fork_is_safe()
        with processes_allowed():
            assert [pid for _, pid in map_over_cores(square_and_pid, [1, 2])] == [os.getpid()] * 2
    finally:
        stop.set()
        other.join()


def test_a_pool_worker_does_not_start_a_pool_of_its_own():
    got = in_fresh_python(
        """
        def pid(_):
            return os.getpid()
        def inner_pids(_):
            return cores.map_over_cores(pid, [1, 2, 3])
        with cores.processes_allowed():
            print(json.dumps({"workers": cores.map_over_cores(inner_pids, [0, 1]), "me": os.getpid()}))
        """
    )
    for worker_pids in got["workers"]:
        assert len(set(worker_pids)) == 1  # each worker ran its three items itself
        assert worker_pids[0] != got["me"]


def test_an_error_in_a_worker_is_raised_here():
    got = in_fresh_python(
        """
        def fails_on_three(x):
            if x == 3:
                raise ValueError("three")
            return os.getpid()
        try:
            with cores.processes_allowed():
                cores.map_over_cores(fails_on_three, [1, 2, 3, 4])
        except ValueError as e:
            print(json.dumps(str(e)))
        """
    )
    assert got == "three"


def running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not ended (a zombie has ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def caller_with_workers(tmp_path: Path, seconds: list[float]) -> tuple[subprocess.Popen, list[int]]:
    """A process (its own session) that maps sleeps of ``seconds`` over two workers, and the pids of
    the workers once both have begun."""
    pids_file = tmp_path / "pids"
    script = textwrap.dedent(
        f"""
        import os, signal, sys, time
        from testbed.plan import cores
        cores.usable_cores = lambda: 2
        def sleeper(s):
            with open({str(pids_file)!r}, "a") as f:
                f.write(f"{{os.getpid()}}\\n")
            time.sleep(s)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            with cores.processes_allowed():
                cores.map_over_cores(sleeper, {seconds!r})
        except KeyboardInterrupt:
            sys.exit(130)
        """
    )
    caller = subprocess.Popen(
        [sys.executable, "-c", script], cwd=os.getcwd(), stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(pids_file.read_text().split() if pids_file.exists() else []) < 2:
        time.sleep(0.05)
    if not pids_file.exists() or len(pids_file.read_text().split()) < 2:
        caller.kill()
        pytest.fail(f"the two workers did not begin within 30 s: {caller.communicate()[1]}")
    return caller, [int(p) for p in pids_file.read_text().split()]


def wait_ended(pids: list[int], seconds: float = 5) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(running(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if running(p)]


def test_workers_die_with_a_caller_killed_with_9(tmp_path):
    caller, workers = caller_with_workers(tmp_path, [60, 60])
    caller.send_signal(signal.SIGKILL)
    caller.communicate()
    assert not wait_ended(workers)


def test_ctrl_c_ends_the_caller_and_its_workers_without_a_traceback(tmp_path):
    """A terminal's Ctrl-C reaches the whole process group: a busy worker and an idle one (its item
    done) end silently; the caller says it was interrupted, as the command line does."""
    caller, workers = caller_with_workers(tmp_path, [60, 0.1])
    time.sleep(0.5)  # the second worker idle, waiting for work
    os.killpg(caller.pid, signal.SIGINT)
    _, stderr = caller.communicate(timeout=30)
    assert caller.returncode == 130
    assert "Traceback" not in stderr, stderr
    assert not wait_ended(workers)


def test_a_grant_plan_on_every_core_is_the_plan_on_one():
    workers = place(PLANNED)
    one = grant_plan.plan_grants(PLANNED, PLANNED.topology_spec, workers, connections=1)
    got = in_fresh_python(
        """
        import pickle
        from testbed.plan import grant_plan
        from testbed.plan.placement import place
        from tests.unit.test_cores import PLANNED
        pids = []
        def recorded(fn, items, parallel=True):
            pids.extend(cores.map_over_cores(_pid, range(2)))
            return cores.map_over_cores(fn, items, parallel)
        def _pid(_):
            return os.getpid()
        grant_plan.PARALLEL_ACTIONS = 0
        grant_plan.map_over_cores = recorded
        with cores.processes_allowed():
            plan = grant_plan.plan_grants(PLANNED, PLANNED.topology_spec, place(PLANNED), connections=1)
        print(json.dumps({"plan": pickle.dumps(plan).hex(), "pids": pids, "me": os.getpid()}))
        """
    )
    assert got["pids"] and got["me"] not in got["pids"]  # the plan's own call, as set up, forked
    every = pickle.loads(bytes.fromhex(got["plan"]))
    assert every.hops and all(h.order for h in every.hops)  # something to compare: both links' orders
    assert every == one


#: an atlas experiment whose grant plan orders transfers on two links, 8 pipelines of 8 microbatches
PLANNED = exp(
    topology_spec=topo({"a": 8, "b": 8}, rate="50mbit", delay="10ms"),
    replicas=8,
    microbatches=8,
    schedule="1f1b",
    policy=parse_policy("atlas"),
)
