"""``testbed link list|down|up``: outages of a WAN link of a topology that is up on this machine
(``net/outages.py``), from any shell."""

from __future__ import annotations

from testbed.cli.common import root_preamble


def cmd_link(args) -> int:
    from testbed.net.outages import find_topology, is_down, link_ends, resolve_link, set_link

    root_preamble("testbed link")
    topo = find_topology(args.run)
    ends = link_ends(topo.spec, topo.record.prefix)
    if args.link_command == "list":
        for name, pair in ends.items():
            link = next(x for x in topo.spec.links if f"{x.a}:{x.b}" == name)
            state = "down" if is_down(pair) else "up"
            print(
                f"{name} {state} {link.rate_bps / 1e6:g} Mbit/s {link.delay_us / 1e3:g} ms "
                f"({topo.record.prefix}, {topo.spec.name}: {' '.join(f'{e.netns}/{e.ifname}' for e in pair)})"
            )
        return 0
    name = resolve_link(topo.spec, args.link)
    down = args.link_command == "down"
    changed = set_link(ends[name], name, down, topo.out_dir)
    what = "down" if down else "up"
    print(f"{name} {what}" if changed else f"{name} was already {what}")
    return 0
