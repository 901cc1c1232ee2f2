#!/usr/bin/env python3
"""Stress test of signals: `testbed run` interrupted at any moment must leave nothing behind.

Runs `testbed run default` ``--trials`` times; each trial sends SIGINT or SIGTERM at a moment from
0 s to the end of an uninterrupted calibration run (``--mode random``, or ``sweep``: evenly
spaced; ``--between`` narrows the window; or ``phases``: shortly after each phase begins, in
turn, so that short phases such as the teardown get their share), to the runner alone (``kill PID``) or to its process
group (Ctrl-C in a terminal), and then compares the machine with its state before the trial, as
the integration tests do (``machine_state``: namespaces, root links, qdiscs, iptables rules,
registered runs), plus the run's control sockets and any process of the trial (its session) still
alive a second after the runner exited. Other users of the machine may change it meanwhile: a
change counts when it names the trial's run prefix (``--strict``: every change counts). A failing
trial prints what was left and runs ``testbed clean --run PREFIX``. At the end: trials and
failures per phase, the phase being where the run was when the signal left (startup, building,
workers_start, training, teardown: after the last iteration, finalize: the network is gone, the
summary is being written; exited: the run ended first). Exit status 1 on any failure.

Run as root: .venv/bin/python scripts/stress_signals.py [--trials 60] [--mode random|sweep|phases]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.integration.conftest import machine_state  # noqa: E402 - the integration tests' notion

TESTBED = [sys.executable, "-m", "testbed.cli"]
RUNS = Path("/run/testbed/runs")
CONTROL = Path("/run/testbed/control")
PHASES = ("startup", "building", "workers_start", "training", "teardown", "finalize", "exited")
PR_SET_CHILD_SUBREAPER = 36
#: how long a process of the trial may outlive the runner (PR_SET_PDEATHSIG acts asynchronously)
GRACE_S = 1.0
#: a trial whose runner is still alive this long after the signal is hung
HANG_S = 120.0


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat after the command name (state, ppid, pgrp, session, ...), or None."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def session_processes(sid: int) -> dict[int, str]:
    """Live (not zombie) processes of session ``sid``: {pid: command line}."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        st = _stat(int(entry))
        if st is None or int(st[3]) != sid or st[0] in ("Z", "X"):
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            cmd = "?"
        out[int(entry)] = cmd.strip()[:160]
    return out


def reap_orphans(keep: int) -> None:
    """Reap zombies that were reparented to this script (a child subreaper), but not ``keep``."""
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != keep:
            st = _stat(int(entry))
            if st is not None and st[0] == "Z" and int(st[1]) == os.getpid():
                try:
                    os.waitpid(int(entry), os.WNOHANG)
                except ChildProcessError:
                    pass


