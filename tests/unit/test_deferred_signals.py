"""Holding the ending signals back while a run creates, registers or tears down (no root)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.net.signals import deferred_signals, signals_deferred

REPO = Path(__file__).resolve().parents[2]


class Ended(Exception):
    pass


@pytest.fixture
def handler():
    """SIGTERM and SIGHUP raise Ended (recording which came); the old handlers come back after."""
    got: list[int] = []

    def on_signal(signum, frame):
        got.append(signum)
        raise Ended(signum)

    saved = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGHUP)}
    yield got
    for s, h in saved.items():
        signal.signal(s, h)


def test_a_signal_in_a_section_acts_when_it_ends(handler):
    finished = False
    with pytest.raises(Ended):
        with deferred_signals():
            assert signals_deferred()
            signal.raise_signal(signal.SIGTERM)
            finished = True  # not cut short
    assert finished and handler == [signal.SIGTERM]
    assert not signals_deferred()
    with pytest.raises(Ended):  # the handler is back: acts at once
        signal.raise_signal(signal.SIGTERM)


def test_sections_nest_and_the_first_signal_wins(handler):
    with pytest.raises(Ended):
        with deferred_signals():
            with deferred_signals():
                signal.raise_signal(signal.SIGHUP)
            assert handler == []  # the outer section still holds it
            signal.raise_signal(signal.SIGTERM)
    assert handler == [signal.SIGHUP]


def test_a_section_without_a_signal_changes_nothing(handler):
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    with deferred_signals():
        pass
    assert {s: signal.getsignal(s) for s in before} == before
    assert handler == []


def test_an_error_in_the_section_still_delivers_the_signal(handler):
    with pytest.raises(Ended) as caught:
        with deferred_signals():
            signal.raise_signal(signal.SIGTERM)
            raise ValueError("the section failed")
    assert isinstance(caught.value.__context__, ValueError)


def test_a_launcher_whose_parent_is_gone_exits_at_once():
    """The launcher told that its parent is another process (its parent died before it could ask
    to die with it) exits instead of importing torch and waiting for requests."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "testbed.train.launcher", "1"],
        cwd=REPO,
        stdin=subprocess.PIPE,  # kept open: a launcher that stays waits on it forever
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()
        proc.wait()
        proc.stdin.close()
        proc.stdout.close()
        proc.stderr.close()


def test_a_section_never_delivers_to_an_earlier_sections_handler():
    """A handler saved by an earlier section is not used again: a section that finds its own
    holding handler left in place (as when the one before it could not be put back) delivers
    SIGINT as Python's default does, KeyboardInterrupt."""
    from testbed.net import signals as S

    calls: list[int] = []
    old = signal.signal(signal.SIGINT, lambda signum, frame: calls.append(signum))
    try:
        with S.deferred_signals():
            pass  # saves the recording handler and puts it back
        signal.signal(signal.SIGINT, S._hold)  # a holding handler left behind
        with pytest.raises(KeyboardInterrupt):
            with S.deferred_signals():
                signal.raise_signal(signal.SIGINT)
        assert calls == [] and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, old)
