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
import re
import select
import shutil
import socket
import subprocess
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

from testbed.errors import BuildError, DelayElementError, FeatureError
from testbed.net.hostproc import netns_argv, stop_popen
from testbed.net.registry import RunRecord, control_dir
from testbed.net.shaping import DelayQueue
from testbed.net.shaping_text import iptables_restore_text

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
        raise FeatureError(
            "libnetfilter_queue headers are missing, needed to build the NFQUEUE delay "
            "element: apt-get install libnetfilter-queue-dev"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    proc = subprocess.run(
        ["gcc", "-O2", "-Wall", "-o", str(tmp), str(SOURCE), "-lnetfilter_queue", "-lnfnetlink"],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise FeatureError(f"building the NFQUEUE delay element failed:\n{proc.stderr.strip()}")
    os.replace(tmp, path)
    return path


#: the counters ``nfq_delay`` prints per queue when it exits
_STATS_LINE = re.compile(
    r"^queue (?P<queue>\d+) packets (?P<packets>\d+) max_held (?P<max_held>\d+) "
    r"late_mean_us (?P<late_mean_us>[0-9.]+) late_p99_us (?P<late_p99_us>\d+) late_max_us (?P<late_max_us>\d+) "
    r"stamped (?P<stamped>\d+)(?: dropped (?P<dropped>\d+) changes (?P<changes>\d+))?$",
    re.M,
)


def read_element_stats(log_path: Path) -> list[dict[str, float]]:
    """The per-queue counters a stopped element wrote to its log (``nfq_delay.c``): ``queue``,
    ``packets``, ``max_held``, and how late packets were released: ``late_mean_us``,
    ``late_p99_us`` (upper edge of a power-of-two histogram bucket), ``late_max_us``;
    ``stamped``, the packets whose delay counted from the kernel's receive time stamp; and
    ``dropped`` (the element's own loss) and ``changes`` (live changes taken), 0 where not given."""
    text = log_path.read_text(errors="replace") if log_path.exists() else ""
    return [{k: float(v or 0) for k, v in m.groupdict().items()} for m in _STATS_LINE.finditer(text)]


def control_path(netns: str) -> Path:
    """The control socket of ``netns``'s element (``nfq_delay --control``): in the registry's
    control folder, named after the namespace (so after the run's prefix: ``testbed clean``
    removes it)."""
    return control_dir() / f"{netns}.sock"


def set_queue(
    netns: str, queue_num: int, delay_us: int, jitter_us: int, loss_pct: float, timeout_s: float = 1.0
) -> None:
    """Change queue ``queue_num`` of ``netns``'s element live: its one-way delay and jitter (µs)
    and its loss (percent), for packets arriving from now on; a shorter delay never reorders
    (``nfq_delay.c``). Waits for the element's answer. Raises DelayElementError where the element
    is not there, does not answer within ``timeout_s`` or refuses the change."""
    msg = f"set {queue_num} {int(delay_us)} {int(jitter_us)} {round(loss_pct * 10_000)}".encode()
    # the answer's address is a path: an abstract one belongs to this namespace, not the element's
    reply = control_dir() / f"{netns}-reply{os.getpid()}-{threading.get_ident()}.sock"
    reply.unlink(missing_ok=True)
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        try:
            sock.bind(str(reply))
            sock.settimeout(timeout_s)
            sock.sendto(msg, str(control_path(netns)))
            answer = sock.recv(256).decode(errors="replace")
        except OSError as e:
            raise DelayElementError(f"the delay element of {netns} did not take the change ({e})") from None
        finally:
            reply.unlink(missing_ok=True)
    if answer != "ok":
        raise DelayElementError(f"the delay element of {netns} refused {msg.decode()!r}: {answer}")


class DelayElement:
    """One ``nfq_delay`` process serving every delay queue of one namespace."""

    def __init__(self, netns: str, queues: list[DelayQueue], log_path: Path, seed: int = 1) -> None:
        self.netns, self.queues, self.log_path = netns, queues, log_path
        self.argv = [str(build_helper())]
        for q in queues:
            self.argv += ["--queue", q.element_arg()]
        self.argv += ["--seed", str(seed)]
        if any(q.live for q in queues):
            self.argv += ["--control", str(control_path(netns))]
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 5.0) -> subprocess.Popen:
        """Start the element and wait until every queue is bound (it prints ``ready``)."""
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{self.netns}", "--", *self.argv],
            stdout=subprocess.PIPE,
            stderr=log,
            stdin=subprocess.DEVNULL,
            process_group=0,  # a terminal's Ctrl-C is the runner's to act on: it stops the element last
        )
        log.close()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        line = self.proc.stdout.readline() if ready else b""
        if line.strip() != b"ready":
            self.proc.kill()
            self.proc.wait()
            raise DelayElementError(
                f"delay element in {self.netns} did not start: "
                f"{self.log_path.read_text(errors='replace').strip()[-500:]}"
            )
        return self.proc

    def stop(self) -> None:
        if self.proc is not None:
            stop_popen(self.proc)


