"""Processes inside emulated hosts: started with nsenter(1), output captured to a per-host log."""
from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Sequence


def netns_argv(netns: str, argv: Sequence[str]) -> list[str]:
    """``argv`` run inside namespace ``netns`` (nsenter execs it: the PID is the command's)."""
    return ["nsenter", f"--net=/run/netns/{netns}", "--", *argv]


def open_log(path: Path, argv: Sequence[str]):
    path.parent.mkdir(parents=True, exist_ok=True)
    f = open(path, "ab", buffering=0)
    f.write(f"\n# t_ns={time.monotonic_ns()} $ {' '.join(argv)}\n".encode())
    return f


def run_logged(netns: str, argv: Sequence[str], log_path: Path, timeout_s: float) -> subprocess.CompletedProcess:
    """Run ``argv`` in ``netns`` to completion; its output is returned and appended to ``log_path``."""
    proc = subprocess.run(netns_argv(netns, argv), capture_output=True, text=True, timeout=timeout_s,
                          stdin=subprocess.DEVNULL)
    with open_log(log_path, argv) as f:
        f.write(proc.stdout.encode() + proc.stderr.encode())
        f.write(f"# exit {proc.returncode}\n".encode())
    return proc


def stop_popen(proc: subprocess.Popen, grace_s: float = 2.0) -> None:
    """SIGTERM ``proc`` (a child of ours), SIGKILL it after ``grace_s`` seconds, and reap it."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
