"""``testbed link list|down|up|rate``: a WAN link of a topology that is up on this machine taken
down, brought back, or given another rate, from any shell (``net/link_control.py``)."""

from __future__ import annotations

from testbed.cli.common import root_preamble
from testbed.errors import SpecError


def cmd_link(args) -> int:
    from testbed.net.link_control import (
        find_topology,
        is_down,
        link_ends,
        link_rate_bps,
        resolve_link,
        set_link,
        set_rate,
    )
    from testbed.spec.units import UnitError, parse_rate_bps

    root_preamble("testbed link")
    topo = find_topology(args.run)
    ends = link_ends(topo.spec, topo.record.prefix)
    if args.link_command == "list":
        for name, pair in ends.items():
            link = next(x for x in topo.spec.links if f"{x.a}:{x.b}" == name)
            state = "down" if is_down(pair) else "up"
            now = link_rate_bps(pair[0])
            changed = f" (topology: {link.rate_bps / 1e6:g} Mbit/s)" if now != link.rate_bps else ""
            print(
                f"{name} {state} {now / 1e6:g} Mbit/s{changed} {link.delay_us / 1e3:g} ms "
                f"({topo.record.prefix}, {topo.spec.name}: {' '.join(f'{e.netns}/{e.ifname}' for e in pair)})"
            )
        return 0
    name = resolve_link(topo.spec, args.link)
    if args.link_command == "rate":
        try:
            rate = parse_rate_bps(args.rate)
        except UnitError as e:
            raise SpecError("testbed link rate", "RATE", args.rate, str(e), "e.g. 30mbit") from None
        set_rate(ends[name], name, rate, topo.out_dir)
        print(f"{name} {rate / 1e6:g} Mbit/s both ways")
        return 0
    down = args.link_command == "down"
    changed = set_link(ends[name], name, down, topo.out_dir)
    what = "down" if down else "up"
    print(f"{name} {what}" if changed else f"{name} was already {what}")
    return 0