class Supervisor(threading.Thread):
    """Polls delay elements; on the first unexpected exit, calls ``on_failure`` with the error."""

    def __init__(
        self, elements: list[DelayElement], on_failure: Callable[[DelayElementError], None], interval_s: float = 0.05
    ) -> None:
        super().__init__(name="delay-supervisor", daemon=True)
        self.elements, self.on_failure, self.interval_s = elements, on_failure, interval_s
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(self.interval_s):
            for el in self.elements:
                code = el.proc.poll() if el.proc else None
                if code is not None and not self._halt.is_set():
                    tail = el.log_path.read_text(errors="replace").strip()[-300:]
                    self.on_failure(
                        DelayElementError(
                            f"the delay element of {el.netns} exited with status {code} at "
                            f"t={time.monotonic_ns()} ns: packets on its links are being dropped, not delayed; "
                            f"the run is not valid. Log tail: {tail or '(empty)'}"
                        )
                    )
                    return

    def stop(self) -> None:
        self._halt.set()


class DelayQueues:
    """The delay mechanism's userspace part for a run's namespaces on this machine: per namespace,
    one element for its delay queues and the iptables rules that feed them (loss drops too), and
    a supervisor that calls ``on_failure`` when an element dies. ``stop`` ends them all."""

    def __init__(self, log_dir: Path, record: RunRecord, on_failure: Callable[[DelayElementError], None]) -> None:
        self.log_dir, self.record, self.on_failure = log_dir, record, on_failure
        self.elements: list[DelayElement] = []
        self._supervisor: Supervisor | None = None

    def start(self, queues: Sequence[DelayQueue]) -> None:
        """Start elements and install rules for ``queues``. Raises DelayElementError when an element
        does not start, BuildError when iptables-restore refuses the rules."""
        by_ns: dict[str, list[DelayQueue]] = defaultdict(list)
        for q in queues:
            by_ns[q.netns].append(q)
        for i, (ns, mine) in enumerate(by_ns.items()):
            elementary = [q for q in mine if q.needs_element]
            if elementary:
                el = DelayElement(ns, elementary, self.log_dir / f"nfq_delay-{ns}.log", seed=i + 1)
                self.elements.append(el)
                proc = el.start()
                self.record.add_process(proc.pid, f"nfq_delay in {ns}")
            text = iptables_restore_text(mine)
            proc = subprocess.run(netns_argv(ns, ["iptables-restore"]), input=text, capture_output=True, text=True)
            if proc.returncode != 0:
                raise BuildError(f"iptables-restore in {ns} failed: {proc.stderr.strip()}\ninput:\n{text}")
        if self.elements:
            self._supervisor = Supervisor(self.elements, self.on_failure)
            self._supervisor.start()

    def stop_watching(self) -> None:
        """Stop the supervisor: what follows (a teardown) may end the elements."""
        if self._supervisor is not None:
            self._supervisor.stop()

    def stop(self) -> None:
        self.stop_watching()
        for el in self.elements:
            el.stop()
        self.elements.clear()
