"""Signals at any moment: SIGINT or SIGTERM sent to ``testbed run`` while it builds, while its
workers start, while it trains or tears down leaves nothing behind (namespaces, registry entry,
root links, qdiscs, iptables rules, processes), without ``testbed clean``. A second signal, or a
background failure, during a teardown does not cut it short. ``scripts/stress_signals.py`` tries
random moments; these are fixed ones, found by watching the run folder and the registry."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed.errors import DelayElementError
from testbed.run.backends import make_network
from testbed.spec.topology_file import load_topology

from .conftest import REPO, alive_with_argv, machine_state

RUNS = Path("/run/testbed/runs")
#: the longest a script may take from SIGTERM to its exit while it measures the WAN (s): its
#: network's teardown, 1.4-2.8 s alone; the probe's server held it 10 s more before 2026-12-07
SIGTERM_EXIT_S = 6.0


class Run:
    """``testbed run default`` in a session of its own (its processes are found by session)."""

    def __init__(self, out: Path, argv: list[str] | None = None) -> None:
        """``argv``: another command whose run folder is ``out`` (default ``testbed run default``)."""
        self.out = out
        self.proc = subprocess.Popen(
            [sys.executable, *(argv or ["-m", "testbed.cli", "run", "default", "--out", str(out)])],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.record: dict | None = None

    def registered(self) -> dict | None:
        """The run's registry entry, once it has one (kept once seen)."""
        for path in RUNS.glob("*.json"):
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if data.get("owner_pid") == self.proc.pid:
                self.record = data
        return self.record

    def phases(self) -> set[str]:
        try:
            return {json.loads(line)["phase"] for line in (self.out / "startup.jsonl").read_text().splitlines()}
        except (OSError, ValueError, KeyError):
            return set()

    def wait_for(self, what: str, ready, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if ready():
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.005)
        self.proc.kill()
        out, err = self.proc.communicate()
        raise AssertionError(f"the run never reached {what}:\n{err[-3000:]}")

    def finish(self, timeout_s: float = 120) -> tuple[int, str]:
        _, err = self.proc.communicate(timeout=timeout_s)
        return self.proc.returncode, err

    def session(self) -> dict[int, str]:
        """Live processes of the run's session (the runner, what it started), by PID."""
        alive = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                st = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except (OSError, IndexError):
                continue
            if int(st[3]) == self.proc.pid and st[0] not in ("Z", "X"):
                alive[int(entry)] = cmd
        return alive

    def processes(self, grace_s: float = 2.0) -> dict[int, str]:
        """Processes of the run's session still alive ``grace_s`` after it exited (PR_SET_PDEATHSIG
        acts asynchronously)."""
        deadline = time.monotonic() + grace_s
        while (alive := self.session()) and time.monotonic() < deadline:
            time.sleep(0.05)
        return alive


def left_behind(before: dict, prefix: str | None, run: Run | None = None) -> dict:
    """What the run ``prefix`` (None: a run never registered) left: its namespaces and registry
    entry, any new root link, qdisc or iptables rule, and processes of ``run``'s session."""
    after = machine_state()
    left = {
        "netns": [n for n in after["netns"] if prefix and n.startswith(f"{prefix}-")],
        "runs": [r for r in after["runs"] if prefix and r.startswith(prefix)],
        **{k: sorted(set(after[k]) - set(before[k])) for k in ("links", "qdiscs", "iptables")},
        "processes": run.processes() if run is not None else {},
    }
    return {k: v for k, v in left.items() if v}


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_while_building(tmp_path, sig):
    """Registered, its network not built yet: the build finishes (held back), then comes down."""
    before = machine_state()
    run = Run(tmp_path)
    run.wait_for("its registration", lambda: run.registered() and "network_built" not in run.phases())
    run.proc.send_signal(sig)
    code, err = run.finish()
    assert code == 128 + sig, err
    assert "Traceback" not in err, err
    assert left_behind(before, run.record["prefix"], run) == {}


