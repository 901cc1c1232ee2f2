"""Real training runs across emulated DCs: correctness against one process, the default run,
and a killed worker aborting the run cleanly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed.plan.worker_config import read_worker_config
from testbed.run.runner import run_experiment
from testbed.sim.validate import MEASURED_STARTS, MODELLED_WINDOW
from testbed.spec.experiment_file import load_experiment
from testbed.trace import schema as T
from testbed.trace.events import read_events
from tests.support.reference import reference_losses

from .conftest import REPO, machine_state, run_cli


def _quiet(line: str) -> None:
    pass


def test_pp_x_dp_matches_single_process(two_dc_gpipe_netns, clean_machine):
    """two_dc: 2 pipeline stages (one per DC) x 2 replicas, GPipe; same losses as one process (the
    run shared with test_mininet, ``conftest.two_dc_gpipe``)."""
    from testbed.results.analysis import losses

    exp, run_dir, summary = two_dc_gpipe_netns
    got = losses(read_events(run_dir)).tolist()
    want = reference_losses(exp, exp.iterations)
    assert len(got) == exp.iterations == 3
    for g, w in zip(got, want):
        assert abs(g - w) / abs(w) < 1e-4, (got, want)
    assert summary["loss_first"] == pytest.approx(got[0]) and summary["workers"] == 4


@pytest.fixture(scope="module")
def default_run(tmp_path_factory, launchers):
    """The default experiment, 4 iterations: (experiment, run folder, summary), shared by the tests
    that read it."""
    exp = load_experiment().with_overrides(iterations=4)
    out = tmp_path_factory.mktemp("default") / "run"
    return exp, out, run_experiment(exp, out, progress=_quiet, launcher=launchers.get())


def test_default_run_regime_and_traces(default_run, clean_machine):
    exp, tmp_path, summary = default_run
    for name in (
        "config.json",
        "env.json",
        "events.parquet",
        "trace.json",
        "summary.json",
        "timeline.png",
        "wan_utilization.png",
        "shaping.jsonl",
        "link_counters.jsonl",
        "plans.jsonl",
    ):
        assert (tmp_path / name).exists(), name
    # the one plan the run was made from, recorded as the runner read it
    (plan,) = [json.loads(line) for line in (tmp_path / "plans.jsonl").read_text().splitlines()]
    config = json.loads((tmp_path / "config.json").read_text())
    assert plan["predicted_iteration_s"] == config["predicted_iteration_time_s"]
    assert plan["placement"] == {f"s{w['stage']}r{w['replica']}": w["host"] for w in config["workers"]}
    env = json.loads((tmp_path / "env.json").read_text())
    assert env["delay_mechanism"] in ("netem", "nfqueue") and len(env["corpus_sha256"]) == 64
    from testbed.run.records import sched_group, sched_kernel

    assert {k: env[k] for k in ("cpu_cgroup", "autogroup", "autogroup_nice")} == sched_group()  # the runner: this test
    assert {k: env[k] for k in ("kernel_hz", "kernel_preempt", "sched_sysctls", "sched_tunables")} == sched_kernel()
    assert summary["completed_iterations"] == 4 and not summary["aborted"]
    assert summary["loss_last"] < summary["loss_first"]
    # the regime the project exists for (issue: default experiment)
    assert 0.5 <= summary["wan_compute_ratio"] <= 2, summary
    assert min(summary["bubble_fraction_per_stage"]) >= 0.10
    assert summary["compute_overrun_fraction"] <= 0.05 and summary["representative"]
    assert summary["compute_headroom"] >= 4  # padding targets at least 4x the real operation time
    # the optimizer step is padded like the rest: to one forward target by default
    ev = read_events(tmp_path)
    steps = ev[(ev[T.KIND] == T.OPTIMIZER) & (ev[T.ITERATION] >= exp.warmup_iterations)]
    target_ns = exp.compute.optimizer_target_ms * 1e6
    assert len(steps) == exp.stages * exp.replicas * (exp.iterations - exp.warmup_iterations)
    assert (steps[T.PADDED_NS] >= target_ns).all() and ((steps[T.END_NS] - steps[T.START_NS]) >= target_ns).all()
    # the WAN queues' drops and backlog, read from the kernel's HTB class statistics while training
    counters = [json.loads(line) for line in (tmp_path / "link_counters.jsonl").read_text().splitlines()]
    assert all(isinstance(c["drops"], int) and c["backlog_bytes"] >= 0 for c in counters), counters[:3]
    assert isinstance(summary["wan_queue_drops"], int) and summary["wan_queue_drops"] >= 0, summary
    assert set(summary["wan_queue_drops_by_link"]) <= {c["link"] for c in counters}
    assert summary["wan_queue_drops"] == sum(summary["wan_queue_drops_by_link"].values())
    assert isinstance(summary["wan_queue_backlog_max_bytes"], int)
    # start-up is recorded, phase by phase, from the run's start to its first forward
    from testbed.results.analysis import startup_phases
    from testbed.trace.jsonl import read_jsonl
    from testbed.trace.startup import STARTUP_LOG

    phases = startup_phases(read_jsonl(tmp_path / STARTUP_LOG), read_events(tmp_path))
    assert summary["startup_s"] == pytest.approx(phases["first_forward"])
    assert 0 < phases["network_built"] < phases["launcher_ready"] <= phases["workers_started"]
    assert phases["workers_started"] <= phases["process_group"] and phases["forked"] <= phases["process_group"]
    kinds = set(read_events(tmp_path)[T.KIND])
    assert {T.FORWARD, T.BACKWARD, T.SEND, T.RECV_WAIT, T.ALLREDUCE, T.OPTIMIZER, T.IDLE} <= kinds
    # the workers' threads had the kernel's shortest CPU slice, where the kernel has custom slices,
    # and their main threads waited for inputs in the real-time class (as root: granted)
    from testbed.thread_slice import TRAINING_SLICE_NS, TRAINING_WAIT_RT_PRIORITY, kernel_has_custom_slices

    assert summary["training_wait_rt_priority"] == TRAINING_WAIT_RT_PRIORITY, summary
    assert summary["training_wait_nice"] is None  # the fair class's nice value: not asked
    got = summary["training_slice_ms"]
    if kernel_has_custom_slices():
        assert got == pytest.approx(TRAINING_SLICE_NS / 1e6), summary
    else:  # the kernel's own slice where it reports one (EEVDF, 6.6+), else none
        assert got is None or got > TRAINING_SLICE_NS / 1e6, summary
    trace = json.loads((tmp_path / "trace.json").read_text())
    assert {e["pid"] for e in trace["traceEvents"] if e["ph"] == "X"} == {0, 1, 2}  # one process per DC
    # analyze recomputes the same summary from the traces
    again = run_cli("analyze", str(tmp_path))
    assert again.returncode == 0, again.stderr
    assert json.loads((tmp_path / "summary.json").read_text())["iteration_time_s"] == pytest.approx(
        summary["iteration_time_s"]
    )


def _start_run(tmp_path):
    """A long `testbed run`, returned once worker 2 has written events, with its registry record."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "testbed.cli", "run", "--iterations", "50", "--out", str(tmp_path)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        time.sleep(0.5)
        events = tmp_path / "events" / "w2.jsonl"
        if events.exists() and events.stat().st_size:
            for rec in Path("/run/testbed/runs").glob("*.json"):
                data = json.loads(rec.read_text())
                if data["owner_pid"] == proc.pid:
                    return proc, data
    proc.kill()
    raise AssertionError("the run never started: " + proc.communicate()[1][-2000:])


