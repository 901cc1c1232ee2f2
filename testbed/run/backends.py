"""Choosing what realises a topology: ``--backend netns`` (default), ``mininet`` or ``remote``.

``make_network`` is the way in from Python and from the command line: it hands every backend the
machine's capacity probe, so that a link faster than this machine carries is refused::

    from testbed.spec import load_topology
    from testbed.run.backends import make_network

    with make_network(load_topology("two_dc")) as net:
        print(net.run("east-h0", ["ping", "-U", "-c", "3", str(net.host("west-h0").ip)]).stdout)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from testbed.errors import SpecError
from testbed.net.capacity_probe import capacity_bps
from testbed.net.local import LocalNetwork
from testbed.net.mininet_backend import MininetRealiser
from testbed.net.network import BACKENDS, LocalHosts, Network
from testbed.net.remote.backend import RemoteNetwork
from testbed.spec.topology import TopologySpec

#: the backends by name, and the class that realises each
BACKEND_CLASSES: dict[str, type[LocalNetwork] | type[RemoteNetwork]] = {
    "netns": LocalNetwork,
    "mininet": LocalNetwork,
    "remote": RemoteNetwork,
}
assert tuple(BACKEND_CLASSES) == BACKENDS, "every backend name has its class"


def backend_class(backend: str) -> type[LocalNetwork] | type[RemoteNetwork]:
    """The class that realises ``backend``. Raises SpecError for an unknown backend."""
    if backend not in BACKEND_CLASSES:
        raise SpecError("--backend", "(option)", backend, "is not a backend", f"use one of {', '.join(BACKENDS)}")
    return BACKEND_CLASSES[backend]


def offers_live_shaping(backend: str) -> bool:
    """Whether networks of ``backend`` offer live shaping (Atlas's grants, BubbleTea's control
    sockets), known before one is built. Raises SpecError for an unknown backend."""
    return backend_class(backend).offers_live_shaping


def runs_here(backend: str) -> bool:
    """Whether ``backend``'s hosts are namespaces of this machine (a process here can enter them)."""
    return issubclass(backend_class(backend), LocalHosts)


def check_backend_options(backend: str, inventory: Path | None) -> None:
    """A known backend, and ``--inventory`` given exactly with ``--backend remote``. Raises SpecError."""
    if backend not in BACKENDS:
        raise SpecError("--backend", "(option)", backend, "is not a backend", f"use one of {', '.join(BACKENDS)}")
    if backend == "remote" and inventory is None:
        raise SpecError(
            "--backend remote",
            "--inventory",
            None,
            "is missing",
            "give the inventory file that lists the machines and the DCs they host "
            "(docs/backends.md, 'Several machines')",
        )
    if inventory is not None and backend != "remote":
        raise SpecError(
            "--inventory",
            "(option)",
            str(inventory),
            f"is only used by --backend remote, not {backend}",
            "add --backend remote, or leave --inventory out",
        )


def make_network(
    spec: TopologySpec,
    backend: str = "netns",
    inventory: Path | None = None,
    check_capacity: bool = True,
    **kwargs: Any,
) -> Network:
    """An unbuilt network of ``spec`` on ``backend`` (use it as a context manager); ``kwargs`` go to
    the backend (``delay_mechanism``, ``out_dir``, ``prefix``, ``tcp_buffer_bytes``).
    ``check_capacity``: refuse links faster than the machine carries (measured once, cached).
    Raises SpecError for an unknown backend or a wrong ``inventory``."""
    check_backend_options(backend, inventory)
    if backend == "remote":
        assert inventory is not None
        return RemoteNetwork(spec, inventory=inventory, check_capacity=check_capacity, **kwargs)
    realiser = MininetRealiser() if backend == "mininet" else None
    return LocalNetwork(spec, realiser=realiser, capacity_bps=capacity_bps if check_capacity else None, **kwargs)
