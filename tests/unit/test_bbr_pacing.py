"""BBR's pacing of a message a pipeline's connection sends after idle (``plan/connections.
app_limited_message_s``), where it binds what one connection carries, and which congestion control
a prediction takes: the topology's, else this machine's default, else a run's record of it."""

from __future__ import annotations

import json
from dataclasses import asdict, replace

import pytest
from experiments import exp, topo

from testbed.plan import connections
from testbed.plan.connections import (
    BBR_HIGH_GAIN,
    BBR_PACING_MARGIN,
    app_limited_message_s,
    connection_window_bytes,
    hosts_congestion,
    one_connection_bps,
)
from testbed.plan.placement import place
from testbed.sim.validate import TOPOLOGY_RECORD, load_run
from testbed.spec.wire import TCP_MSS_WITH_TIMESTAMPS

#: the WAN probe's medians on the emulator (Linux 6.18, bbr, NFQUEUE delay) as
#: scripts/bench_bbr_messages.py printed them at fea29b8: (message bytes, RTT s, message s)
PROBED = ((36864, 0.1727, 0.07408), (86016, 0.1727, 0.08554), (86016, 0.0406, 0.01978), (36864, 0.0806, 0.03436))


def test_a_long_message_takes_about_half_a_round_trip_whatever_its_size():
    g = BBR_HIGH_GAIN * (1 - BBR_PACING_MARGIN)
    for rtt in (0.01, 0.05, 0.2):
        long = app_limited_message_s(1e9, rtt)
        assert long == pytest.approx(rtt / (g - 1), rel=1e-4)
        assert 0.5 * rtt < long < 0.55 * rtt


def test_the_pacing_grows_with_the_message_and_a_single_packet_is_not_paced():
    sizes = [TCP_MSS_WITH_TIMESTAMPS * n for n in (1, 2, 4, 8, 26, 60, 208, 1000)]
    times = [app_limited_message_s(b, 0.1) for b in sizes]
    assert times[0] == 0.0  # one packet leaves at once
    assert all(a <= b for a, b in zip(times, times[1:]))


@pytest.mark.parametrize(("nbytes", "rtt_s", "measured_s"), PROBED)
def test_the_formula_is_within_a_few_percent_of_the_probe(nbytes, rtt_s, measured_s):
    assert app_limited_message_s(nbytes, rtt_s) == pytest.approx(measured_s, rel=0.05)


def test_under_bbr_a_message_that_fits_its_window_goes_at_its_paced_rate():
    """100 Mbit/s, 10 ms one way, a window of 0.9 x the bandwidth-delay product (225 kB): the
    window carries 90 Mbit/s, BBR's pacing of 64 KiB about 48 Mbit/s."""
    e = exp(wan_connection_share=0.9)
    workers = place(e)
    bbr = replace(e.topology_spec, tcp_congestion="bbr")
    cubic = replace(e.topology_spec, tcp_congestion="cubic")
    window_bps = connection_window_bytes(e, cubic, workers) * 8 / 0.020
    paced_bps = 65536 * 8 / app_limited_message_s(65536, 0.020)
    assert paced_bps < window_bps
    assert one_connection_bps(e, cubic, workers, "a", "b", 65536) == pytest.approx(window_bps)
    assert one_connection_bps(e, bbr, workers, "a", "b", 65536) == pytest.approx(paced_bps)
    # 64 KiB within a 75 kB window (share 0.3) leave paced, though a window per round trip is slower
    fitting = exp(wan_connection_share=0.3)
    assert connection_window_bytes(fitting, bbr, workers) * 8 / 0.020 < paced_bps
    assert one_connection_bps(fitting, bbr, workers, "a", "b", 65536) == pytest.approx(paced_bps)
    # bytes beyond a small window (12.5 kB): the slower of a window per round trip and the pacing
    narrow = exp(wan_connection_share=0.05)
    w = connection_window_bytes(narrow, bbr, workers) * 8 / 0.020
    assert w < paced_bps and one_connection_bps(narrow, bbr, workers, "a", "b", 65536) == pytest.approx(w)
    # without a modelled window BBR's pacing is the only limit
    assert one_connection_bps(exp(), bbr, workers, "a", "b", 65536) == pytest.approx(paced_bps)
    assert one_connection_bps(exp(), cubic, workers, "a", "b", 65536) is None


def test_the_hosts_run_the_topology_s_congestion_control_else_the_machine_s(monkeypatch):
    monkeypatch.setattr(connections, "machine_congestion", lambda: "bbr")
    t = topo({"a": 1, "b": 1})
    assert hosts_congestion(t) == "bbr"
    assert hosts_congestion(replace(t, tcp_congestion="reno")) == "reno"


def test_a_run_is_predicted_under_the_congestion_control_it_recorded(tmp_path):
    e = exp()
    workers = place(e)
    (tmp_path / "config.json").write_text(json.dumps({**e.to_dict(), "workers": [asdict(w) for w in workers]}))
    (tmp_path / "summary.json").write_text(json.dumps({"iteration_time_s": 1.0}))
    assert load_run(tmp_path).exp.topology_spec.tcp_congestion is None  # no record: this machine's
    (tmp_path / TOPOLOGY_RECORD).write_text(json.dumps({"tcp_congestion": "reno"}))
    assert load_run(tmp_path).exp.topology_spec.tcp_congestion == "reno"
    (tmp_path / TOPOLOGY_RECORD).write_text("not json")
    assert load_run(tmp_path).exp.topology_spec.tcp_congestion is None
