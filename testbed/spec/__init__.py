"""Descriptions: topologies, experiments and policies as validated, frozen data (no root, no kernel,
no torch). The ways in: ``load_topology``/``parse_topology`` and ``load_experiment``/``parse_experiment``
(looked up when first used, so that importing one module of ``spec`` does not load the others)."""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "load_experiment": "testbed.spec.experiment_file",
    "parse_experiment": "testbed.spec.experiment_file",
    "load_topology": "testbed.spec.topology_file",
    "parse_topology": "testbed.spec.topology_file",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'testbed.spec' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
