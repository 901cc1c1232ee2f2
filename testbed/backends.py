"""Choosing what realises a topology: ``--backend netns`` (default), ``mininet`` or ``remote``."""
from __future__ import annotations

from pathlib import Path

from .emulation import Emulation
from .errors import SpecError
from .topology import TopologySpec

BACKENDS = ("netns", "mininet", "remote")


def check_backend_options(backend: str, inventory: Path | None) -> None:
    """``--inventory`` given exactly with ``--backend remote``. Raises SpecError."""
    if backend == "remote" and inventory is None:
        raise SpecError("--backend remote", "--inventory", None, "is missing",
                        "give the inventory file that lists the machines and the DCs they host (README: Several "
                        "machines)")
    if inventory is not None and backend != "remote":
        raise SpecError("--inventory", "(option)", str(inventory), f"is only used by --backend remote, not {backend}",
                        "add --backend remote, or leave --inventory out")


def make_emulation(spec: TopologySpec, backend: str = "netns", inventory: Path | None = None,
                   **kwargs) -> Emulation:
    """An unbuilt emulation of ``spec`` on ``backend`` (use it as a context manager); ``kwargs`` go
    to :class:`emulation.Emulation`. Raises SpecError for an unknown backend."""
    if backend == "netns":
        return Emulation(spec, **kwargs)
    if backend == "mininet":
        from .mininet_backend import MininetEmulation

        return MininetEmulation(spec, **kwargs)
    if backend == "remote":
        from .remote_backend import RemoteEmulation

        check_backend_options(backend, inventory)
        return RemoteEmulation(spec, inventory=inventory, **kwargs)
    raise SpecError("--backend", "(option)", backend, "is not a backend", f"use one of {', '.join(BACKENDS)}")
