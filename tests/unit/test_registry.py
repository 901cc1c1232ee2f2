"""The run registry: records round-trip, PIDs are matched with their start time, dead owners found."""

import json
import os
import subprocess

import pytest

import testbed.net.registry as registry
from testbed.net.registry import (
    ProcessEntry,
    RunRecord,
    list_runs,
    proc_start_time,
    same_process,
    stale_runs,
    stop_process,
)


@pytest.fixture(autouse=True)
def state_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(registry, "RUN_DIR", tmp_path)
    return tmp_path


@pytest.fixture
def dead_process():
    """(pid, start time) of a process that was alive, then killed and reaped."""
    p = subprocess.Popen(["sleep", "30"])
    start = proc_start_time(p.pid)
    p.kill()
    p.wait()
    return p.pid, start


def test_proc_start_time_of_self_matches_proc_stat():
    start = proc_start_time(os.getpid())
    stat = open(f"/proc/{os.getpid()}/stat").read()
    # field 22 (starttime); fields after the ')' that ends the command name start at field 3
    assert start == int(stat.rsplit(")", 1)[1].split()[22 - 3])
    assert same_process(os.getpid(), start)


def test_same_process_refuses_recycled_or_unknown(dead_process):
    pid, start = dead_process
    assert isinstance(start, int)
    assert not same_process(pid, start)  # gone
    mine = proc_start_time(os.getpid())
    assert not same_process(os.getpid(), mine + 1)  # same PID, other start: recycled
    assert not same_process(os.getpid(), None)  # start unknown: never ours
    assert not same_process(pid, None)  # ... even though a gone PID has no start either


def test_round_trip(state_dir):
    rec = RunRecord("tb1234", os.getpid(), proc_start_time(os.getpid()), 1000.5, out_dir="/tmp/out")
    rec.save()
    rec.add_namespaces(["tb1234-a-r", "tb1234-a-h0", "tb1234-a-r"])  # duplicates kept once
    rec.add_process(os.getpid(), "delay element")
    assert rec.path == state_dir / "runs" / "tb1234.json"
    loaded = RunRecord.load(rec.path)
    assert loaded == rec
    assert loaded.namespaces == ["tb1234-a-r", "tb1234-a-h0"]
    assert loaded.processes == [ProcessEntry(os.getpid(), proc_start_time(os.getpid()), "delay element")]
    rec.forget_process(os.getpid())
    assert RunRecord.load(rec.path).processes == []
    rec.delete()
    assert list_runs() == []


def test_list_runs_oldest_first_and_skips_junk(state_dir):
    RunRecord("tbbbbb", 1, None, 200.0).save()
    RunRecord("tbaaaa", 1, None, 300.0).save()
    RunRecord("tbcccc", 1, None, 100.0).save()
    (state_dir / "runs" / "tbdddd.json").write_text("{not json")
    assert [r.prefix for r in list_runs()] == ["tbcccc", "tbbbbb", "tbaaaa"]


def test_stale_runs_finds_dead_owner(dead_process):
    pid, start = dead_process
    alive = RunRecord.new("tbaaaa")  # owned by this test process
    RunRecord("tbdead", pid, start, alive.created_unix + 1).save()
    assert alive.owner_alive()
    assert [r.prefix for r in stale_runs()] == ["tbdead"]


def test_stop_process_stops_ours_only():
    p = subprocess.Popen(["sleep", "30"])
    try:
        start = proc_start_time(p.pid)
        assert not stop_process(p.pid, start + 1)  # wrong start time: not signalled
        assert p.poll() is None
        assert stop_process(p.pid, start, grace_s=2.0)
        assert not same_process(p.pid, start)
    finally:
        if p.poll() is None:  # poll() also copes with a child that stop_process already reaped
            p.kill()
            p.wait()


def test_clean_removes_the_runs_control_sockets_only(state_dir):
    from testbed.net.registry import clean_run

    control = state_dir / "control"
    control.mkdir()
    mine = [control / "tb1234.sock", control / "tb1234-bt.sock", control / "tb1234-w3.sock"]
    other = [control / "tb5678.sock", control / "tb12345.sock", control / "notes.txt"]
    for p in mine + other:
        p.write_text("")
    rec = RunRecord("tb1234", 1, None, 1000.5)  # an owner that is not this process
    rec.save()
    clean_run(rec)
    assert not any(p.exists() for p in mine) and all(p.exists() for p in other)


def test_trace_instances_round_trip_and_only_an_instance_is_ever_removed(state_dir, tmp_path):
    rec = RunRecord("tb1234", os.getpid(), proc_start_time(os.getpid()), 1000.5)
    rec.save()
    rec.add_trace_instance("/sys/kernel/tracing/instances/tb1234-sched")
    assert RunRecord.load(rec.path).trace_instances == ["/sys/kernel/tracing/instances/tb1234-sched"]
    rec.forget_trace_instance("/sys/kernel/tracing/instances/tb1234-sched")
    assert RunRecord.load(rec.path).trace_instances == []
    # a record from before the field loads with none
    data = {k: v for k, v in json.loads(rec.path.read_text()).items() if k != "trace_instances"}
    rec.path.write_text(json.dumps(data))
    assert RunRecord.load(rec.path).trace_instances == []
    keep = tmp_path / "instances" / "tb1234-sched"
    keep.mkdir(parents=True)
    for path in (tmp_path, keep, "/sys/kernel/tracing", "/sys/kernel/tracing/instances/tb9999-sched"):
        with pytest.raises(ValueError, match="not run tb1234's tracefs instance"):  # not under a mount, or not its
            registry.remove_trace_instance(str(path), "tb1234")
    assert keep.is_dir()
    assert registry.remove_trace_instance("/sys/kernel/tracing/instances/tb1234-sched", "tb1234") is False  # gone


def test_a_run_whose_instance_cannot_be_removed_stays_registered(state_dir, monkeypatch):
    """``clean_run`` removes the rest, names the instance it could not remove (a reader holds it
    open: EBUSY) and keeps the record for a later ``testbed clean``."""
    rec = RunRecord("tb1234", 1, None, 1000.5)
    rec.save()
    rec.add_trace_instance("/sys/kernel/tracing/instances/tb1234-sched")

    def busy(path: str, prefix: str) -> bool:
        raise OSError(16, "Device or resource busy")

    monkeypatch.setattr(registry, "remove_trace_instance", busy)
    removed = registry.clean_run(rec)
    assert removed["trace_instances"] == [] and "Device or resource busy" in removed["left"][0]
    assert RunRecord.load(rec.path).trace_instances == ["/sys/kernel/tracing/instances/tb1234-sched"]


def test_a_new_run_never_takes_a_prefix_a_registered_run_holds(state_dir, monkeypatch):
    RunRecord("tbdead", 1, None, 1000.5).save()  # a run killed with -9, not cleaned yet
    draws = iter(["tbdead", "tbdead", "tb0a0b"])
    monkeypatch.setattr(registry, "new_run_prefix", lambda: next(draws))
    monkeypatch.setattr(registry, "existing_namespaces", lambda: {"tb0a0c-east-r"})
    assert registry.unused_run_prefix() == "tb0a0b"
    monkeypatch.setattr(registry, "new_run_prefix", lambda: "tb0a0c")  # its namespaces are still there
    with pytest.raises(RuntimeError, match="testbed clean"):
        registry.unused_run_prefix()
