"""The backend contract: what every realised topology offers (:class:`Network`), and live shaping
(:class:`LiveShaping`), a capability some backends offer and others lack.

Backends (``local.LocalNetwork`` with the netns or the Mininet realiser, and
``remote.backend.RemoteNetwork``) implement :class:`Network` by composing parts (the run's
namespaces, the processes in its hosts, the WAN shaping); neither builds on the other (they share
only :class:`ManagedNetwork`, the context-manager lifecycle). A
backend that can change its WAN shaping while a run goes on exposes it as ``shaping`` (a
:class:`LiveShaping`) and says so before it is built (``offers_live_shaping``); Atlas's controller
asks for it up front (:func:`require_live_shaping`) instead of meeting a method that raises.

Lifecycle: a Network is a context manager. ``with backend(spec, ...) as net:`` builds it (root
needed) and always tears it down, even on Ctrl-C; a failure found in the background (a dead
delay element) interrupts the main thread and is raised from ``check_alive`` and on exit.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

from testbed.errors import SpecError, TestbedError
from testbed.net.signals import deferred_signals, signals_deferred
from testbed.net.tracefs import SchedTrace
from testbed.spec.addressing import AddressPlan, HostAddr
from testbed.spec.routing import RoutingTable
from testbed.spec.topology import TopologySpec

#: the backends' names (``--backend``): ``run/backends.py`` maps each to the class that realises it
BACKENDS = ("netns", "mininet", "remote")


@runtime_checkable
class Process(Protocol):
    """A process started in a host: the part of ``subprocess.Popen`` the testbed uses."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, sig: int) -> None: ...

    def terminate(self) -> None: ...

    def kill(self) -> None: ...


@runtime_checkable
class LiveShaping(Protocol):
    """Changing a built network's WAN shaping while it carries traffic, through netlink, in place
    (no delete, no unshaped window), each change logged in ``shaping.jsonl``."""

    shaping_log_path: Path

    def add_wan_class(
        self,
        src_dc: str,
        dst_dc: str,
        minor: int,
        rate_bps: int,
        ceil_bps: int | None = None,
        pairs: Sequence[tuple[str | None, str | None]] = (),
    ) -> None: ...

    def set_wan_class_rate(
        self, src_dc: str, dst_dc: str, minor: int, rate_bps: int, ceil_bps: int | None = None
    ) -> int: ...

    def compile_wan_class_rates(
        self, src_dc: str, dst_dc: str, rates_bps: Sequence[tuple[int, int] | tuple[int, int, int]]
    ) -> dict[str, Any]: ...

    def set_link_rate(self, a: str, b: str, rate_bps: int) -> None: ...

    def wan_classes(self, src_dc: str, dst_dc: str) -> dict[int, dict[str, int]]: ...

    def wan_tc_argv(self, src_dc: str, dst_dc: str) -> list[list[str]]: ...

    def start_helper(self, argv: Sequence[str], what: str, **kwargs: Any) -> subprocess.Popen: ...


@runtime_checkable
class RelayedControl(Protocol):
    """Live shaping whose links are on other machines (the remote backend), with the run's control
    sockets bridged across them (``net/remote/control_relay.py``): Atlas's controller reads a UDP
    socket here that each machine's relay feeds with its workers' datagrams, and sends each grant
    to the relay of the machine that holds its link (``open_control``); BubbleTea's Unix paths
    are bridged both ways (``open_bridge``)."""

    def open_control(self, path: str) -> tuple[socket.socket, dict[str, Any]]: ...

    def open_bridge(self, here: list[str], there: dict[str, list[str]]) -> None: ...


@runtime_checkable
class LocalHosts(Protocol):
    """Hosts whose namespaces live on this machine (the netns and Mininet backends): a process of
    this machine may enter one (``netns_path``), a helper may start beside them, a process
    started otherwise (forked by the worker launcher) is adopted: registered for ``testbed clean``
    and stopped at teardown; and this machine's scheduler may be recorded for the run
    (``sched_trace``, ``tracefs.SchedTrace``)."""

    def netns_path(self, host: str) -> str: ...

    def log_path(self, host: str) -> Path: ...

    def start_local(self, argv: Sequence[str], what: str, **kwargs: Any) -> subprocess.Popen: ...

    def adopt(self, proc: Process, what: str) -> None: ...

    def sched_trace(self) -> SchedTrace: ...


