"""Shaping plans as text: tc(8) command lines (printed by ``testbed topo show --tc``, and timed
against netlink by ``scripts/bench_network.py``) and the iptables-restore(8) rules that feed the
NFQUEUE delay element. Nothing here runs them."""

from __future__ import annotations

from collections.abc import Sequence

from testbed.net.shaping import DEFAULT_CLASS_MINOR, DelayQueue, EgressPlan, HtbClass, Netem, Pfifo
from testbed.trace.shaping_log import class_id


def iptables_restore_text(queues: Sequence[DelayQueue]) -> str:
    """iptables-restore(8) input for one namespace's delay queues (raw table, PREROUTING).

    No ``--queue-bypass``: if the delay element dies, packets are dropped, never passed undelayed.
    """
    lines = ["*raw", ":PREROUTING ACCEPT [0:0]", ":OUTPUT ACCEPT [0:0]"]
    for q in queues:
        match = f"-i {q.in_ifname}"
        if q.src_range:
            match += f" -m iprange --src-range {q.src_range[0]}-{q.src_range[1]}"
        if q.loss_pct and not q.element_drops:
            lines.append(
                f"-A PREROUTING {match} -m statistic --mode random --probability {q.loss_pct / 100:.8f} -j DROP"
            )
        if q.needs_element:
            lines.append(f"-A PREROUTING {match} -j NFQUEUE --queue-num {q.queue_num}")
    lines.append("COMMIT")
    return "\n".join(lines) + "\n"


def _tc_rate(bps: int) -> str:
    return f"{bps}bit"


def tc_class_argv(ifname: str, cls: HtbClass, verb: str = "add") -> list[str]:
    """``tc class add|change`` for one HTB class (tc-htb(8))."""
    parent = class_id(cls.parent_minor) if cls.parent_minor else "1:"
    return [
        "tc",
        "class",
        verb,
        "dev",
        ifname,
        "parent",
        parent,
        "classid",
        class_id(cls.minor),
        "htb",
        "rate",
        _tc_rate(cls.rate_bps),
        "ceil",
        _tc_rate(cls.ceil_bps),
        "burst",
        str(cls.burst_bytes),
        "cburst",
        str(cls.cburst_bytes),
        "quantum",
        str(cls.quantum_bytes),
    ]


def _leaf_argv(ifname: str, parent: str, handle: str, leaf: Pfifo | Netem) -> list[str]:
    base = ["tc", "qdisc", "add", "dev", ifname, "parent", parent, "handle", handle]
    if isinstance(leaf, Pfifo):
        return base + ["pfifo", "limit", str(leaf.limit_packets)]
    argv = base + ["netem", "limit", str(leaf.limit_packets), "delay", f"{leaf.delay_us}us"]
    if leaf.jitter_us:
        argv.append(f"{leaf.jitter_us}us")
    if leaf.loss_pct:
        argv += ["loss", f"{leaf.loss_pct}%"]
    return argv


def tc_argv(egress: EgressPlan) -> list[list[str]]:
    """The tc(8) command lines equivalent to an egress plan (run inside its namespace)."""
    dev = egress.ifname
    if egress.root_netem is not None:
        argv = _leaf_argv(dev, "root", "1:", egress.root_netem)
        return [argv[:5] + ["root", "handle", "1:"] + argv[9:]]
    if not egress.classes:
        return []
    cmds = [["tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", f"{DEFAULT_CLASS_MINOR:x}"]]
    for cls in egress.classes:
        cmds.append(tc_class_argv(dev, cls))
        if cls.leaf is not None:
            cmds.append(_leaf_argv(dev, class_id(cls.minor), f"{cls.minor:x}:", cls.leaf))
    for f in egress.filters:
        match = []
        if f.src:
            match += ["match", "ip", "src", f"{f.src}/32"]
        if f.dst:
            match += ["match", "ip", "dst", f"{f.dst}/32"]
        cmds.append(
            [
                "tc",
                "filter",
                "add",
                "dev",
                dev,
                "parent",
                "1:",
                "protocol",
                "ip",
                "prio",
                str(f.prio),
                "u32",
                *(match or ["match", "u32", "0", "0"]),
                "flowid",
                class_id(f.flow_minor),
            ]
        )
    return cmds
