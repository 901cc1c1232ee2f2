"""The VM tier: the netem path, tested inside a VM with Debian's stock kernel (``tests/support/vm.py``).

Builds the box the first time (debootstrap from the host's mirror, a few minutes; cached in
/var/cache/testbed/vm), boots it under KVM or TCG, runs ``tests/vm`` inside and asserts on the
JUnit results that come back: every test ran, and passed."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from tests.support.vm import boot, build_box, pytest_command

from .conftest import REPO

#: how many tests tests/vm holds: one that silently went missing must fail this test. ``kill -9``
#: then ``testbed clean`` ran in the box too until 7a7b80b (11-22 s under TCG): what clean removes
#: is the same on both paths (the namespaces, and netem's qdiscs with them; the host tier's
#: test_failures runs it with the delay element, the one path with processes of its own)
EXPECTED_TESTS = 9


@pytest.mark.timeout(1500)
def test_the_netem_path_inside_a_stock_kernel(tmp_path, clean_machine):
    box = build_box(REPO)
    run = boot(box, pytest_command(), REPO, tmp_path / "job", timeout_s=900)
    log = run.job_log
    print(log)
    junit = tmp_path / "job" / "junit.xml"
    assert junit.exists(), f"no results came back under {run.accel}:\n{log[-3000:]}\n{run.console[-2000:]}"
    cases = ET.parse(junit).getroot().iter("testcase")
    verdicts = ("failure", "error", "skipped")
    outcome = {
        f"{c.get('classname')}.{c.get('name')}": next((x.tag for x in c if x.tag in verdicts), "passed") for c in cases
    }
    assert len(outcome) == EXPECTED_TESTS, outcome
    assert all(v == "passed" for v in outcome.values()), f"{outcome}\n{log[-6000:]}"
    assert run.returncode == 0
