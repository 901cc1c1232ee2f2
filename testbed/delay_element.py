"""The NFQUEUE delay element: building the C helper, starting it in a namespace, watching it.

Used where the kernel has no sch_netem (DESIGN.md section 3): packets are queued from the
receiving namespace's ``raw PREROUTING`` chain to ``nfq_delay`` (``nfq_delay.c`` beside this
file), which holds each one for the link's one-way delay. The C element costs about a third of
the CPU of a Python one (DESIGN.md section 3); it is compiled once per source version into
``/var/cache/testbed``. Its rules have no ``--queue-bypass``, and a supervisor thread fails the
run as soon as an element exits, so a dead element can never pass for a working delay.
"""
from __future__ import annotations

import hashlib
import os
import select
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable

from .errors import DelayElementError, FeatureError
from .hostproc import stop_popen
from .shaping import DelayQueue

SOURCE = Path(__file__).with_name("nfq_delay.c")
CACHE_DIR = Path(os.environ.get("TESTBED_CACHE_DIR", "/var/cache/testbed"))
HEADER = "/usr/include/libnetfilter_queue/libnetfilter_queue.h"


def helper_path() -> Path:
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    return CACHE_DIR / "bin" / f"nfq_delay-{digest}"


def build_helper() -> Path:
    """Compile ``nfq_delay`` if this source version is not built yet; return its path.

    Raises FeatureError naming the package to install when gcc or libnetfilter-queue-dev is missing.
    """
    path = helper_path()
    if path.exists():
        return path
    if shutil.which("gcc") is None:
        raise FeatureError("gcc is missing, needed to build the NFQUEUE delay element: apt-get install gcc")
    if not Path(HEADER).exists():
        raise FeatureError("libnetfilter_queue headers are missing, needed to build the NFQUEUE delay "
                           "element: apt-get install libnetfilter-queue-dev")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    proc = subprocess.run(["gcc", "-O2", "-Wall", "-o", str(tmp), str(SOURCE), "-lnetfilter_queue", "-lnfnetlink"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise FeatureError(f"building the NFQUEUE delay element failed:\n{proc.stderr.strip()}")
    os.replace(tmp, path)
    return path


class DelayElement:
    """One ``nfq_delay`` process serving every delay queue of one namespace."""

    def __init__(self, netns: str, queues: list[DelayQueue], log_path: Path, seed: int = 1) -> None:
        self.netns, self.queues, self.log_path = netns, queues, log_path
        self.argv = [str(build_helper())]
        for q in queues:
            self.argv += ["--queue", q.element_arg()]
        self.argv += ["--seed", str(seed)]
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 5.0) -> subprocess.Popen:
        """Start the element and wait until every queue is bound (it prints ``ready``)."""
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(["nsenter", f"--net=/run/netns/{self.netns}", "--", *self.argv],
                                     stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL)
        log.close()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        line = self.proc.stdout.readline() if ready else b""
        if line.strip() != b"ready":
            self.proc.kill()
            self.proc.wait()
            raise DelayElementError(f"delay element in {self.netns} did not start: "
                                    f"{self.log_path.read_text(errors='replace').strip()[-500:]}")
        return self.proc

    def stop(self) -> None:
        if self.proc is not None:
            stop_popen(self.proc)


class Supervisor(threading.Thread):
    """Polls delay elements; on the first unexpected exit, calls ``on_failure`` with the error."""

    def __init__(self, elements: list[DelayElement], on_failure: Callable[[DelayElementError], None],
                 interval_s: float = 0.05) -> None:
        super().__init__(name="delay-supervisor", daemon=True)
        self.elements, self.on_failure, self.interval_s = elements, on_failure, interval_s
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(self.interval_s):
            for el in self.elements:
                code = el.proc.poll() if el.proc else None
                if code is not None and not self._halt.is_set():
                    tail = el.log_path.read_text(errors="replace").strip()[-300:]
                    self.on_failure(DelayElementError(
                        f"the delay element of {el.netns} exited with status {code} at "
                        f"t={time.monotonic_ns()} ns: packets on its links are being dropped, not delayed; "
                        f"the run is not valid. Log tail: {tail or '(empty)'}"))
                    return

    def stop(self) -> None:
        self._halt.set()
