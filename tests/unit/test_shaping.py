"""Shaping plans as data: HTB trees, netem leaves, NFQUEUE delay queues, tc and iptables text."""

import ipaddress
import math
import re

import pytest

from testbed.net.shaping import (
    DEFAULT_CLASS_MINOR,
    ETH_HLEN,
    MTU,
    HtbClass,
    Netem,
    Pfifo,
    U32Filter,
    htb_burst_bytes,
    plan_shaping,
    with_class,
)
from testbed.net.shaping_text import iptables_restore_text, tc_argv
from testbed.spec.addressing import AddressPlan
from testbed.spec.topology_file import load_topology, parse_topology

FRAME = MTU + ETH_HLEN  # 1514 bytes on the wire per full-sized packet


def make(link_extra=None, a_extra=None):
    spec = parse_topology(
        {
            "dcs": [{"name": "a", "hosts": 2, **(a_extra or {})}, {"name": "b", "hosts": 1}],
            "links": [{"between": ["a", "b"], "rate": "100mbit", "delay": "20ms", **(link_extra or {})}],
        }
    )
    return spec, AddressPlan(spec, "tb0000")


def default_leaf(egress):
    return next(c for c in egress.classes if c.minor == DEFAULT_CLASS_MINOR).leaf


def test_htb_tree_on_each_wan_end():
    spec, plan = make()
    for mech in ("netem", "nfqueue"):
        sp = plan_shaping(spec, plan, mech)
        for dc, peer in (("a", "b"), ("b", "a")):
            e = sp.egress_of(plan.routers[dc].netns, f"w-{peer}")
            assert [(c.minor, c.parent_minor) for c in e.classes] == [(1, 0), (DEFAULT_CLASS_MINOR, 1)]
            assert all(c.rate_bps == c.ceil_bps == 100 * 10**6 for c in e.classes)


def test_netem_leaf_holds_queue_plus_bdp():
    spec, plan = make({"jitter": "2ms", "loss": "1%", "queue": 200})
    e = plan_shaping(spec, plan, "netem").egress_of("tb0000-a-r", "w-b")
    leaf = default_leaf(e)
    # frames in flight over delay + jitter: 100 Mbit/s = 12.5e6 B/s, times 22 ms, in 1514-byte frames
    in_flight = math.ceil(100e6 / 8 * 0.022 / FRAME)
    assert leaf == Netem(delay_us=20_000, jitter_us=2_000, loss_pct=1.0, limit_packets=200 + in_flight)


def test_nfqueue_delays_on_the_receiving_router():
    spec, plan = make({"jitter": "2ms", "loss": "1%", "queue": 200})
    sp = plan_shaping(spec, plan, "nfqueue")
    assert default_leaf(sp.egress_of("tb0000-a-r", "w-b")) == Pfifo(200)
    # a->b traffic leaves a's router on w-b (shaped) and enters b's router on w-a (delayed)
    at_b = [q for q in sp.delay_queues if q.netns == "tb0000-b-r"]
    assert [(q.in_ifname, q.delay_us, q.jitter_us, q.loss_pct) for q in at_b] == [("w-a", 20_000, 2_000, 1.0)]
    assert {q.netns for q in sp.delay_queues} == {"tb0000-a-r", "tb0000-b-r"}  # no intra delay: routers only


def test_nfqueue_intra_delay_host_queues():
    spec, plan = make(a_extra={"intra_delay": "100us"})
    sp = plan_shaping(spec, plan, "nfqueue")
    router = [q for q in sp.delay_queues if q.netns == "tb0000-a-r" and q.in_ifname == "br0"]
    assert [q.delay_us for q in router] == [100]  # hosts' traffic towards other DCs
    h0, h1 = plan.hosts_of("a")
    for h in (h0, h1):
        qs = [q for q in sp.delay_queues if q.netns == h.netns]
        # same-DC sources first (two access links), then the catch-all (one access link)
        assert [(q.queue_num, q.delay_us, q.src_range) for q in qs] == [
            (0, 2 * 100, (str(h0.ip), str(h1.ip))),
            (1, 100, None),
        ]
        text = iptables_restore_text(qs)
        assert text.index("--src-range") < text.index("--queue-num 1")
    assert not any(q.netns.startswith("tb0000-b-") and q.in_ifname == "eth0" for q in sp.delay_queues)


def test_netem_intra_delay_on_both_access_link_ends():
    spec, plan = make(a_extra={"intra_delay": "100us"})
    sp = plan_shaping(spec, plan, "netem")
    h = plan.hosts["a-h1"]
    for netns, ifname in ((h.netns, "eth0"), ("tb0000-a-r", "h1")):
        e = sp.egress_of(netns, ifname)
        assert e.classes == () and e.root_netem.delay_us == 100  # unshaped: bare netem root
    argv = tc_argv(sp.egress_of(h.netns, "eth0"))
    assert len(argv) == 1 and argv[0][:9] == ["tc", "qdisc", "add", "dev", "eth0", "root", "handle", "1:", "netem"]
    assert argv[0][-2:] == ["delay", "100us"]


def test_unknown_mechanism():
    spec, plan = make()
    with pytest.raises(ValueError):
        plan_shaping(spec, plan, "tbf")


