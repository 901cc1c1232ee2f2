"""A measured WAN profile (``spec/wan_profile.py``) by hand: one connection's rate for a transfer of
any size, its record read back and refused when malformed, and the simulator taking it in place
of the modelled window (tests/integration/test_network.py measures one on a real network)."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest
from experiments import exp

from testbed.errors import SpecError
from testbed.plan.allreduce import allreduce_s, stage_rings
from testbed.plan.connections import connection_window_bytes, one_connection_bps, sent_at_once
from testbed.plan.placement import place
from testbed.plan.wan_load import boundary_loads
from testbed.sim.figures import simulate_policy
from testbed.sim.validate import MEASURED_LINKS, MODELLED_WINDOW, validate_run
from testbed.spec.experiment import Experiment
from testbed.spec.experiment_file import load_experiment
from testbed.spec.wan_profile import WAN_PROFILE_FILE, PathProfile, WanProfile
from testbed.spec.wire import TCP_GOODPUT_FRACTION

#: a 64 KiB message in 10 ms beyond the round trip (52.4 Mbit/s), 25 Mbit/s in bulk
AB = PathProfile("a", "b", 0.020, 65536, 0.010, 25e6)


def test_a_message_up_to_the_timed_size_goes_at_its_rate_and_the_rest_at_the_bulk_rate():
    assert AB.message_bps == pytest.approx(65536 * 8 / 0.010)
    assert AB.one_connection_bps(1000) == pytest.approx(AB.message_bps)
    assert AB.one_connection_bps(65536) == pytest.approx(AB.message_bps)
    # 1 MB: the first 64 KiB in 10 ms, the other 934,464 bytes at 25 Mbit/s (299.0 ms)
    seconds = 0.010 + (1_000_000 - 65536) * 8 / 25e6
    assert AB.one_connection_bps(1_000_000) == pytest.approx(8e6 / seconds)
    assert AB.one_connection_bps(1e12) == pytest.approx(25e6, rel=1e-4)  # a long transfer: the bulk rate


def test_a_profile_reads_back_and_malformed_ones_are_refused():
    prof = WanProfile((AB, PathProfile("b", "a", 0.020, 65536, 0.012, 24e6)), "bbr", 100_000)
    back = WanProfile.from_dict(json.loads(json.dumps(prof.to_dict())))
    assert back == prof
    assert back.path("b", "a").message_s == 0.012 and back.path("a", "c") is None
    with pytest.raises(ValueError, match="bulk_bps"):
        PathProfile("a", "b", 0.02, 65536, 0.01, 0.0)
    with pytest.raises(ValueError, match="message_bytes"):
        PathProfile("a", "b", 0.02, 0, 0.01, 1e6)
    with pytest.raises(TypeError):
        WanProfile.from_dict({"paths": [{"src": "a", "dst": "b"}]})
    with pytest.raises(KeyError):
        WanProfile.from_dict({})


def test_the_simulator_takes_a_measured_path_in_place_of_the_window():
    e = exp(wan_connection_share=0.2)  # stages in a and b: 100 Mbit/s, 10 ms one way
    workers = place(e)
    window = connection_window_bytes(e, e.topology_spec, workers)
    assert window is not None
    assert one_connection_bps(e, e.topology_spec, workers, "a", "b", 65536) == pytest.approx(window * 8 / 0.020)
    measured = e.with_overrides(wan_profile=WanProfile((AB,)))
    assert one_connection_bps(measured, e.topology_spec, workers, "a", "b", 65536) == pytest.approx(AB.message_bps)
    # a direction the profile did not measure keeps the window
    assert one_connection_bps(measured, e.topology_spec, workers, "b", "a", 65536) == pytest.approx(window * 8 / 0.020)
    # a boundary transfer alone: its bytes at the measured rate
    load = boundary_loads(measured, e.topology_spec, workers)[0]
    assert load.transfer_s == pytest.approx(e.activation_bytes * 8 / AB.one_connection_bps(e.activation_bytes))


def test_the_all_reduce_takes_the_measured_bulk_rate_of_one_step_s_chunk():
    """dp-wan, 2 replicas in a and b: each ring's edge sends 2 (R - 1) / R = 1x the stage's bits in
    1 step each way, at what one connection carries for a chunk of half the gradients."""
    e = exp(wan_connection_share=0.2).with_overrides(policy="dp-wan")
    workers = place(e)
    prof = WanProfile((AB, PathProfile("b", "a", 0.020, 65536, 0.010, 25e6)))
    measured = e.with_overrides(wan_profile=prof)
    slowest = 0.0
    for ring in stage_rings(e, workers):
        one = min(100e6 * TCP_GOODPUT_FRACTION, AB.one_connection_bps(ring.bits / 8 / 2))
        slowest = max(slowest, 2 * 0.010 + ring.sent_bits() / one)
    assert allreduce_s(measured, e.topology_spec, workers) == pytest.approx(slowest)


def _run_folder(tmp_path, e: Experiment, measured: dict) -> None:
    workers = place(e)
    (tmp_path / "config.json").write_text(json.dumps({**e.to_dict(), "workers": [asdict(w) for w in workers]}))
    (tmp_path / "summary.json").write_text(json.dumps(measured))


def test_validation_uses_the_runs_profile_unless_told_not_to(tmp_path):
    e = load_experiment("two_dc")
    modelled = simulate_policy(e).iteration_time_s
    _run_folder(tmp_path, e, {"iteration_time_s": modelled})
    assert validate_run(tmp_path)["links"] == MODELLED_WINDOW
    dcs = [d.name for d in e.topology_spec.dcs]
    slow = [PathProfile(x, y, 0.1, e.activation_bytes, 1.0, 1e6) for x in dcs for y in dcs if x != y]
    (tmp_path / WAN_PROFILE_FILE).write_text(json.dumps(WanProfile(tuple(slow)).to_dict()))
    got = validate_run(tmp_path)
    assert got["links"] == MEASURED_LINKS
    assert got["figures"]["iteration_time_s"]["predicted"] > modelled  # a second per transfer
    back = validate_run(tmp_path, measured_links=False)
    assert back["links"] == MODELLED_WINDOW and back["figures"]["iteration_time_s"]["predicted"] == modelled
    (tmp_path / WAN_PROFILE_FILE).write_text('{"paths": [{"src": "a"}]}')
    with pytest.raises(SpecError, match="not a WAN profile"):
        validate_run(tmp_path)


def test_a_transfer_leaves_as_one_burst_when_each_connection_s_share_fits_its_window():
    """AB keeps 25 Mbit/s x 20 ms = 62.5 kB in flight: 64 KiB on one connection does not fit, on
    two (32 KiB each) it does; without a profile the modelled window decides, and with no window
    modelled every transfer is a burst."""
    assert AB.window_bytes == pytest.approx(62_500)
    e = exp(wan_connection_share=0.2)
    workers = place(e)
    measured = e.with_overrides(wan_profile=WanProfile((AB,)))
    assert not sent_at_once(measured, e.topology_spec, workers, "a", "b", 65536, 1)
    assert sent_at_once(measured, e.topology_spec, workers, "a", "b", 65536, 2)
    window = connection_window_bytes(e, e.topology_spec, workers)
    assert sent_at_once(e, e.topology_spec, workers, "b", "a", window, 1)
    assert not sent_at_once(e, e.topology_spec, workers, "b", "a", window + 1, 1)
    assert sent_at_once(exp(), e.topology_spec, workers, "a", "b", 1e9, 1)
