"""The WAN load of a placement, as `testbed plan` prints it: the sharing-bound regime by numbers."""

from __future__ import annotations

import pytest

from testbed.plan.connections import wan_connections
from testbed.plan.cost_model import predict
from testbed.plan.placement import place
from testbed.plan.wan_load import boundary_loads, format_loads
from testbed.spec.experiment_file import load_experiment
from testbed.spec.wire import TCP_GOODPUT_FRACTION


def test_the_sharing_experiment_is_sharing_bound_but_not_saturated():
    """Striped over 5 connections (Atlas's n there), four pipelines at once take D x S / B, over a
    stage's forward; the link still idles most of the iteration the cost model predicts."""
    exp = load_experiment("sharing").with_overrides(policy="atlas")
    workers = place(exp)
    n = wan_connections(exp, exp.topology_spec, workers)
    (load,) = boundary_loads(exp, exp.topology_spec, workers, n)
    alone = 65536 * 8 / (25e6 * TCP_GOODPUT_FRACTION)
    assert (load.src, load.dst, load.pipelines, n) == ("east", "west", 4, 5)
    assert load.transfer_s == pytest.approx(alone) and load.fair_transfer_s == pytest.approx(4 * alone)
    assert load.fair_transfer_s > load.forward_s == pytest.approx(0.040)  # D x S / B over a forward
    assert load.busy_s == pytest.approx(16 * alone)
    assert load.idle_share(predict(exp, exp.topology_spec, workers).iteration_s) >= 0.2
    # one connection alone (pp-fair) is held to a window of 20% of the link's 125 kB bandwidth-delay
    # product, 25 kB per 40 ms (5 Mbit/s of payload): the cap, not the sharing, decides
    (one,) = boundary_loads(exp, exp.topology_spec, workers, 1)
    assert one.transfer_s == pytest.approx(65536 * 8 / 5e6) == pytest.approx(one.fair_transfer_s)
    # 20% per connection of this path: a buffer cap for the 40 ms RTT of one 25 Mbit/s link
    assert load.connection_share == pytest.approx(0.2)
    assert "4 pipelines" in format_loads([load], 1.0)


def test_the_per_connection_share_is_stated_for_each_path():
    exp = load_experiment("default")
    shares = {(x.src, x.dst): x.connection_share for x in boundary_loads(exp, exp.topology_spec, place(exp))}
    # one cap for every socket: it reproduces the share on the path that needs the smallest buffer
    # (east-central, 20 ms RTT); on the 50 ms central-west path the same window is 8% of the link
    assert shares[("east", "central")] == pytest.approx(0.2)
    assert shares[("central", "west")] == pytest.approx(0.08)