class Network(Protocol):
    """A topology realised by a backend (see the module docstring)."""

    #: whether built networks of this backend offer ``shaping``
    offers_live_shaping: ClassVar[bool]
    spec: TopologySpec
    prefix: str
    out_dir: Path
    plan: AddressPlan
    routes: RoutingTable
    #: the delay mechanism in use (``netem`` or ``nfqueue``), known once built
    mechanism: str
    build_s: float
    #: MTU of every emulated interface (None: the kernel's default, 1500)
    mtu: int | None

    @property
    def backend(self) -> str:
        """The backend's name (``--backend``)."""
        ...

    @property
    def shaping(self) -> LiveShaping | None:
        """Live shaping, or None where the backend lacks it (or before the network is built)."""
        ...

    def __enter__(self) -> Network: ...

    def __exit__(self, *exc: object) -> None: ...

    @property
    def hosts(self) -> dict[str, HostAddr]: ...

    def host(self, name: str) -> HostAddr: ...

    def log_path(self, host: str) -> Path: ...

    def host_machine(self, host: str) -> str | None:
        """The machine a host runs on (its inventory name), None where it is this machine."""
        ...

    def run(self, host: str, argv: Sequence[str], timeout_s: float = 60) -> subprocess.CompletedProcess: ...

    def popen(self, host: str, argv: Sequence[str], **kwargs: Any) -> Process: ...

    def python(self, host: str) -> str: ...

    def process_env(self, extra: dict[str, str]) -> dict[str, str]: ...

    @property
    def host_out_dir(self) -> str: ...

    @property
    def local_files(self) -> bool: ...

    def share_file(self, path: Path) -> str: ...

    def share_bytes(self, name: str, data: bytes) -> str: ...

    def wan_counters(self) -> dict[tuple[str, str], dict[int, dict[str, int]]]: ...

    def wait_quiet(self, timeout_s: float = 60.0) -> float: ...

    def check_alive(self) -> None: ...

    def now_ns(self) -> int: ...

    @property
    def backend_info(self) -> dict[str, Any]: ...


def require_live_shaping(net: Network, why: str) -> LiveShaping:
    """``net.shaping``, or SpecError saying that ``why`` needs a backend with live shaping."""
    if net.shaping is None:
        raise SpecError(
            "--backend",
            "(option)",
            net.backend,
            f"cannot change shaping live, which {why} needs",
            "use --backend netns or mininet",
        )
    return net.shaping


#: networks of this process whose build began and whose teardown has not finished
_UNFINISHED: list[ManagedNetwork] = []


def tear_down_unfinished() -> list[str]:
    """Tear down every network of this process whose teardown did not run or did not finish (an
    exception that left between building and the ``with`` body, a teardown step that failed): the
    last resort of a command before it exits. Returns the prefixes of those networks; raises the
    first teardown error once every one was tried."""
    prefixes, errors = [], []
    for net in list(_UNFINISHED):
        prefixes.append(getattr(net, "prefix", "?"))
        try:
            net.tear_down_safely()
        except Exception as e:  # noqa: BLE001 - every network gets its try; the first error is raised
            errors.append(e)
    if errors:
        raise errors[0]
    return prefixes


class ManagedNetwork:
    """The lifecycle every backend shares: a context manager that builds on entry and always tears
    down, and a background failure (``fail``) that interrupts the main thread (SIGUSR1) and is
    raised from ``check_alive`` and on exit. Subclasses define ``build`` and ``teardown``.

    Signals: a teardown runs with SIGINT, SIGTERM and SIGHUP held back (``registry.deferred_signals``:
    a second Ctrl-C cannot cut it short) and is no longer interrupted by a background failure; so
    does a build where ``defer_signals_while_building`` (every step of it creates and registers
    something, and it takes seconds at most). A held-back signal acts once the section ends. A
    network whose teardown did not finish stays in this process's list for
    :func:`tear_down_unfinished`."""

    failure: TestbedError | None = None
    _old_usr1: Any = None
    _interrupting = False
    _interrupt_lock = threading.Lock()  # (one for every network: it guards one flag, briefly)
    #: hold the ending signals back while building (a build that takes seconds at most)
    defer_signals_while_building: ClassVar[bool] = False

    def build(self) -> None:
        raise NotImplementedError

    def teardown(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Any:
        try:
            _UNFINISHED.append(self)
            if threading.current_thread() is threading.main_thread():
                self._old_usr1 = signal.signal(signal.SIGUSR1, self._on_usr1)
                self._interrupting = True
            if self.defer_signals_while_building:
                with deferred_signals("tearing down once the network is built"):
                    self.build()
            else:
                self.build()
        except BaseException:
            self.tear_down_safely()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.tear_down_safely()
        if self.failure is not None and exc[0] is None:
            raise self.failure

    def tear_down_safely(self) -> None:
        """``teardown`` with the ending signals held back and no background failure interrupting
        it; once it returns, the network leaves the unfinished list. Raises what ``teardown`` raised
        (the network stays in the list), then a signal that came meanwhile."""
        with deferred_signals("already tearing down"):
            with self._interrupt_lock:
                self._interrupting = False  # from here on fail() sends no SIGUSR1
            try:
                self.teardown()
            finally:
                self._restore_signal()
            if self in _UNFINISHED:
                _UNFINISHED.remove(self)

    def _restore_signal(self) -> None:
        if self._old_usr1 is not None:
            signal.signal(signal.SIGUSR1, self._old_usr1)
            self._old_usr1 = None

    def _on_usr1(self, signum: int, frame: object) -> None:
        # inside a section that must not be split (creating and registering, a teardown), the
        # failure waits for check_alive or the end of the with statement
        if self.failure is not None and self._interrupting and not signals_deferred():
            raise self.failure

    def fail(self, err: TestbedError) -> None:
        """Called from a watcher thread (a dead delay element, a profile step that failed): record
        the error and interrupt the main thread (unless it is tearing down)."""
        self.failure = err
        print(f"testbed: error: {err}", flush=True)
        with self._interrupt_lock:
            if self._interrupting:
                signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGUSR1)

    def check_alive(self) -> None:
        """Raise the failure a watcher found (a dead delay element), if any."""
        if self.failure is not None:
            raise self.failure