def test_signal_before_registration(tmp_path):
    """The command has started its launcher (importing torch) and imports its own modules; no
    network is registered yet."""
    before = machine_state()
    run = Run(tmp_path)
    run.wait_for("its launcher's start", lambda: (tmp_path / "logs" / "launcher.log").exists())
    run.proc.send_signal(signal.SIGTERM)
    code, err = run.finish()
    assert code == 128 + signal.SIGTERM, err
    record = run.registered()  # (one left behind names its owner)
    assert left_behind(before, record["prefix"] if record else None, run) == {}


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_while_workers_start(tmp_path, sig):
    """The launcher has preloaded the run and forks the workers."""
    before = machine_state()
    run = Run(tmp_path)
    run.wait_for("the launcher's readiness", lambda: run.registered() and "launcher_ready" in run.phases())
    run.proc.send_signal(sig)
    code, err = run.finish()
    assert code in (130, 128 + sig), err
    assert left_behind(before, run.record["prefix"], run) == {}


def _training(run: Run) -> bool:
    events = run.out / "events"
    return events.exists() and any(p.stat().st_size for p in events.glob("*.jsonl")) and bool(run.registered())


def test_ctrl_c_in_a_terminal_while_training(tmp_path):
    """Ctrl-C in a terminal signals the whole process group: the run's processes are in groups of
    their own, so only the runner gets it and stops them in order (a delay element that died of
    the terminal's SIGINT failed the run, and its failure could cut the teardown short)."""
    before = machine_state()
    run = Run(tmp_path)
    run.wait_for("training", lambda: _training(run))
    own_group = os.getpgid(run.proc.pid)
    started = {pid: cmd for pid, cmd in run.session().items() if pid != run.proc.pid}
    assert any("nfq_delay" in cmd or "testbed.train.launcher" in cmd for cmd in started.values()), started
    for pid, cmd in started.items():
        assert os.getpgid(pid) != own_group, f"{cmd} would get the terminal's Ctrl-C"
    os.killpg(own_group, signal.SIGINT)
    code, err = run.finish()
    assert code == 130, err
    assert "delay element" not in err, err
    assert json.loads((tmp_path / "summary.json").read_text())["aborted"] is True
    assert left_behind(before, run.record["prefix"], run) == {}


def test_sigterm_while_training(tmp_path):
    before = machine_state()
    run = Run(tmp_path)
    run.wait_for("training", lambda: _training(run))
    run.proc.send_signal(signal.SIGTERM)
    code, err = run.finish()
    assert code == 128 + signal.SIGTERM, err
    assert "SIGTERM: tearing down" in err
    assert json.loads((tmp_path / "summary.json").read_text())["aborted"] is True  # summarised, as Ctrl-C
    assert left_behind(before, run.record["prefix"], run) == {}


def test_sigint_after_the_last_iteration(tmp_path):
    """The workers are done: the signal comes while they leave, the network comes down, or the
    summary is written."""
    before = machine_state()
    # three iterations (the fewest the default's warm-up allows), not eight: the signal's moment is what
    # the test is about (about 5 s less)
    run = Run(tmp_path, ["-m", "testbed.cli", "run", "default", "--iterations", "3", "--out", str(tmp_path)])
    lines: list[str] = []

    def last_iteration() -> bool:
        lines.append(run.proc.stdout.readline())
        return "iteration 3/3" in lines[-1]

    run.wait_for("its last iteration", last_iteration)
    run.registered()
    run.proc.send_signal(signal.SIGINT)
    code, err = run.finish()
    assert code in (0, 130), err
    assert left_behind(before, run.record["prefix"], run) == {}


def _namespaces_of(prefix: str) -> list[str]:
    return [n for n in machine_state()["netns"] if n.startswith(f"{prefix}-")]


@pytest.fixture
def ctrl_c_as_a_command_has_it():
    """SIGINT's handler Python's default (KeyboardInterrupt), as ``tears_down_on_signals`` sets it
    when a command starts, and no deferred-signals section open: in the whole suite an earlier
    in-process test can leave another handler in place, and the interrupt then goes to it (a fresh
    clone's suite, 2026-12-07: a host command's Ctrl-C raised nothing, its 37 s sleep ran out)."""
    from testbed.net import signals

    assert signals._Deferral.depth == 0, "a deferred-signals section is still open from an earlier test"
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


@pytest.mark.usefixtures("ctrl_c_as_a_command_has_it")
def test_a_second_signal_during_teardown_waits_for_it(tmp_path):
    """Ctrl-C while the network is being torn down: the teardown finishes, then the interrupt."""
    _teardown_interrupted(tmp_path)


