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
