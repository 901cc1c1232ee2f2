"""Pairing a transfer's two reports (atlas/rendezvous.py)."""

import pytest

from testbed.atlas import rendezvous
from testbed.atlas.channel import READY, RECV
from testbed.atlas.rendezvous import Rendezvous

KEY = (0, 2, 0, 5)  # sender rank, receiver rank, iteration, microbatch


@pytest.mark.parametrize("first, second", [(RECV, READY), (READY, RECV)])
def test_a_transfer_is_ready_once_both_sides_reported_in_either_order(first, second):
    r = Rendezvous()
    assert r.report(KEY, first, 100) is None
    t_sender, t_receiver = r.report(KEY, second, 250)  # (sender's time, receiver's time)
    assert (t_sender, t_receiver) == ((250, 100) if second == READY else (100, 250))
    assert r.half == {}


def test_a_lone_report_expires_with_the_other_side_taken_at_its_time():
    r = Rendezvous()
    r.report(KEY, READY, 1_000)
    assert r.expiries_ns(lambda key: 500) == [1_500]
    assert r.expire(1_499, lambda key: 500) == [] and r.expired == 0
    assert r.expire(1_500, lambda key: 500) == [(KEY, 1_000, 1_000)]
    assert r.expired == 1 and r.half == {} and r.expiries_ns(lambda key: 500) == []


def test_done_transfers_are_remembered_up_to_the_memory(monkeypatch):
    monkeypatch.setattr(rendezvous, "DONE_MEMORY", 2)
    r = Rendezvous()
    r.report(KEY, READY, 1)
    r.finish(KEY)
    assert r.is_done(KEY) and r.half == {}  # its half forgotten with it
    r.finish((0, 2, 0, 6))
    r.finish((0, 2, 0, 7))
    assert not r.is_done(KEY) and r.is_done((0, 2, 0, 7))  # the oldest forgotten first