def test_killed_worker_aborts_the_run(tmp_path):
    before = machine_state()
    proc, record = _start_run(tmp_path)
    victim = next(p["pid"] for p in record["processes"] if p["what"].endswith(" in central-h0"))
    t_kill = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert "worker 2" in err and "central-h0" in err, err
    assert time.monotonic() - t_kill < 30
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["aborted"] is True
    assert machine_state() == before


def test_ctrl_c_keeps_traces_and_removes_the_network(tmp_path):
    before = machine_state()
    proc, _ = _start_run(tmp_path)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["aborted"] is True and (tmp_path / "events.parquet").exists()
    assert machine_state() == before


def test_hung_worker_aborts_within_the_hang_timeout(tmp_path, clean_machine, launcher):
    import threading

    from testbed.run.watch import RunError

    exp = load_experiment().with_overrides(iterations=200)
    stopped = []

    def freeze_worker_4():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not stopped:
            time.sleep(0.3)
            events = tmp_path / "events" / "w4.jsonl"
            if events.exists() and events.stat().st_size:
                for rec in Path("/run/testbed/runs").glob("*.json"):
                    data = json.loads(rec.read_text())
                    if data["owner_pid"] == os.getpid():
                        pid = next(p["pid"] for p in data["processes"] if p["what"].endswith(" in west-h0"))
                        os.kill(pid, signal.SIGSTOP)
                        stopped.append(time.monotonic())

    t = threading.Thread(target=freeze_worker_4)
    t.start()
    with pytest.raises(RunError, match="no worker progressed for 8 s"):
        run_experiment(exp, tmp_path, progress=_quiet, hang_timeout_s=8, launcher=launcher)
    t.join()
    assert stopped and time.monotonic() - stopped[0] < 8 + 20
    assert json.loads((tmp_path / "summary.json").read_text())["aborted"] is True