def own_record(pid: int) -> dict | None:
    for path in RUNS.glob("*.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if data.get("owner_pid") == pid:
            return data
    return None


def startup_phases(out: Path) -> set[str]:
    try:
        lines = (out / "startup.jsonl").read_text().splitlines()
    except OSError:
        return set()
    phases = set()
    for line in lines:
        try:
            phases.add(json.loads(line)["phase"])
        except (ValueError, KeyError, TypeError):
            continue
    return phases


class Trial:
    """One `testbed run` in its own session, its output read by a thread."""

    def __init__(self, out: Path, iterations: int) -> None:
        self.out, self.iterations = out, iterations
        self.proc = subprocess.Popen(
            [*TESTBED, "run", "default", "--out", str(out)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.t0 = time.monotonic()
        self.lines: list[str] = []
        self.record: dict | None = None
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def phase(self) -> str:
        """Where the run is now (approximately: it moves on while this looks)."""
        if self.proc.poll() is not None:
            return "exited"
        record = own_record(self.proc.pid)
        phases = startup_phases(self.out)
        if record is not None:
            self.record = record
        elif self.record is None and "network_built" not in phases:
            return "startup"
        else:
            return "finalize"  # the network was built and is gone: summary, plots
        if "network_built" not in phases:
            return "building"
        events = self.out / "events"
        if not (events.exists() and any(p.stat().st_size for p in events.glob("*.jsonl"))):
            return "workers_start"
        last = f"iteration {self.iterations}/{self.iterations}"
        return "teardown" if any(last in line for line in self.lines) else "training"

    def wait(self, timeout_s: float) -> int | None:
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None


def calibrate(tmp: Path) -> tuple[float, int]:
    """One uninterrupted run: its duration (s) and its iterations."""
    t = Trial(tmp / "calibration", 0)
    code = t.wait(600)
    t._reader.join(5)
    if code != 0:
        raise SystemExit("the calibration run failed:\n" + "".join(t.lines[-30:]))
    duration = time.monotonic() - t.t0
    config = json.loads((tmp / "calibration" / "config.json").read_text())
    return duration, int(config["iterations"])


def trial_prefixes(trial: Trial) -> set[str]:
    """The run prefixes of the trial: the registry entry it was seen with, any entry it left."""
    found = {trial.record["prefix"]} if trial.record else set()
    for path in RUNS.glob("*.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if data.get("owner_pid") == trial.proc.pid:
            found.add(data["prefix"])
    return found


def leftovers(before: dict, trial: Trial, strict: bool) -> tuple[dict[str, object], dict[str, object]]:
    """(what the trial left, other changes): differences from ``before`` that name the trial's run
    prefix, the run's control sockets and processes of its session; other changes are the trial's
    too with ``strict``, else another user's of the machine (reported, not counted)."""
    deadline = time.monotonic() + GRACE_S
    while True:
        reap_orphans(trial.proc.pid)
        procs = session_processes(trial.proc.pid)
        if not procs or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    after = machine_state()
    prefixes = trial_prefixes(trial)
    left: dict[str, object] = {}
    others: dict[str, object] = {}
    for key, was in before.items():
        extra = sorted(set(after[key]) - set(was))
        mine = [x for x in extra if strict or any(p in x for p in prefixes)]
        if mine:
            left[key] = mine
        if len(mine) < len(extra):
            others[key] = [x for x in extra if x not in mine]
    if CONTROL.is_dir():
        socks = sorted(p.name for p in CONTROL.iterdir() if any(p.name.startswith(x) for x in prefixes))
        if socks:
            left["control sockets"] = socks
    if procs:
        left["processes"] = procs
    return left, others


def clean_up(trial: Trial) -> None:
    """Stop what the trial left running (its processes, by PID) and run `testbed clean` on its run."""
    for pid in session_processes(trial.proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    time.sleep(0.2)
    reap_orphans(trial.proc.pid)
    for prefix in sorted(trial_prefixes(trial)):
        proc = subprocess.run([*TESTBED, "clean", "--run", prefix], cwd=REPO, capture_output=True, text=True)
        print("    testbed clean: " + (proc.stdout.strip() or proc.stderr.strip()).replace("\n", "\n    "))


#: ``--mode phases``: each trial waits for one of these phases in turn, then up to this long (s)
PHASE_JITTER_S = {"startup": 1.5, "building": 0.3, "workers_start": 0.3, "training": 6.0, "teardown": 0.3}


def wait_and_send(trial: Trial, at_s: float | None, target_phase: str | None, jitter_s: float, send) -> str:
    """Wait until ``at_s`` seconds after the start, or until ``target_phase`` (or a later one)
    plus ``jitter_s``; then ``send()`` unless the run has ended. Returns the phase the run was in."""
    order = {p: i for i, p in enumerate(PHASES)}
    while trial.proc.poll() is None:
        if at_s is not None and time.monotonic() - trial.t0 >= at_s:
            break
        if target_phase is not None and order[trial.phase()] >= order[target_phase]:
            time.sleep(jitter_s)
            break
        time.sleep(0.01)
    phase = trial.phase()
    if phase != "exited":
        try:
            send()
        except ProcessLookupError:
            phase = "exited"
    return phase


def run_trial(k: int, args: argparse.Namespace, tmp: Path, end_s: float, iterations: int, rng: random.Random):
    """One interrupted run; returns (its phase, what it left)."""
    at_s = target_phase = None
    jitter_s = 0.0
    if args.mode == "phases":
        target_phase = list(PHASE_JITTER_S)[k % len(PHASE_JITTER_S)]
        jitter_s = rng.uniform(0, PHASE_JITTER_S[target_phase])
    else:
        lo, hi = args.between or (0.0, end_s)
        at_s = lo + (hi - lo) * ((k + 0.5) / args.trials if args.mode == "sweep" else rng.random())
    sig = rng.choice([signal.SIGINT, signal.SIGTERM])
    target = args.target if args.target != "mixed" else rng.choice(["pid", "group"])
    before = machine_state()
    trial = Trial(tmp / f"t{k}", iterations)
    kill = os.killpg if target == "group" else os.kill
    phase = wait_and_send(trial, at_s, target_phase, jitter_s, lambda: kill(trial.proc.pid, sig))
    t_sent = time.monotonic() - trial.t0
    code = trial.wait(HANG_S)
    if code is None:
        trial.proc.kill()
        trial.wait(10)
    trial._reader.join(5)
    left, others = leftovers(before, trial, args.strict)
    if code is None:
        left["hung"] = f"still running {HANG_S:g} s after the signal"
    print(
        f"trial {k + 1:>3}: {signal.Signals(sig).name:<7} to {target:<5} at {t_sent:5.2f} s ({phase:<13}) "
        f"exit {code}: {'FAILED' if left else 'ok'}",
        flush=True,
    )
    if others:
        print(f"    (changed meanwhile by others, not counted: { {key: len(v) for key, v in others.items()} })")
    if left:
        for key, what in left.items():
            print(f"    left {key}: {what}")
        print("    output tail:\n      " + "      ".join(trial.lines[-12:]))
        clean_up(trial)
    return phase, left


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=60, help="interrupted runs (default 60)")
    ap.add_argument(
        "--mode",
        choices=("random", "sweep", "phases"),
        default="random",
        help="moments: random, evenly spaced, or shortly after each phase begins in turn (default random)",
    )
    ap.add_argument(
        "--target",
        choices=("pid", "group", "mixed"),
        default="mixed",
        help="send to the runner, to its process group (as Ctrl-C), or either at random (default)",
    )
    ap.add_argument(
        "--strict",
        action="store_true",
        help="count every change of the machine, not only what names the trial's run (a machine no one else uses)",
    )
    ap.add_argument("--seed", type=int, default=None, help="random seed (default: time)")
    ap.add_argument(
        "--between",
        type=float,
        nargs=2,
        metavar=("FROM_S", "TO_S"),
        help="random and sweep: only between these seconds after the start (default: 0 to the end of a run)",
    )
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root")
    seed = args.seed if args.seed is not None else int(time.time())
    rng = random.Random(seed)
    ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1)  # orphans of a trial come back to us
    counts: Counter[str] = Counter()
    failures: Counter[str] = Counter()
    with tempfile.TemporaryDirectory(prefix="stress-signals-") as tmp_name:
        tmp = Path(tmp_name)
        end_s, iterations = calibrate(tmp)
        print(
            f"seed {seed}; a run takes {end_s:.1f} s ({iterations} iterations); {args.trials} trials, "
            f"mode {args.mode}, to {args.target}",
            flush=True,
        )
        for k in range(args.trials):
            phase, left = run_trial(k, args, tmp, end_s, iterations, rng)
            counts[phase] += 1
            failures[phase] += bool(left)
    print("phase            trials  failures")
    for phase in PHASES:
        if counts[phase]:
            print(f"{phase:<16} {counts[phase]:>6}  {failures[phase]:>8}")
    total = sum(failures.values())
    print(f"total            {sum(counts.values()):>6}  {total:>8}")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
