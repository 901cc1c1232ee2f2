"""The VM tier: tests of the netem path, run only inside the VM test box (``tests/support/vm.py``,
``scripts/vm_check``), whose stock Debian kernel has ``sch_netem``. Elsewhere they are not
collected at all (not skipped): the host suite runs them through the box
(``tests/integration/test_vm.py``) and asserts on their results."""

from __future__ import annotations

import os

import pytest

from tests.integration.conftest import clean_machine, machine_state  # noqa: F401 - fixtures shared with the host tier

IN_VM = os.environ.get("TESTBED_IN_VM") == "1"
if not IN_VM:
    collect_ignore_glob = ["test_*.py"]


def pytest_collection_modifyitems(config, items):
    for item in items:
        item.add_marker(pytest.mark.root)