def test_compare_policies_same_losses_and_comparison_json(tmp_path, clean_machine):
    """pp-fair and dp-wan place workers differently; the math (and so the losses) must not change.
    The comparison starts its own worker launcher, as ``testbed compare`` does (the suite's other
    runs share one: conftest's ``launchers``)."""
    from testbed.run.compare import compare
    from testbed.spec.compute import ComputeModel

    exp = load_experiment().with_overrides(iterations=3, warmup_iterations=1, compute=ComputeModel(mode="real"))
    result = compare(exp, ["pp-fair", "dp-wan", "atlas"], tmp_path, progress=_quiet)
    assert (tmp_path / "launcher.log").exists()  # the log of the launcher the comparison started
    saved = json.loads((tmp_path / "comparison.json").read_text())
    assert set(saved["policies"]) == {"pp-fair", "dp-wan", "atlas"}
    assert saved["policies"]["dp-wan"]["policy"] == "dp-wan"
    from testbed.results.analysis import losses

    a = losses(read_events(tmp_path / "pp-fair")).tolist()
    b = losses(read_events(tmp_path / "dp-wan")).tolist()
    c = losses(read_events(tmp_path / "atlas")).tolist()
    assert len(a) == 3 and a == pytest.approx(b, rel=1e-5) and a == pytest.approx(c, rel=1e-5)
    assert a == pytest.approx(reference_losses(exp, 3), rel=1e-4)  # one process's (test_atlas_grants' ablation too)
    assert (tmp_path / "atlas" / "controller.jsonl").read_text().strip()  # grants were made
    cfg = json.loads((tmp_path / "dp-wan" / "config.json").read_text())
    assert {w["dc"] for w in cfg["workers"] if w["replica"] == 0} == {"east"}  # a whole pipeline in one DC
    # the speed-up is the ratio of the runs' own iteration times, recomputed here from their events
    from testbed.results.analysis import iteration_times

    def measured_s(policy: str) -> float:
        it = iteration_times(read_events(tmp_path / policy), warmup=1)
        return float(it["duration_s"].mean())

    assert result["speedup"]["dp-wan/pp-fair"] == pytest.approx(measured_s("pp-fair") / measured_s("dp-wan"), rel=1e-6)
    assert result["speedup"]["atlas/dp-wan"] == pytest.approx(measured_s("dp-wan") / measured_s("atlas"), rel=1e-6)


def test_striped_wan_transfers_keep_the_math(tmp_path, clean_machine, launcher):
    """Activations and gradients split over 4 connections under a capped socket buffer arrive intact."""
    from testbed.results.analysis import losses
    from testbed.spec.compute import ComputeModel

    exp = load_experiment().with_overrides(
        iterations=3,
        warmup_iterations=1,
        wan_connections=4,
        policy="atlas",
        wan_connection_share=0.1,
        compute=ComputeModel(mode="real"),
    )
    run_experiment(exp, tmp_path, progress=_quiet, launcher=launcher)
    got = losses(read_events(tmp_path)).tolist()
    assert got == pytest.approx(reference_losses(exp, 3), rel=1e-4)
    assert read_worker_config(tmp_path / "worker_config.json").training.wan_connections == 4


def test_dead_controller_falls_back_to_fair_sharing(tmp_path, clean_machine, launcher):
    """A malformed control message kills the controller thread: links open up, training goes on."""
    import socket
    import threading

    exp = load_experiment().with_overrides(iterations=4, policy="atlas")
    lines = []

    def kill_controller():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            time.sleep(0.3)
            if any("iteration 1/" in line for line in lines):
                cfg = read_worker_config(tmp_path / "worker_config.json")
                s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                s.sendto(b"not json", cfg.control_socket)
                return

    t = threading.Thread(target=kill_controller)
    t.start()
    summary = run_experiment(exp, tmp_path, progress=lines.append, launcher=launcher)
    t.join()
    assert summary["completed_iterations"] == 4 and not summary["aborted"]
    assert (tmp_path / "controller_failed").exists()
    assert any("fell back to fair sharing" in line for line in lines)
    last = {}
    for line in (tmp_path / "shaping.jsonl").read_text().splitlines():
        e = json.loads(line)
        last[(e["netns"], e["ifname"], e["classid"])] = e["rate_bps"]
    pipeline_classes = {k: v for k, v in last.items() if k[2] in ("1:20", "1:21")}
    assert pipeline_classes and all(v == 100_000_000 for v in pipeline_classes.values())  # all open again