def _teardown_interrupted(tmp_path) -> None:
    """The test's body: the network torn down whole, then the KeyboardInterrupt."""
    before = machine_state()
    with pytest.raises(KeyboardInterrupt):
        with make_network(load_topology("two_dc"), out_dir=tmp_path) as net:
            stop_all = net.processes.stop_all

            def interrupted_stop_all():
                signal.raise_signal(signal.SIGINT)  # during the teardown's first step
                stop_all()

            net.processes.stop_all = interrupted_stop_all
    assert _namespaces_of(net.prefix) == []
    assert left_behind(before, net.prefix) == {}


def test_a_background_failure_during_teardown_does_not_cut_it_short(tmp_path):
    """A delay element's failure found just before the teardown (its supervisor looked first)
    interrupts the main thread no more once the teardown has begun; it is raised after it."""
    before = machine_state()
    with pytest.raises(DelayElementError, match="found late"):
        with make_network(load_topology("two_dc"), out_dir=tmp_path) as net:
            stop_all = net.processes.stop_all

            def stop_all_after_a_failure():
                net.fail(DelayElementError("a delay element's death, found late"))
                time.sleep(0.5)  # where the interrupt would land
                stop_all()

            net.processes.stop_all = stop_all_after_a_failure
    assert left_behind(before, net.prefix) == {}


@pytest.mark.usefixtures("ctrl_c_as_a_command_has_it")
def test_a_signal_while_a_host_command_starts_leaves_no_process(tmp_path, monkeypatch):
    """``net.run`` (a probe, a check) cut by Ctrl-C the moment its process has started, before
    the caller holds it: the process is killed, not left running. ``subprocess.run`` lost it
    there (2026-12-07: a SIGTERM during ``--profile-wan`` left the probe's client behind)."""
    before = machine_state()
    argv = ["sleep", "37.25"]  # a duration no other process has
    popen = subprocess.Popen

    class SignalledAsItStarts(popen):  # type: ignore[misc,valid-type]
        def __init__(self, args, *a, **kw):
            super().__init__(args, *a, **kw)
            if list(args[-len(argv) :]) == argv:
                signal.raise_signal(signal.SIGINT)

    with make_network(load_topology("two_dc"), out_dir=tmp_path) as net:
        monkeypatch.setattr(subprocess, "Popen", SignalledAsItStarts)
        t0 = time.monotonic()
        handler = signal.getsignal(signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):
            net.run("east-h0", argv, timeout_s=60)
            blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
            pytest.fail(f"no KeyboardInterrupt: SIGINT's handler {handler!r}, signals blocked {blocked}")
        monkeypatch.setattr(subprocess, "Popen", popen)
        assert time.monotonic() - t0 < 5  # not the sleep's 37 s
        assert alive_with_argv(argv) == []
    assert left_behind(before, net.prefix) == {}


def test_sigterm_to_a_script_while_it_measures_the_wan(tmp_path):
    """The scripts that run experiments (here ``prediction_error.py``) end on SIGTERM as the
    command does: the network comes down promptly, nothing is left for ``testbed clean``. The
    signal comes while the script measures the run's WAN paths (``--profile-wan``, its runs' first
    phase: ``net/wan_probe.py``); a signal while training is the command's,
    test_sigterm_while_training. Until the probe killed its server when cut short, the teardown
    waited 10 s for that server to exit."""
    before = machine_state()
    out = tmp_path / "two_dc-pp-fair"
    # --no-record: a script that ran to its end would write its table into this checkout's docs
    argv = [
        str(REPO / "scripts" / "prediction_error.py"),
        "--no-record",
        "--experiments",
        "two_dc",
        "--policies",
        "pp-fair",
    ]
    run = Run(out, [*argv, "--iterations", "30", "--out", str(tmp_path)])
    run.wait_for("measuring its WAN", lambda: "network_built" in run.phases() and run.registered())
    run.proc.send_signal(signal.SIGTERM)
    t_signal = time.monotonic()
    code, err = run.finish()
    took_s = time.monotonic() - t_signal
    assert code == 128 + signal.SIGTERM, err
    assert "SIGTERM: tearing down" in err and "Traceback" not in err, err
    assert took_s < SIGTERM_EXIT_S, took_s  # 1.4-2.8 s seen: the teardown of two_dc
    assert "wan_profiled" not in run.phases() and not (out / "wan_profile.json").exists()  # it was measuring
    assert left_behind(before, run.record["prefix"], run) == {}
