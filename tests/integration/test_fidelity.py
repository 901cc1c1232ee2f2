"""The fidelity check on the shipped topologies: measured rate and RTT within the stated tolerances."""

from __future__ import annotations

import json

import pytest

from testbed.net.fidelity import check_direction, check_fidelity
from testbed.net.wan_probe import profile_wan
from testbed.plan.connections import buffer_for_share, window_for_share
from testbed.run.backends import make_network
from testbed.spec.topology_file import load_topology, parse_topology
from testbed.spec.wire import TCP_GOODPUT_FRACTION

from .conftest import LONG_RTT, SHORT, run_cli


def _assert_report_ok(report):
    bad = [link for link in report["links"] if not link["ok"]]
    assert not bad, json.dumps(bad, indent=1)
    assert report["ok"]


def test_three_dc_fidelity(tmp_path, clean_machine):
    """Every link of the default topology in both directions: the 60 ms east-west path over
    ``LONG_RTT``'s window, the 20 and 50 ms ones over ``SHORT``'s (12 s less of the suite: 38 s)."""
    spec = load_topology("three_dc")
    with make_network(spec, out_dir=tmp_path) as net:
        reports = [
            check_fidelity(net, **SHORT, links=["east:central", "central:west"]),
            check_fidelity(net, **LONG_RTT, links=["east:west"]),
        ]
    assert sorted((x["src_dc"], x["dst_dc"]) for r in reports for x in r["links"]) == sorted(
        (a, b) for link in spec.links for a, b in ((link.a, link.b), (link.b, link.a))
    )
    for report in reports:
        _assert_report_ok(report)


