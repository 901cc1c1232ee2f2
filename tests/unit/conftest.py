"""Fixtures every unit test gets."""

from __future__ import annotations

import sys

import pytest


@pytest.fixture(autouse=True)
def _switch_interval_set_back():
    """A test that starts BubbleTea's filling thread sets the process's switch interval
    (``bubbletea/fill.py``): each test starts with the one the process had."""
    before = sys.getswitchinterval()
    yield
    sys.setswitchinterval(before)


@pytest.fixture
def without_handoff(monkeypatch):
    """The model without the worker's hand-off between two operations (``plan/handoff.py``): for
    the tests that work a schedule's timeline out by hand from its compute and transfer times
    alone; the hand-off's own tests (``test_handoff.py``) and the saved predictions keep it."""
    monkeypatch.setattr("testbed.plan.handoff.ACTION_HANDOFF_S", 0.0)
    monkeypatch.setattr("testbed.plan.handoff.STRIPE_SEND_S", 0.0)
