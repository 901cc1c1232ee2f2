"""The receiver's goodput from iperf3's server JSON: whole measured seconds only, iperf3's quirks left out."""

from __future__ import annotations

import pytest

from testbed.net.iperf import receiver_goodput


def _iv(start, end, nbytes, omitted=False, seconds=None):
    return {"sum": {"start": start, "end": end, "seconds": seconds or end - start, "bytes": nbytes, "omitted": omitted}}


def test_omitted_quirky_and_partial_intervals_do_not_count():
    server = {
        "intervals": [
            _iv(0.0, 1.0, 100, omitted=True),
            _iv(1.0, 2.0, 1_000, omitted=True),
            _iv(1.0, 1.0, 1_000, seconds=2.0),  # iperf3 3.12's interval at the end of the omitted seconds
            _iv(1.0, 2.0, 1_250_000),
            _iv(2.0, 3.0, 1_250_000),
            _iv(3.0, 3.1, 10_000),  # the last, partial one
        ]
    }
    goodput, intervals = receiver_goodput(server)
    assert goodput == 10_000_000  # 2.5 MB over 2 s
    assert intervals == pytest.approx((800.0, 8_000.0, 10_000_000.0, 10_000_000.0, 800_000.0))


def test_a_dip_counts_at_its_weight():
    server = {"intervals": [_iv(0.0, 1.0, 1_000_000), _iv(1.0, 2.0, 500_000), _iv(2.0, 3.0, 1_000_000)]}
    assert receiver_goodput(server)[0] == 2_500_000 * 8 / 3


def test_no_whole_second_is_none():
    assert receiver_goodput({"intervals": [_iv(0.0, 0.5, 100)]})[0] is None
    assert receiver_goodput({})[0] is None
    assert receiver_goodput({"intervals": [_iv(0.0, 1.0, 100, omitted=True)]}) == (None, (800.0,))
