"""Independent simulations over the cores (``plan/cores.py``): the same results as in one process,
in order, in other processes only where it is worth it and a fork is safe, errors raised here, no
worker left when the caller is killed; and a grant plan the same on every core as on one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import replace

import pytest

from testbed.plan import cores, grant_plan
from testbed.plan.cores import map_over_cores
from testbed.plan.placement import place
from testbed.spec.policy import parse_policy
from tests.unit.experiments import exp, topo


def square_and_pid(x: int) -> tuple[int, int]:
    return x * x, os.getpid()


def inner_pids(_: int) -> list[int]:
    """What a pool worker's own map_over_cores runs in."""
    return [pid for _, pid in map_over_cores(square_and_pid, [1, 2, 3])]


def fails_on_three(x: int) -> int:
    if x == 3:
        raise ValueError("three")
    return x


@pytest.fixture
def two_cores(monkeypatch):
    """Two usable cores, whatever this machine's affinity."""
    monkeypatch.setattr(cores, "usable_cores", lambda: 2)


def test_items_go_to_other_processes_in_order(two_cores):
    out = map_over_cores(square_and_pid, list(range(7)))
    assert [y for y, _ in out] == [x * x for x in range(7)]
    pids = {pid for _, pid in out}
    assert os.getpid() not in pids
    assert 1 <= len(pids) <= 2


def test_not_worth_it_or_one_item_or_one_core_stays_here(two_cores, monkeypatch):
    assert {pid for _, pid in map_over_cores(square_and_pid, [1, 2], worth=False)} == {os.getpid()}
    assert {pid for _, pid in map_over_cores(square_and_pid, [5])} == {os.getpid()}
    monkeypatch.setattr(cores, "usable_cores", lambda: 1)
    assert {pid for _, pid in map_over_cores(square_and_pid, [1, 2])} == {os.getpid()}


def test_a_caller_running_other_threads_is_not_forked(two_cores):
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        assert not cores.fork_is_safe()
        assert [pid for _, pid in map_over_cores(square_and_pid, [1, 2])] == [os.getpid()] * 2
    finally:
        stop.set()
        other.join()


def test_a_pool_worker_does_not_start_a_pool_of_its_own(two_cores):
    for worker_pids in map_over_cores(inner_pids, [0, 1]):
        assert len(set(worker_pids)) == 1  # each worker ran its three items itself
        assert worker_pids[0] != os.getpid()


def test_an_error_in_a_worker_is_raised_here(two_cores):
    with pytest.raises(ValueError, match="three"):
        map_over_cores(fails_on_three, [1, 2, 3, 4])


def test_workers_die_with_a_caller_killed_with_9(tmp_path):
    pids_file = tmp_path / "pids"
    script = textwrap.dedent(
        f"""
        import os, time
        from testbed.plan import cores
        cores.usable_cores = lambda: 2
        def sleeper(x):
            with open({str(pids_file)!r}, "a") as f:
                f.write(f"{{os.getpid()}}\\n")
            time.sleep(60)
        cores.map_over_cores(sleeper, [1, 2])
        """
    )
    caller = subprocess.Popen([sys.executable, "-c", script], cwd=os.getcwd())
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(pids_file.read_text().split() if pids_file.exists() else []) < 2:
            time.sleep(0.05)
        workers = [int(p) for p in pids_file.read_text().split()]
        assert len(workers) == 2
    finally:
        caller.send_signal(signal.SIGKILL)
        caller.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") for p in workers):
        time.sleep(0.05)
    assert not [p for p in workers if os.path.exists(f"/proc/{p}")]


def test_a_grant_plan_on_every_core_is_the_plan_on_one(two_cores, monkeypatch):
    e = exp(
        topology_spec=topo({"a": 8, "b": 8}, rate="50mbit", delay="10ms"),
        replicas=8,
        microbatches=8,
        schedule="1f1b",
        policy=parse_policy("atlas"),
    )
    workers = place(e)
    grant_plan._plan_grants.cache_clear()
    monkeypatch.setattr(grant_plan, "PARALLEL_ACTIONS", 10**9)
    one = grant_plan.plan_grants(e, e.topology_spec, workers, connections=1)
    grant_plan._plan_grants.cache_clear()
    spread = []
    real_map = cores.map_over_cores

    def recorded(fn, items, worth=True):
        out = real_map(fn, items, worth)
        spread.append(worth)
        return out

    monkeypatch.setattr(grant_plan, "PARALLEL_ACTIONS", 0)
    monkeypatch.setattr(grant_plan, "map_over_cores", recorded)
    every = grant_plan.plan_grants(replace(e), e.topology_spec, workers, connections=1)
    grant_plan._plan_grants.cache_clear()
    assert spread == [True]
    assert every.hops and all(h.order for h in every.hops)  # something to compare: both links' orders
    assert every == one
