"""Live changes of HTB classes: in place, effective while traffic flows, logged with their time."""
from __future__ import annotations

import json
import statistics
import threading
import time

from testbed.emulation import Emulation
from testbed.fidelity import rate_within
from testbed.iperf import iperf
from testbed.shaping import TCP_GOODPUT_FRACTION
from testbed.topology import load_topology


def test_link_rate_change_takes_effect_mid_transfer(tmp_path, clean_machine):
    with Emulation(load_topology("two_dc"), out_dir=tmp_path) as emu:
        new_rate = 30_000_000
        changed = {}

        def change_later():
            time.sleep(3.5)
            changed["t_ns"] = emu.set_wan_class_rate("east", "west", 0x10, new_rate)

        t = threading.Thread(target=change_later)
        t.start()
        result = iperf(emu, "east-h0", "west-h0", duration_s=10, omit_s=0).interval_bps
        t.join()
        # per-second figures are the sender's and come in bursts: average whole seconds
        before = statistics.mean(result[1:3])
        after = statistics.mean(result[5:10])
        assert rate_within(before, 100e6 * TCP_GOODPUT_FRACTION), before
        assert rate_within(after, new_rate * TCP_GOODPUT_FRACTION), after
        assert emu.wan_classes("east", "west")[0x10]["rate_bps"] == new_rate
        log = [json.loads(line) for line in (tmp_path / "shaping.jsonl").read_text().splitlines()]
        change = [e for e in log if e["event"] == "change"]
        assert change and change[-1]["t_ns"] == changed["t_ns"] and change[-1]["rate_bps"] == new_rate


def test_per_host_classes_with_filters(tmp_path, clean_machine):
    with Emulation(load_topology("two_dc"), out_dir=tmp_path) as emu:
        emu.add_wan_class("east", "west", 0x11, 10_000_000, pairs=[("east-h1", "west-h1")])
        assert emu.wan_classes("east", "west")[0x11]["rate_bps"] == 10_000_000
        slow = iperf(emu, "east-h1", "west-h1", duration_s=3, omit_s=1)
        fast = iperf(emu, "east-h0", "west-h0", duration_s=3, omit_s=1)
        assert rate_within(slow.bits_per_second, 10e6 * TCP_GOODPUT_FRACTION), slow
        assert rate_within(fast.bits_per_second, 100e6 * TCP_GOODPUT_FRACTION), fast
        emu.set_wan_class_rate("east", "west", 0x11, 40_000_000)
        faster = iperf(emu, "east-h1", "west-h1", duration_s=3, omit_s=1)
        assert rate_within(faster.bits_per_second, 40e6 * TCP_GOODPUT_FRACTION), faster
