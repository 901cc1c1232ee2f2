"""Independent simulations over the cores (``plan/cores.py``): the same results as in one process,
in order, in other processes only where the program allows it, it is worth it and a fork is safe;
errors raised here; no worker left, and no word from one, when the caller is killed or
interrupted; and a grant plan the same on every core as on one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from testbed.plan import cores, grant_plan
from testbed.plan.cores import map_over_cores, processes_allowed
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
    """Two usable cores, whatever this machine's affinity, and processes allowed."""
    monkeypatch.setattr(cores, "usable_cores", lambda: 2)
    with processes_allowed():
        yield


def test_items_go_to_other_processes_in_order(two_cores):
    assert cores.fork_is_safe()  # (else nothing below would fork)
    out = map_over_cores(square_and_pid, list(range(7)))
    assert [y for y, _ in out] == [x * x for x in range(7)]
    pids = {pid for _, pid in out}
    assert os.getpid() not in pids
    assert 1 <= len(pids) <= 2


def test_not_allowed_not_worth_it_one_item_or_one_core_stays_here(monkeypatch):
    monkeypatch.setattr(cores, "usable_cores", lambda: 2)
    assert {pid for _, pid in map_over_cores(square_and_pid, [1, 2])} == {os.getpid()}  # not allowed
    with processes_allowed():
        assert {pid for _, pid in map_over_cores(square_and_pid, [1, 2], parallel=False)} == {os.getpid()}
        assert {pid for _, pid in map_over_cores(square_and_pid, [5])} == {os.getpid()}
        monkeypatch.setattr(cores, "usable_cores", lambda: 1)
        assert {pid for _, pid in map_over_cores(square_and_pid, [1, 2])} == {os.getpid()}
    assert not cores._allowed  # as before the block


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
    pids = []

    def recorded(fn, items, parallel=True):
        assert parallel and cores.fork_is_safe()
        pids.extend(os.getpid() if r is None else r for r in map_over_cores(worker_pid, range(2)))
        return map_over_cores(fn, items, parallel)

    monkeypatch.setattr(grant_plan, "PARALLEL_ACTIONS", 0)
    monkeypatch.setattr(grant_plan, "map_over_cores", recorded)
    every = grant_plan.plan_grants(replace(e), e.topology_spec, workers, connections=1)
    grant_plan._plan_grants.cache_clear()
    assert pids and os.getpid() not in pids  # the same settings as the plan's own call forked
    assert every.hops and all(h.order for h in every.hops)  # something to compare: both links' orders
    assert every == one


def worker_pid(_: int) -> int:
    return os.getpid()