def test_cli_check_json_two_dc(tmp_path, clean_machine):
    proc = run_cli(
        "topo",
        "check",
        "two_dc",
        "--json",
        "--duration",
        "3",
        "--omit",
        "1",
        "--attempts",
        "2",
        "--link",
        "west:east",
        "--out",
        str(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["delay_mechanism"] in ("netem", "nfqueue") and report["attempts"] == 2
    assert {"src_dc", "dst_dc", "rate_mbit", "measured_rate_mbit", "delay_ms", "measured_rtt_ms", "ok"} <= set(
        report["links"][0]
    )
    assert {(link["src_dc"], link["dst_dc"]) for link in report["links"]} == {("east", "west"), ("west", "east")}
    assert report["links"][0]["delay_ms"] == load_topology("two_dc").links[0].delay_us / 1000
    _assert_report_ok(report)
    assert (tmp_path / "fidelity.json").exists() and (tmp_path / "shaping.jsonl").exists()


def test_loss_jitter_and_access_links(tmp_path, clean_machine):
    spec = parse_topology(
        {
            "dcs": [
                {"name": "a", "hosts": 2, "intra_rate": "200mbit", "intra_delay": "1ms"},
                {"name": "b", "hosts": 1},
            ],
            "links": [{"between": ["a", "b"], "rate": "50mbit", "delay": "15ms", "jitter": "1ms", "loss": "1%"}],
        },
        "impaired",
    )
    with make_network(spec, out_dir=tmp_path) as net:
        # one direction (the other's delay element and loss rule are the same code with the same
        # figures; three_dc's fidelity test measures both directions of every link): a failing
        # measurement taken again once, as SHORT's attempts
        args = {k: v for k, v in SHORT.items() if k != "attempts"}
        link = check_direction(net, "a", "b", **args)
        if not link.ok:
            link = check_direction(net, "a", "b", **args)
        assert link.ok, link.to_dict()
        assert link.measured_loss_pct is not None and link.expected_rtt_ms == 2 * (1 + 15)
        # two hosts of one DC are two access links apart: RTT 4 x 1 ms
        from testbed.net.fidelity import measure_rtt_ms, rtt_within

        rtt, _ = measure_rtt_ms(net, "a-h0", "a-h1", 20)
        assert rtt_within(rtt, 4.0), rtt


def test_rate_accuracy_at_the_ends_of_the_range(tmp_path, clean_machine):
    """HTB with ~1 ms bursts holds its rate from 1 Gbit/s down to 1 Mbit/s (DESIGN.md section 3)."""
    from testbed.net.fidelity import rate_within
    from testbed.net.iperf import iperf
    from testbed.spec.wire import TCP_GOODPUT_FRACTION

    spec = parse_topology(
        {
            "dcs": [{"name": "a", "hosts": 2}, {"name": "b", "hosts": 2}],
            "links": [{"between": ["a", "b"], "rate": "1gbit", "delay": "10ms"}],
        },
        "range",
    )
    with make_network(spec, out_dir=tmp_path) as net:
        from testbed.net.fidelity import check_direction

        fast = check_direction(net, "a", "b", duration_s=4, omit_s=2, rtt_samples=10)
        assert fast.ok, fast.to_dict()
        net.shaping.set_link_rate("a", "b", 1_000_000)
        slow = iperf(net, "a-h1", "b-h1", duration_s=6, omit_s=2)
        assert rate_within(slow.bits_per_second, 1e6 * TCP_GOODPUT_FRACTION), slow


def test_a_shallow_queue_reports_its_drops_and_a_deep_one_none(tmp_path, clean_machine):
    """Queue drops come from the kernel's class counters: one TCP flow through a 30-packet queue on
    a path of 826 packets' bandwidth-delay product drops in slow start, through a 4000-packet queue
    it does not; ``topo check`` says which link dropped."""

    def topo(queue: int) -> dict:
        link = {"between": ["a", "b"], "rate": "100mbit", "delay": "50ms", "queue": queue}
        return {"dcs": [{"name": "a", "hosts": 1}, {"name": "b", "hosts": 1}], "links": [link]}

    with make_network(parse_topology(topo(4000), "deep"), out_dir=tmp_path / "deep") as net:
        deep = check_direction(net, "a", "b", duration_s=3, omit_s=1, rtt_samples=5)
    assert deep.queue_drops == 0, deep.to_dict()
    shallow_file = tmp_path / "shallow.yaml"
    shallow_file.write_text(json.dumps(topo(30)))
    proc = run_cli("topo", "check", str(shallow_file), "--duration", "3", "--omit", "1", "--out", str(tmp_path / "s"))
    assert "queue 30 packets is below the bandwidth-delay product" in proc.stderr  # the load-time warning
    assert "WAN queues dropped packets on a->b, b->a while measured" in proc.stdout, proc.stdout
    report = json.loads((tmp_path / "s" / "fidelity.json").read_text())
    assert all(link["queue_drops"] > 0 for link in report["links"])


def test_the_wan_probe_measures_one_connection_under_a_socket_buffer_cap(tmp_path, clean_machine):
    """``net/wan_probe.py`` on a 100 Mbit/s link of 10 ms each way, socket buffers capped at
    100 kB (a fifth of the 250 kB bandwidth-delay product, doubled as the old kernels' rule
    needs): the idle round trip is the link's, a 64 KiB message takes at least its time at the
    line rate, and one connection's bulk goodput stays under the link yet carries at least half
    of the cap per round trip (what any kernel advertises of a buffer: tcp_adv_win_scale's rule
    or the later measured ratio)."""
    spec = parse_topology(
        {
            "dcs": [{"name": "a", "hosts": 1}, {"name": "b", "hosts": 1}],
            "links": [{"between": ["a", "b"], "rate": "100mbit", "delay": "10ms"}],
        },
        "probe",
    )
    cap = 100_000
    with make_network(spec, out_dir=tmp_path, tcp_buffer_bytes=cap) as net:
        prof = profile_wan(net, [("a", "b")], 65536, 0.02, cap, bulk_s=1.5)
    assert [(p.src, p.dst) for p in prof.paths] == [("a", "b"), ("b", "a")]
    assert prof.congestion and prof.socket_buffer_bytes == cap
    for p in prof.paths:
        assert 0.020 <= p.rtt_s <= 0.025, p
        assert p.message_s >= 65536 * 8 / 100e6, p
        assert 0.5 * cap * 8 / p.rtt_s * 0.9 <= p.bulk_bps <= 100e6 * TCP_GOODPUT_FRACTION * 1.02, p


def test_the_socket_buffer_cap_holds_one_connection_to_the_modelled_window(tmp_path, clean_machine):
    """An experiment's ``wan_connection_share`` of 0.2 on a 100 Mbit/s link of 10 ms each way is a
    50 kB window (``plan/connections.window_for_share``); the cap the testbed sets for it on this
    kernel (``buffer_for_share``: the window over ``window_per_buffer_byte``) holds one bulk
    connection's window (goodput x RTT) within 15% of 50 kB, so that the connection fills the
    stated fifth of the link (the per-path spread of the kernel's ratio: docs/results.md)."""
    spec = parse_topology(
        {
            "dcs": [{"name": "a", "hosts": 1}, {"name": "b", "hosts": 1}],
            "links": [{"between": ["a", "b"], "rate": "100mbit", "delay": "10ms"}],
        },
        "window",
    )
    window = window_for_share(100e6, 0.020, 0.2)
    cap = buffer_for_share(100e6, 0.020, 0.2)
    with make_network(spec, out_dir=tmp_path, tcp_buffer_bytes=cap) as net:
        prof = profile_wan(net, [("a", "b")], 65536, 0.02, cap, bulk_s=2.0)
    for p in prof.paths:
        kept = p.bulk_bps / 8 * p.rtt_s
        assert 0.85 * window <= kept <= 1.15 * window, (kept, window, cap, p)


def test_a_10_gbit_link_checked_at_dilation_10(tmp_path, clean_machine):
    """``topo check two_dc_10g --dilation 10``: 10 Gbit/s with 2 ms in the emulated frame is 1 Gbit/s
    with 20 ms in the kernel (the class's rate read back); the goodput, in the emulated frame, within
    2% of the expected (issue 44's goal; the check's own tolerance is 5%), the RTT 4 ms."""
    proc = run_cli(
        "topo", "check", "two_dc_10g", "--dilation", "10", "--json", "--duration", "3", "--omit", "1",
        "--attempts", "2", "--out", str(tmp_path),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["time_dilation"] == 10
    for row in report["links"]:
        print(row["src_dc"], row["dst_dc"], row["measured_rate_mbit"], row["expected_goodput_mbit"])
        assert row["rate_mbit"] == 10_000 and row["expected_rtt_ms"] == pytest.approx(4.0)
        assert abs(row["measured_rate_mbit"] / row["expected_goodput_mbit"] - 1) <= 0.02, row
        assert row["measured_rtt_ms"] == pytest.approx(4.0, abs=0.2), row
    shaping = [json.loads(x) for x in (tmp_path / "shaping.jsonl").read_text().splitlines()]
    assert {r["ceil_bps"] for r in shaping if r["event"] == "add" and r["classid"] == "1:1"} == {1_000_000_000}