@pytest.mark.parametrize(
    "rate_bps, burst",
    [
        (100 * 10**6, 100 * 10**6 // 8 // 1000),  # 1 ms at 100 Mbit/s: 12500 bytes
        (10 * 10**9, 10 * 10**9 // 8 // 1000),  # 1 ms at 10 Gbit/s
        (1 * 10**6, 2 * FRAME),  # 1 ms is 125 bytes: floor of two frames
    ],
)
def test_htb_burst(rate_bps, burst):
    assert htb_burst_bytes(rate_bps) == burst


def test_iptables_text_loss_then_nfqueue_without_bypass():
    spec, plan = make({"loss": "2.5%"})
    qs = [q for q in plan_shaping(spec, plan, "nfqueue").delay_queues if q.netns == "tb0000-b-r"]
    lines = iptables_restore_text(qs).splitlines()
    assert lines[0] == "*raw" and lines[-1] == "COMMIT"
    drop = next(i for i, line in enumerate(lines) if "statistic" in line)
    nfq = next(i for i, line in enumerate(lines) if "NFQUEUE" in line)
    assert drop < nfq
    assert float(re.search(r"--probability (\S+)", lines[drop]).group(1)) == pytest.approx(2.5 / 100)
    assert lines[drop].endswith("-j DROP") and "-i w-a" in lines[drop]
    assert "--queue-bypass" not in "\n".join(lines)


def test_loss_without_delay_needs_no_element():
    spec, plan = make({"delay": "0ms", "loss": "1%"})
    qs = [q for q in plan_shaping(spec, plan, "nfqueue").delay_queues if q.netns == "tb0000-b-r"]
    text = iptables_restore_text(qs)
    assert "DROP" in text and "NFQUEUE" not in text


def test_tc_argv_htb_tree():
    spec, plan = make()
    cmds = tc_argv(plan_shaping(spec, plan, "nfqueue").egress_of("tb0000-a-r", "w-b"))
    lines = [" ".join(c) for c in cmds]
    burst = str(htb_burst_bytes(100 * 10**6))
    assert lines[0] == "tc qdisc add dev w-b root handle 1: htb default 10"
    assert lines[1].startswith("tc class add dev w-b parent 1: classid 1:1 htb rate 100000000bit ceil 100000000bit")
    assert f"burst {burst} cburst {burst}" in lines[1]
    assert lines[2].startswith("tc class add dev w-b parent 1:1 classid 1:10 htb")
    assert lines[3] == "tc qdisc add dev w-b parent 1:10 handle 10: pfifo limit 1000"
    assert len(lines) == 4


def ip_hex(ip):
    return f"0x{int(ipaddress.IPv4Address(ip)):08x}"


def test_u32_keys():
    f = U32Filter(prio=1, flow_minor=0x11, src="10.100.0.2", dst="10.100.1.3")
    assert ip_hex("10.100.0.2") == "0x0a640002"
    assert f.keys() == [f"{ip_hex('10.100.0.2')}/0xffffffff+12", f"{ip_hex('10.100.1.3')}/0xffffffff+16"]
    assert U32Filter(1, 0x11, dst="192.168.255.1").keys() == ["0xc0a8ff01/0xffffffff+16"]
    assert U32Filter(1, 0x11).keys() == ["0x0/0x0+0"]  # match everything


def test_with_class_copies_the_default_leaf_and_adds_filters():
    spec, plan = make()
    e = plan_shaping(spec, plan, "netem").egress_of("tb0000-a-r", "w-b")
    f = U32Filter(prio=1, flow_minor=0x11, src="10.100.0.2", dst="10.100.1.2")
    new = with_class(e, HtbClass(0x11, 1, 20 * 10**6, 20 * 10**6), (f,))
    assert new.classes[:-1] == e.classes and new.filters == (f,)
    assert new.classes[-1].leaf == default_leaf(e) and isinstance(default_leaf(e), Netem)
    own = with_class(e, HtbClass(0x12, 1, 10**6, 10**6, Pfifo(5)), ())
    assert own.classes[-1].leaf == Pfifo(5)
    assert e.classes[-1].minor == DEFAULT_CLASS_MINOR  # the original plan is unchanged
    lines = [" ".join(c) for c in tc_argv(new)]
    assert "classid 1:11 htb rate 20000000bit" in lines[-3]
    assert lines[-2].startswith("tc qdisc add dev w-b parent 1:11 handle 11: netem")
    assert lines[-1] == (
        "tc filter add dev w-b parent 1: protocol ip prio 1 u32 match ip src 10.100.0.2/32 "
        "match ip dst 10.100.1.2/32 flowid 1:11"
    )


def test_shipped_topology_plans_cover_every_wan_end():
    spec = load_topology("four_dc_mesh")
    plan = AddressPlan(spec, "tb0000")
    for mech in ("netem", "nfqueue"):
        sp = plan_shaping(spec, plan, mech)
        assert len(sp.egress) == 2 * len(spec.links)  # unshaped access links: no plans
        if mech == "nfqueue":
            assert len(sp.delay_queues) == 2 * len(spec.links)
        else:
            assert sp.delay_queues == ()