def test_the_simulator_validates_a_fresh_run(default_run, clean_machine):
    """``testbed sim --validate`` on a fresh run of the default experiment (pp-fair, one
    connection per boundary: the module's run, 2 iterations measured after the default's 2 of
    warm-up), as a new user runs it: the window modelled from what the testbed configures, no WAN
    profile (2.2% in two runs at 33fad16; the measured paths, ``--profile-wan``, are
    test_schedules.py's): iteration time within 10%, utilization and bubbles within 0.05 (the
    Paper-scale issue's tolerance). A run of its own (4 iterations measured) cost 12.7 s of the
    suite until it took the module's."""
    exp, out, _ = default_run
    assert exp.policy.name == "pp-fair" and exp.iterations - exp.warmup_iterations == 2
    got = run_cli("sim", "--validate", str(out), "--json")
    assert got.returncode == 0, got.stderr
    result = json.loads(got.stdout)
    assert result["links"] == MODELLED_WINDOW
    # the pipelines start as far apart as the run's did: the first at 0, the others after it
    assert result["starts"] == MEASURED_STARTS and len(result["start_offsets_s"]) == exp.replicas
    assert result["start_offsets_s"][0] == 0 and all(x >= 0 for x in result["start_offsets_s"])
    figures = result["figures"]
    assert abs(figures["iteration_time_s"]["error"]) <= 0.10, figures
    assert abs(figures["gpu_utilization"]["error"]) <= 0.05, figures
    assert abs(figures["bubble_fraction"]["error"]) <= 0.05, figures


def test_a_run_dilated_twice_gives_the_undilated_runs_figures(default_run, tmp_path, clean_machine, launcher):
    """The default experiment at ``time_dilation`` 2 (``spec/dilation.py``): in the emulated frame
    its iteration time, GPU utilization and bubble fraction are the undilated run's within 5% (0.03
    for the shares); in real time an iteration took about twice as long, and the kernel's link
    classes ran at half the topology's rates."""
    exp, _, plain = default_run
    dilated = run_experiment(exp.with_overrides(time_dilation=2), tmp_path, progress=_quiet, launcher=launcher)
    print({k: (plain[k], dilated[k]) for k in ("iteration_time_s", "gpu_utilization", "bubble_fraction")})
    assert dilated["time_dilation"] == 2 and plain["time_dilation"] == 1
    assert dilated["iteration_time_s"] == pytest.approx(plain["iteration_time_s"], rel=0.05)
    assert dilated["gpu_utilization"] == pytest.approx(plain["gpu_utilization"], abs=0.03)
    assert dilated["bubble_fraction"] == pytest.approx(plain["bubble_fraction"], abs=0.03)
    assert dilated["representative"] and dilated["loss_last"] == pytest.approx(plain["loss_last"], rel=1e-4)
    from testbed.results.analysis import iteration_times

    real_s = iteration_times(read_events(tmp_path), exp.warmup_iterations)["duration_s"].mean()
    assert real_s == pytest.approx(2 * dilated["iteration_time_s"], rel=1e-6)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["time_dilation_applied"] == 2 and config["compute"]["forward_ms"] == 2 * exp.compute.forward_ms
    shaping = [json.loads(x) for x in (tmp_path / "shaping.jsonl").read_text().splitlines()]
    link_rates = {r["ceil_bps"] for r in shaping if r["event"] == "add" and r["classid"] == "1:1"}
    assert link_rates == {x.rate_bps // 2 for x in exp.topology_spec.links}
    # the simulator takes the run as it ran: its experiment dilated, its figures back in real time
    got = run_cli("sim", "--validate", str(tmp_path), "--json")
    assert got.returncode == 0, got.stderr
    figure = json.loads(got.stdout)["figures"]["iteration_time_s"]
    assert figure["measured"] == pytest.approx(real_s, rel=1e-6) and abs(figure["error"]) <= 0.10, figure


def test_a_shared_launcher_that_exited_is_replaced(tmp_path):
    """``Launchers`` (a sweep's, the suite's): the same launcher for every run while it runs, a new
    one once it has exited (here killed), and none left running once the holder is closed."""
    from testbed.run.launch import Launchers

    with Launchers(tmp_path / "launcher.log") as launchers:
        first = launchers.get()
        assert launchers.get() is first
        first.proc.kill()
        first.proc.wait()
        second = launchers.get()
        assert second is not first and second.proc.poll() is None
    assert second.proc.poll() is not None
