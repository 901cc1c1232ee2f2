"""The paced FIFO queue (``plan/fifo_queue.py``) and bursts in ``FairShare``, against hand-computed
fluid queues: a link of 1 transfer per second, each burst 1 transfer of work."""

import pytest

from testbed.plan.fair_share import FairShare
from testbed.plan.fifo_queue import PacedFifo


def test_a_burst_alone_leaves_at_the_link_rate_whatever_its_pacing():
    """Paced at 2/s it is all in by 0.5 s, but the link sends 1/s: done at 1.0. Paced at the link
    rate there is no queue: done at 1.0 too; paced at 0.25/s, at its own pace: 4.0."""
    for rate, done in ((2.0, 1.0), (1.0, 1.0), (0.25, 4.0)):
        q = PacedFifo(1.0)
        q.add(0.0, "a", rate)
        assert q.next_done() == (pytest.approx(done), "a")


def test_the_earlier_burst_leaves_first_not_together():
    """a paced at 2/s from 0 (in by 0.5), b at 2/s from 0.25 (in by 0.75). Virtual time: bytes of
    [0, 0.25) went in at 2/s, leave by t = 0.5; those of [0.25, 0.5) at 4/s, leave by 1.5: a is
    done at 1.5. Then [0.5, 0.75) at 2/s: b is done at 2.0. (Fair shares: a at 1.75; strict
    FIFO of whole bursts: a at 1.0.)"""
    q = PacedFifo(1.0)
    q.add(0.0, "a", 2.0)
    q.add(0.25, "b", 2.0)
    assert q.next_done() == (pytest.approx(1.5), "a")
    q.remove(1.5, "a")
    assert q.next_done() == (pytest.approx(2.0), "b")
    assert q.sending_rate() == pytest.approx(1.0)  # b's bytes still wait


def test_bursts_that_start_together_share_like_fair_flows():
    q = PacedFifo(1.0)
    q.add(0.0, "a", 1.0)
    q.add(0.0, "b", 1.0)
    assert q.next_done()[0] == pytest.approx(2.0)


def test_a_burst_after_the_queue_emptied_starts_afresh():
    q = PacedFifo(1.0)
    q.add(0.0, "a", 2.0)
    q.remove(1.0, "a")
    assert q.next_done() is None and q.sending_rate() == 0.0
    q.add(3.0, "b", 2.0)
    assert q.next_done() == (pytest.approx(4.0), "b")
    with pytest.raises(KeyError):
        q.remove(4.0, "a")


def test_bad_rates_are_refused():
    with pytest.raises(ValueError, match="capacity"):
        PacedFifo(0.0)
    with pytest.raises(ValueError, match="pacing rate"):
        PacedFifo(1.0).add(0.0, "a", 0.0)


def test_fair_share_serves_bursts_in_order_and_acked_flows_share_the_rest():
    """Bursts x (from 0) and y (from 0.25), each paced at 2/s on link l: as the queue above, x at
    1.5 and y at 2.0. An ACK-clocked flow z on link m (2/s) is not slowed by them; a burst on a
    path of two links shares them as an ACK-clocked flow."""
    fs = FairShare({"l": 1.0, "m": 2.0})
    fs.add(0.0, "x", ("l",), 2.0, pacing=2.0)
    fs.add(0.0, "z", ("m",), 5.0)
    fs.add(0.25, "y", ("l",), 2.0, pacing=2.0)
    assert fs.next_done() == (pytest.approx(0.5), "z")
    fs.remove(0.5, "z")
    assert fs.next_done() == (pytest.approx(1.5), "x")
    fs.remove(1.5, "x")
    assert fs.next_done() == (pytest.approx(2.0), "y") and len(fs) == 1
    fs.remove(2.0, "y")
    fs.add(3.0, "w", ("l", "m"), 5.0, pacing=5.0)  # two links: fair sharing, the link's 1/s
    assert fs.next_done() == (pytest.approx(4.0), "w")


def test_three_bursts_paced_at_the_link_rate_leave_in_arrival_order():
    """a, b and c, each paced at the link's 1/s, start 0.1 s apart (all in by 1.0, 1.1 and 1.2).
    Virtual time: 1 going in until 0.1 (no queue); 2 until 0.2 (x reaches 0.2 at 0.3); 3 until 1.0
    (x reaches 1.0 at 0.3 + 0.8 x 3 = 2.7: a done); 2 until 1.1 (2.9: b); 1 until 1.2 (3.0: c).
    Fair shares would end a at 2.75."""
    q = PacedFifo(1.0)
    for t, flow in ((0.0, "a"), (0.1, "b"), (0.2, "c")):
        q.add(t, flow, 1.0)
    for done, flow in ((2.7, "a"), (2.9, "b"), (3.0, "c")):
        assert q.next_done() == (pytest.approx(done), flow)
        q.remove(done, flow)
    fs = FairShare({"l": 1.0})
    for t, flow in ((0.0, "a"), (0.1, "b"), (0.2, "c")):
        fs.add(t, flow, ("l",), 1.0)
    assert fs.next_done() == (pytest.approx(2.75), "a")
